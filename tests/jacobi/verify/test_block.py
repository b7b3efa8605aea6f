"""Block verification (``verifier="block"``) is lossless and keeps at least as many drafts as token by token.

What is specified, and at which sample size:
- **One window, 200,000 direct draws.** Drafts d_i ~ q_i as SJD drafts them (q_i fixed before the forward), p_i from
  a random enumerable target over 4 tokens, window 2; the verifier commits its prefix and one token, and the rest
  of the 3 tokens is sampled from p. The 64 sequences must follow p exactly (chi-square, level 1e-3; 7 bins expect
  fewer than 5 draws and are pooled), so a correct sampler passes with probability 0.999, and the plausible
  mistake, resampling from the token-wise residual norm(max(p - q, 0)) instead of the weighted
  norm(max(rho p - q, 0)), is rejected at p < 1e-6 (over 3 tokens this sample size did not detect it, which is why
  the target has 4). The mean number accepted equals its exact value sum_i E[rho_i] within 4 standard errors (and
  token by token's sum_i E[prod_j min(1, r_j)] on the same draws), and block verification keeps more: 0.898
  against 0.881 drafts per window exactly, beyond 4 standard errors of the paired draws.
- **In the loop** (the chi-square of ``test_frontier_exactness.py``: 6000 rows, top-3 toy model, 5 tokens): with
  independent, maximal and Gumbel coupling, random and target-derived fresh drafts, CFG, dense distributions,
  siblings of the first draft and the SJD-VP draft prior.
"""

import collections
import doctest
import itertools

import pytest
import torch

import hf_sjd
from hf_sjd.jacobi.distributions import residual_distribution, sample
from hf_sjd.jacobi.verify import SpeculativeVerifier
from hf_sjd.jacobi.verify import block as block_module
from hf_sjd.jacobi.verify.base import at_position
from hf_sjd.jacobi.verify.block import BlockVerifier, prefix_weights
from enumerable import VOCAB, WINDOW, draft_laws, exact_law, target_after, target_table
from toy import COND, NULL, chi_square_pvalue, syncs_between_forwards

DRAWS = 200_000


def test_doctests():
    assert doctest.testmod(block_module).failed == 0


def test_prefix_weights_are_the_recursion_and_never_below_token_by_token():
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(64, 12, generator=gen) * (torch.rand(64, 12, generator=gen) > 0.1)  # some p(d) = 0
    q = torch.rand(64, 12, generator=gen) + 0.01
    weights = [torch.ones(64)]
    for i in range(12):
        weights.append(torch.clamp(weights[-1] * p[:, i] / q[:, i], max=1.0))
    rho = prefix_weights(p, q)
    assert torch.allclose(rho, torch.stack(weights, 1), atol=1e-5)
    token_by_token = token_by_token_weights(p, q)
    assert (rho >= token_by_token - 1e-6).all() and (rho > token_by_token + 1e-3).any()


