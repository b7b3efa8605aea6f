"""Probes: instruments plugged into the decoding loop through the public registries, for the length of one block.

    with probe("growth") as p:     # registers DRAFT_PRIORS["bench-vp-probe"], VERIFIERS["bench-growth-probe"]
        model.generate(..., draft_prior="bench-vp-probe", verifier="bench-growth-probe")
    p.counts                       # [grew & accepted, grew & verified, accepted, verified] over the block
    # here the registries hold exactly what they held before

Invariant: a probe leaves nothing registered after its block (also when the block raises), and restores any
entry it shadowed. ``probe(None)`` is a no-op with ``counts = None``. The probes subclass the public component
classes (``hf_sjd.VerificationPredictionPrior``, ``hf_sjd.SpeculativeVerifier``, ``hf_sjd.PhraseVerifier``) and
pass every argument through unchanged, so sampling is the component's own.

* ``growth``: the SJD-VP paper's growth statistic. The prior (run at strength 0, so sampling is unchanged)
  records which tokens grew over the last N observations (its ``last_growth``); the verifier wrapper counts,
  among verified drafts, those that grew, were accepted, or both.
* ``prior-cost``: wall time spent inside the verification-prediction prior (``counts = [seconds, calls]``).
* ``pv-cost``: wall time spent inside the phrase verifier (matching, joint test, walk): ``VERIFIERS["phrase"]``
  is timed for the block (``counts = [seconds, calls]``).
* ``cuda-7b``: no instrument; for the block the cost model prices every model as a 7B decoder on a CUDA device
  (:func:`hf_sjd.jacobi.cost_model.priced_as`), so a CPU run takes the ``"auto"`` picks and plans such a model
  would get on a GPU. The tokens are the reference model's; only which cells run changes.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

PRIOR_NAME, VERIFIER_NAME = "bench-vp-probe", "bench-growth-probe"
PROBES = ("growth", "prior-cost", "pv-cost", "cuda-7b")


@dataclass
class ProbeState:
    counts: list | None = None
    prior: object = None

    def add(self, values: list) -> None:
        self.counts = list(values) if self.counts is None else [a + b for a, b in zip(self.counts, values)]


def _timed(cls, state: ProbeState):
    """``cls`` whose calls add ``[seconds, 1]`` to ``state`` (its call signature kept: transformers' logits
    processor list reads it to pass the keyword arguments a prior takes)."""
    class Timed(cls):
        @functools.wraps(cls.__call__)
        def __call__(self, *args, **kwargs):
            start = time.perf_counter()
            out = super().__call__(*args, **kwargs)
            state.add([time.perf_counter() - start, 1])
            return out

    return Timed


def _growth_classes(state: ProbeState):
    import hf_sjd

    class ProbedPrior(hf_sjd.VerificationPredictionPrior):
        @classmethod
        def from_config(cls, *args, **kwargs):
            state.prior = super().from_config(*args, **kwargs)
            return state.prior

    class GrowthVerifier(hf_sjd.SpeculativeVerifier):
        """Exact verification that also counts which verified drafts grew (from the prior's last call)."""

        def __call__(self, drafts, *args, **kwargs):
            result = super().__call__(drafts, *args, **kwargs)
            growth = getattr(state.prior, "last_growth", None)
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
    if name == "cuda-7b":
        from hf_sjd.jacobi.cost_model import priced_as

        from .suites import SEVEN_B

        with priced_as(SEVEN_B):
            yield state
        return
    import hf_sjd

    if name == "growth":
        prior, verifier = _growth_classes(state)
        entries = [(hf_sjd.DRAFT_PRIORS, PRIOR_NAME, prior), (hf_sjd.VERIFIERS, VERIFIER_NAME, verifier)]
    elif name == "prior-cost":
        entries = [(hf_sjd.DRAFT_PRIORS, PRIOR_NAME, _timed(hf_sjd.VerificationPredictionPrior, state))]
    else:  # pv-cost: the phrase verifier itself, timed
        entries = [(hf_sjd.VERIFIERS, "phrase", _timed(hf_sjd.VERIFIERS["phrase"], state))]
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
