"""Text -> image-generation prompt, one rule per family: what ``hf-sjd bench --model`` feeds ``generate``.

    family        prompt builder (the family's own recipe)                          needs
    emu3          ``Emu3Processor(text, return_for_image_generation=True,             processor
                  image_area=side**2)``: text + ``<|image start|>{H}*{W}<|image token|>``
    janus         ``processor.apply_chat_template`` (when the processor has one),      processor
                  then ``JanusProcessor(text, generation_mode="image")``: + ``<begin_of_image>``
    lumina-mgpt   the tokenizer on Lumina-mGPT's instruction                           tokenizer
                  ``Generate an image of {W}x{H} according to the following prompt:\\n{text}``,
                  then ``ChameleonAdapter.image_header(H, W)``
    llamagen      one condition token per prompt: ``config.condition_token_ids[text]``  config

``texts`` [batch] -> ``input_ids`` / ``attention_mask`` [batch, prompt length], left padded (every row ends with
its image header). A builder only uses what the checkpoint ships; :func:`load_text_processor` says what is missing
before any weights load. The unconditional (CFG) prompt is the adapter's (``unconditional_prompt``).
"""

from __future__ import annotations

import torch

#: Lumina-mGPT's generation instruction (its inference recipe); {w} x {h} in pixels
LUMINA_TEMPLATE = "Generate an image of {w}x{h} according to the following prompt:\n{text}"
#: what each family's prompt builder needs: a processor (``AutoProcessor``) or a tokenizer (``AutoTokenizer``)
NEEDS = {"emu3": "processor", "janus": "processor", "lumina-mgpt": "tokenizer", "llamagen": None}


