"""A ragged view of transformers' ``DynamicCache`` for per-row Jacobi commits.

Invariant (layout ``"ragged"``): slots ``[0, P)`` hold the prompt as given (``prompt_mask``: any padding side), row
``r`` its committed tokens in ``[P, valid_r)`` and masked garbage up to ``slots = max_r valid_r``; positions follow
transformers' ``generate`` (prompt: ``cumsum(position_mask) - 1``, the prompt mask unless an unconditional prompt's
positions count its padding; new token k: last prompt position ``+ 1 + k``), up to
the last one transformers feeds: a slot past a row's end (a window sized for the batch's longest row) repeats it,
so no forward holds a position the model lacks (a learned table's end, a dynamic rotary embedding's switch).
:meth:`commit` moves each row's kept appended slots to ``valid_r`` in one scatter, then crops the tail.

Layout ``"aligned"`` (``hf_sjd.adapters.support.layout``: models that measure distances in slots, e.g. sliding
windows): each row's logical slot ``l`` sits at physical ``l + slots - valid_r``, masked slots on its left.

Per-iteration cost, one kernel launch per op::

    attention_mask(W)             2     ones [rows, slots + W], then slot_code < valid written into its cached part
    position_ids(W)               2     position_base[:, :W] + valid, capped at last_position
    plan(kept)                    1     valid + kept (kept broadcast over copies of the batch: CFG)
    commit: move appended slots   2 + n one stack of the n layer tensors' appended slots, one index_put_ per tensor
    tree_attention_mask(W, m)     5     ``jacobi_siblings``: attention_mask repeated over the W queries, its appended
                                        part and-ed with :func:`tree_visibility` among them (built once per W, m)
    promote(source)               2n+1  an accepted sibling's entry copied over the first draft's slot (only in
                                        iterations where some row accepted one)

    slot_code [rows, capacity]    -1 on a real prompt slot, int64 max on prompt padding, s on slot s >= P:
                                  slot s is usable by row r iff slot_code[r, s] < valid_r
    position_base [rows, n]       position of logical slot valid_r + k is position_base[r, k] + valid_r
    last_position [rows]          the last position transformers feeds: the prompt's last + max_new_tokens - 1
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DummyLayer, DynamicIndexedLayer, DynamicLayer, DynamicSlidingWindowLayer

from ..checks import UnsupportedModelError
from .constants import cached

UNUSABLE = torch.iinfo(torch.long).max  # slot code of prompt padding: never below a valid count
#: layers with one entry per token, which this module can move and cut (sliding-window layers are made full before
#: anything is stored: hf_sjd.adapters.support.full_attention_layers)
CROPPABLE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, DynamicIndexedLayer, DummyLayer)


def check_croppable(cache: object, model) -> None:
    """``UnsupportedModelError`` unless ``cache`` is a ``DynamicCache`` of per-token layers."""
    layers = getattr(cache, "layers", None) or []
    if isinstance(cache, DynamicCache) and all(type(layer) in CROPPABLE_LAYERS for layer in layers):
        return
    kinds = sorted({type(layer).__name__ for layer in layers})
    why = (f"Jacobi decoding cuts the KV cache per token and per row, which needs a transformers DynamicCache of "
           f"per-token attention layers; this generate() call decodes with {type(cache).__name__}"
           + (f" (layers {', '.join(kinds)})" if kinds else "") + ": pass no cache= and leave cache_implementation "
           "unset, so that generate() builds a DynamicCache")
    raise UnsupportedModelError(model, "cache that cannot be cut per token", why)


def prompt_positions(prompt_mask: torch.Tensor) -> torch.Tensor:
    """``[rows, P]`` positions of the prompt slots, as transformers' ``generate`` assigns them."""
    return (prompt_mask.long().cumsum(-1) - 1).masked_fill(prompt_mask == 0, 0)


def tree_visibility(slots: torch.Tensor, num_cached: int, num_siblings: int) -> torch.Tensor:
    """``[W, K]`` bool (query ``w`` may attend to key ``k``) of a forward appending ``[uncached, drafts, siblings]``
    to ``num_cached`` slots: causal, a sibling seeing the cached slots, the uncached token and itself."""
    key, query = slots[None], slots[num_cached:, None]  # [1, K], [W, 1]: each appended token's own slot
    sibling = query >= slots.shape[0] - num_siblings
    return (key <= query) & (~sibling | (key <= num_cached) | (key == query))


def tree_positions(window_positions: torch.Tensor, num_siblings: int) -> torch.Tensor:
    """``[rows, W]`` positions of ``[uncached, drafts, siblings]`` from those of ``[uncached, drafts]``."""
    return torch.cat([window_positions, window_positions[:, 1:2].expand(-1, num_siblings)], dim=1)


