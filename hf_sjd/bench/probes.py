"""Probes: instruments plugged into the decoding loop through the registries, for the length of one block.

    with probe("growth") as p:     # registers DRAFT_PRIORS["bench-vp-probe"], VERIFIERS["bench-growth-probe"]
        model.generate(..., draft_prior="bench-vp-probe", verifier="bench-growth-probe")
    p.counts                       # [grew & accepted, grew & verified, accepted, verified] over the block
    # here the registries hold exactly what they held before

Invariant: a probe leaves nothing registered after its block (also when the block raises), and restores any
entry it shadowed. ``probe(None)`` is a no-op with ``counts = None``.

* ``growth``: the SJD-VP paper's growth statistic. The prior (run at strength 0, so sampling is unchanged)
  records which tokens grew over the last N observations; the verifier wrapper counts, among verified
  drafts, those that grew, were accepted, or both.
* ``prior-cost``: wall time spent inside the verification-prediction prior (``counts = [seconds, calls]``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

PRIOR_NAME, VERIFIER_NAME = "bench-vp-probe", "bench-growth-probe"


@dataclass
class ProbeState:
    counts: list | None = None
    prior: object = None

    def add(self, values: list) -> None:
        self.counts = list(values) if self.counts is None else [a + b for a, b in zip(self.counts, values)]


def _classes(state: ProbeState, grow: bool):
    import hf_sjd
    from hf_sjd.jacobi.priors import VerificationPredictionPrior

    class ProbedPrior(VerificationPredictionPrior):
        @classmethod
        def from_config(cls, config, adapter, draft_ids, options):
            state.prior = super().from_config(config, adapter, draft_ids, options)
            return state.prior

        def __call__(self, input_ids, scores, positions, rows, carried):
            start = time.perf_counter()
            out = super().__call__(input_ids, scores, positions=positions, rows=rows, carried=carried)
            if not grow:
                state.add([time.perf_counter() - start, 1])
            return out

    class GrowthVerifier(hf_sjd.SpeculativeVerifier):
        """Exact verification that also counts which verified drafts grew (from the prior's last call)."""

        def __call__(self, drafts, draft_probs, target_probs, uniforms):
            result = super().__call__(drafts, draft_probs, target_probs, uniforms)
            prior = state.prior
            growth = getattr(prior, "last_growth", None)
            if growth is not None and growth.shape[0] == drafts.numel():  # [batch * window, vocab]
                grew = growth.view(*drafts.shape, -1).gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [batch, window]
                slot = torch.arange(drafts.shape[1], device=drafts.device)
                verified = slot <= result.num_accepted[:, None]
                accepted = slot < result.num_accepted[:, None]
                state.add([int((grew & accepted).sum()), int((grew & verified).sum()), int(accepted.sum()),
                           int(verified.sum())])
            return result

    return ProbedPrior, GrowthVerifier


@contextlib.contextmanager
def probe(name: str | None) -> Iterator[ProbeState]:
    """Register the probe's components for the block, then restore the registries exactly."""
    state = ProbeState()
    if name is None:
        yield state
        return
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; probes: {', '.join(PROBES)}")
    import hf_sjd

    prior, verifier = _classes(state, grow=name == "growth")
    entries = [(hf_sjd.DRAFT_PRIORS, PRIOR_NAME, prior)]
    if name == "growth":
        entries.append((hf_sjd.VERIFIERS, VERIFIER_NAME, verifier))
    saved = [(registry, key, registry.get(key, _MISSING)) for registry, key, _ in entries]
    try:
        for registry, key, value in entries:
            registry[key] = value
        yield state
    finally:
        for registry, key, old in saved:
            if old is _MISSING:
                registry.pop(key, None)
            else:
                registry[key] = old


_MISSING = object()
PROBES = ("growth", "prior-cost")
