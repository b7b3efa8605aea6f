"""Verifiers: decide how many drafts of a Jacobi window are committed, and what to resample after them.

Every verifier sees one window per row, fully batched::

    drafts        [batch, window]          the drafted tokens d_1..d_L
    draft_probs   [batch, window, vocab]   q_i, the distribution d_i was *actually* sampled from
    target_probs  [batch, window, vocab]   p_i, the processed target at position i, given d_1..d_{i-1}
    uniforms      [batch, window]          u_i ~ U[0, 1), one per draft

(dense, or :class:`~hf_sjd.jacobi.distributions.SparseProbs` if the verifier sets ``sparse_ready``) and returns a
:class:`VerificationResult`. A verifier states each draft's acceptance probability and the residual at a rejection;
the accept walk is :meth:`Verifier.__call__`, which a verifier that decides otherwise overrides (``block``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..distributions import Probs, gather_window, residual_distribution, token_probs


@dataclass
class VerificationResult:
    num_accepted: torch.Tensor  # [batch] long, leading drafts accepted (0..window)
    residual_probs: torch.Tensor  # [batch, vocab] distribution of the recovered token (ignored if all accepted)


def first_rejection(accepted: torch.Tensor) -> torch.Tensor:
    """``accepted`` [batch, window] bool -> number of leading ``True`` per row [batch]."""
    return accepted.long().cumprod(dim=-1).sum(dim=-1)


def gather_tokens(probs: Probs, tokens: torch.Tensor) -> torch.Tensor:
    """``probs`` [batch, window, vocab], ``tokens`` [batch, window] -> probability of each token [batch, window]."""
    return token_probs(probs, tokens.unsqueeze(-1)).squeeze(-1)


def accept_ratio(numerator: torch.Tensor, q_draft: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """min(1, ``numerator`` / q(d)), 0 where p(d) = 0: a draft outside the processors' support is never accepted."""
    # q(d) itself however small (a floor would misread a denormal q); a q(d) of 0 is read as the smallest normal
    q_draft = torch.where(q_draft > 0, q_draft, torch.finfo(q_draft.dtype).tiny)
    accept_prob = (numerator / q_draft).clamp(max=1.0)
    return torch.where(p_draft > 0, accept_prob, torch.zeros_like(accept_prob))


def at_position(probs: Probs, index: torch.Tensor) -> Probs:
    """``probs`` [batch, window, vocab], ``index`` [batch] -> ``probs[b, index[b]]`` [batch, vocab] (one gather per
    tensor, no row index to build)."""
    return gather_window(probs, index[:, None])[:, 0]


class Verifier:
    """Base class: subclasses implement :meth:`acceptance_probs` and may override :meth:`residual_at`."""

    sparse_ready = False  # works on SparseProbs as well as dense tensors
    # a rejected first slot resamples from norm(max(p - q, 0)), so siblings verify by recursion (verify_siblings)
    siblings_ready = False
    # the accepted count reads drafts after the first rejected one: given the commit, those drafts no longer follow
    # their q, so a coupling that keeps them (draft_coupling "maximal", "gumbel") would not be exact
    reads_past_rejection = False

    def acceptance_probs(self, drafts: torch.Tensor, draft_probs: torch.Tensor,
                         target_probs: torch.Tensor) -> torch.Tensor:
        """``accept_prob`` [batch, window] in [0, 1]: draft i is accepted iff ``u_i <= accept_prob_i`` (and > 0)."""
        raise NotImplementedError(f"{type(self).__name__} must implement acceptance_probs(drafts, draft_probs, "
                                  f"target_probs) -> [batch, window] (see hf_sjd.Verifier)")

    def residual_at(self, drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                    position: torch.Tensor) -> torch.Tensor:
        """What the first rejection ``position`` [batch] resamples from: by default norm(max(p - q, 0)) there."""
        return residual_distribution(at_position(target_probs, position), at_position(draft_probs, position))

    def __call__(self, drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 uniforms: torch.Tensor) -> VerificationResult:
        accept_prob = self.acceptance_probs(drafts, draft_probs, target_probs)  # [batch, window]
        accepted = (uniforms <= accept_prob) & (accept_prob > 0)
        num_accepted = first_rejection(accepted)  # [batch]
        residual = self.residual_at(drafts, draft_probs, target_probs, num_accepted.clamp(max=drafts.shape[1] - 1))
        return VerificationResult(num_accepted=num_accepted, residual_probs=residual)