def one_window(verifier, table, q, weighted_residual: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """DRAWS windows verified once, then completed to WINDOW + 1 tokens from p: (sequences [N, L + 1], accepted [N])."""
    torch.manual_seed(2)
    drafts = torch.multinomial(q, DRAWS, replacement=True).T  # [N, L]
    target = torch.stack([target_after(table, drafts[:, :i]) for i in range(WINDOW)], 1)  # [N, L, V]
    result = verifier(drafts, q.expand(DRAWS, -1, -1), target, torch.rand(DRAWS, WINDOW))
    accepted = result.num_accepted
    residual = result.residual_probs
    if not weighted_residual:  # the control: the token-wise residual after block verification's decision
        position = accepted.clamp(max=WINDOW - 1)
        residual = residual_distribution(at_position(target, position), q[position])
    committed = torch.where(accepted == WINDOW, sample(target_after(table, drafts)), sample(residual))
    sequences = torch.cat([drafts, drafts[:, :1]], 1).scatter(1, accepted[:, None], committed[:, None])
    for i in range(1, WINDOW + 1):  # complete each row from p after its committed prefix
        sequences[:, i] = torch.where(accepted < i, sample(target_after(table, sequences[:, :i])), sequences[:, i])
    return sequences, accepted


def expected_accepted(table, q, weights) -> float:
    """sum_i E[w_i(d_1..d_i)] over d ~ q, exactly: ``weights`` maps (p_draft, q_draft) [1, L] -> [1, L + 1]."""
    total = 0.0
    for drafts in itertools.product(range(VOCAB), repeat=WINDOW):
        tokens = torch.tensor([drafts])
        q_draft = q[torch.arange(WINDOW), tokens[0]][None]  # [1, L]
        p_draft = torch.stack([target_after(table, tokens[:, :i])[0, d] for i, d in enumerate(drafts)])[None]
        total += float(q_draft.prod()) * float(weights(p_draft, q_draft)[0, 1:].sum())
    return total


def token_by_token_weights(p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad((p_draft / q_draft).clamp(max=1.0).cumprod(-1), (1, 0), value=1.0)


def test_one_window_commits_the_target_law_and_keeps_more_than_token_by_token():
    table, q = target_table(), draft_laws()
    rows, accepted = one_window(BlockVerifier(), table, q)
    _, pvalue, impossible = chi_square_pvalue(collections.Counter(map(tuple, rows.tolist())), exact_law(table))
    assert impossible == 0 and pvalue > 1e-3
    _, token_accepted = one_window(SpeculativeVerifier(), table, q)
    for kept, weights in ((accepted, prefix_weights), (token_accepted, token_by_token_weights)):
        mean, se = kept.double().mean(), kept.double().std() / DRAWS ** 0.5
        assert abs(mean - expected_accepted(table, q, weights)) < 4 * se  # P(accepted >= i | d) = w_i
    # never fewer in expectation (the paper's theorem); on this table 0.017 more drafts per window exactly, and the
    # paired draws (same drafts and uniforms) show it beyond 4 standard errors
    assert expected_accepted(table, q, prefix_weights) > expected_accepted(table, q, token_by_token_weights)
    gain = (accepted - token_accepted).double()
    assert gain.mean() > 4 * gain.std() / DRAWS ** 0.5


def test_token_wise_residual_after_a_block_decision_is_detected():
    table, q = target_table(), draft_laws()
    rows, _ = one_window(BlockVerifier(), table, q, weighted_residual=False)
    _, pvalue, _ = chi_square_pvalue(collections.Counter(map(tuple, rows.tolist())), exact_law(table))
    assert pvalue < 1e-6


LOOP_CASES = [  # (strategy, window, guidance, knobs)
    ("sjd", 2, None, {}),
    ("sjd", 3, 3.0, {}),
    # mc-sjd's fresh drafts and siblings; a coupling that keeps drafts is refused with block verification
    ("mc-sjd", 2, None, {"draft_coupling": "independent"}),
    ("mc-sjd", 3, 3.0, {"draft_coupling": "independent", "jacobi_sparse": False}),
    ("mc-sjd", 2, None, {"draft_coupling": "independent", "draft_init": "random", "jacobi_siblings": 2}),
    ("mc-sjd", 2, 3.0, {"draft_coupling": "independent", "jacobi_siblings": 2}),
    ("sjd-vp", 2, None, {"vp_growth_steps": 1}),  # q = the VP prior's fused p' (dense; N = 1 fires at window 2)
]


@pytest.mark.device
@pytest.mark.parametrize("strategy,window,guidance,knobs", LOOP_CASES, ids=str)
def test_block_verification_in_the_loop_is_lossless(model, laws, strategy, window, guidance, knobs):
    torch.manual_seed(5)
    extra = {} if guidance is None else {"guidance_scale": guidance,
                                         "negative_prompt_ids": torch.full((6000, 1), NULL)}
    out = model.generate(torch.full((6000, 1), COND), do_sample=True, top_k=3, max_new_tokens=5,
                         custom_generate=strategy, verifier="block", jacobi_window=window, grid_width=2,
                         return_dict_in_generate=True, **extra, **knobs)
    counts = collections.Counter(tuple(row) for row in out.sequences[:, 1:].tolist())
    _, pvalue, impossible = chi_square_pvalue(counts, laws[guidance])
    assert impossible == 0 and pvalue > 1e-3
    assert out.stats.num_accepted > 6000  # drafts were verified and kept
    if knobs.get("jacobi_siblings"):
        assert out.stats.num_siblings_accepted > 300


def test_block_verification_adds_no_device_read():
    """2 reads per gap in a sparse loop (the commit read, the support check) whichever verifier."""
    block = syncs_between_forwards(verifier="block", draft_coupling="independent", jacobi_sparse=True)
    assert block == syncs_between_forwards(verifier="speculative", draft_coupling="independent",
                                           jacobi_sparse=True) == [2] * 6


def test_phrase_verification_refuses_block_as_its_per_token_verifier(model):
    with pytest.raises(ValueError, match=r"pv_base_verifier='block' decides the window as a whole.*'speculative'"):
        model.generate(torch.full((1, 1), COND), do_sample=True, top_k=3, max_new_tokens=3, custom_generate="sjd-pv",
                       pv_base_verifier="block", phrase_library=None)
    assert "block" in hf_sjd.VERIFIERS
