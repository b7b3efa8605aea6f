"""Exact speculative-sampling verification: the lossless verifier of SJD and MC-SJD."""

from __future__ import annotations

import torch

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

    def acceptance_probs(self, drafts: torch.Tensor, draft_probs: torch.Tensor,
                         target_probs: torch.Tensor) -> torch.Tensor:
        """``accept_prob`` [batch, window] = min(1, p(d) / q(d)); 0 where p(d) = 0."""
        p_draft = gather_tokens(target_probs, drafts)
        q_draft = gather_tokens(draft_probs, drafts)
        accept_prob = (p_draft / q_draft.clamp_min(torch.finfo(q_draft.dtype).tiny)).clamp(max=1.0)
        return torch.where(p_draft > 0, accept_prob, torch.zeros_like(accept_prob))
