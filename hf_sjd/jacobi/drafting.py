"""Drafting: how the Jacobi window is filled (initialisation) and refreshed after each commit (redraft).

The window slides by the number of committed tokens. Slots that were already in the window are
*redrafted* from this iteration's target distribution at that position (Teng et al. 2024); slots newly
exposed at the end are *initialised* (uniformly at random, or by copying a grid neighbour). Every draft
is stored with the exact distribution it was sampled from, ``q``, which is what keeps verification
lossless whatever the drafting rule.

Redrafting is ``independent`` (SJD: a fresh sample from the new distribution) or ``maximal`` (MC-SJD,
So et al. 2025, arXiv 2510.24211: a maximal coupling of the previous draft and the new distribution,
so drafts stay put unless the distribution moved away from them; the marginal is still the new
distribution, so ``q`` is unchanged and the method stays lossless), or ``gumbel`` (the SCD authors' GS
variant: every window position keeps its exponential race noise ``E`` while it stays in the window, and each
of its drafts is ``argmax q / E``, i.e. Gumbel-max on ``log q``: common random numbers across iterations).
Fresh slots beyond the computed positions can also start from what the past forwards know
(:mod:`hf_sjd.jacobi.fresh_drafts`: ``last-target``, ``row-above``, ...).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from transformers import LogitsProcessorList

from .distributions import (Probs, SparseProbs, expand_window, force_tokens, gather_window, mixture,
                            residual_distribution, sample, sample_without_replacement, token_probs, where,
                            without_token)
from .fresh_drafts import AUTO_INIT, FRESH_INITS, GRID_INITS, FreshDrafts

__all__ = ["DRAFT_INITS", "DRAFT_COUPLINGS", "SIBLING_SAMPLINGS", "SIBLING_LAWS", "DraftWindow", "Drafter",
           "maximal_coupling", "sample", "force_tokens"]

DRAFT_INITS = ("random", "repeat-horizon", *FRESH_INITS, AUTO_INIT)
DRAFT_COUPLINGS = ("independent", "maximal", "gumbel")
SIBLING_SAMPLINGS = ("without-replacement", "iid")
# What the first draft's siblings are drawn from (``jacobi_sibling_law``; :meth:`Drafter.with_sibling_law`).
SIBLING_LAWS = ("draft", "previous", "mixture")


@dataclass
class DraftWindow:
    tokens: torch.Tensor  # [batch, window] long
    probs: Probs  # [batch, window, vocab] q: the distribution verification divides by (dense or SparseProbs)
    # [batch, window, vocab] the distribution drafts were actually sampled from, where it differs from ``probs``
    # (only a prior with ``verify_unfused``, e.g. SJD-VP's literal "paper" mode, which is therefore not exact).
    sampled_probs: torch.Tensor | None = None
    noise: torch.Tensor | None = None  # [batch, window, vocab] Exp(1) race noise per slot (gumbel coupling)
    # [batch, vocab] the law the first draft's siblings were drawn from, where it is not its q (``sibling_law``)
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
        sampled = None if self.sampled_probs is None else self.sampled_probs[rows]
        noise = None if self.noise is None else self.noise[rows]
        siblings = None if self.sibling_probs is None else self.sibling_probs[rows]
        return DraftWindow(self.tokens[rows], self.probs[rows], sampled, noise, siblings)


def maximal_coupling(prev_tokens: torch.Tensor, prev_probs: Probs, new_probs: Probs) -> torch.Tensor:
    r"""Sample :math:`y \sim p_{new}` maximally coupled with :math:`x \sim p_{prev}` (the previous draft).

    Keep :math:`x` with probability :math:`\min(1, p_{new}(x)/p_{prev}(x))`, else draw from
    :math:`\mathrm{norm}(\max(p_{new} - p_{prev}, 0))`. Then :math:`y \sim p_{new}` exactly and
    :math:`P(y = x) = \sum_v \min(p_{prev}(v), p_{new}(v))`, the largest possible (MC-SJD, So et al. 2025).

    Example::

        >>> import torch
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


