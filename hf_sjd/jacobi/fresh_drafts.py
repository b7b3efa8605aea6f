"""Fresh drafts: what a slot newly exposed at the end of the window is drafted from (``draft_init``).

The last slots of a slid window have no target distribution yet; ``"random"`` drafts them uniformly
(:class:`~hf_sjd.jacobi.drafting.Drafter`), the rules here from what past forwards know::

    rule              q of a fresh slot at grid index g = n + k            where g has no row above (g < width)
    last-target       p_last: the row's target at the last window          (no grid needed)
                      position of the previous forward
    row-above-dist    p_above: the model's distribution at g - width       p_last
                      when it was committed (or the q it was drafted
                      from, if still in the window)

    n                 committed image tokens of the row (``num_generated``); window slot k is grid index n + k
    width             tokens per grid row (``grid_width``)
    fresh  [b, L]     slots to draft here (the others keep their redrafted token and q)
    p_last [b, V]     the previous forward's target at its last position (uniform for the first window)
    history [B, H, V] the model's distribution at each committed position, ring-indexed by grid index

Invariant (exactness): each fresh draft is sampled from the ``q`` stored with it, a function of committed tokens,
past forwards and earlier window slots only; slots whose source is in the window are drafted in blocks of
``width``, so a source is final before it is read.
"""

from __future__ import annotations

import torch

from .constants import cached, offsets
from .distributions import Probs, SparseProbs, expand_window, gather_window, sample, where


class LastTarget:
    """``last-target``: every fresh slot drafted from p_last (no state, no grid)."""

    def __init__(self, grid_width: int | None, batch: int, window: int) -> None:
        pass

    def record(self, target: Probs, count: torch.Tensor, num_generated: torch.Tensor, rows: torch.Tensor) -> None:
        """Nothing to remember: p_last is handed to :meth:`fill`."""

    def fill(self, tokens: torch.Tensor, probs: Probs, fresh: torch.Tensor, last: Probs,
             num_generated: torch.Tensor, rows: torch.Tensor | None, noise: torch.Tensor | None
             ) -> tuple[torch.Tensor, Probs]:
        """Draft the ``fresh`` [b, L] slots of ``tokens`` [b, L] / ``probs`` [b, L, V] from ``last`` [b, V]."""
        q = where(fresh, expand_window(last, tokens.shape[1]), probs)
        return torch.where(fresh, _draw(q, tokens, noise), tokens), q


