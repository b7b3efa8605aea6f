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
:meth:`commit` moves them to ``[valid_r, valid_r + kept_r)`` with one batched scatter over the changed
slots only, then crops the tail. With equal rows (batch 1) the gather is skipped and this is exactly
``DynamicCache.crop(-n)``. Published SJD code instead keeps the batch *minimum*, wasting every other
row's accepted tokens.

Layouts (``hf_sjd.adapters.support.layout`` decides, from a probe of the model, before the first forward):
``"ragged"`` is the invariant above, for models that read positions from ``position_ids`` and attend through
the mask (masked gaps change nothing). ``"aligned"`` is for models that measure distances in slots (sliding or
chunked windows, GPT-Neo's local layers, ALiBi over slot distances): every row's logical slots are kept
contiguous and end at the last cached slot, so a row that committed fewer tokens has more masked slots on its
left (left padding, which such models ignore) instead of a gap before its window. Row ``r``'s logical slot ``l``
then sits at physical slot ``l + slots - valid_r``; a commit or a row leaving moves every row by its own shift
(one gather per layer tensor over the cached slots, so this layout costs a pass over the cache per iteration).

Every op here is a kernel launch per iteration on a GPU, so per-row constants of the prompt are kept
(built once, row-selected when rows leave) and each per-iteration quantity is one or two ops::

    quantity                      ops   how
    attention_mask(W)             2     ones [rows, slots + W], then slot_code < valid written into its cached part
    position_ids(W)               1     position_base[:, :W] + valid
    plan(kept)                    1     valid + kept (kept broadcast over copies of the batch: CFG)
    commit: move appended slots   2 + n one stack of every layer tensor's appended slots (n tensors: the source
                                        copy, as destination and source may overlap), one scatter_ per tensor
    tree_attention_mask(W, m)     ~8    ``jacobi_siblings``: the 2D mask as 4D, causal, the m appended siblings of
                                        the first draft seeing only the cached slots, the uncached token and
                                        themselves
    promote(source)               2n+1  before commit: an accepted sibling's entry copied over the first draft's
                                        appended slot, so the kept prefix is [uncached, sibling] as the invariant
                                        says

    slot_code [rows, capacity]    -1 on a real prompt slot, int64 max on prompt padding, s on slot s >= P:
                                  slot s is usable by row r iff slot_code[r, s] < valid_r
    position_base [rows, n]       position of logical slot valid_r + k is position_base[r, k] + valid_r
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DummyLayer, DynamicIndexedLayer, DynamicLayer, DynamicSlidingWindowLayer

from ..checks import UnsupportedModelError

UNUSABLE = torch.iinfo(torch.long).max  # slot code of prompt padding: never below a valid count
#: cache layers whose entries are one per token in a tensor this module can move and cut (sliding-window layers
#: are replaced by full ones before anything is stored: hf_sjd.adapters.support.full_attention_layers)
CROPPABLE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, DynamicIndexedLayer, DummyLayer)


def check_croppable(cache: object, model=None) -> None:
    """Raise unless ``cache`` is a ``DynamicCache`` whose layers keep one entry per token (the only kind that can
    be cut per row): a :class:`~hf_sjd.adapters.UnsupportedModelError` naming ``model`` if given."""
    layers = getattr(cache, "layers", None) or []
    if isinstance(cache, DynamicCache) and all(type(layer) in CROPPABLE_LAYERS for layer in layers):
        return
    kinds = sorted({type(layer).__name__ for layer in layers})
    why = (f"Jacobi decoding cuts the KV cache per token and per row, which needs a transformers DynamicCache of "
           f"per-token attention layers; this generate() call decodes with {type(cache).__name__}"
           + (f" (layers {', '.join(kinds)})" if kinds else "") + ": pass no cache= and leave cache_implementation "
           "unset, so that generate() builds a DynamicCache")
    if model is None:
        raise ValueError(why)
    raise UnsupportedModelError(model, "cache that cannot be cut per token", why)


def prompt_positions(prompt_mask: torch.Tensor) -> torch.Tensor:
    """``[rows, P]`` positions of the prompt slots, as transformers' ``generate`` assigns them."""
    return (prompt_mask.long().cumsum(-1) - 1).masked_fill(prompt_mask == 0, 0)


