"""Draft priors (``draft_prior=``, :data:`hf_sjd.jacobi.registry.DRAFT_PRIORS`): ``LogitsProcessor``s over the
redraft distributions, called on flat rows with ``positions`` (generated index), ``rows`` (original batch row) and
``carried`` (False: a fresh slot, no distribution yet). What a prior returns is what drafts are sampled from, and
the ``q`` verification divides by (lossless) unless it sets ``verify_unfused``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import LogitsProcessor

from ..checks import check_choice, check_float, check_int
from .options import ComponentOptions

VP_VERIFY_MODES = ("lossless", "paper")
# Floor for log(p) and log(p_bar): the raw log gain of a token that comes from zero is then large but finite.
LOG_FLOOR = 1e-12


@dataclass
class VPOptions(ComponentOptions):
    """The prior's knobs (``vp_*``): the paper's N = 3, strength 1, the log gain bounded to [0, 1]."""

    PREFIX: ClassVar[str] = "vp_"
    growth_steps: int = 3  # N consecutive increases for the growth mask
    strength: float = 1.0  # fusion strength
    beta: float = 0.5  # EWA weight of the baseline
    max_gain: float | None = 1.0  # clip the log gain to [0, max_gain] (None: the paper's unbounded gain)
    verify: str = "lossless"  # "lossless": q = the fused p'; "paper": verified with the unfused p (biased)

    def validate(self) -> "VPOptions":
        return VPOptions(
            growth_steps=check_int("vp_growth_steps", self.growth_steps, minimum=1),
            strength=check_float("vp_strength", self.strength, minimum=0.0),
            beta=check_float("vp_beta", self.beta, minimum=0.0, maximum=1.0, low_open=True, high_open=True),
            max_gain=check_float("vp_max_gain", self.max_gain, minimum=0.0, low_open=True, allow_none=True),
            verify=check_choice("vp_verify", self.verify, VP_VERIFY_MODES))


class VerificationPredictionPrior(LogitsProcessor):
    r"""SJD-VP verification prior (arXiv 2603.27115). For a position observed in consecutive
    iterations with distributions :math:`p_1, \dots, p_t`::

        baseline   p_bar_t = beta p_bar_{t-1} + (1 - beta) p_{t-1},  p_bar_2 = p_1
        log gain   S_t(x) = log p_t(x) - log p_bar_t(x), clipped to [0, max_gain] (None: unbounded, the paper's)
        growth     M_t(x) = 1 iff p_t(x) > p_{t-1}(x) > ... > p_{t-N}(x)   (N = growth_steps)
        fusion     log p'_t(x) = log p_t(x) + strength M_t(x) S_t(x), renormalised

    Drafts are sampled from :math:`p'`, which ``verify="lossless"`` also verifies with (exact); ``verify="paper"``
    verifies with the unfused :math:`p`, which biases the output. The paper fuses its Top-K candidates; this fuses
    the whole support of :math:`p`, the same set under a top-k warper of its K. History: a ring of ``window + 1``
    slots per row (slot = position mod (window + 1)).

        >>> prior = VerificationPredictionPrior(window=4, growth_steps=1, strength=1.0, beta=0.5)
        >>> at = dict(positions=torch.tensor([3]), rows=torch.tensor([0]), carried=torch.tensor([True]))
        >>> _ = prior(None, torch.tensor([[0.5, 0.5]]).log(), **at)       # first observation: unchanged
        >>> prior(None, torch.tensor([[0.6, 0.4]]).log(), **at).softmax(-1)  # token 0 grew: x (0.6 / 0.5)
        tensor([[0.6429, 0.3571]])
    """

    options_class = VPOptions

    def __init__(self, window: int, growth_steps: int = 3, strength: float = 1.0, beta: float = 0.5,
                 max_gain: float | None = 1.0, verify: str = "lossless", batch: int | None = None) -> None:
        """``batch``: the call's rows (history for all of them from the first call; ``None``: grown to the highest
        row seen, a device read per call)."""
        options = VPOptions(growth_steps, strength, beta, max_gain, verify).validate()
        self.num_slots = check_int("jacobi_window", window, minimum=0) + 1
        self.batch = check_int("batch", batch, minimum=1, allow_none=True)
        self.growth_steps, self.strength, self.beta = options.growth_steps, options.strength, options.beta
        self.max_gain = options.max_gain
        # past distributions kept per slot: a position is observed at most window times (num_slots - 1), so a
        # growth_steps beyond that never fires and needs no history (where "auto" picks a narrow window)
        self.depth = min(self.growth_steps, self.num_slots)
        self.verify_unfused = options.verify == "paper"
        self.history: torch.Tensor | None = None  # [rows, slots, depth, vocab] past p, oldest first
        self.baseline: torch.Tensor | None = None  # [rows, slots, vocab] p_bar
        self.num_seen: torch.Tensor | None = None  # [rows, slots] observations of the slot's position
        self.slot_position: torch.Tensor | None = None  # [rows, slots] position the slot holds (-1: none)
        self.last_growth: torch.Tensor | None = None  # [n, vocab] M_t of the last call (diagnostics)

    @classmethod
    def from_config(cls, config, adapter, draft_ids, options: VPOptions) -> "VerificationPredictionPrior":
        return cls(config.widest, batch=config.rows, **dataclasses.asdict(options))

    def _allocate(self, rows: torch.Tensor, scores: torch.Tensor) -> None:
        """Room for the call's rows (or rows ``0 .. max(rows)``); existing histories are kept when more appear."""
        have = 0 if self.history is None else self.history.shape[0]
        if self.batch is not None and have:
            return
        needed = self.batch or int(rows.max()) + 1
        if needed <= have:
            return
        vocab, device, extra = scores.shape[-1], scores.device, needed - have
        grown = (torch.zeros(extra, self.num_slots, self.depth, vocab, device=device),
                 torch.zeros(extra, self.num_slots, vocab, device=device),
                 torch.zeros(extra, self.num_slots, dtype=torch.long, device=device),
                 torch.full((extra, self.num_slots), -1, dtype=torch.long, device=device))
        if have:
            grown = tuple(torch.cat([old, new]) for old, new in
                          zip((self.history, self.baseline, self.num_seen, self.slot_position), grown))
        self.history, self.baseline, self.num_seen, self.slot_position = grown

    def growth_mask(self, past: torch.Tensor, probs: torch.Tensor, num_seen: torch.Tensor) -> torch.Tensor:
        """M_t [n, vocab]: ``past`` [n, N, vocab] (oldest first), ``probs`` [n, vocab], ``num_seen`` [n]."""
        chain = torch.cat([past, probs.unsqueeze(1)], dim=1)  # [n, N+1, vocab]
        grew = (chain[:, 1:] > chain[:, :-1]).all(dim=1)
        return grew & (num_seen >= self.growth_steps).unsqueeze(-1)  # N increases need N past observations

    def log_gain(self, probs: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
        """S_t [n, vocab] = log p - log p_bar, clipped to [0, max_gain] in the bounded variant."""
        gain = probs.clamp_min(LOG_FLOOR).log() - baseline.clamp_min(LOG_FLOOR).log()
        return gain.clamp(0.0, self.max_gain) if self.max_gain is not None else gain

    def __call__(self, input_ids: Any, scores: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
                 carried: torch.Tensor) -> torch.Tensor:
        if scores.shape[0] == 0:
            return scores
        self._allocate(rows, scores)
        probs = scores.float().softmax(-1)  # [n, vocab] p_t
        slot = positions % self.num_slots  # [n]
        held, seen = self.slot_position[rows, slot], self.num_seen[rows, slot]  # [n] each, as stored
        num_seen = torch.where(held != positions, 0, seen)  # [n]: 0 where the slot still holds an older position
        past = self.history[rows, slot]  # [n, N, vocab]
        baseline = self.baseline[rows, slot]  # [n, vocab]

        grew = self.growth_mask(past, probs, num_seen) & carried.unsqueeze(-1)  # [n, vocab]
        boost = self.strength * grew * self.log_gain(probs, baseline)  # zero where not grown
        self.last_growth = grew
        fused = torch.where(probs > 0, scores.float() + boost, scores.float())

        # Record this observation for carried slots only (fresh window slots have no distribution yet): a fresh one
        # writes back what it read, so no device read picks the carried ones ((row, slot) pairs are distinct: a
        # row's window positions are consecutive and fewer than the slots)
        keep = ~carried
        self.history[rows, slot] = torch.where(keep[:, None, None], past,
                                               torch.cat([past[:, 1:], probs.unsqueeze(1)], dim=1))
        mean = torch.where((num_seen == 0).unsqueeze(-1), probs, self.beta * baseline + (1 - self.beta) * probs)
        self.baseline[rows, slot] = torch.where(keep.unsqueeze(-1), baseline, mean)
        self.num_seen[rows, slot] = torch.where(keep, seen, num_seen + 1)
        self.slot_position[rows, slot] = torch.where(keep, held, positions)
        return fused.to(scores.dtype)
