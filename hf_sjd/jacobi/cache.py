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
        self._derive()

    def _derive(self) -> None:
        """Per-row constants of the prompt, kept so that later forwards build mask and positions in few ops."""
        self.prompt_real = self.prompt_mask.bool()  # [rows, P]
        self.position_offset = self.prompt_positions[:, -1] + 1 - self.prompt_length  # [rows] slot -> position

    @property
    def num_slots(self) -> int:
        return self.cache.get_seq_length()

    @property
    def prompt_length(self) -> int:
        return self.prompt_mask.shape[1]

    def attention_mask(self, num_new: int) -> torch.Tensor:
        """``[rows, slots + num_new]`` mask for a forward that appends ``num_new`` slots."""
        num_slots = self.num_slots
        if num_slots == 0:  # the prefill: the prompt as given, then the drafts
            return torch.nn.functional.pad(self.prompt_mask, (0, num_new), value=1)
        # Later forwards append after every row's prompt (the prefill committed it whole): cached slots are usable
        # below valid_r unless they are prompt padding, and every appended slot is.
        usable = torch.arange(num_slots, device=self.valid.device) < self.valid[:, None]  # [rows, slots]
        usable[:, : self.prompt_length] &= self.prompt_real
        return torch.nn.functional.pad(usable.long(), (0, num_new), value=1)

    def position_ids(self, num_new: int) -> torch.Tensor:
        """``[rows, num_new]`` positions of the appended tokens (logical slots ``valid_r + k``)."""
        offsets = torch.arange(num_new, device=self.valid.device)
        if self.num_slots == 0:  # the prefill: the prompt's own positions, then the drafts after its last one
            after = self.prompt_positions[:, -1:] + 1 + offsets[: num_new - self.prompt_length]
            return torch.cat([self.prompt_positions, after], dim=1)
        # slot valid_r + k is the (valid_r + k - P)-th token after the prompt
        return (self.position_offset + self.valid)[:, None] + offsets

    def plan(self, kept: torch.Tensor, num_new: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What :meth:`commit` needs from the device, as device tensors (the loop reads them with its own):
        (every row's valid prefix ends where the forward appended [0-d bool], valid slots after it [rows])."""
        start = self.num_slots - num_new
        return (self.valid == start).all(), self.valid + kept

    def commit(self, kept: torch.Tensor, num_new: int, aligned: bool, max_valid: int) -> None:
        """Keep the first ``kept`` [rows] of the ``num_new`` slots the last forward appended; drop the rest.
        ``aligned`` and ``max_valid`` are :meth:`plan`'s results, read by the host."""
        total = self.num_slots
        if not aligned:
            self._compact(total - num_new, num_new)
        self.valid = self.valid + kept
        if total > max_valid:
            self.cache.crop(-(total - max_valid))

    def _compact(self, start: int, num_new: int) -> None:
        """Move each row's appended slots from ``[start, start + num_new)`` down to ``[valid_r, ...)``.

        Only the appended slots are written: the first ``kept_r`` land where row r's prefix ends, the rest
        in its garbage tail (``valid_r + num_new <= start + num_new``, so nothing valid is overwritten)."""
        dest = (self.valid[:, None] + torch.arange(num_new, device=self.valid.device))[:, None, :, None]
        for layer in self.cache.layers:
            for tensor in (layer.keys, layer.values):
                appended = tensor[:, :, start:].clone()  # [rows, heads, num_new, dim]; dest may overlap it
                tensor.scatter_(2, dest.expand_as(appended), appended)

    def select_rows(self, rows: torch.Tensor, max_valid: int) -> None:
        """Keep only ``rows`` (finished rows leave the batch, so they cost no more compute); ``max_valid`` is
        the kept rows' largest valid count (read by the host with the commit)."""
        self.cache.batch_select_indices(rows)
        self.prompt_mask, self.prompt_positions = self.prompt_mask[rows], self.prompt_positions[rows]
        self.valid = self.valid[rows]
        self._derive()
        if rows.numel() and self.num_slots > max_valid:
            self.cache.crop(-(self.num_slots - max_valid))
