"""Fresh drafts: what a window slot newly exposed at the end of the window is drafted from.

After a commit the window slides; its last slots lie beyond every position the forward computed a
distribution for, so they are *fresh*. ``draft_init="random"`` drafts them uniformly and
``"repeat-horizon"`` copies the left grid neighbour (:class:`~hf_sjd.jacobi.drafting.Drafter`); the rules
here draft them from what the past iterations already know::

    rule              q of a fresh slot at grid index g = n + k      where g has no row above (g < width)
    last-target       p_last: the row's distribution at the last    (no grid needed)
                      window position of the previous forward
    row-above         point mass on the committed/drafted token      p_last
                      at g - width
    row-above-dist    p_above: the model's distribution at       p_last
                      g - width when it was committed (or the
                      q it was drafted from, if still drafted)
    row-above-mix     w * delta(token above) + (1 - w) * p_last      p_last
                      (w = ``draft_init_weight``)

    vocabulary / shapes
    n                 committed image tokens of the row (``num_generated``); window slot k is grid index n + k
    width             tokens per grid row (``grid_width``)
    fresh  [b, L]     slots to draft here (the others keep their redrafted token and q)
    p_last [b, V]     the previous forward's target at its last position (uniform for the first window)
    history [B, H, V] the model's distribution at each committed position, ring-indexed by grid index

Invariant (what keeps verification exact): each fresh draft is sampled from the ``q`` stored with it, and
``q`` is a function of the committed tokens, of past forwards and of drafts at earlier window slots only;
the verifier divides by that ``q``. Slots whose source is itself in the window are drafted in blocks of
``width`` slots, so a source is final before it is read.
"""

from __future__ import annotations

import torch

from .distributions import Probs, SparseProbs, expand_window, gather_window, point_masses, sample, where

FRESH_INITS = ("last-target", "row-above", "row-above-dist", "row-above-mix")
GRID_INITS = ("row-above", "row-above-dist", "row-above-mix")  # need ``grid_width``
# ``draft_init="auto"`` (the mc-sjd preset): the rule that measured best on the reference model where the grid
# is known (docs/results/frontier.md), the best grid-free rule elsewhere.
AUTO_INIT, AUTO_GRID_INIT, AUTO_GRID_FREE_INIT = "auto", "row-above-dist", "last-target"


def resolve_auto(init: str, grid_width: int | None) -> str:
    """``init`` with ``"auto"`` replaced by the rule it stands for given the grid (``None``: no grid)."""
    if init != AUTO_INIT:
        return init
    return AUTO_GRID_INIT if grid_width else AUTO_GRID_FREE_INIT


