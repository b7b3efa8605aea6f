"""What ``hf-sjd bench --model`` benchmarks: the reference layout, or any checkpoint an adapter supports.

    --model                            subject                      quality columns
    (none) / folder with ar/ + vq/     ``hf_sjd.reference.load``    FD-ref, class accuracy (with classifier/)
    folder or Hub id of a checkpoint   :class:`CheckpointSubject`   speed only
      (emu3, janus, chameleon = Lumina-mGPT, LlamaGen-style llama)

A subject gives :mod:`hf_sjd.sampling` what the reference model gives it (``model``, ``num_image_tokens``,
``draft_token_ids``, ``latent_embeddings``, ``vocab_size``), ``prompt_inputs(texts)`` -> (ids, mask) [batch, P],
and what differs per family: ``forward_module`` (the module the forward timer hooks), ``sample_ar`` (the family's
own sampling loop for ``ar``) and ``decode`` (PIL images, or None).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from ..adapters.base import MissingPhraseLibrary
from ..sampling import verifiers_of

#: families whose ``ar`` rows have no transformers sampling loop for image tokens -> why
NO_AR = {"lumina-mgpt": "transformers' ChameleonForConditionalGeneration.forward sets every image token's logit "
                        "to the minimum, so its own generate cannot sample an image"}


#: verifiers that group drafts by their VQ codebook vectors, and the families whose adapter has none -> why
LATENT_VERIFIERS = ("lantern", "gsd")
NO_LATENTS = {"llamagen": "its adapter has no VQ codebook vectors (latent_embeddings), which they group drafts by"}


def is_reference_layout(model: str | None) -> bool:
    """``--model`` names the shipped weights (None) or a folder laid out like them (``ar/config.json``)."""
    return model is None or (Path(model).expanduser() / "ar" / "config.json").is_file()


def load_reference_model(parser, model: str | None):
    """The reference-layout model at ``--model`` (None: the shipped one); exit 2 naming ``--model`` where it cannot
    load (``hf-sjd generate`` and ``bench``)."""
    from ..reference import load

    try:
        return load(model)
    except Exception as error:  # noqa: BLE001 - safetensors and torch raise their own types for a corrupt file
        parser.error(f"--model: cannot load a reference-layout model from {model!r} ({type(error).__name__}: "
                     f"{error})")


def default_phrase_library(parser, subject, model: str | None, flag: str | None = None):
    """The phrase library the subject's adapter defaults to (None: none); exit 2 naming ``--model`` where its config
    names a library folder that is not there (``hf-sjd generate`` and ``bench``, before any generation), with the
    command's own ``flag`` for a library in its place (the adapter's message names the Python keyword)."""
    try:
        return subject.model.sjd_adapter.default_phrase_library
    except MissingPhraseLibrary as error:
        remedy = f"pass {flag} <folder or Hub repo id>" if flag else "run without a phrase-verification method"
        parser.error(f"--model {model}: {error.instead(remedy)}")


def load_reference(parser, model: str | None, device) -> tuple:
    """``(subject, classifier on device or None where the layout has no classifier/)`` of a reference layout."""
    from ..reference import load_classifier, weights_dir

    subject = load_reference_model(parser, model)
    root = Path(model) if model else weights_dir()
    return subject, load_classifier(model).to(device) if (root / "classifier" / "config.json").exists() else None


class ImageLayoutProcessor(LogitsProcessor):
    """transformers logits processor for the ``ar`` rows: at generated position ``t`` the adapter's layout
    token where it fixes one, else only image tokens (Emu3's ``prefix_allowed_tokens_fn`` of its docs)."""

    def __init__(self, adapter, prompt_length: int) -> None:
        self.adapter, self.prompt_length = adapter, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = torch.full((scores.shape[0], 1), input_ids.shape[1] - self.prompt_length, device=scores.device)
        scores = self.adapter.mask_to_images(scores)  # [rows, vocab]
        forced = self.adapter.structural_tokens(position)  # [rows, 1], -1 = free
        if forced is None:
            return scores
        point = torch.full_like(scores, torch.finfo(scores.dtype).min).scatter_(1, forced.clamp(min=0), 0.0)
        return torch.where(forced >= 0, point, scores)


class ConditionalRows(LogitsProcessor):
    """Scores ``[2 * batch, vocab]`` of Janus's ``[conditional; unconditional]`` rows -> the conditional ones
    (what its ``ClassifierFreeGuidanceLogitsProcessor`` gives at scale 1, which it refuses to build)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores[: scores.shape[0] // 2]


class CheckpointSubject:
    """A supported checkpoint with its prompt builder (:class:`hf_sjd.prompts.ImagePrompter`)."""

    def __init__(self, model, prompter, name: str) -> None:
        self.model, self.prompter, self.name = model, prompter, name
        self.adapter = model.sjd_adapter
        self.family = self.adapter.family
        if not self.default_prompts():
            raise ValueError("this LlamaGen-style checkpoint has no config.condition_token_ids, so its prompts "
                             "are unknown")
        probe_ids, _ = prompter(self.default_prompts()[:1])
        self.layout = self.adapter.prepare_generation(probe_ids, {})  # the grid every prompt asks for
        grid = getattr(self.layout, "grid", None)
        if grid is None:
            raise ValueError(f"the {self.family} checkpoint describes no image grid (config.image_grid)")
        self.num_image_tokens = grid.num_tokens
        self.vocab_size = self.adapter.vocab_size
        self.vq = None

    def default_prompts(self) -> list[str]:
        from ..reference import CLASS_NAMES

        if self.family == "llamagen":
            return list(getattr(self.model.config, "condition_token_ids", None) or {})
        return [f"a photo of a {name}" for name in CLASS_NAMES]

    @property
    def draft_token_ids(self) -> torch.Tensor:
        return self.adapter.draft_token_ids

    @property
    def latent_embeddings(self) -> torch.Tensor:
        return self.adapter.latent_embeddings

    @property
    def forward_module(self):
        """The module each decoding forward calls once (Janus: its language model; Lumina-mGPT: the decoder)."""
        if self.family == "janus":
            return self.model.model.language_model
        if self.family == "lumina-mgpt":
            return self.model.model
        return self.model

    def prompt_inputs(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.prompter(texts)

    def sample_ar(self, prompt_ids: torch.Tensor, attention_mask: torch.Tensor, guidance_scale: float,
                  **common) -> torch.Tensor:
        """The family's own sampling loop: ``[batch, prompt + num_image_tokens]``."""
        if self.family in NO_AR:
            raise ValueError(f"ar on {self.family}: {NO_AR[self.family]}")
        if self.family == "janus":
            # Janus's image loop always runs the unconditional rows; at scale 1 transformers adds no CFG
            # processor to fold them back (and fails), so keep the conditional half: u + 1 (c - u) = c.
            processors = LogitsProcessorList([ConditionalRows()] if guidance_scale == 1 else [])
            codes = self.model.generate(prompt_ids, attention_mask=attention_mask, generation_mode="image",
                                        guidance_scale=guidance_scale, logits_processor=processors, **common)
            return torch.cat([prompt_ids, codes.to(prompt_ids.dtype)], 1)
        extra = {}
        if guidance_scale != 1.0:  # transformers' own (unbatched) CFG, on the adapter's unconditional prompt
            uncond, mask = self.adapter.unconditional_prompt(prompt_ids, attention_mask)
            extra = {"guidance_scale": guidance_scale, "negative_prompt_ids": uncond,
                     "negative_prompt_attention_mask": mask}
        layout = self.adapter.prepare_generation(prompt_ids, {}) if hasattr(self.adapter, "mask_to_images") else None
        processors = LogitsProcessorList([ImageLayoutProcessor(layout, prompt_ids.shape[1])] if layout is not None
                                         else [])
        return self.model.generate(prompt_ids, attention_mask=attention_mask, logits_processor=processors,
                                   **common, **extra)

    def decode(self, tokens: torch.Tensor) -> list | None:
        """Generated tokens -> PIL images, or None where the family ships no decoder (Lumina-mGPT)."""
        try:
            return self.layout.decode_images(tokens)
        except (NotImplementedError, ValueError):
            return None


def check_methods(family: str, methods: set[str]) -> str | None:
    """Why ``methods`` cannot run on ``family`` (None: they can)."""
    if "ar" in methods and family in NO_AR:
        return f"the ar rows cannot run on {family}: {NO_AR[family]}"
    grouping = sorted(m for m in methods if verifiers_of(m, {}) & set(LATENT_VERIFIERS))
    if grouping and family in NO_LATENTS:
        return f"{', '.join(grouping)} cannot run on {family}: {NO_LATENTS[family]}"
    return None


def load_checkpoint(model: str, image_size: int | None, dtype: torch.dtype = torch.float32,
                    processor: str | None = None):
    """``--model`` (folder or Hub id) -> (family, loader): the family from ``config.json`` and the processor (or
    tokenizer; from ``processor`` where the model ships none: Lumina-mGPT) first, then ``loader()`` loads the
    weights into a :class:`CheckpointSubject`. ``ValueError`` naming ``--model`` and what is wrong."""
    from ..phrase_builder import FAMILY_CLASSES, SUPPORTED_FAMILIES, inspect_checkpoint
    from ..prompts import ImagePrompter, load_text_processor

    checkpoint = inspect_checkpoint(model)  # ValueError "--model X: ... Supported families: ..."
    family = {"chameleon": "lumina-mgpt", "llama": "llamagen"}.get(checkpoint.model_type, checkpoint.model_type)
    try:  # before any weights: the prompt builder's processor or tokenizer
        processor = load_text_processor(processor or checkpoint.location, family, None if processor else
                                        checkpoint.revision, checkpoint.local_files_only and not processor)
    except ValueError as error:
        raise ValueError(f"--{'processor' if processor else 'model'} {processor or model}: {error}") from None

    def loader() -> CheckpointSubject:
        import transformers

        import hf_sjd

        model_class = getattr(transformers, FAMILY_CLASSES[checkpoint.model_type])
        try:
            loaded = model_class.from_pretrained(checkpoint.location, revision=checkpoint.revision, dtype=dtype,
                                                 local_files_only=checkpoint.local_files_only).eval()
        except Exception as error:  # missing or mismatched weights, offline Hub
            raise ValueError(f"--model {model}: cannot load {model_class.__name__} from {checkpoint.location} "
                             f"({type(error).__name__}: {error}). Supported families: {SUPPORTED_FAMILIES}") from error
        hf_sjd.enable(loaded)
        try:
            return CheckpointSubject(loaded, ImagePrompter(loaded.sjd_adapter, processor, image_size), model)
        except ValueError as error:  # a size the family cannot generate, a prompt without the image header
            raise ValueError(f"--model {model}: {error}") from None

    return family, loader
