"""A ragged view of transformers' ``DynamicCache`` for per-row Jacobi commits.

Each row commits a different number of tokens per iteration, but the cache tensors are rectangular
``[batch, heads, slots, head_dim]``. Invariant kept here: slots ``[0, P)`` hold the prompt as given
(``prompt_mask`` says which of them are real tokens: left, right or inner padding alike), row ``r`` holds
its committed tokens in slots ``[P, valid_r)`` and garbage in ``[valid_r, slots)``, where
``slots = max_r valid_r``. Padding and garbage are masked out through the 2D attention mask, and positions
come from per-row counters, so a row never waits for or re-feeds anything.

Positions follow transformers' ``generate`` exactly, whatever the padding side: prompt slot ``s`` has
``cumsum(prompt_mask) - 1`` (0 on padding), and the ``k``-th token after the prompt has the last prompt
slot's position ``+ 1 + k``. (With right padding that last slot is a pad at position 0: transformers warns
and so behaves differently from the left-padded prompt; we reproduce it rather than guess a fix.)

After a forward appended ``W`` slots at ``[T, T + W)``, row ``r`` keeps the first ``kept_r`` of them:
:meth:`commit` moves them to ``[valid_r, valid_r + kept_r)`` with one batched gather over the changed
slots only, then crops the tail. With equal rows (batch 1) the gather is skipped and this is exactly
``DynamicCache.crop(-n)``. Published SJD code instead keeps the batch *minimum*, wasting every other
row's accepted tokens.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def check_croppable(cache: object) -> None:
    """Raise unless ``cache`` is a full-attention ``DynamicCache`` (the only kind that can be rolled back)."""
    if not isinstance(cache, DynamicCache) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        layers = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])})
        raise ValueError(
            f"Jacobi decoding rolls the KV cache back, which needs a transformers DynamicCache with full-attention "
            f"layers; got {type(cache).__name__} with layers {layers}. Use the default cache (do not set "
            f"cache_implementation) and a model whose cache can be cropped.")


def prompt_positions(prompt_mask: torch.Tensor) -> torch.Tensor:
    """``[rows, P]`` positions of the prompt slots, as transformers' ``generate`` assigns them."""
    return (prompt_mask.long().cumsum(-1) - 1).masked_fill(prompt_mask == 0, 0)


class RaggedCache:
    def __init__(self, cache: DynamicCache, prompt_mask: torch.Tensor) -> None:
        self.cache = cache
        self.prompt_mask = prompt_mask.long()  # [rows, P] 1 = real prompt token, 0 = padding (any side)
        self.prompt_positions = prompt_positions(self.prompt_mask)  # [rows, P]
        self.valid = torch.zeros(prompt_mask.shape[0], dtype=torch.long, device=prompt_mask.device)  # [rows]

    @property
    def num_slots(self) -> int:
        return self.cache.get_seq_length()

    @property
    def prompt_length(self) -> int:
        return self.prompt_mask.shape[1]

    def attention_mask(self, num_new: int) -> torch.Tensor:
        """``[rows, slots + num_new]`` mask for a forward that appends ``num_new`` slots."""
        num_slots = self.num_slots
        width = num_slots + num_new
        slot = torch.arange(width, device=self.valid.device)[None]
        usable = (slot < self.valid[:, None]) | (slot >= num_slots)  # valid prefix, or appended now
        # Appended slot num_slots + k continues row r's valid prefix: its logical slot is valid_r + k.
        logical = torch.where(slot < num_slots, slot, self.valid[:, None] + slot - num_slots)
        real = torch.nn.functional.pad(self.prompt_mask, (0, width - self.prompt_length), value=1)
        return (usable & real.gather(1, logical).bool()).long()

    def position_ids(self, num_new: int) -> torch.Tensor:
        """``[rows, num_new]`` positions of the appended tokens (logical slots ``valid_r + k``)."""
        logical = self.valid[:, None] + torch.arange(num_new, device=self.valid.device)[None]  # [rows, num_new]
        prompt_length = self.prompt_length
        in_prompt = self.prompt_positions.gather(1, logical.clamp(max=prompt_length - 1))
        after_prompt = self.prompt_positions[:, -1:] + 1 + logical - prompt_length
        return torch.where(logical < prompt_length, in_prompt, after_prompt)

    def commit(self, kept: torch.Tensor, num_new: int) -> None:
        """Keep the first ``kept`` [rows] of the ``num_new`` slots the last forward appended; drop the rest."""
        total = self.num_slots
        start = total - num_new  # where the forward appended its slots
        new_valid = self.valid + kept
        if not bool((self.valid == start).all()):
            self._compact(start, new_valid)
        self.valid = new_valid
        remove = total - int(new_valid.max())
        if remove > 0:
            self.cache.crop(-remove)

    def _compact(self, start: int, new_valid: torch.Tensor) -> None:
        """Move each row's kept new slots from ``[start, ...)`` down to ``[valid_r, ...)``."""
        low, high = int(self.valid.min()), int(new_valid.max())
        if high <= low:
            return
        dest = torch.arange(low, high, device=self.valid.device)[None]  # [1, S]
        valid = self.valid[:, None]
        source = torch.where(dest < valid, dest, start + dest - valid).clamp(max=self.num_slots - 1)  # [rows, S]
        for layer in self.cache.layers:
            index = source[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys[:, :, low:high] = layer.keys.gather(2, index)
            layer.values[:, :, low:high] = layer.values.gather(2, index)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (finished rows leave the batch, so they cost no more compute)."""
        self.cache.batch_select_indices(rows)
        self.prompt_mask, self.prompt_positions = self.prompt_mask[rows], self.prompt_positions[rows]
        self.valid = self.valid[rows]
        drop = self.num_slots - int(self.valid.max()) if rows.numel() else 0
        if drop > 0:
            self.cache.crop(-drop)
