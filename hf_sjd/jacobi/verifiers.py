"""Verifiers: decide how many drafts of a Jacobi window are committed, and what to resample after them.

Every verifier sees one window per row, fully batched::

    drafts        [batch, window]          the drafted tokens d_1..d_L
    draft_probs   [batch, window, vocab]   q_i, the distribution d_i was *actually* sampled from
    target_probs  [batch, window, vocab]   p_i, the model's distribution at position i (after processors),
                                           given the prefix and d_1..d_{i-1}
    uniforms      [batch, window]          u_i ~ U[0, 1), one per draft

and returns a :class:`VerificationResult`: the number of leading drafts accepted per row, and the
distribution the first rejected position is resampled from (its token is the *recovered* token). When
a whole window is accepted the loop draws a *bonus* token from the next position's distribution instead.

A verifier states two things (:class:`Verifier`): the acceptance probability of every draft, and the
distribution a rejected position is resampled from; the accept walk (accept while ``u_i <= a_i``, stop at
the first rejection) is written once, in :meth:`Verifier.__call__`. Adding a verifier is one class here
(or anywhere) plus one line in :data:`hf_sjd.jacobi.registry.VERIFIERS`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VerificationResult:
    num_accepted: torch.Tensor  # [batch] long, leading drafts accepted (0..window)
    residual_probs: torch.Tensor  # [batch, vocab] distribution of the recovered token (ignored if all accepted)


def first_rejection(accepted: torch.Tensor) -> torch.Tensor:
    """``accepted`` [batch, window] bool -> number of leading ``True`` per row [batch]."""
    return accepted.long().cumprod(dim=-1).sum(dim=-1)


def gather_tokens(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs`` [batch, window, vocab], ``tokens`` [batch, window] -> probability of each token [batch, window]."""
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def at_position(probs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``probs`` [batch, window, vocab], ``index`` [batch] -> ``probs[b, index[b]]`` [batch, vocab]."""
    return probs[torch.arange(probs.shape[0], device=probs.device), index]


def residual_distribution(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) row-wise; falls back to p where p == q (rejection then has probability 0)."""
    residual = (target - draft).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), target)


class Verifier:
    """Base class: subclasses implement :meth:`acceptance_probs` and may override :meth:`residual_at`.

    :meth:`__call__` walks the window with them; verifiers that compose others (phrase verification over a
    per-token ``pv_base_verifier``) call the two methods directly. State, if any, is per ``generate`` call.
    """

    def acceptance_probs(self, drafts: torch.Tensor, draft_probs: torch.Tensor,
                         target_probs: torch.Tensor) -> torch.Tensor:
        """``accept_prob`` [batch, window] in [0, 1]: draft i is accepted iff ``u_i <= accept_prob_i`` (and > 0)."""
        raise NotImplementedError(f"{type(self).__name__} must implement acceptance_probs(drafts, draft_probs, "
                                  f"target_probs) -> [batch, window] (see hf_sjd.Verifier)")

    def residual_at(self, drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                    position: torch.Tensor) -> torch.Tensor:
        """The distribution [batch, vocab] resampled from when ``position`` [batch] is the first rejection;
        by default norm(max(p - q, 0)) there."""
        return residual_distribution(at_position(target_probs, position), at_position(draft_probs, position))

    def __call__(self, drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 uniforms: torch.Tensor) -> VerificationResult:
        accept_prob = self.acceptance_probs(drafts, draft_probs, target_probs)  # [batch, window]
        accepted = (uniforms <= accept_prob) & (accept_prob > 0)
        num_accepted = first_rejection(accepted)  # [batch]
        residual = self.residual_at(drafts, draft_probs, target_probs, num_accepted.clamp(max=drafts.shape[1] - 1))
        return VerificationResult(num_accepted=num_accepted, residual_probs=residual)


class SpeculativeVerifier(Verifier):
    r"""Exact speculative-sampling verification (lossless).

    Accept draft :math:`d_i` iff :math:`u_i \le \min(1, p_i(d_i) / q_i(d_i))` and every earlier draft was
    accepted; resample the first rejected position from :math:`\mathrm{norm}(\max(p_i - q_i, 0))`.
    The committed tokens then follow the target distribution exactly (Leviathan et al. 2023; Chen et al.
    2023), which is what makes Speculative Jacobi Decoding lossless (Teng et al. 2024, "Accelerating
    Auto-regressive Text-to-Image Generation with Training-free Speculative Jacobi Decoding",
    arXiv 2410.01699). A draft with :math:`p_i(d_i) = 0` (outside the processors' support) is always rejected.

    Example::

        >>> import torch
        >>> from hf_sjd import SpeculativeVerifier
        >>> p = torch.tensor([[[0.5, 0.5, 0.0], [0.1, 0.9, 0.0]]])  # [batch=1, window=2, vocab=3]
        >>> q = torch.tensor([[[0.25, 0.75, 0.0], [1.0, 0.0, 0.0]]])
        >>> result = SpeculativeVerifier()(torch.tensor([[0, 0]]), q, p, torch.tensor([[0.9, 0.5]]))
        >>> result.num_accepted  # d_1: ratio 2 -> accepted; d_2: ratio 0.1 < 0.5 -> rejected
        tensor([1])
        >>> result.residual_probs  # norm(max(p_2 - q_2, 0)) = token 1
        tensor([[0., 1., 0.]])
    """

    def acceptance_probs(self, drafts: torch.Tensor, draft_probs: torch.Tensor,
                         target_probs: torch.Tensor) -> torch.Tensor:
        """``accept_prob`` [batch, window] = min(1, p(d) / q(d)); 0 where p(d) = 0."""
        p_draft = gather_tokens(target_probs, drafts)
        q_draft = gather_tokens(draft_probs, drafts)
        accept_prob = (p_draft / q_draft.clamp_min(torch.finfo(q_draft.dtype).tiny)).clamp(max=1.0)
        return torch.where(p_draft > 0, accept_prob, torch.zeros_like(accept_prob))

