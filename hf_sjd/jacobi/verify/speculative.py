"""Exact speculative-sampling verification: the lossless verifier of SJD and MC-SJD."""

from __future__ import annotations

import torch

from ..distributions import Probs, residual_distribution, token_probs, where
from .base import Verifier, gather_tokens


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

    sparse_ready = True
    siblings_ready = True  # the first slot's residual is norm(max(p - q, 0)): siblings verify by recursion

    def acceptance_probs(self, drafts: torch.Tensor, draft_probs: torch.Tensor,
                         target_probs: torch.Tensor) -> torch.Tensor:
        """``accept_prob`` [batch, window] = min(1, p(d) / q(d)); 0 where p(d) = 0."""
        p_draft = gather_tokens(target_probs, drafts)
        q_draft = gather_tokens(draft_probs, drafts)
        accept_prob = (p_draft / q_draft.clamp_min(torch.finfo(q_draft.dtype).tiny)).clamp(max=1.0)
        return torch.where(p_draft > 0, accept_prob, torch.zeros_like(accept_prob))


def verify_siblings(residual: Probs, draft_probs: Probs, siblings: torch.Tensor, uniforms: torch.Tensor,
                    trying: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Probs]:
    r"""Recursive rejection sampling of the first slot's siblings, after its main draft was rejected.

    ::

        residual   [batch, vocab]   r_1 = norm(max(p - q, 0)) at the first slot (the main draft's residual)
        draft_probs [batch, vocab]  q, which the main draft and every sibling were drawn from, independently
        siblings   [batch, m]       s_1..s_m ~ q i.i.d.
        uniforms   [batch, m]       one per sibling
        trying     [batch] bool     rows whose main draft at the first slot was rejected

    Sibling i is accepted iff :math:`u_i \le \min(1, r_i(s_i) / q(s_i))`; on its rejection
    :math:`r_{i+1} = \mathrm{norm}(\max(r_i - q, 0))`. The committed token then follows p exactly, as with one
    draft (SpecTr, Sun et al. 2023; SpecInfer, Miao et al. 2024): a row that no sibling rescues resamples from
    the last residual, not from r_1. Returns (rescued [batch] bool, the accepted sibling's index [batch], the
    residual [batch, vocab] to resample from where not rescued). A Python loop over the m siblings: each one's
    residual is the previous one's, so they are sequential by construction (m is small).

    Example::

        >>> r1 = torch.tensor([[0.0, 1.0, 0.0]]); q = torch.tensor([[0.5, 0.25, 0.25]])
        >>> rescued, index, last = verify_siblings(r1, q, torch.tensor([[0, 1]]), torch.tensor([[0.1, 0.1]]),
        ...                                        torch.tensor([True]))
        >>> rescued, index  # s_1 = 0: r_1(0) = 0, rejected; s_2 = 1: ratio r_2(1) / q(1) = 1 / 0.25, accepted
        (tensor([True]), tensor([1]))
    """
    batch = siblings.shape[0]
    rescued = torch.zeros(batch, dtype=torch.bool, device=siblings.device)
    index = torch.zeros(batch, dtype=torch.long, device=siblings.device)
    for i in range(siblings.shape[1]):
        sibling = siblings[:, i:i + 1]
        ratio = (token_probs(residual, sibling) / token_probs(draft_probs, sibling).clamp_min(torch.finfo(
            uniforms.dtype).tiny)).squeeze(-1)  # [batch]
        accept = trying & ~rescued & (uniforms[:, i] <= ratio) & (ratio > 0)
        index = torch.where(accept, i, index)
        rescued = rescued | accept
        residual = where(trying & ~rescued, residual_distribution(residual, draft_probs), residual)
    return rescued, index, residual