class FreshDrafts:
    """State and rule of fresh drafts for one ``generate`` call.

    Args:
        rule: one of :data:`FRESH_INITS`.
        grid_width: tokens per grid row (the ``row-above*`` rules).
        weight: ``w`` of ``row-above-mix`` in [0, 1].
    """

    def __init__(self, rule: str, grid_width: int | None, weight: float = 0.5) -> None:
        if rule in GRID_INITS and not grid_width:
            raise ValueError(f"draft_init={rule!r} needs the token-grid width: pass grid_width=...")
        self.rule, self.width, self.weight = rule, grid_width or 0, weight
        self.history: Probs | None = None  # [B, H + 1, V]; slot H takes the writes to ignore

    @property
    def needs_grid(self) -> bool:
        return self.rule in GRID_INITS

    @property
    def sparse_ready(self) -> bool:
        """Every rule but the mixture keeps q on a support (a mixture of a point mass and p_last has two)."""
        return self.rule != "row-above-mix"

    def start(self, batch: int, window: int, vocab: int, device: torch.device) -> None:
        """Size the history of committed distributions (only ``row-above-dist`` reads it); it is allocated at
        the first :meth:`record`, in the kind (dense or sparse) of the targets."""
        if self.rule == "row-above-dist":
            self.ring = self.width + window + 2  # > width + the most a row commits per forward: no collisions
            self.batch, self.history = batch, None

    def _allocate(self, like: Probs) -> Probs:
        slots = (self.batch, self.ring + 1)
        if isinstance(like, SparseProbs):
            ids = torch.full((*slots, like.ids.shape[-1]), like.vocab_size, dtype=torch.long, device=like.device)
            return SparseProbs(ids, like.probs.new_zeros(ids.shape), None, like.table)
        return like.new_zeros(*slots, like.shape[-1])

    def _as_history(self, target: Probs) -> Probs:
        """``target`` in the history's kind. A dense target (an iteration whose support did not fit the sparse
        width) is kept as its top entries, renormalised: the history only proposes drafts, and each draft is
        verified against the q it was sampled from, so the truncation costs acceptance, never exactness."""
        if isinstance(self.history, SparseProbs) and not isinstance(target, SparseProbs):
            top, _ = SparseProbs.from_scores(target.log(), self.history.ids.shape[-1], self.history.table)
            return top  # softmax of log p over the top entries: p renormalised there
        if isinstance(target, SparseProbs) and not isinstance(self.history, SparseProbs):
            return target.dense()
        return target

    def record(self, target: Probs, count: torch.Tensor, num_generated: torch.Tensor,
               rows: torch.Tensor) -> None:
        """Store the distributions ``target`` [b, L+1, V] the ``count`` [b] committed tokens came from.

        ``num_generated`` [b] counts the committed tokens after this commit; ``rows`` [b] the batch rows."""
        if self.rule != "row-above-dist":
            return
        if self.history is None:
            self.history = self._allocate(target)
        target = self._as_history(target)
        rows = torch.arange(target.shape[0], device=count.device) if rows is None else rows
        slot = torch.arange(target.shape[1], device=count.device)
        position = num_generated[:, None] - count[:, None] + slot  # [b, L+1] grid index of each old slot
        index = (rows[:, None].expand(-1, len(slot)), torch.where(slot < count[:, None], position % self.ring, self.ring))
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
        return above

    def fill(self, tokens: torch.Tensor, probs: Probs, fresh: torch.Tensor, last: Probs,
             recent: torch.Tensor | None, num_generated: torch.Tensor | None, rows: torch.Tensor | None,
             noise: torch.Tensor | None = None) -> tuple[torch.Tensor, Probs]:
        """Draft the ``fresh`` [b, L] slots of ``tokens`` [b, L] / ``probs`` [b, L, V]; ``last`` [b, V] is p_last.

        ``recent`` [b, width + 1] the last committed tokens (right-aligned), ``noise`` [b, L, V] the Gumbel
        coupling's ``E`` (or ``None``). Returns the new (tokens, probs)."""
        batch, size = tokens.shape
        base = expand_window(last, size)  # [b, L, V]
        if self.rule == "last-target":
            q = where(fresh, base, probs)
            return torch.where(fresh, _draw(q, tokens, noise), tokens), q
        slot = torch.arange(size, device=tokens.device)
        source = num_generated[:, None] + slot - self.width  # [b, L] grid index of the token above
        has_source = source >= 0
        in_window = (slot >= self.width).expand(batch, -1)  # the source is window slot k - width (else committed)
        span = recent.shape[1]
        committed_col = (span - self.width + slot).clamp(0, span - 1)  # recent[:, span - (n - source)]
        above_committed = recent.gather(1, committed_col.expand(batch, -1))  # [b, L]
        dist_committed = self._committed_above(probs, source, rows) if self.rule == "row-above-dist" else None
        window_col = (slot - self.width).clamp_min(0).expand(batch, -1)
        for start in range(0, size, max(self.width, 1)):  # sources of a block lie before it: final when read
            block = (slot >= start) & (slot < start + self.width)
            above = torch.where(in_window, tokens.gather(1, window_col), above_committed)
            if self.rule == "row-above-dist":
                q_source = where(in_window, gather_window(probs, window_col), dist_committed)
            else:
                point = point_masses(above, probs)
                q_source = point if self.rule == "row-above" else self.weight * point + (1 - self.weight) * base
            use = fresh & block
            probs = where(use, where(has_source, q_source, base), probs)
            tokens = torch.where(use, _draw(probs, tokens, noise), tokens)
        return tokens, probs


def _draw(q: Probs, tokens: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """A draw from ``q`` [b, L, V] per slot. Sparse slots whose q is the uniform draft distribution (the first
    window, before any forward) keep their token: a random draft, itself a draw from that q."""
    drawn = sample(q, noise)
    if isinstance(q, SparseProbs) and q.uniform is not None:
        drawn = torch.where(q.uniform > 0, tokens, drawn)
    return drawn
