"""Sparse distributions are the dense ones, stored on their support: every operation agrees with its dense
twin, and SJD on sparse p and q keeps the model's exact law, also when an iteration's support does not fit
(ties at the k-th score) and the loop goes dense for it.

Chi-square sample sizes as in test_exactness.py (6000 rows; power ~1 against a TV shift of 0.05).
"""

import collections
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chi2
from transformers import LogitsProcessor, LogitsProcessorList, TopKLogitsWarper

from hf_sjd.jacobi.distributions import (SparseProbs, force_tokens, gather_window, residual_distribution, sample,
                                         same_kind, to_dense, token_probs, where)
from toy import COND, VOCAB, chi_square_pvalue, toy_model

NUM_SAMPLES = 6000


def random_case(batch=3, window=4, vocab=50, k=6, seed=0):
    """Dense and sparse forms of top-k target distributions and of a draft q mixing sparse and uniform slots."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, window, vocab, generator=generator)
    scores = TopKLogitsWarper(k)(None, scores.view(-1, vocab)).view(batch, window, vocab)
    table = torch.zeros(vocab + 1)
    table[: vocab // 2] = 1.0 / (vocab // 2)  # random drafts: uniform over the first half
    target, overflow = SparseProbs.from_scores(scores, 2 * k, table)
    assert not overflow
    uniform_slot = torch.rand(batch, window, generator=generator) < 0.5
    redraft, _ = SparseProbs.from_scores(scores.roll(1, dims=1), 2 * k, table)
    draft = where(uniform_slot, SparseProbs.uniform_draws(batch, window, table, 2 * k), redraft)
    return scores.softmax(-1), target, draft, table


def test_sparse_form_is_the_dense_distribution():
    dense_p, p, q, _ = random_case()
    assert torch.allclose(p.dense(), dense_p, atol=1e-6)
    tokens = torch.randint(0, 50, (3, 4, 7))
    assert torch.allclose(token_probs(p, tokens), dense_p.gather(-1, tokens), atol=1e-6)
    assert torch.allclose(token_probs(q, tokens), q.dense().gather(-1, tokens), atol=1e-6)


def test_residual_force_where_and_window_gather_match_dense():
    dense_p, p, q, _ = random_case(seed=1)
    dense_q = q.dense()
    assert torch.allclose(residual_distribution(p, q).dense(), residual_distribution(dense_p, dense_q), atol=1e-6)
    forced = torch.tensor([[-1, 7, -1, 3], [2, -1, -1, -1], [-1, -1, -1, -1]])
    assert torch.allclose(force_tokens(forced, q).dense(), force_tokens(forced, dense_q), atol=1e-6)
    index = torch.tensor([[3, 0], [1, 1], [2, 3]])
    assert torch.allclose(gather_window(p, index).dense(), gather_window(dense_p, index), atol=1e-6)
    assert all(isinstance(x, torch.Tensor) for x in same_kind(p, dense_q))  # mixed kinds: both dense


def test_sparse_samples_follow_p():
    """5000 draws from a 6-token support: chi-square at level 1e-3 (expected counts >= 300 per token)."""
    dense_p, p, _, _ = random_case(batch=1, window=1, k=6, seed=2)
    torch.manual_seed(0)
    draws = sample(p[torch.zeros(5000, dtype=torch.long), 0])
    law = dense_p[0, 0]
    counts = collections.Counter(draws.tolist())
    assert set(counts) <= set(law.nonzero().flatten().tolist())
    _, pvalue, _ = chi_square_pvalue({(t,): c for t, c in counts.items()},
                                     {(t,): float(law[t]) for t in range(50) if law[t] > 0})
    assert pvalue > 1e-3


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_draws_without_replacement_follow_the_sequential_law(sparse):
    """Ordered pairs from 60,000 rows: P(a, b) = p(a) p(b) / (1 - p(a)), chi-square over the 6 pairs (expected
    counts >= 1700); :func:`without_token` is the next draw's law, dense and sparse alike; a third draw from a
    support of 3 is a placeholder."""
    from hf_sjd.jacobi.distributions import sample_without_replacement, without_token

    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    rows = 60_000
    if sparse:  # the support's last slot is padding (id 4 = vocab_size, probability 0)
        probs = SparseProbs(torch.tensor([0, 1, 2, 4]).expand(rows, -1), p.expand(rows, -1), None, torch.zeros(5))
    else:
        probs = p.expand(rows, -1)
    torch.manual_seed(0)
    tokens, drawn = sample_without_replacement(probs, 4)
    assert drawn[:, :3].all() and not drawn[:, 3].any()
    assert (tokens[:, 0] != tokens[:, 1]).all() and (tokens[:, :3] != 3).all()
    pairs = collections.Counter(map(tuple, tokens[:, :2].tolist()))
    expected = {(a, b): rows * float(p[a] * p[b] / (1 - p[a])) for a in range(3) for b in range(3) if a != b}
    assert set(pairs) == set(expected)
    statistic = sum((pairs[k] - e) ** 2 / e for k, e in expected.items())
    assert chi2.sf(statistic, df=len(expected) - 1) > 1e-3
    rest = without_token(probs, tokens[:, 0])  # the law of the second draw
    dense_rest = to_dense(rest)[:, :3]
    expected_rest = torch.where(torch.arange(3) == tokens[:, :1], 0.0, p[:3] / (1 - p[tokens[:, :1]]))
    assert torch.allclose(dense_rest, expected_rest)


def test_support_larger_than_the_width_is_reported():
    scores = torch.zeros(2, 10)  # all tied: top-k keeps every token
    scores[1, 4:] = float("-inf")
    table = torch.zeros(11)
    _, overflow = SparseProbs.from_scores(scores[1:], 5, table)
    assert not overflow  # 4 finite scores fit 5 slots (a full 5 would be reported: a 6th might exist)
    _, overflow = SparseProbs.from_scores(scores, 5, table)
    assert overflow


def test_top_k_rule_on_the_candidates_is_transformers_top_k():
    """Scores rounded to a coarse grid (as bf16 logits are) tie at the k-th score; ties are kept, as in
    ``TopKLogitsWarper``, while they fit the width, and reported when they may not."""
    generator = torch.Generator().manual_seed(4)
    scores = (torch.randn(64, 40, generator=generator) * 2).round()  # many ties
    table = torch.zeros(41)
    expected = TopKLogitsWarper(5)(None, scores).softmax(-1)
    sparse, overflow = SparseProbs.from_scores(scores, 10, table, top_k=5)
    fits = (expected > 0).sum(-1) < 10
    assert fits.any() and not fits.all()  # both cases occur
    assert overflow
    assert torch.allclose(sparse.dense()[fits], expected[fits], atol=1e-6)
    narrow, overflow = SparseProbs.from_scores(scores[fits], 10, table, top_k=5)
    assert not overflow and torch.allclose(narrow.dense(), expected[fits], atol=1e-6)


class TieAfter(LogitsProcessor):
    """Flattens the scores (every token tied) where the prefix ends in ``token``: top-k then keeps them all."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores):
        return torch.where((input_ids[:, -1] == self.token)[:, None], torch.zeros_like(scores), scores)


