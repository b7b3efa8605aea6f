"""LlamaGen-style models: a ``LlamaForCausalLM`` over VQ codes with a condition-token prefix.

The checkpoint's config describes its layout (the shipped reference model does)::

    image_token_range = [first, last)    # drafted ids; image token id - first = VQ code
    image_grid = [height, width]
    null_condition_token_id = ...        # the unconditional prompt for classifier-free guidance
    vq_fingerprint = "..."               # optional: codebook hash of its VQ tokenizer (phrase libraries)
    phrase_library = "../phrases"        # optional: default SJD-PV library (repo id, or folder relative to it)
"""

from __future__ import annotations

from pathlib import Path

import torch

from .base import ADAPTERS, ImageGenerationAdapter


class LlamaGenAdapter(ImageGenerationAdapter):
    family = "llamagen"

    @classmethod
    def matches(cls, model) -> bool:
        return getattr(model.config, "image_token_range", None) is not None

    @property
    def draft_token_ids(self) -> torch.Tensor:
        first, last = self.model.config.image_token_range
        return torch.arange(first, last, device=self.model.device)

    @property
    def grid_width(self) -> int | None:
        grid = getattr(self.model.config, "image_grid", None)
        return int(grid[1]) if grid else None

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """``config.vq_fingerprint`` (the VQ tokenizer's codebook hash) if the checkpoint records it."""
        return getattr(self.model.config, "vq_fingerprint", None)

    @property
    def default_phrase_library(self) -> str | None:
        """``config.phrase_library``: a Hub repo id, or a folder relative to the checkpoint's folder."""
        library = getattr(self.model.config, "phrase_library", None)
        if library is None:
            return None
        local = Path(getattr(self.model.config, "_name_or_path", "") or ".") / library
        return str(local.resolve()) if local.is_dir() else library

    def unconditional_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        null_id = getattr(self.model.config, "null_condition_token_id", None)
        if null_id is None:
            return super().unconditional_prompt(input_ids, attention_mask)
        ones = torch.ones(input_ids.shape[0], 1, dtype=torch.long, device=input_ids.device)
        return ones * null_id, ones


ADAPTERS.append(LlamaGenAdapter)
