"""Drafting: how the Jacobi window is filled (initialisation) and refreshed after each commit (redraft).

The window slides by the number of committed tokens. Slots already in the window are *redrafted* from this
iteration's target at that position (Teng et al. 2024); slots new at the end are *fresh*
(:mod:`hf_sjd.jacobi.fresh_drafts`). Every draft is stored with the distribution it was sampled from, ``q``, which
keeps verification lossless whatever the rule. Each mode is one entry of a table::

    table            knob                  modes
    COUPLINGS        draft_coupling        independent (SJD) | maximal (MC-SJD, arXiv 2510.24211: maximally coupled
                                           with the previous draft) | gumbel (each position keeps its race noise)
    FRESH_RULES      draft_init            random | last-target | row-above-dist (| auto: by whether the grid is known)
    SIBLING_LAWS     jacobi_sibling_law    draft (the first draft's q) | mixture (q averaged with the last target)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from .constants import cached, offsets
from .distributions import (Probs, SparseProbs, expand_window, force_tokens, gather_window, mixture,
                            residual_distribution, sample, sample_without_replacement, token_probs, total_mass,
                            where, without_token)
from .fresh_drafts import FRESH_RULES


# draft_init="auto": the rule that measured best where the grid is known (docs/results/frontier.md), else grid-free
AUTO_INIT, AUTO_GRID_INIT, AUTO_GRID_FREE_INIT = "auto", "row-above-dist", "last-target"
DRAFT_INITS = ("random", *FRESH_RULES, AUTO_INIT)
GRID_INITS = ("row-above-dist",)  # need grid_width


def resolve_auto_init(init: str, grid_width: int | None) -> str:
    """``init`` with ``"auto"`` replaced by the rule it stands for given the grid (``None``: no grid)."""
    if init != AUTO_INIT:
        return init
    return AUTO_GRID_INIT if grid_width else AUTO_GRID_FREE_INIT


@dataclass
class DraftWindow:
    tokens: torch.Tensor  # [batch, window] long
    probs: Probs  # [batch, window, vocab] q: the distribution verification divides by (dense or SparseProbs)
    # [batch, window, vocab] what drafts were sampled from where it is not ``probs`` (a ``verify_unfused`` prior)
    sampled_probs: torch.Tensor | None = None
    noise: torch.Tensor | None = None  # [batch, window, vocab] Exp(1) race noise per slot (gumbel coupling)
    # [batch, vocab] the law the first draft's siblings were drawn from, where it is not its q (SIBLING_LAWS)
    sibling_probs: Probs | None = None

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    @property
    def sampling_probs(self) -> Probs:
        return self.probs if self.sampled_probs is None else self.sampled_probs

    @property
    def sibling_source(self) -> Probs:
        """[batch, vocab] what the first draft's siblings are drawn from (and verified against)."""
        return self.probs[:, 0] if self.sibling_probs is None else self.sibling_probs

    def select_rows(self, rows: torch.Tensor) -> "DraftWindow":
        return DraftWindow(*(None if value is None else value[rows] for value in vars(self).values()))


def maximal_coupling(prev_tokens: torch.Tensor, prev_probs: Probs, new_probs: Probs) -> torch.Tensor:
    r"""Sample :math:`y \sim p_{new}` maximally coupled with :math:`x \sim p_{prev}` (the previous draft): keep
    :math:`x` with probability :math:`\min(1, p_{new}(x)/p_{prev}(x))`, else draw from
    :math:`\mathrm{norm}(\max(p_{new} - p_{prev}, 0))`, so :math:`P(y = x) = \sum_v \min(p_{prev}(v), p_{new}(v))`.

        >>> _ = torch.manual_seed(0)
        >>> prev = torch.tensor([[0.5, 0.5]]); new = torch.tensor([[0.5, 0.5]])
        >>> maximal_coupling(torch.tensor([1]), prev, new)  # same distribution: always kept
        tensor([1])
    """
    prev = prev_tokens.unsqueeze(-1)
    keep_prob = (token_probs(new_probs, prev) / token_probs(prev_probs, prev).clamp_min(1e-30)).squeeze(-1)
    keep = torch.rand_like(keep_prob) < keep_prob
    resampled = sample(residual_distribution(new_probs, prev_probs))
    return torch.where(keep, prev_tokens, resampled)