def tree_visibility(slots: torch.Tensor, num_cached: int, num_siblings: int) -> torch.Tensor:
    """``[W, K]`` bool (True: query ``w`` may attend to key ``k``) of a tree forward over ``num_cached`` cached
    slots: ``slots`` = ``0 .. K - 1`` (K = cached + W appended), the appended ``[uncached, drafts, siblings]``
    (:meth:`RaggedCache.tree_attention_mask`, which adds each row's padding). The window is causal; a sibling sees
    the cached slots, the uncached token and itself, as the first draft does."""
    key, query = slots[None], slots[num_cached:, None]  # [1, K], [W, 1]: each appended token's own slot
    sibling = query >= slots.shape[0] - num_siblings
    return (key <= query) & (~sibling | (key <= num_cached) | (key == query))


def tree_positions(window_positions: torch.Tensor, num_siblings: int) -> torch.Tensor:
    """``[rows, W]`` positions of a tree forward's ``[uncached, drafts, siblings]`` from those of ``[uncached,
    drafts]`` (``[rows, L + 1]``): the siblings sit at the first draft's position."""
    return torch.cat([window_positions, window_positions[:, 1:2].expand(-1, num_siblings)], dim=1)


class RaggedCache:
    def __init__(self, cache: DynamicCache, prompt_mask: torch.Tensor) -> None:
        # the model's layout, as the adapter's prepare_cache decided it (hf_sjd.adapters.support.layout), or its
        # refusal, kept for now (before the first decoding forward) so that the request's own checks came first
        layout = cache.__dict__.pop("sjd_layout", "ragged")
        if isinstance(layout, Exception):
            raise layout
        self.aligned = layout == "aligned"
        self.cache = cache
        self.prompt_mask = prompt_mask.long()  # [rows, P] 1 = real prompt token, 0 = padding (any side)
        self.prompt_positions = prompt_positions(self.prompt_mask)  # [rows, P]
        self.valid = torch.zeros(prompt_mask.shape[0], dtype=torch.long, device=prompt_mask.device)  # [rows]
        self._offsets = torch.arange(0, device=prompt_mask.device)
        # per-row constants of the prompt (module docstring): built here, grown on demand, row-selected with rows
        self._slot_code = self._slot_codes(self.prompt_length + 512)  # [rows, capacity]
        self._position_base = self._position_bases(32)  # [rows, n]

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
        # Later forwards append after every row's prompt (the prefill committed it whole): cached slots are usable
        # below valid_r unless they are prompt padding, and every appended slot is.
        mask = self.prompt_mask.new_ones(self.prompt_mask.shape[0], num_slots + num_new)
        if self.aligned:  # physical slot s holds row r's logical slot s - (slots - valid_r), if that is >= 0
            logical = self._arange(num_slots)[None] - (num_slots - self.valid)[:, None]  # [rows, slots]
            code = self.slot_code(num_slots).gather(1, logical.clamp_min(0))
            torch.logical_and(logical >= 0, code < self.valid[:, None], out=mask[:, :num_slots])
            return mask
        torch.lt(self.slot_code(num_slots), self.valid[:, None], out=mask[:, :num_slots])
        return mask

    def tree_attention_mask(self, num_new: int, num_siblings: int) -> torch.Tensor:
        """``[rows, 1, num_new, slots + num_new]`` bool (True: attend) for a forward after the prefill whose appended
        tokens are ``[uncached, drafts, siblings]`` (``jacobi_siblings``): :meth:`attention_mask` with
        :func:`tree_visibility`."""
        sees = tree_visibility(self._arange(self.num_slots + num_new), self.num_slots, num_siblings)
        return self.attention_mask(num_new).bool()[:, None, None, :] & sees[None, None]

    def tree_position_ids(self, num_new: int, num_siblings: int) -> torch.Tensor:
        """``[rows, num_new]`` positions of ``[uncached, drafts, siblings]`` (:meth:`tree_attention_mask`)."""
        return tree_positions(self.position_ids(num_new - num_siblings), num_siblings)

    def position_ids(self, num_new: int) -> torch.Tensor:
        """``[rows, num_new]`` positions of the appended tokens (logical slots ``valid_r + k``)."""
        if self.num_slots == 0:  # the prefill: the prompt's own positions, then the drafts after its last one
            after = self.prompt_positions[:, -1:] + 1 + self._arange(num_new - self.prompt_length)
            return torch.cat([self.prompt_positions, after], dim=1)
        if self._position_base.shape[1] < num_new:
            self._position_base = self._position_bases(2 * num_new)
        return self._position_base[:, :num_new] + self.valid[:, None]

    def plan(self, kept: torch.Tensor) -> torch.Tensor:
        """``[rows]`` valid slots once every row keeps ``kept`` of the slots the last forward appended (device;
        the host reads its bounds with the loop's one read, then calls :meth:`commit`). ``kept`` is ``[rows]``,
        or ``[rows / k]`` when the cache rows are ``k`` copies of one batch that commit alike (guidance:
        conditional rows, then unconditional rows): it then applies to every copy."""
        return (self.valid.view(-1, kept.shape[0]) + kept).view(-1)

    def commit(self, valid: torch.Tensor, num_new: int, lowest_valid: int, max_valid: int) -> None:
        """Keep, of the ``num_new`` slots the last forward appended, what makes every row's valid count ``valid``
        (:meth:`plan`); drop the rest. ``lowest_valid`` (the fewest valid slots of any row, before) and
        ``max_valid`` (the most, after) are read by the host: with ``lowest_valid`` at the appended slots
        every row's prefix already ends there and nothing moves."""
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
        """Copy each row's appended slot ``source`` [rows] over appended slot 1 (an accepted sibling's entry over the
        first draft's), where :meth:`commit` keeps it; a row whose ``source`` is 1 is unchanged. One gather per layer
        tensor, one stack per shape, one copy per tensor (siblings lie past the window: no overlap)."""
        start = self.num_slots - num_new
        index = (start + source)[:, None, None, None]  # [rows, 1, 1, 1]
        for tensors in self._layer_tensors().values():
            rows, heads, _, dim = tensors[0].shape
            picked = torch.stack([tensor.gather(2, index.expand(rows, heads, 1, dim)) for tensor in tensors])
            for tensor, entries in zip(tensors, picked):
                tensor[:, :, start + 1:start + 2].copy_(entries)

    def _layer_tensors(self) -> dict[tuple, list[torch.Tensor]]:
        """Every tensor of the cache that holds one entry per slot, as a ``[rows, heads, slots, dim]`` view (writes
        to it write the cache), grouped by (shape, dtype, device) so a group stacks: each layer's keys and values,
        and a sparse-attention layer's indexer keys ``[rows, slots, dim]`` and positions ``[dims, rows, slots]``.
        A layer that reads another layer's cache (``DummyLayer``) holds none."""
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
        """Move each row's appended slots from ``[start, start + num_new)`` down to ``[valid_r, ...)``.

        Only the appended slots are written: the first ``kept_r`` land where row r's prefix ends, the rest
        in its garbage tail (``valid_r + num_new <= start + num_new``, so nothing valid is overwritten). The
        destination may overlap the source, so the appended slots are copied first: one stack for all layer
        tensors of a shape, then one in-place scatter per tensor."""
        dest = (self.valid[:, None] + self._arange(num_new))[:, None, :, None]  # [rows, 1, num_new, 1]
        for tensors in self._layer_tensors().values():
            appended = torch.stack([tensor[:, :, start:] for tensor in tensors])  # [n, rows, heads, num_new, dim]
            for tensor, moved in zip(tensors, appended):
                tensor.scatter_(2, dest.expand_as(moved), moved)

    def _move(self, source: torch.Tensor) -> None:
        """Aligned layout: cached slot ``p`` of row ``r`` becomes what slot ``source[r, p]`` holds (clamped into the
        cache: a source outside it lands on a slot the mask hides), for ``p < source.shape[1]``; the caller crops
        the slots after those. Per layer tensor, one gather into a copy and one copy back (one tensor at a time: the
        copy is the only extra memory)."""
        index = source.clamp(0, self.num_slots - 1)[:, None, :, None]  # [rows, 1, n, 1]
        for tensors in self._layer_tensors().values():
            rows, heads, _, dim = tensors[0].shape
            expanded = index.expand(rows, heads, index.shape[2], dim)
            for tensor in tensors:
                tensor[:, :, : index.shape[2]].copy_(tensor.gather(2, expanded))

    def select_rows(self, rows: torch.Tensor, max_valid: int) -> None:
        """Keep only ``rows`` (finished rows leave the batch, so they cost no more compute); ``max_valid`` is
        the kept rows' largest valid count (read by the host with the commit)."""
        self.cache.batch_select_indices(rows)
        self.prompt_mask, self.prompt_positions = self.prompt_mask[rows], self.prompt_positions[rows]
        self.valid = self.valid[rows]
        self._slot_code, self._position_base = self._slot_code[rows], self._position_base[rows]
        excess = self.num_slots - max_valid
        if rows.numel() and excess > 0:
            if self.aligned:  # the rows left end at the last slot: their first `excess` slots are all masked
                self._move(self._arange(max_valid)[None].expand(rows.numel(), -1) + excess)
            self.cache.crop(-excess)