class RowAboveDistribution:
    """``row-above-dist``: the distribution one grid row up, in a ring of ``width + window + 2`` positions per row."""

    def __init__(self, grid_width: int | None, batch: int, window: int) -> None:
        if not grid_width:
            raise ValueError("draft_init='row-above-dist' needs the token-grid width: pass grid_width=...")
        self.width, self.batch, self.ring = grid_width, batch, grid_width + window + 2
        self.history: Probs | None = None  # [B, ring + 1, V]; slot ``ring`` takes the writes to ignore
        self._layouts: dict[tuple, tuple] = {}  # (window size, device) -> :meth:`_layout`

    def _allocate(self, like: Probs) -> Probs:
        slots = (self.batch, self.ring + 1)
        if isinstance(like, SparseProbs):
            ids = torch.full((*slots, like.ids.shape[-1]), like.vocab_size, dtype=torch.long, device=like.device)
            return SparseProbs(ids, like.probs.new_zeros(ids.shape), None, like.table)
        return like.new_zeros(*slots, like.shape[-1])

    def _as_history(self, target: Probs) -> Probs:
        """``target`` in the history's kind."""
        if isinstance(self.history, SparseProbs) and not isinstance(target, SparseProbs):
            return _top_entries(target, self.history)
        if isinstance(target, SparseProbs) and not isinstance(self.history, SparseProbs):
            return target.dense()
        return target

    def record(self, target: Probs, count: torch.Tensor, num_generated: torch.Tensor,
               rows: torch.Tensor | None) -> None:
        """Store the distributions ``target`` [b, L+1, V] the ``count`` [b] committed tokens came from."""
        if self.history is None:
            self.history = self._allocate(target)
        target = self._as_history(target)
        rows = torch.arange(target.shape[0], device=count.device) if rows is None else rows
        slot = offsets(target.shape[1], count.device)
        position = num_generated[:, None] - count[:, None] + slot  # [b, L+1] grid index of each old slot
        uncommitted = slot >= count[:, None]  # written to slot ``ring``, never read
        index = (rows[:, None].expand(-1, len(slot)), (position % self.ring).masked_fill(uncommitted, self.ring))
        if isinstance(target, SparseProbs):
            self.history.ids.index_put_(index, target.ids)
            self.history.probs.index_put_(index, target.probs)
        else:
            self.history.index_put_(index, target)

    def _committed_above(self, probs: Probs, source: torch.Tensor, rows: torch.Tensor | None) -> Probs:
        """[b, L, V] the history's distribution at grid index ``source`` [b, L] (in the kind of ``probs``)."""
        if self.history is None:  # before the first commit every source lies in the window: a placeholder
            return probs
        batch, size = source.shape
        rows = torch.arange(batch, device=source.device) if rows is None else rows
        above = self.history[rows[:, None].expand(-1, size), (source % self.ring).clamp_min(0)]
        if isinstance(above, SparseProbs) and not isinstance(probs, SparseProbs):
            return above.dense()
        if isinstance(probs, SparseProbs) and not isinstance(above, SparseProbs):  # the first commit went dense
            return _top_entries(above, probs)
        return above

    def _layout(self, size: int, device: torch.device) -> tuple:
        """The window's constants, built once per size (read-only): (k - width [L]: slot k's offset to the grid index
        above it; whether that is window slot k - width [L] bool; that slot, clamped [L]; each block's slots [L])."""
        def build() -> tuple:
            slot = offsets(size, device)
            blocks = [(slot >= start) & (slot < start + self.width) for start in range(0, size, self.width)]
            return slot - self.width, slot >= self.width, (slot - self.width).clamp_min(0), blocks

        return cached(self._layouts, (size, device), build)

    def fill(self, tokens: torch.Tensor, probs: Probs, fresh: torch.Tensor, last: Probs,
             num_generated: torch.Tensor, rows: torch.Tensor | None, noise: torch.Tensor | None
             ) -> tuple[torch.Tensor, Probs]:
        """Draft the ``fresh`` [b, L] slots block by block (``width`` slots: a block's sources lie before it)."""
        batch, size = tokens.shape
        base = expand_window(last, size)  # [b, L, V]: p_last where the grid has no row above
        above_offset, in_window, window_col, blocks = self._layout(size, tokens.device)
        source = num_generated[:, None] + above_offset  # [b, L] grid index of the token above
        # the source is window slot k - width (else committed)
        in_window, window_col = in_window.expand(batch, -1), window_col.expand(batch, -1)
        committed = self._committed_above(probs, source, rows)
        for block in blocks:
            use = fresh & block
            above = committed if size <= self.width else where(in_window, gather_window(probs, window_col), committed)
            probs = where(use, where(source >= 0, above, base), probs)
            tokens = torch.where(use, _draw(probs, tokens, noise), tokens)
        return tokens, probs


FRESH_RULES = {"last-target": LastTarget, "row-above-dist": RowAboveDistribution}  # draft_init -> rule


def _top_entries(dense: torch.Tensor, like: SparseProbs) -> SparseProbs:
    """``dense`` [*lead, V] kept sparse as its top entries, as many as ``like`` holds (a proposal only: exact)."""
    return SparseProbs.from_scores(dense.log(), like.ids.shape[-1], like.table)[0]


def _draw(q: Probs, tokens: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """A draw from ``q`` [b, L, V] per slot; a sparse slot with a uniform q keeps its (random, so q-drawn) token."""
    drawn = sample(q, noise)
    if isinstance(q, SparseProbs) and q.uniform is not None:
        drawn = torch.where(q.uniform > 0, tokens, drawn)
    return drawn
