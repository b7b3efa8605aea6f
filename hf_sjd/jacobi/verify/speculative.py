"""Exact speculative-sampling verification: the lossless verifier of SJD and MC-SJD."""

from __future__ import annotations

import torch

from ..distributions import Probs, residual_distribution, token_probs, where, without_token
from .base import Verifier, accept_ratio, gather_tokens


class SpeculativeVerifier(Verifier):
    r"""Exact speculative-sampling verification (lossless; Leviathan et al. 2023, SJD: Teng et al. 2024,
    arXiv 2410.01699): accept :math:`d_i` iff :math:`u_i \le \min(1, p_i(d_i) / q_i(d_i))` and every earlier draft
    was accepted; resample the first rejected position from :math:`\mathrm{norm}(\max(p_i - q_i, 0))`.

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
        return accept_ratio(p_draft, gather_tokens(draft_probs, drafts), p_draft)


def verify_siblings(residual: Probs, law: Probs, first_draft: torch.Tensor, siblings: torch.Tensor,
                    distinct: bool | torch.Tensor, uniforms: torch.Tensor, trying: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, Probs]:
    r"""Recursive rejection sampling of the first slot's siblings, after its main draft was rejected::

        residual    [batch, vocab]  r_1 = norm(max(p - q, 0)) at the first slot
        law         [batch, vocab]  s, what the siblings are drawn from (``jacobi_sibling_law``)
        first_draft [batch]         x, the main draft
        siblings    [batch, m]      s_1..s_m: s_i ~ q_i
        distinct    [batch] bool    rows drawn without replacement: q_i = s with x, s_1..s_{i-1} removed
                                    (else q_i = s); ``True``: every row (fewer ops)
        uniforms    [batch, m]      one per sibling
        trying      [batch] bool    rows whose main draft was rejected

    Sibling i is accepted iff :math:`q_i(s_i) > 0` and :math:`u_i \le r_i(s_i) / q_i(s_i)`, else
    :math:`r_{i+1} = \mathrm{norm}(\max(r_i - q_i, 0))`: speculative sampling of each :math:`r_i`, so the committed
    token follows p exactly (SpecInfer, Miao et al. 2023; Jeon et al. 2024, arXiv 2402.14160). Returns (rescued [batch],
    the accepted sibling's index [batch], the residual to resample from where not rescued).

    Example (without replacement, x = 0 rejected)::

        >>> r1 = torch.tensor([[0.0, 0.0, 1.0]]); q = torch.tensor([[0.5, 0.3, 0.2]])
        >>> rescued, index, last = verify_siblings(r1, q, torch.tensor([0]), torch.tensor([[1, 2]]),
        ...                                        torch.tensor([True]), torch.tensor([[0.1, 0.9]]),
        ...                                        torch.tensor([True]))
        >>> rescued, index  # s_1 = 1: r_1(1) = 0, rejected; s_2 = 2: r_2(2) / q_2(2) = 1 / 1, accepted
        (tensor([True]), tensor([1]))

    """
    batch = siblings.shape[0]
    index = torch.zeros(batch, dtype=torch.long, device=siblings.device)
    open_rows, chain = trying, residual  # rows still looking for a sibling; r_i (every row: only open rows read it)
    proposal = _next_proposal(law, first_draft, distinct)  # q_1
    for i in range(siblings.shape[1]):
        sibling = siblings[:, i:i + 1]
        q_sibling = token_probs(proposal, sibling).squeeze(-1)  # [batch]
        ratio = token_probs(chain, sibling).squeeze(-1) / torch.where(q_sibling > 0, q_sibling, 1.0)
        accept = open_rows & (q_sibling > 0) & (uniforms[:, i] <= ratio) & (ratio > 0)
        index = torch.where(accept, i, index)
        open_rows = open_rows & ~accept
        chain = residual_distribution(chain, proposal)  # r_{i+1}
        if i + 1 < siblings.shape[1]:
            proposal = _next_proposal(proposal, sibling[:, 0], distinct)  # q_{i+1}
    return trying & ~open_rows, index, where(open_rows, chain, residual)


def _next_proposal(proposal: Probs, drawn: torch.Tensor, distinct: bool | torch.Tensor) -> Probs:
    """The law of the next sibling: ``proposal`` without the token just ``drawn`` on the rows ``distinct`` names."""
    removed = without_token(proposal, drawn)
    return removed if distinct is True else where(distinct, removed, proposal)