@torch.no_grad()
def exact_law(model, processors: LogitsProcessorList, num_new: int = 3) -> dict:
    sequences = torch.tensor(list(itertools.product(range(VOCAB), repeat=num_new)))
    ids = torch.cat([torch.full((len(sequences), 1), COND), sequences], dim=1)
    logits = model(input_ids=ids).logits[:, :num_new].float()
    log_joint = torch.zeros(len(sequences))
    for step in range(num_new):
        probs = processors(ids[:, : step + 1], logits[:, step]).softmax(-1)
        log_joint += probs.gather(1, sequences[:, step:step + 1]).squeeze(1).log()
    return {tuple(seq): float(p) for seq, p in zip(sequences.tolist(), log_joint.exp())}


@pytest.mark.device
@pytest.mark.parametrize("sparse, knobs", [(True, {}), (False, {}),
                                           (True, {"draft_init": "row-above-dist", "grid_width": 2})])
def test_sparse_loop_is_exact_when_ties_overflow_the_width(sparse, knobs):
    """top_k=2 keeps 4 sparse slots of 6 tokens; after the model's favourite first token every token ties, so
    those iterations go dense and the next ones come back to sparse (drafts then carry a dense q into a sparse
    iteration; with ``row-above-dist`` a dense target enters the sparse history as its top entries)."""
    model = toy_model()
    with torch.no_grad():
        favourite = int(model(input_ids=torch.tensor([[COND]])).logits[0, -1].argmax())
    tie = TieAfter(favourite)
    exact = exact_law(model, LogitsProcessorList([tie, TopKLogitsWarper(2)]))
    torch.manual_seed(3)
    out = model.generate(torch.full((NUM_SAMPLES, 1), COND), do_sample=True, top_k=2, max_new_tokens=3,
                         custom_generate="mc-sjd", jacobi_window=2, jacobi_sparse=sparse,
                         logits_processor=LogitsProcessorList([tie]), return_dict_in_generate=True, **knobs)
    counts = collections.Counter(tuple(row) for row in out.sequences[:, 1:].tolist())
    _, pvalue, impossible = chi_square_pvalue(counts, exact)
    assert impossible == 0 and pvalue > 1e-3
    assert out.stats.num_accepted > NUM_SAMPLES / 2
    # the tie case was exercised often: sequences through the tie token
    assert sum(c for seq, c in counts.items() if favourite in seq[:2]) > NUM_SAMPLES / 4