# -- redraft couplings: (previous window, the old slot of each new slot [b, k] (>= the old size: none), the new
# distributions [b, k, V], race noise or None) -> the redrafted tokens [b, k]
def _independent(window: DraftWindow, old_index: torch.Tensor, dist: Probs, noise: torch.Tensor | None
                 ) -> torch.Tensor:
    return sample(dist, noise)


def _maximal(window: DraftWindow, old_index: torch.Tensor, dist: Probs, noise: torch.Tensor | None) -> torch.Tensor:
    redrafted = sample(dist, noise)
    if window.size == 0:
        return redrafted
    has_prev, prev_index = old_index < window.size, old_index.clamp(max=window.size - 1)  # [b, k] each
    prev_tokens, prev_probs = window.tokens.gather(1, prev_index), gather_window(window.sampling_probs, prev_index)
    return torch.where(has_prev, maximal_coupling(prev_tokens, prev_probs, dist), redrafted)


COUPLINGS = {"independent": _independent, "maximal": _maximal, "gumbel": _independent}  # gumbel: the noise is kept
DRAFT_COUPLINGS = tuple(COUPLINGS)
KEEPS_DRAFTS = ("maximal", "gumbel")  # couplings that carry a slot's previous draft (or its race noise) forward


# -- sibling laws: (window, this iteration's targets [b, L+1, V], tokens each row committed [b]) -> law [b, V] or
# None (the first draft's q)
def _first_draft(window: DraftWindow, target_probs: Probs, num_committed: torch.Tensor) -> Probs | None:
    return None


def _mixture_with_previous(window: DraftWindow, target_probs: Probs, num_committed: torch.Tensor) -> Probs:
    """(q + p_prev) / 2, p_prev the target at the last committed position (what q, behind a rejection, misses)."""
    previous = gather_window(target_probs, (num_committed - 1)[:, None])[:, 0]  # [b, V]
    return mixture(window.probs[:, 0], previous, 0.5)


SIBLING_LAWS = {"draft": _first_draft, "mixture": _mixture_with_previous}


def verifies_unfused(priors) -> bool:
    """Whether a draft prior has drafts verified against another law than the one they were sampled from."""
    return any(getattr(prior, "verify_unfused", False) for prior in priors)