class Drafter:
    """Fills and slides the Jacobi window.

    Args:
        draft_token_ids: ``[n]`` ids that random initialisation draws from (uniform ``q``).
        vocab_size: size of the model's distributions.
        init: ``"random"`` (uniform over ``draft_token_ids``) or ``"repeat-horizon"`` (copy the left
            neighbour in the token grid, or the token above at the start of a grid row; ``q`` is then a
            point mass, which verification handles exactly).
        coupling: ``"independent"`` or ``"maximal"`` redrafting (see module docstring).
        grid_width: tokens per grid row (``"repeat-horizon"`` needs it).
        draft_processors: ``LogitsProcessor``s (draft priors, :mod:`hf_sjd.jacobi.priors`) applied to redraft
            distributions before sampling, called on flat rows with ``positions``, ``rows`` and ``carried``
            keyword arguments (the SJD-VP prior plugs in here); ``q`` is whatever they return, unless a
            prior sets ``verify_unfused``.
        structural_tokens: ``positions [b, k] -> ids [b, k]`` (``-1`` = free) or ``None``: tokens the
            model's layout fixes (an adapter's :meth:`structural_tokens`); they are drafted with ``q`` = point mass.
        init_weight: ``w`` of ``init="row-above-mix"`` (see :mod:`hf_sjd.jacobi.fresh_drafts`).
        sibling_sampling: how :meth:`siblings` draws the first draft's siblings: ``"without-replacement"``
            or ``"iid"`` (:data:`SIBLING_SAMPLINGS`).
        sibling_law: what they are drawn from (:data:`SIBLING_LAWS`, :meth:`with_sibling_law`).
    """

    def __init__(self, draft_token_ids: torch.Tensor, vocab_size: int, init: str = "random",
                 coupling: str = "independent", grid_width: int | None = None,
                 draft_processors: list | None = None, structural_tokens=None, init_weight: float = 0.5,
                 sibling_sampling: str = "without-replacement", sibling_law: str = "draft") -> None:
        self.draft_token_ids = draft_token_ids
        self.sibling_sampling, self.sibling_law = sibling_sampling, sibling_law
        self.fresh = FreshDrafts(init, grid_width, init_weight) if init in FRESH_INITS else None
        self.structural_tokens = structural_tokens
        self.init, self.coupling, self.grid_width = init, coupling, grid_width
        self.draft_processors = LogitsProcessorList(draft_processors or [])
        self.verify_unfused = any(getattr(p, "verify_unfused", False) for p in self.draft_processors)
        self.uniform_q = torch.zeros(vocab_size + 1, device=draft_token_ids.device)  # [V + 1]: 0 at the sparse padding id
        self.uniform_q[draft_token_ids] = 1.0 / draft_token_ids.numel()
        self.sparse = False  # q as SparseProbs (set by the loop when the verifier and the processors allow it)

    @property
    def sparse_ready(self) -> bool:
        """Whether drafting works on sparse distributions: not with draft priors (they rewrite dense log-probs),
        Gumbel coupling (its noise covers the vocabulary) or a fresh rule that mixes distributions."""
        return (not self.draft_processors and self.coupling != "gumbel"
                and (self.fresh is None or self.fresh.sparse_ready))

    @property
    def needs_grid(self) -> bool:
        """Whether drafting reads the committed tokens' grid context (``recent``, ``num_generated``)."""
        return self.init == "repeat-horizon" or self.init in GRID_INITS

    def _noise(self, batch: int, size: int) -> torch.Tensor | None:
        """Fresh race noise ``E`` [b, size, V] for new window positions (gumbel coupling), else ``None``."""
        if self.coupling != "gumbel":
            return None
        vocab = self.uniform_q.numel() - 1
        return torch.empty(batch, size, vocab, device=self.uniform_q.device).exponential_()

    # -- initialisation -------------------------------------------------------------------------
    def _random(self, batch: int, size: int, like: Probs | None = None) -> tuple[torch.Tensor, Probs]:
        """Uniform drafts over ``draft_token_ids`` and their q, of the kind of ``like`` (default: the drafter's)."""
        pick = torch.randint(0, self.draft_token_ids.numel(), (batch, size), device=self.draft_token_ids.device)
        if isinstance(like, SparseProbs) or (like is None and self.sparse):
            width = 1 if like is None else like.ids.shape[-1]
            return self.draft_token_ids[pick], SparseProbs.uniform_draws(batch, size, self.uniform_q, width)
        return self.draft_token_ids[pick], self.uniform_q[:-1].expand(batch, size, -1)

    def _repeat_horizon(self, tokens: torch.Tensor, fresh: torch.Tensor, recent: torch.Tensor,
                        num_generated: torch.Tensor) -> torch.Tensor:
        """Copy grid neighbours into ``fresh`` slots; slots with no image neighbour stay random.

        Returns ``[b, L]`` the copied token of every slot that copies one, ``-1`` elsewhere.

        ``tokens``/``fresh`` [b, L]; ``recent`` [b, W+1] the last committed tokens (right-aligned);
        ``num_generated`` [b] committed image tokens so far (window slot k is grid index n + k).
        """
        width, (batch, size) = self.grid_width, tokens.shape
        span = recent.shape[1]
        buffer = torch.cat([recent, tokens], dim=1)  # [b, span + L]
        slot = torch.arange(size, device=tokens.device)
        grid_index = num_generated[:, None] + slot  # [b, L] grid index of each window slot
        source = torch.where(grid_index % width != 0, grid_index - 1, grid_index - width)
        has_source = source >= 0
        pointer = torch.arange(span + size, device=tokens.device).repeat(batch, 1)  # [b, span + L]
        own = span + slot
        pointer[:, span:] = torch.where(fresh & has_source, span + source - num_generated[:, None], own)
        # Fresh slots may copy fresh slots: resolve the chains by pointer jumping (log2(L) gathers).
        for _ in range(max(1, math.ceil(math.log2(size + 1)))):
            pointer = pointer.gather(1, pointer)
        copied = buffer.gather(1, pointer[:, span:])
        use = fresh & has_source
        return torch.where(use, copied, -1)

    def initial(self, batch: int, size: int, recent: torch.Tensor | None = None,
                num_generated: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> DraftWindow:
        """A window of ``size`` fresh drafts for ``batch`` rows."""
        tokens, probs = self._random(batch, size)
        noise = self._noise(batch, size)
        if noise is not None:  # Gumbel-max on the uniform q: the same law as the uniform pick
            tokens = sample(probs, noise)
        window = DraftWindow(tokens, probs, noise=noise)
        if self.fresh is not None:
            self.fresh.start(batch, size, probs.shape[-1], probs.device)
            if size > 0:
                fresh = torch.ones_like(tokens, dtype=torch.bool)
                uniform = (SparseProbs.uniform_draws(batch, 1, self.uniform_q)[:, 0] if self.sparse  # p_last before
                           else self.uniform_q[:-1].expand(batch, -1))  # any forward: the uniform draft q
                tokens, probs = self.fresh.fill(tokens, probs, fresh, uniform, recent, num_generated, None, noise)
                window = DraftWindow(tokens, probs, noise=noise)
        if self.init == "repeat-horizon" and size > 0:
            fresh = torch.ones_like(tokens, dtype=torch.bool)
            window = self._apply_horizon(window, fresh, recent, num_generated)
        return self._force_structure(window, positions)

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

    def _apply_priors(self, dist: Probs, positions: torch.Tensor | None, rows: torch.Tensor | None,
                      carried: torch.Tensor) -> torch.Tensor:
        """Draft priors over the redraft distributions ``dist`` [b, k, V] (flattened to LogitsProcessor rows)."""
        if not self.draft_processors or dist.shape[1] == 0:
            return dist
        batch, size, vocab = dist.shape
        if rows is None:
            rows = torch.arange(batch, device=dist.device)
        scores = dist.clamp_min(0).log().reshape(-1, vocab)  # [b*k, V] log p (-inf outside the support)
        fused = self.draft_processors(None, scores, positions=positions.reshape(-1),
                                      rows=rows[:, None].expand(-1, size).reshape(-1), carried=carried.reshape(-1))
        return fused.softmax(-1).view(batch, size, vocab)

    def _apply_horizon(self, window: DraftWindow, fresh: torch.Tensor, recent: torch.Tensor,
                       num_generated: torch.Tensor) -> DraftWindow:
        copied = self._repeat_horizon(window.tokens, fresh, recent, num_generated)  # q: a point mass there
        sampled = None if window.sampled_probs is None else force_tokens(copied, window.sampled_probs)
        return DraftWindow(torch.where(copied >= 0, copied, window.tokens), force_tokens(copied, window.probs), sampled,
                           window.noise)

    def with_sibling_law(self, window: DraftWindow, target_probs: Probs, num_committed: torch.Tensor
                         ) -> DraftWindow:
        r"""``window`` with the law its first draft's siblings are drawn from (``sibling_law``), after each row
        committed ``num_committed`` [b] tokens of ``target_probs`` [b, L+1, V] (this iteration's targets)::

            draft      q, the first draft's own law
            previous   p_prev [b, V]: the target at the last committed position, the distribution the token
                       just before the first slot came from
            mixture    (q + p_prev) / 2

        Why p_prev: after a rejection the first draft's q was computed behind the rejected token, while p_prev
        was computed behind committed tokens only, one position earlier (image tokens' neighbours share much
        of their mass), so it covers what q misses. A sibling is verified against the residual of the drafts
        before it (recursive rejection sampling), which is exact for any law known before the forward: p_prev
        is one, and an accepted sibling ends the commit, so no later draft depends on it.
        """
        if self.sibling_law == "draft":
            return window
        previous = gather_window(target_probs, (num_committed - 1)[:, None])[:, 0]  # [b, V]
        law = previous if self.sibling_law == "previous" else mixture(window.probs[:, 0], previous, 0.5)
        return dataclasses.replace(window, sibling_probs=law)

    def siblings(self, window: DraftWindow, count: int) -> torch.Tensor:
        """``[b, count]`` siblings of the first draft (``jacobi_siblings``), drawn from ``window.sibling_source``
        given the draft: without replacement (``sibling_sampling``; the draft and each other excluded, a
        placeholder where the support is used up) on the rows :meth:`distinct_siblings` names, i.i.d. elsewhere.
        A sparse law's uniform component (random drafts) is drawn i.i.d. over ``draft_token_ids``, with its weight."""
        first, drafted = window.sibling_source, window.tokens[:, 0]  # [b, V], [b]
        if self.sibling_sampling == "iid":
            return self._iid_siblings(first, count)
        tokens, drawn = sample_without_replacement(without_token(first, drafted), count)
        tokens = torch.where(drawn, tokens, drafted[:, None])  # a placeholder: q_i is 0 there, never accepted
        distinct = self.distinct_siblings(first)
        if distinct is not True:  # the rows with a uniform component: i.i.d.
            tokens = torch.where(distinct[:, None], tokens, self._iid_siblings(first, count))
        return tokens

    def distinct_siblings(self, first: Probs) -> bool | torch.Tensor:
        """Which rows :meth:`siblings` draws without replacement from ``first`` [b, V] (the siblings' law as
        drafted, before any densifying): ``True`` (every row), ``False`` (none: ``sibling_sampling="iid"``), or a
        ``[b]`` bool tensor where a sparse q has a uniform component (no support to exclude tokens from)."""
        if self.sibling_sampling == "iid":
            return False
        if isinstance(first, SparseProbs) and first.uniform is not None:
            return first.uniform == 0
        return True

    def sibling_drafts(self, window: DraftWindow, count: int) -> torch.Tensor:
        """``[b, count]`` the drafts after the first sibling (``jacobi_sibling_drafts``): window slots 2 .. count + 1
        drawn afresh from their q, independently of the window's own drafts there. Independent, because block
        verification decides the window from every slot, so a draft it has read is no longer a draw from its q
        once the first slot is known to be rejected; a fresh draw is, whatever the verifier."""
        return self._draw(window.probs[:, 1:count + 1])

    def _iid_siblings(self, first: Probs, count: int) -> torch.Tensor:
        return self._draw(expand_window(first, count))

    def _draw(self, law: Probs) -> torch.Tensor:
        """One token per distribution of ``law`` [b, k, V] -> [b, k]; a sparse law's uniform component (random
        drafts) is drawn over ``draft_token_ids`` with its weight (:func:`sample` races over the support only)."""
        drawn = sample(law)
        if isinstance(law, SparseProbs) and law.uniform is not None:
            uniform, _ = self._random(*drawn.shape, like=law)
            drawn = torch.where(torch.rand(drawn.shape, device=drawn.device) < law.uniform, uniform, drawn)
        return drawn

    # -- redraft --------------------------------------------------------------------------------
    def _kept_noise(self, window: DraftWindow, old_index: torch.Tensor, has_prev: torch.Tensor, size: int
                    ) -> torch.Tensor | None:
        """Gumbel coupling: [b, size, V] race noise of the next window, a position keeping its own while it stays
        in the window (``old_index`` [b, size] its old slot, ``has_prev`` [b, size] whether it had one)."""
        if self.coupling != "gumbel":
            return None
        batch, old_size = window.tokens.shape
        fresh_noise = self._noise(batch, size)
        if old_size == 0:
            return fresh_noise
        prev_index = old_index.clamp(max=old_size - 1).unsqueeze(-1).expand(-1, -1, fresh_noise.shape[-1])
        return torch.where(has_prev.unsqueeze(-1), window.noise.gather(1, prev_index), fresh_noise)

    def slide(self, window: DraftWindow, target_probs: Probs, num_committed: torch.Tensor, size: int,
              recent: torch.Tensor | None = None, num_generated: torch.Tensor | None = None,
              positions: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> DraftWindow:
        """The next window after each row committed ``num_committed`` [b] tokens.

        New slot k sits at old window index ``num_committed + k`` (0-based). If that index is within
        ``target_probs`` [b, L+1, vocab] (this iteration's distributions), the slot is redrafted from it;
        otherwise it is freshly initialised. ``positions`` [b, size] are the slots' generated-token indices and
        ``rows`` [b] the rows' original batch indices (draft priors key their history by them).
        """
        batch, old_size = window.tokens.shape
        slot = torch.arange(size, device=target_probs.device)
        old_index = num_committed[:, None] + slot  # [b, size]
        carried = old_index <= old_size  # a target distribution exists for this slot
        has_prev = old_index < old_size  # a previous draft exists for this slot
        index = old_index.clamp(max=old_size)
        target = gather_window(target_probs, index)  # [b, size, V]
        dist = self._apply_priors(target, positions, rows, carried)  # what drafts are sampled from
        noise = self._kept_noise(window, old_index, has_prev, size)
        redrafted = sample(dist, noise)
        if self.coupling == "maximal" and old_size > 0:
            prev_index = old_index.clamp(max=max(old_size - 1, 0))
            prev_tokens = window.tokens.gather(1, prev_index)
            prev_probs = gather_window(window.sampling_probs, prev_index)
            coupled = maximal_coupling(prev_tokens, prev_probs, dist)
            redrafted = torch.where(has_prev, coupled, redrafted)
        fresh_tokens, fresh_probs = self._random(batch, size, like=dist)
        if noise is not None:
            fresh_tokens = sample(fresh_probs, noise)
        tokens = torch.where(carried, redrafted, fresh_tokens)
        probs = where(carried, target if self.verify_unfused else dist, fresh_probs)
        sampled = where(carried, dist, fresh_probs) if self.verify_unfused else None
        if self.fresh is not None:
            self.fresh.record(target_probs, num_committed, num_generated, rows)
            if sampled is None and size > 0:  # (an unfused prior keeps random fresh drafts)
                tokens, probs = self.fresh.fill(tokens, probs, ~carried, target_probs[:, old_size], recent,
                                                num_generated, rows, noise)
        new_window = DraftWindow(tokens, probs, sampled, noise)
        if self.init == "repeat-horizon":  # a no-op where every slot was carried (no device read to check)
            new_window = self._apply_horizon(new_window, ~carried, recent, num_generated)
        return self._force_structure(new_window, positions)