class ImagePrompter:
    """Builds one family's image-generation prompts. ``image_size``: side in pixels (None: the family's default)."""

    def __init__(self, adapter, processor=None, image_size: int | None = None) -> None:
        self.adapter, self.processor, self.image_size = adapter, processor, image_size
        self.family = adapter.family

    def __call__(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``texts`` [batch] -> (``input_ids``, ``attention_mask``) [batch, prompt length], left padded."""
        build = {"emu3": self._emu3, "janus": self._janus, "lumina-mgpt": self._lumina,
                 "llamagen": self._llamagen}[self.family]
        return build(list(texts))

    def _encode(self, call, texts: list[str], **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        tokenizer.padding_side = "left"  # generation continues every row at its end
        out = call(text=texts, padding=True, return_tensors="pt", **kwargs)
        return out["input_ids"], out["attention_mask"]

    def _emu3(self, texts):
        kwargs = {} if self.image_size is None else {"image_area": self.image_size ** 2}
        return self._encode(self.processor, texts, return_for_image_generation=True, **kwargs)

    def _janus(self, texts):
        if self.image_size is not None and self.image_size != self.adapter.encoder_image_size():
            raise ValueError(f"--image-size {self.image_size}: Janus generates one size only, "
                             f"{self.adapter.encoder_image_size()} px (its VQ grid)")
        if getattr(self.processor, "chat_template", None):  # the model card's recipe
            texts = [self.processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "text", "text": t}]}], add_generation_prompt=True)
                for t in texts]
        return self._encode(self.processor, texts, generation_mode="image")

    def _lumina(self, texts):
        side = self.image_size or self.adapter.encoder_image_size(getattr(self.processor, "image_processor", None))
        header = self.adapter.image_header(side, side)  # raises for a side that is not a multiple of 32
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        ids, mask = self._encode(tokenizer, [LUMINA_TEMPLATE.format(w=side, h=side, text=t) for t in texts])
        tail = torch.tensor([header] * len(texts), dtype=ids.dtype)
        return torch.cat([ids, tail], 1), torch.cat([mask, torch.ones_like(tail)], 1)

    def _llamagen(self, texts):
        conditions = getattr(self.adapter.model.config, "condition_token_ids", None) or {}
        unknown = [t for t in texts if t not in conditions]
        if unknown:
            raise ValueError(f"unknown prompt(s) {unknown[:5]}; this LlamaGen-style model is conditioned on "
                             f"config.condition_token_ids: {', '.join(conditions) or 'none'}")
        ids = torch.tensor([[conditions[t]] for t in texts], dtype=torch.long)
        return ids, torch.ones_like(ids)


def load_text_processor(location: str, family: str, revision: str | None = None, local_files_only: bool = False):
    """The checkpoint's processor (``AutoProcessor``) or, failing that, its tokenizer (``AutoTokenizer``);
    ``None`` for a family that needs neither. Raises ``ValueError`` naming what the family needs."""
    need = NEEDS[family]
    if need is None:
        return None
    from transformers import AutoProcessor, AutoTokenizer

    options = {"revision": revision, "local_files_only": local_files_only}
    errors = []
    for loader in (AutoProcessor, AutoTokenizer) if need == "tokenizer" else (AutoProcessor,):
        try:
            found = loader.from_pretrained(location, **options)
        except Exception as error:  # no processor/tokenizer files, unknown class, offline Hub
            errors.append(f"{loader.__name__}: {type(error).__name__}: {str(error).splitlines()[0]}")
            continue
        if need == "processor" and not hasattr(found, "tokenizer"):
            errors.append(f"AutoProcessor gave a {type(found).__name__}, not the family's processor")
            continue
        return found
    what = ("its processor (processor_config.json with the tokenizer files: save it with "
            "processor.save_pretrained next to the model)" if need == "processor" else
            "its tokenizer (tokenizer files: save it with tokenizer.save_pretrained next to the model)")
    raise ValueError(f"the {family} prompt is built with {what}; none at {location} ({'; '.join(errors)})")


# -- prompt sets (``hf-sjd bench --prompts``) --------------------------------------------------------------
#: named prompt sets -> (Hub dataset id, split, text column): MS-COCO 2017 val captions (per image a list: the
#: first is used) and PartiPrompts (Yu et al. 2022)
PROMPT_SETS = {"coco2017-val": ("phiyodr/coco2017", "validation", "captions"),
               "parti": ("nateraw/parti-prompts", "train", "Prompt")}
PROMPT_SET_HELP = ("coco2017-val[:N], parti[:N], a .txt file (one prompt a line) or a COCO captions .json "
                   "(captions_val2017.json), each with an optional [:N]")


def load_prompt_set(spec: str) -> list[str] | None:
    """``--prompts`` naming a set -> its prompts; None where ``spec`` is a comma list of prompts instead.

    ``[:N]``: N prompts drawn with seed 0, in the set's order, the same in every run. A COCO captions file gives
    each image's first caption (lowest annotation id), images in id order."""
    import json
    import random
    import re
    from pathlib import Path

    source, count = re.fullmatch(r"(.*?)(?:\[:(\d+)\])?", spec.strip(), re.S).groups()
    is_file = source.lower().endswith((".txt", ".json"))
    if source not in PROMPT_SETS and not is_file:
        if count is not None:
            raise ValueError(f"--prompts {spec!r}: unknown prompt set {source!r}; allowed: {PROMPT_SET_HELP}, or "
                             "comma-separated prompts")
        return None
    if is_file:
        path = Path(source).expanduser()
        if not path.is_file():
            raise ValueError(f"--prompts {spec!r}: no file {str(path)!r}")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--prompts {spec!r}: cannot read {str(path)!r} as UTF-8 text: {error}") from None
        if path.suffix.lower() == ".txt":
            prompts = [line.strip() for line in text.splitlines() if line.strip()]
        else:
            try:
                annotations = json.loads(text)["annotations"]
                first = {}
                for note in sorted(annotations, key=lambda a: a["id"]):
                    first.setdefault(note["image_id"], note["caption"].strip())
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise ValueError(f"--prompts {spec!r}: not a COCO captions file (annotations with id, image_id, "
                                 f"caption): {type(error).__name__}: {error}") from None
            prompts = [first[image] for image in sorted(first)]
    else:
        from datasets import load_dataset

        dataset_id, split, column = PROMPT_SETS[source]
        try:
            rows = load_dataset(dataset_id, split=split)[column]
        except Exception as error:  # offline, missing dataset, renamed column
            raise ValueError(f"--prompts {source}: cannot load the Hub dataset {dataset_id} (split {split}, column "
                             f"{column}): {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}."
                             " Download it, or pass a local file (captions_val2017.json, prompts.txt)") from None
        prompts = [(row[0] if isinstance(row, list) else row).strip() for row in rows]
    if not prompts:
        raise ValueError(f"--prompts {spec!r}: the set holds no prompt")
    if count is not None:
        if not 1 <= int(count) <= len(prompts):
            raise ValueError(f"--prompts {spec!r}: [:N] must be in [1, {len(prompts)}] (the set's prompts)")
        prompts = [prompts[i] for i in sorted(random.Random(0).sample(range(len(prompts)), int(count)))]
    return prompts
