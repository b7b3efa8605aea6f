"""Block verification: the exact verifier that keeps the most drafts of a window (lossless, like ``speculative``)."""

from __future__ import annotations

import torch

from ..constants import offsets
from ..distributions import Probs, normalised_residual, unnormalised_residual
from .base import VerificationResult, Verifier, at_position, gather_tokens


def prefix_weights(p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    r"""``rho`` [batch, window + 1]: :math:`\rho_0 = 1`, :math:`\rho_i = \min(1, \rho_{i-1} p_i(d_i) / q_i(d_i))`.

    ``p_draft``, ``q_draft`` [batch, window]: each draft's target and draft probability. The recursion is a
    reflected random walk in log space, :math:`\log\rho_i = S_i - \max_{j \le i} S_j` with
    :math:`S_i = \sum_{k \le i} \log(p_k(d_k) / q_k(d_k))` and :math:`S_0 = 0`, so it is one ``cumsum`` and one
    ``cummax`` instead of a loop over the window. A draft with :math:`p_i(d_i) = 0` zeroes every later weight.

    >>> prefix_weights(torch.tensor([[0.25, 0.5, 0.0]]), torch.tensor([[0.5, 0.25, 0.5]]))
    tensor([[1.0000, 0.5000, 1.0000, 0.0000]])
    """
    tiny = torch.finfo(p_draft.dtype).tiny
    log_ratio = torch.where(p_draft > 0, (p_draft / q_draft.clamp_min(tiny)).log(), float("-inf"))
    walk = torch.nn.functional.pad(log_ratio.cumsum(-1), (1, 0))  # [batch, window + 1]: S_0 .. S_L
    return (walk - walk.cummax(-1).values).exp()


class BlockVerifier(Verifier):
    r"""Block verification (Sun et al. 2025, "Block Verification Accelerates Speculative Decoding", ICLR 2025,
    arXiv 2403.10444): lossless, and never keeps fewer drafts in expectation than token-by-token verification.

    Token-by-token verification stops at the first draft with :math:`u_i > p_i(d_i)/q_i(d_i)`, even when the
    drafts after it are likely under p. Block verification weighs each prefix of the window as a whole (same
    shapes as :mod:`~hf_sjd.jacobi.verify.base`; positions 1..L, ``target_probs[:, i - 1]`` is :math:`p_i`)::

        rho_0 = 1,  rho_i = min(1, rho_{i-1} p_i(d_i) / q_i(d_i))          weight of the prefix d_1..d_i
        beta_i = sum_x max(rho_i p_{i+1}(x) - q_{i+1}(x), 0)                mass of what may follow it instead
        h_i = beta_i / (beta_i + 1 - rho_i) for i < L,   h_L = rho_L       stop probability at i
        accepted = max {i : u_i <= h_i} (0 if none)
        recovered ~ norm(max(rho_i p_{i+1} - q_{i+1}, 0)) at i = accepted < L;  bonus ~ p_{L+1} at i = L

    A low ratio early no longer ends the window: a later draft that p favours restores the prefix's weight. The
    output follows p whenever :math:`d_i \sim q_i` given the drafts before it (the paper's theorem; the assumption
    token-by-token verification makes too), and the chi-square tests of ``tests/jacobi/verify/test_block.py`` check
    it. The decision reads every draft, so the drafts it leaves no longer follow their q: a coupling that keeps
    them into the next window (``reads_past_rejection``) is refused. With no draft accepted the recovered token
    comes from norm(max(p_1 - q_1, 0)), the token-by-token residual, so siblings of the first draft verify as there.

    Example (p = (1/3, 2/3) and q = (2/3, 1/3) at both slots, u = (0.7, 0.5))::

        >>> from hf_sjd import BlockVerifier, SpeculativeVerifier
        >>> p = torch.tensor([[1 / 3, 2 / 3]]).expand(2, 2, 2); q = p.flip(-1)  # [batch=2, window=2, vocab=2]
        >>> drafts, uniforms = torch.tensor([[0, 1], [0, 0]]), torch.tensor([[0.7, 0.5], [0.7, 0.5]])
        >>> BlockVerifier()(drafts, q, p, uniforms).num_accepted
        tensor([2, 0])
        >>> SpeculativeVerifier()(drafts, q, p, uniforms).num_accepted
        tensor([0, 0])

    Row 0: rho_1 = 0.5 (d_1 = 0 has ratio 1/2, token by token rejected as u_1 = 0.7 > 0.5), rho_2 = min(1, 0.5 x 2)
    = 1 = h_2, so both drafts are accepted. Row 1: rho_2 = 0.25 < u_2, and h_1 = 0 (beta_1 = max(1/6 - 2/3, 0) +
    max(1/3 - 1/3, 0) = 0): nothing is accepted, and the recovered token is drawn from norm(max(p_1 - q_1, 0)).
    """

    sparse_ready = True
    siblings_ready = True  # nothing accepted: the recovered token's law is norm(max(p_1 - q_1, 0)), as token-wise
    reads_past_rejection = True  # h_i reads rho_j for j > i (the whole window decides)

    def __call__(self, drafts: torch.Tensor, draft_probs: Probs, target_probs: Probs,
                 uniforms: torch.Tensor) -> VerificationResult:
        size = drafts.shape[1]
        rho = prefix_weights(gather_tokens(target_probs, drafts), gather_tokens(draft_probs, drafts))  # [b, L + 1]
        # slot i (0-based) holds max(rho_i p_{i+1} - q_{i+1}, 0): what may replace draft i + 1 after an accepted
        # prefix of i drafts
        residuals = unnormalised_residual(target_probs, draft_probs, rho[:, :-1])  # [b, L, K or vocab]
        beta = residuals.sum(-1)  # [b, L]: beta_0 .. beta_{L-1}
        # (beta_i + 1 - rho_i) is the probability of reaching prefix i undecided: 0 only where no later stop can
        # fail, so a 0 / 0 there is never read in exact arithmetic (1: stop, should rounding get there)
        undecided = beta + 1 - rho[:, :-1]
        stop_prob = torch.where(undecided > 0, beta / torch.where(undecided > 0, undecided, 1.0), 1.0)
        stop_prob = torch.cat([stop_prob[:, 1:], rho[:, -1:]], dim=1)  # [b, L]: h_1 .. h_L
        stops = (uniforms <= stop_prob) & (stop_prob > 0)
        num_accepted = (stops * offsets(size + 1, drafts.device)[1:]).amax(-1)  # [b]: the last stop's 1 .. L
        position = num_accepted.clamp(max=size - 1)
        return VerificationResult(num_accepted, normalised_residual(at_position(residuals, position),
                                                                    at_position(target_probs, position)))