@pytest.mark.parametrize("vocab, reads", [(1024, 1), (4096, 2)])
def test_auto_goes_sparse_only_where_the_support_is_a_sixteenth_of_the_vocabulary(vocab, reads):
    """Top-k 100 keeps 200 support slots: dense at V = 1024 (one read per iteration), sparse at V = 4096 (a second
    read: whether the support fitted)."""
    from toy import syncs_between_forwards

    assert syncs_between_forwards(vocab=vocab) == [reads] * 6


@pytest.mark.parametrize("knobs", [dict(draft_prior="verification-prediction"),
                                   dict(verifier="gsd", draft_coupling="independent")])
def test_the_vp_prior_and_gsd_read_nothing_more(knobs):
    """The SJD-VP prior (its history sized by the call's rows, fresh slots written back) and GSD's rank window
    (built without a bool mask) add no device read to the iteration's one."""
    from toy import syncs_between_forwards

    assert syncs_between_forwards(**knobs) == [1] * 6


def test_jacobi_sparse_takes_a_bool_or_auto():
    from hf_sjd import SJDConfig

    assert SJDConfig().jacobi_sparse == "auto" and SJDConfig(jacobi_sparse=False).jacobi_sparse is False
    assert SJDConfig(jacobi_sparse=np.False_).jacobi_sparse is False  # a numpy bool is a bool
    with pytest.raises(TypeError, match="jacobi_sparse must be True or False, got 'yes'.*or 'auto'"):
        SJDConfig(jacobi_sparse="yes")


@pytest.mark.device
def test_greedy_is_the_same_sparse_or_dense():
    model = toy_model()
    prompts = torch.full((4, 1), COND)
    outputs = [model.generate(prompts, do_sample=False, max_new_tokens=6, custom_generate="mc-sjd",
                              jacobi_window=3, jacobi_sparse=sparse) for sparse in (True, False)]
    assert torch.equal(*outputs)


def test_doctests():
    import doctest

    from hf_sjd.jacobi import distributions

    assert doctest.testmod(distributions).failed == 0