class RaggedCache:
    def __init__(self, cache: DynamicCache, prompt_mask: torch.Tensor, max_new_tokens: int | None = None,
                 position_mask: torch.Tensor | None = None) -> None:
        # the layout the adapter's prepare_cache picked, or its refusal, raised now: after the request's own checks
        layout = cache.__dict__.pop("sjd_layout", "ragged")
        if isinstance(layout, Exception):
            raise layout
        self.aligned = layout == "aligned"
        self.cache = cache
        self.prompt_mask = prompt_mask.long()  # [rows, P] 1 = real prompt token, 0 = padding (any side)
        self.prompt_positions = prompt_positions(self.prompt_mask if position_mask is None else position_mask)
        # [rows, 1] the last position transformers feeds (None: a cache with no call's end, the layout probe's)
        self.last_position = None if max_new_tokens is None else self.prompt_positions[:, -1:] + max_new_tokens - 1
        self.valid = torch.zeros(prompt_mask.shape[0], dtype=torch.long, device=prompt_mask.device)  # [rows]
        self._offsets = torch.arange(0, device=prompt_mask.device)
        # per-row constants of the prompt (module docstring): built here, grown on demand, row-selected with rows
        self._slot_code = self._slot_codes(self.prompt_length + 512)  # [rows, capacity]
        self._position_base = self._position_bases(32)  # [rows, n]
        self._tree_visibility: dict[tuple[int, int], torch.Tensor] = {}  # (W, m) -> [W, W] among appended slots

    @property
    def num_slots(self) -> int:
        return self.cache.get_seq_length()

    @property
    def prompt_length(self) -> int:
        return self.prompt_mask.shape[1]

    def _arange(self, n: int) -> torch.Tensor:
        """[n] ``0 .. n - 1``, sliced from one device tensor (grown by doubling)."""
        if self._offsets.numel() < n:
            self._offsets = torch.arange(max(2 * n, 64), device=self.valid.device)
        return self._offsets[:n]

    def _slot_codes(self, capacity: int) -> torch.Tensor:
        code = self._arange(capacity).repeat(self.prompt_mask.shape[0], 1)  # [rows, capacity]
        code[:, : self.prompt_length] = torch.where(self.prompt_mask.bool(), -1, UNUSABLE)
        return code

    def _position_bases(self, width: int) -> torch.Tensor:
        # slot valid_r + k is the (valid_r + k - P)-th token after the prompt
        offset = self.prompt_positions[:, -1] + 1 - self.prompt_length  # [rows] slot -> position
        return offset[:, None] + self._arange(width)  # [rows, width]

    def slot_code(self, num_slots: int) -> torch.Tensor:
        """[rows, num_slots]: slot ``s`` is usable by row ``r`` iff ``slot_code[r, s] < valid_r``."""
        if self._slot_code.shape[1] < num_slots:
            self._slot_code = self._slot_codes(2 * num_slots)
        return self._slot_code[:, :num_slots]

    def attention_mask(self, num_new: int) -> torch.Tensor:
        """``[rows, slots + num_new]`` mask for a forward that appends ``num_new`` slots."""
        num_slots = self.num_slots
        if num_slots == 0:  # the prefill: the prompt as given, then the drafts (num_new counts both)
            return torch.nn.functional.pad(self.prompt_mask, (0, num_new - self.prompt_length), value=1)
        # later forwards: cached slots below valid_r are usable unless prompt padding, and every appended slot is
        mask = self.prompt_mask.new_ones(self.prompt_mask.shape[0], num_slots + num_new)
        if self.aligned:  # physical slot s holds row r's logical slot s - (slots - valid_r), if that is >= 0
            logical = self._arange(num_slots)[None] - (num_slots - self.valid)[:, None]  # [rows, slots]
            code = self.slot_code(num_slots).gather(1, logical.clamp_min(0))
            torch.logical_and(logical >= 0, code < self.valid[:, None], out=mask[:, :num_slots])
            return mask
        torch.lt(self.slot_code(num_slots), self.valid[:, None], out=mask[:, :num_slots])
        return mask

    def tree_attention_mask(self, num_new: int, num_siblings: int) -> torch.Tensor:
        """``[rows, 1, num_new, slots + num_new]`` bool: :meth:`attention_mask` with :func:`tree_visibility` (every
        appended token sees the usable cached slots: only the appended block differs between queries)."""
        among_new = cached(self._tree_visibility, (num_new, num_siblings),
                           lambda: tree_visibility(self._arange(num_new), 0, num_siblings))  # [W, W]
        allowed = self.attention_mask(num_new).bool()[:, None, None, :].repeat(1, 1, num_new, 1)
        allowed[..., self.num_slots:] &= among_new
        return allowed

    def tree_position_ids(self, num_new: int, num_siblings: int) -> torch.Tensor:
        """``[rows, num_new]`` positions of ``[uncached, drafts, siblings]`` (:meth:`tree_attention_mask`)."""
        return tree_positions(self.position_ids(num_new - num_siblings), num_siblings)

    def position_ids(self, num_new: int) -> torch.Tensor:
        """``[rows, num_new]`` positions of the appended tokens (logical slots ``valid_r + k``)."""
        if self.num_slots == 0:  # the prefill: the prompt's own positions, then the drafts after its last one
            after = self.prompt_positions[:, -1:] + 1 + self._arange(num_new - self.prompt_length)
            return torch.cat([self.prompt_positions, self._capped(after)], dim=1)
        if self._position_base.shape[1] < num_new:
            self._position_base = self._position_bases(2 * num_new)
        return self._capped(self._position_base[:, :num_new] + self.valid[:, None])

    def _capped(self, positions: torch.Tensor) -> torch.Tensor:
        return positions if self.last_position is None else torch.minimum(positions, self.last_position)

    def plan(self, kept: torch.Tensor) -> torch.Tensor:
        """``[rows]`` valid slots once each row keeps ``kept`` appended slots (``[rows / k]``: per batch copy)."""
        return (self.valid.view(-1, kept.shape[0]) + kept).view(-1)

    def commit(self, valid: torch.Tensor, num_new: int, lowest_valid: int, max_valid: int) -> None:
        """Keep of the ``num_new`` appended slots what makes each row's valid count ``valid`` (:meth:`plan`)."""
        total = self.num_slots
        if self.aligned:
            if self.valid.shape[0] > 1:  # row r moves by its own shift; one row never moves (it stays right-aligned)
                before = total - num_new
                self._move(self._arange(max_valid)[None] + ((before - self.valid) - (max_valid - valid))[:, None])
        elif lowest_valid < total - num_new:
            self._compact(total - num_new, num_new)
        self.valid = valid
        if total > max_valid:
            self.cache.crop(-(total - max_valid))

    def promote(self, source: torch.Tensor, num_new: int) -> None:
        """Copy each row's appended slot ``source`` [rows] over appended slot 1 (an accepted sibling's entry)."""
        start = self.num_slots - num_new
        rows, slots = self._arange(source.shape[0]), start + source
        for tensors in self._layer_tensors().values():
            for tensor in tensors:  # read by (row, slot) pairs into a fresh [rows, heads, dim], then written
                tensor[:, :, start + 1].copy_(tensor.transpose(1, 2)[rows, slots])

    def _layer_tensors(self) -> dict[tuple, list[torch.Tensor]]:
        """Every cache tensor with one entry per slot, as a writable ``[rows, heads, slots, dim]`` view, grouped by
        (shape, dtype, device) so a group stacks: keys, values, and an indexed layer's indexer keys and positions."""
        groups: dict[tuple, list[torch.Tensor]] = {}
        for layer in self.cache.layers:
            tensors = [layer.keys, layer.values]
            if isinstance(layer, DynamicIndexedLayer):
                keys, positions = layer.indexer_keys, layer.indexer_position_ids
                tensors += [keys.unsqueeze(1) if keys is not None and keys.numel() else None,
                            positions.transpose(0, 1).unsqueeze(-1) if positions is not None else None]
            for tensor in tensors:
                if tensor is not None and tensor.numel():
                    groups.setdefault((tensor.shape, tensor.dtype, tensor.device), []).append(tensor)
        return groups

    def _compact(self, start: int, num_new: int) -> None:
        """Move each row's appended slots ``[start, start + num_new)`` to ``[valid_r, ...)``: copied out first (the
        two ranges may overlap), then written by (row, slot) pairs, whole ``[heads, dim]`` entries (a ``scatter_``
        along the slots would look up every element)."""
        rows = self._arange(self.valid.shape[0])[:, None]
        dest = self.valid[:, None] + self._arange(num_new)  # [rows, num_new]
        for tensors in self._layer_tensors().values():
            appended = torch.stack([tensor[:, :, start:] for tensor in tensors])  # [n, rows, heads, num_new, dim]
            for tensor, moved in zip(tensors, appended):
                tensor.transpose(1, 2).index_put_((rows, dest), moved.transpose(1, 2))

    def _move(self, source: torch.Tensor) -> None:
        """Aligned layout: slot ``p`` of row ``r`` takes slot ``source[r, p]`` (clamped: a masked slot)."""
        index = source.clamp(0, self.num_slots - 1)  # [rows, n]
        rows = self._arange(index.shape[0])[:, None]
        for tensors in self._layer_tensors().values():
            for tensor in tensors:  # the pairs' entries read into a fresh tensor, then written
                tensor[:, :, : index.shape[1]].copy_(tensor.transpose(1, 2)[rows, index].transpose(1, 2))

    def select_rows(self, rows: torch.Tensor, max_valid: int) -> None:
        """Keep only ``rows`` (finished rows leave); ``max_valid``: the kept rows' largest valid count."""
        self.cache.batch_select_indices(rows)
        self.prompt_mask, self.prompt_positions = self.prompt_mask[rows], self.prompt_positions[rows]
        self.last_position = None if self.last_position is None else self.last_position[rows]
        self.valid = self.valid[rows]
        self._slot_code, self._position_base = self._slot_code[rows], self._position_base[rows]
        excess = self.num_slots - max_valid
        if rows.numel() and excess > 0:
            if self.aligned:  # the rows left end at the last slot: their first `excess` slots are all masked
                self._move(self._arange(max_valid)[None].expand(rows.numel(), -1) + excess)
            self.cache.crop(-excess)
