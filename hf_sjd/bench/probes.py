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
* ``siblings``: what sibling drafts would add (the tree lead: several candidates for a window slot in the same
  forward, verified by recursive rejection sampling). Exact verification runs unchanged; for each (row,
  forward) the wrapper computes, from this forward's p and q, the expected extra tokens had each slot also
  carried ``m`` i.i.d. siblings drawn from its q (:func:`sibling_gain`). ``counts = [gain at slot 0 for m = 1,
  3, 7, gain at every slot for m = 1, 3, P(first slot rejected), (row, forward) pairs]`` (sums over the pairs).
* ``cuda-7b``: no instrument; for the block the cost model prices every model as a 7B decoder on a CUDA device
  (:func:`hf_sjd.jacobi.cost_model.priced_as`), so a CPU run takes the ``"auto"`` picks and plans such a model
  would get on a GPU. The tokens are the reference model's; only which cells run changes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..jacobi.distributions import to_dense

PRIOR_NAME, VERIFIER_NAME, SIBLINGS_NAME = "bench-vp-probe", "bench-growth-probe", "bench-siblings-probe"
SIBLINGS = (1, 3, 7)  # siblings per slot the probe prices


def sibling_gain(accept_prob: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 siblings: int) -> torch.Tensor:
    r"""[b, L] expected extra tokens per slot had slot j carried ``siblings`` more drafts, i.i.d. from its q.

    Recursive rejection sampling (SpecInfer, Miao et al. 2024; SpecTr, Sun et al. 2023) after the main draft's
    rejection verifies sibling i against :math:`r_i` (:math:`r_1 = \mathrm{norm}(\max(p - q, 0))`, then
    :math:`r_{i+1} = \mathrm{norm}(\max(r_i - q, 0))`) and accepts it with probability :math:`\sum_v \min(q, r_i)`:
    lossless. A sibling accepted at slot j commits itself and a token from p after it (the tree forward computed
    that distribution): one token more than the recovered one. So the gain at slot j is P(first rejection at j)
    x P(some sibling accepted), with P(first rejection at j) from this forward's realised acceptance
    probabilities ``accept_prob`` [b, L]; q, p [b, L, V] dense.

    >>> q = torch.tensor([[[0.5, 0.5, 0.0]]]); p = torch.tensor([[[0.0, 0.5, 0.5]]])
    >>> sibling_gain(torch.tensor([[0.0]]), q, p, siblings=1)  # r_1 = token 2, which q never draws
    tensor([[0.]])
    >>> q = torch.tensor([[[0.25, 0.25, 0.5]]]); p = torch.tensor([[[0.5, 0.0, 0.5]]])
    >>> sibling_gain(torch.tensor([[0.5]]), q, p, siblings=1)  # r_1 = token 0: P(rej) 0.5 x min(q, r_1) 0.25
    tensor([[0.1250]])
    """
    reach = torch.cumprod(torch.cat([torch.ones_like(accept_prob[:, :1]), accept_prob[:, :-1]], 1), 1)  # [b, L]
    residual, missed = _normalised((target_probs - draft_probs).clamp_min(0)), torch.ones_like(accept_prob)
    for _ in range(siblings):  # each sibling against the running residual
        missed = missed * (1 - torch.minimum(draft_probs, residual).sum(-1))
        residual = _normalised((residual - draft_probs).clamp_min(0))
    return reach * (1 - accept_prob) * (1 - missed)


def _normalised(weights: torch.Tensor) -> torch.Tensor:
    return weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)


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

    class SiblingsVerifier(hf_sjd.SpeculativeVerifier):
        """Exact verification that also prices sibling drafts at every slot (:func:`sibling_gain`)."""

        def __call__(self, drafts, draft_probs, target_probs, uniforms):
            result = super().__call__(drafts, draft_probs, target_probs, uniforms)
            if drafts.shape[1]:
                q, p = to_dense(draft_probs).double(), to_dense(target_probs).double()  # [b, L, V]
                accept = self.acceptance_probs(drafts, q, p)
                gains = [sibling_gain(accept, q, p, m) for m in SIBLINGS]
                state.add([*(float(g[:, 0].sum()) for g in gains), *(float(g.sum()) for g in gains[:2]),
                           float((1 - accept[:, 0]).sum()), drafts.shape[0]])
            return result

    return ProbedPrior, GrowthVerifier, SiblingsVerifier


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
        from ..jacobi.cost_model import priced_as
        from .measurements import MODEL_SIZES

        with priced_as(next(shape for size, shape in MODEL_SIZES.items() if size.startswith("7B"))):
            yield state
        return
    import hf_sjd

    prior, growth, siblings = _classes(state, grow=name == "growth")
    entries = {"growth": [(hf_sjd.DRAFT_PRIORS, PRIOR_NAME, prior), (hf_sjd.VERIFIERS, VERIFIER_NAME, growth)],
               "prior-cost": [(hf_sjd.DRAFT_PRIORS, PRIOR_NAME, prior)],
               "siblings": [(hf_sjd.VERIFIERS, SIBLINGS_NAME, siblings)]}[name]
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
PROBES = ("growth", "prior-cost", "siblings", "cuda-7b")
