"""Tiny random Emu3 / Janus / Chameleon checkpoints saved with ``save_pretrained``, each with what its prompt
builder needs (Emu3 / Janus: a processor; Chameleon: a tokenizer): what ``hf-sjd bench --model DIR`` loads.

The tokenizers are word-level (``tokenizers.models.WordLevel``) over the tiny models' own vocabularies
(tests/adapters/adapter_models.py) plus a few words; unknown words map to ``<unk>``. Random weights: cost
and shape only.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "adapters"))

from adapter_models import JANUS_BOI, tiny_chameleon, tiny_emu3, tiny_janus  # noqa: E402

WORDS = ("a", "photo", "of", "coffee", "cat", "red", "apple")


def word_tokenizer(vocab: dict[str, int], free_ids, **special):
    """A ``PreTrainedTokenizerFast`` over ``vocab`` + :data:`WORDS` (at ``free_ids``), left padding."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {**vocab, **dict(zip(("<unk>", *WORDS), free_ids))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
    extra = special.pop("extra_special_tokens", {})
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", extra_special_tokens=extra,
                                        **special)
    tokenizer.add_special_tokens({"additional_special_tokens": [k for k in vocab if k.startswith("<")]})
    return tokenizer


def save_emu3(root: Path) -> Path:
    from transformers import Emu3ImageProcessor, Emu3Processor

    model = tiny_emu3()
    tokenizer = word_tokenizer(model.config.vocabulary_map, range(3, 11), bos_token="<|extra_203|>",
                               eos_token="<|extra_204|>", pad_token="<|endoftext|>", extra_special_tokens={
                                   "image_token": "<image>", "boi_token": "<|image start|>",
                                   "eoi_token": "<|image end|>", "image_wrapper_token": "<|image token|>",
                                   "eof_token": "<|extra_201|>"})
    folder = root / "emu3"
    model.save_pretrained(folder)
    Emu3Processor(Emu3ImageProcessor(), tokenizer).save_pretrained(folder)
    return folder


JANUS_TEMPLATE = ("{% for message in messages %}User: {% for part in message['content'] %}{{ part['text'] }}"
                  "{% endfor %}{% endfor %}")


def save_janus(root: Path) -> Path:
    from transformers import JanusImageProcessor, JanusProcessor

    model = tiny_janus()
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<end_of_image>": 4, "<begin_of_image>": JANUS_BOI,
             "<image_placeholder>": 60, "User": 14, ":": 15}
    tokenizer = word_tokenizer(vocab, range(20, 28), bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                               extra_special_tokens={"image_token": "<image_placeholder>",
                                                     "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"})
    folder = root / "janus"
    model.save_pretrained(folder)
    JanusProcessor(JanusImageProcessor(size={"height": 32, "width": 32}), tokenizer, chat_template=JANUS_TEMPLATE,
                   num_image_tokens=16).save_pretrained(folder)
    return folder


def save_chameleon(root: Path, tokenizer: bool = True) -> Path:
    model = tiny_chameleon()
    folder = root / "chameleon"
    model.save_pretrained(folder)
    if tokenizer:
        word_tokenizer(model.config.vocabulary_map, range(40, 48), bos_token="<s>", eos_token="</s>",
                       pad_token="<pad>").save_pretrained(folder)
    return folder
