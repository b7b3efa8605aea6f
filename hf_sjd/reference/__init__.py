"""The shipped reference text-to-image AR model: a LlamaGen-style ``LlamaForCausalLM`` over VQ codes.

Vocabulary layout (``vocab_size = 530``)::

    0 .. 511     image tokens: token id == VQ code index (16x16 grid, raster order)
    512 .. 527   condition tokens, one per class in ``data.CLASSES`` (id = 512 + class index)
    528          null condition: the unconditional prompt for classifier-free guidance
    529          padding (left padding of batched prompts; never generated)

A sequence is ``[condition, 256 image tokens]``, no BOS/EOS. Trained with 10% condition dropout to the null
token, so ``guidance_scale > 1`` works.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from .data import CLASS_NAMES, CLASSES, IMAGE_SIZE
from .vq import image_codes

NUM_CODES = 512
CONDITION_OFFSET = NUM_CODES
NULL_CONDITION_ID = CONDITION_OFFSET + len(CLASSES)
PAD_TOKEN_ID = NULL_CONDITION_ID + 1
VOCAB_SIZE = PAD_TOKEN_ID + 1
GRID_SIZE = IMAGE_SIZE // 4
NUM_IMAGE_TOKENS = GRID_SIZE * GRID_SIZE
CONDITIONS = {c.name: CONDITION_OFFSET + i for i, c in enumerate(CLASSES)}  # prompt -> condition token id


def weights_dir() -> Path:
    """Folder of the shipped weights inside the installed package."""
    return Path(str(resources.files("hf_sjd.reference") / "weights"))


def ar_config():
    """The reference model's ``LlamaConfig`` (about 2M parameters)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=512, rope_theta=10000.0,
        pad_token_id=PAD_TOKEN_ID, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,
        # Read by hf_sjd's LlamaGen-style adapter, so the saved checkpoint describes its own layout.
        image_token_range=[0, NUM_CODES], image_grid=[GRID_SIZE, GRID_SIZE],
        null_condition_token_id=NULL_CONDITION_ID,
        condition_token_ids=CONDITIONS,
    )


@dataclass
class ReferenceModel:
    """Everything needed to sample images from the reference model."""

    model: "torch.nn.Module"  # LlamaForCausalLM
    vq: "torch.nn.Module"  # VQTokenizer
    conditions: dict[str, int]  # prompt -> condition token id
    draft_token_ids: torch.Tensor  # [512] the image-code token ids (what SJD drafts)
    null_condition_id: int = NULL_CONDITION_ID
    grid_size: tuple[int, int] = (GRID_SIZE, GRID_SIZE)
    num_image_tokens: int = NUM_IMAGE_TOKENS

    @property
    def latent_embeddings(self) -> torch.Tensor:
        """``[512, 32]`` VQ codebook vectors, row i = image token ``draft_token_ids[i]``: pass them on,
        ``generate(..., custom_generate="lantern", latent_embeddings=ref.latent_embeddings)``."""
        return self.vq.codebook.detach()

    def prompt_ids(self, prompts: list[str]) -> torch.Tensor:
        """Prompts -> ``[batch, 1]`` condition ids. Unknown prompts raise, listing the known ones."""
        unknown = [p for p in prompts if p not in self.conditions]
        if unknown:
            raise ValueError(f"unknown prompt(s) {unknown}; known prompts: {sorted(self.conditions)}")
        return torch.tensor([[self.conditions[p]] for p in prompts], dtype=torch.long)

    def unconditional_ids(self, batch_size: int) -> torch.Tensor:
        return torch.full((batch_size, 1), self.null_condition_id, dtype=torch.long)

    def decode(self, sequences: torch.Tensor) -> list:
        """Generated sequences ``[batch, prompt + 256]`` (or bare ``[batch, 256]`` codes) -> PIL images (checked by
        :func:`~hf_sjd.reference.vq.image_codes`)."""
        return self.vq.decode(image_codes(sequences, self.num_image_tokens, self.draft_token_ids))


def load(path: str | Path | None = None, dtype: torch.dtype = torch.float32) -> ReferenceModel:
    """Load the shipped reference model (or one written by ``scripts/train_reference_model.py`` at ``path``), its
    fp16 weights upcast to ``dtype`` (fp32 is fastest on CPU)."""
    from transformers import LlamaForCausalLM

    from .vq import VQTokenizer

    root = Path(path) if path is not None else weights_dir()
    for part in ("ar", "vq"):
        if not (root / part / "config.json").exists():
            raise FileNotFoundError(f"no reference model at {root} (expected {root / part / 'config.json'}): give a "
                                    "folder laid out like the shipped weights (hf_sjd.reference.weights_dir()), or "
                                    "none for the shipped model")
    model = LlamaForCausalLM.from_pretrained(root / "ar", dtype=dtype).eval()
    vq = VQTokenizer.from_pretrained(root / "vq").to(dtype).eval()
    return ReferenceModel(model=model, vq=vq, conditions=dict(CONDITIONS), draft_token_ids=torch.arange(NUM_CODES))


def load_classifier(path: str | Path | None = None):
    """The shipped reference-class image classifier (quality proxy)."""
    from .classifier import ReferenceClassifier

    root = Path(path) if path is not None else weights_dir()
    return ReferenceClassifier.from_pretrained(root / "classifier").eval()


__all__ = ["CLASS_NAMES", "CLASSES", "NULL_CONDITION_ID", "NUM_CODES", "PAD_TOKEN_ID", "ReferenceModel",
           "VOCAB_SIZE", "ar_config", "load", "load_classifier", "weights_dir"]