class Drafter:
    """Fills and slides the Jacobi window for one ``generate`` call: random drafts uniform over ``draft_token_ids``;
    ``draft_processors``: draft priors (:mod:`hf_sjd.jacobi.priors`); ``structural_tokens``: ``positions [b, k] ->
    ids [b, k]`` (-1: free), the layout's fixed tokens, drafted with a point-mass q."""

    def __init__(self, draft_token_ids: torch.Tensor, vocab_size: int, init: str = "random",
                 coupling: str = "independent", sibling_law: str = "draft", grid_width: int | None = None,
                 batch: int = 1, window: int = 0, draft_processors: list | None = None,
                 structural_tokens=None) -> None:
        self.draft_token_ids, self.structural_tokens = draft_token_ids, structural_tokens
        self.redraft, self.sibling_law = COUPLINGS[coupling], SIBLING_LAWS[sibling_law]
        self.race_noise = coupling == "gumbel"  # each window position keeps its Exp(1) noise (COUPLINGS)
        self.fresh = FRESH_RULES[init](grid_width, batch, window) if init in FRESH_RULES else None
        self.draft_processors = LogitsProcessorList(draft_processors or [])
        self.verify_unfused = verifies_unfused(self.draft_processors)
        self.uniform_q = torch.zeros(vocab_size + 1, device=draft_token_ids.device)  # [V + 1]: 0 at the padding id
        self.uniform_q[draft_token_ids] = 1.0 / draft_token_ids.numel()
        self.sparse = False  # q as SparseProbs (set by the loop when the verifier and the processors allow it)
        self._uniform_cache: dict[tuple[int, int, int], SparseProbs] = {}  # (batch, size, width) -> uniform q

    @property
    def sparse_ready(self) -> bool:
        """Not with draft priors (dense log-probs) or the Gumbel coupling (noise over the vocabulary)."""
        return not self.draft_processors and not self.race_noise

    def _noise(self, batch: int, size: int) -> torch.Tensor | None:
        """Fresh race noise ``E`` [b, size, V] for new window positions (gumbel coupling), else ``None``."""
        if not self.race_noise:
            return None
        vocab = self.uniform_q.numel() - 1
        return torch.empty(batch, size, vocab, device=self.uniform_q.device).exponential_()

    def _random(self, batch: int, size: int, like: Probs | None = None) -> tuple[torch.Tensor, Probs]:
        """Uniform drafts over ``draft_token_ids`` and their q, of the kind of ``like`` (default: the drafter's)."""
        pick = torch.randint(0, self.draft_token_ids.numel(), (batch, size), device=self.draft_token_ids.device)
        if isinstance(like, SparseProbs) or (like is None and self.sparse):
            width = 1 if like is None else like.ids.shape[-1]
            return self.draft_token_ids[pick], self._uniform_draws(batch, size, width)
        return self.draft_token_ids[pick], self.uniform_q[:-1].expand(batch, size, -1)

    def _uniform_draws(self, batch: int, size: int, width: int) -> SparseProbs:
        """:meth:`SparseProbs.uniform_draws`, built once per shape (:func:`~hf_sjd.jacobi.constants.cached`)."""
        return cached(self._uniform_cache, (batch, size, width),
                      lambda: SparseProbs.uniform_draws(batch, size, self.uniform_q, width))

    def _force_structure(self, window: DraftWindow, positions: torch.Tensor | None) -> DraftWindow:
        """Put the layout's fixed tokens (if any) into the window, each with a point-mass ``q``."""
        if self.structural_tokens is None or positions is None or window.size == 0:
            return window
        forced = self.structural_tokens(positions)  # [b, L], -1 = free
        if forced is None:
            return window
        sampled = None if window.sampled_probs is None else force_tokens(forced, window.sampled_probs)
        return DraftWindow(torch.where(forced >= 0, forced, window.tokens), force_tokens(forced, window.probs), sampled,
                           window.noise)

    def _apply_priors(self, dist: Probs, positions: torch.Tensor, rows: torch.Tensor | None,
                      carried: torch.Tensor) -> Probs:
        """Draft priors over the redraft distributions ``dist`` [b, k, V] (flattened to LogitsProcessor rows)."""
        if not self.draft_processors or dist.shape[1] == 0:
            return dist
        batch, size, vocab = dist.shape
        rows = torch.arange(batch, device=dist.device) if rows is None else rows
        scores = dist.clamp_min(0).log().reshape(-1, vocab)  # [b*k, V] log p (-inf outside the support)
        fused = self.draft_processors(None, scores, positions=positions.reshape(-1),
                                      rows=rows[:, None].expand(-1, size).reshape(-1), carried=carried.reshape(-1))
        return fused.softmax(-1).view(batch, size, vocab)

    def initial(self, batch: int, size: int, positions: torch.Tensor | None = None,
                num_generated: torch.Tensor | None = None) -> DraftWindow:
        """A window of ``size`` fresh drafts for ``batch`` rows at generated ``positions`` [b, size]."""
        tokens, probs = self._random(batch, size)
        noise = self._noise(batch, size)
        if noise is not None:  # Gumbel-max on the uniform q: the same law as the uniform pick
            tokens = sample(probs, noise)
        if self.fresh is not None and size > 0:
            uniform = (SparseProbs.uniform_draws(batch, 1, self.uniform_q)[:, 0] if self.sparse  # p_last before
                       else self.uniform_q[:-1].expand(batch, -1))  # any forward: the uniform draft q
            tokens, probs = self.fresh.fill(tokens, probs, torch.ones_like(tokens, dtype=torch.bool), uniform,
                                            num_generated, None, noise)
        return self._force_structure(DraftWindow(tokens, probs, noise=noise), positions)

    def slide(self, window: DraftWindow, target_probs: Probs, num_committed: torch.Tensor, size: int,
              positions: torch.Tensor | None = None, rows: torch.Tensor | None = None,
              num_generated: torch.Tensor | None = None) -> DraftWindow:
        """The next window after each row committed ``num_committed`` [b] tokens: new slot k, at old index
        ``num_committed + k``, is redrafted from ``target_probs`` [b, L+1, V] there if it exists, else fresh."""
        batch, old_size = window.tokens.shape
        old_index = num_committed[:, None] + offsets(size, num_committed.device)  # [b, size]
        target = gather_window(target_probs, old_index.clamp(max=old_size))  # [b, size, V]
        is_law = total_mass(target_probs) >= 0  # [b, L+1]; NaN mass: no law
        # a target distribution exists for this slot, and is one: behind a draft the processors forbid (a prefix
        # vanilla sampling never builds) they may allow nothing, and a draft must come from the q stored with it
        carried = (old_index <= old_size) & is_law.gather(1, old_index.clamp(max=old_size))
        dist = self._apply_priors(target, positions, rows, carried)  # what drafts are sampled from
        noise = self._kept_noise(window, old_index, size)
        redrafted = self.redraft(window, old_index, dist, noise)
        fresh_tokens, fresh_probs = self._random(batch, size, like=dist)
        if noise is not None:
            fresh_tokens = sample(fresh_probs, noise)
        tokens = torch.where(carried, redrafted, fresh_tokens)
        probs = where(carried, target if self.verify_unfused else dist, fresh_probs)
        sampled = where(carried, dist, fresh_probs) if self.verify_unfused else None
        if self.fresh is not None:
            self.fresh.record(target_probs, num_committed, num_generated, rows)
            if sampled is None and size > 0:  # (an unfused prior keeps random fresh drafts)
                last = target_probs[:, old_size]  # [b, V]; a row where it is no law keeps its random fresh drafts
                tokens, probs = self.fresh.fill(tokens, probs, ~carried & is_law[:, old_size, None], last,
                                                num_generated, rows, noise)
        return self._force_structure(DraftWindow(tokens, probs, sampled, noise), positions)

    def _kept_noise(self, window: DraftWindow, old_index: torch.Tensor, size: int) -> torch.Tensor | None:
        """Gumbel coupling: the next window's race noise [b, size, V], a position keeping its own."""
        if not self.race_noise:
            return None
        batch, old_size = window.tokens.shape
        fresh_noise = self._noise(batch, size)
        if old_size == 0:
            return fresh_noise
        has_prev = old_index < old_size  # a previous draft exists for this slot
        return torch.where(has_prev.unsqueeze(-1), gather_window(window.noise, old_index.clamp(max=old_size - 1)),
                           fresh_noise)

    # -- siblings of the first draft (jacobi_siblings) -------------------------------------------------------------
    def with_sibling_law(self, window: DraftWindow, target_probs: Probs, num_committed: torch.Tensor) -> DraftWindow:
        """``window`` with the law its first draft's siblings are drawn from (:data:`SIBLING_LAWS`)."""
        law = self.sibling_law(window, target_probs, num_committed)
        return window if law is None else dataclasses.replace(window, sibling_probs=law)

    def siblings(self, window: DraftWindow, count: int) -> torch.Tensor:
        """``[b, count]`` siblings of the first draft from ``window.sibling_source``: without replacement (the draft
        excluded) on the rows :meth:`distinct_siblings` names, i.i.d. elsewhere."""
        first, drafted = window.sibling_source, window.tokens[:, 0]  # [b, V], [b]
        tokens, drawn = sample_without_replacement(without_token(first, drafted), count)
        tokens = torch.where(drawn, tokens, drafted[:, None])  # a placeholder: q_i is 0 there, never accepted
        distinct = self.distinct_siblings(first)
        if distinct is not True:  # the rows with a uniform component: i.i.d.
            tokens = torch.where(distinct[:, None], tokens, self._draw(expand_window(first, count)))
        return tokens

    @staticmethod
    def distinct_siblings(first: Probs) -> bool | torch.Tensor:
        """Rows drawn without replacement: all (``True``), or [b] bool, not where q has a uniform component."""
        if isinstance(first, SparseProbs) and first.uniform is not None:
            return first.uniform == 0
        return True

    def _draw(self, law: Probs) -> torch.Tensor:
        """One token per distribution of ``law`` [b, k, V], a sparse law's uniform component included."""
        drawn = sample(law)
        if isinstance(law, SparseProbs) and law.uniform is not None:
            uniform, _ = self._random(*drawn.shape, like=law)
            drawn = torch.where(torch.rand(drawn.shape, device=drawn.device) < law.uniform, uniform, drawn)
        return drawn
