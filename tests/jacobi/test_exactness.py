"""SJD is lossless: its samples follow the model's own (processed, guided) distribution exactly.

Sample size: 6000 rows over the 27 top-3 sequences of 3 tokens. A chi-square test at that size has
power ~1 against a total-variation shift of 0.05 (the deliberately broken verifier below shifts far
more and is rejected at p < 1e-20), while a correct sampler passes at level 1e-3 with probability 0.999.
"""

import collections
import functools
import os

import pytest
import torch

import hf_sjd
from hf_sjd.jacobi.verify import SpeculativeVerifier
from toy import COND, NULL, VOCAB, chi_square_pvalue, exact_distribution

pytestmark = pytest.mark.device  # on a GPU too (tests/conftest.py)

NUM_SAMPLES = 6000


class UniformQVerifier(SpeculativeVerifier):
    """Deliberately wrong: pretends every draft came from a uniform q (true only for fresh random drafts)."""

    sparse_ready = False  # it builds a dense q

    def __call__(self, drafts, draft_probs, target_probs, uniforms):
        uniform = torch.full_like(draft_probs, 1.0 / draft_probs.shape[-1])
        return super().__call__(drafts, uniform, target_probs, uniforms)


def test_the_loop_runs_on_the_test_device(model):
    """Under HF_SJD_TEST_DEVICE (tests/conftest.py) these tests run on that device's kernels, not the CPU's."""
    device = torch.device(os.environ.get("HF_SJD_TEST_DEVICE", "cpu"))
    out = model.generate(torch.full((2, 1), COND), do_sample=True, top_k=3, max_new_tokens=3, custom_generate="sjd",
                         jacobi_window=2)
    assert model.device.type == out.device.type == device.type


def sample_counts(model, strategy, guidance_scale=None, window=2, **kwargs):
    torch.manual_seed(1)
    prompts = torch.full((NUM_SAMPLES, 1), COND)
    extra = {}
    if guidance_scale is not None:
        extra = {"guidance_scale": guidance_scale, "negative_prompt_ids": torch.full((NUM_SAMPLES, 1), NULL)}
    out = model.generate(prompts, do_sample=True, top_k=3, max_new_tokens=3, custom_generate=strategy,
                         jacobi_window=window, return_dict_in_generate=True, **extra, **kwargs)
    counts = collections.Counter(tuple(row) for row in out.sequences[:, 1:].tolist())
    return counts, out.stats


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])  # p and q on the top-k support or not
@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
def test_samples_follow_exact_distribution(model, strategy, sparse):
    exact = exact_distribution(model, [COND], 3, top_k=3)
    counts, stats = sample_counts(model, strategy, jacobi_sparse=sparse)
    _, pvalue, impossible = chi_square_pvalue(counts, exact)
    assert impossible == 0
    assert pvalue > 1e-3
    # the test is only meaningful if drafts (including redrafted ones) were actually verified and accepted
    assert stats.num_accepted > NUM_SAMPLES / 2


def test_guided_samples_follow_exact_guided_distribution(model):
    exact = exact_distribution(model, [COND], 3, top_k=3, guidance_scale=3.0, null_prompt=[NULL])
    counts, stats = sample_counts(model, "sjd", guidance_scale=3.0)
    _, pvalue, impossible = chi_square_pvalue(counts, exact)
    assert impossible == 0 and pvalue > 1e-3
    assert stats.num_accepted > NUM_SAMPLES / 2
    # and guidance changed the law (otherwise the test above would not test guidance)
    unguided = exact_distribution(model, [COND], 3, top_k=3)
    assert sum(abs(exact[s] - unguided[s]) for s in exact) / 2 > 0.05


def test_guided_samples_under_a_repetition_penalty_follow_transformers_law(model):
    """transformers guides log-probabilities, and a repetition penalty reads a guided score's sign: its law is not
    the one guidance over the logits gives (checked below), and the samples follow it."""
    from transformers import RepetitionPenaltyLogitsProcessor

    law = functools.partial(exact_distribution, model, [COND], 3, top_k=3, guidance_scale=3.0, null_prompt=[NULL],
                            processors=[RepetitionPenaltyLogitsProcessor(1.5)])
    exact = law(guide_log_probs=True)
    counts, stats = sample_counts(model, "sjd", guidance_scale=3.0, repetition_penalty=1.5)
    _, pvalue, impossible = chi_square_pvalue(counts, exact)
    assert impossible == 0 and pvalue > 1e-3
    assert stats.num_accepted > NUM_SAMPLES / 2
    over_logits = law(guide_log_probs=False)
    assert sum(abs(exact[s] - over_logits[s]) for s in exact) / 2 > 0.05


# p that depends strongly on the previous token (a sequence bias): where a verifier's decision biases the drafts it
# leaves, redrafting them by coupling shows (at TV ~0.04, so 40000 rows: the chi-square rejects it at p < 1e-6)
SEQUENCE_BIAS = [[[3], 2.0], [[1, 2], -4.0], [[0, 0], 3.0]]
COUPLED_ROWS = 40000


def coupled_counts(model, seed, **knobs):
    torch.manual_seed(seed)
    out = model.generate(torch.full((COUPLED_ROWS, 1), COND), do_sample=True, top_k=VOCAB, max_new_tokens=3,
                         sequence_bias=SEQUENCE_BIAS, return_dict_in_generate=True, **knobs)
    return collections.Counter(tuple(row) for row in out.sequences[:, 1:].tolist()), out.stats


def test_mc_sjd_is_exact_where_its_coupling_keeps_drafts(model, monkeypatch):
    """Maximal coupling keeps a slot's previous draft, exact only while that draft still follows its q given the
    commit: token-by-token verification never reads past the first rejection, block verification reads the whole
    window (so it is refused with a coupling; bypassed here, it is detected)."""
    from transformers import SequenceBiasLogitsProcessor

    from hf_sjd.jacobi.verify import BlockVerifier

    exact = exact_distribution(model, [COND], 3, top_k=VOCAB,
                               processors=[SequenceBiasLogitsProcessor(sequence_bias=SEQUENCE_BIAS)])
    for knobs in ({}, {"jacobi_siblings": 2}, {"draft_coupling": "gumbel"}):
        counts, stats = coupled_counts(model, 31, custom_generate="mc-sjd", jacobi_window=2, **knobs)
        _, pvalue, impossible = chi_square_pvalue(counts, exact)
        assert impossible == 0 and pvalue > 1e-3, knobs
        assert stats.num_accepted > COUPLED_ROWS / 2
    with pytest.raises(ValueError, match="draft_coupling='maximal' keeps a slot's previous draft"):
        model.generate(torch.full((1, 1), COND), custom_generate="mc-sjd", verifier="block", max_new_tokens=3)
    monkeypatch.setattr(BlockVerifier, "reads_past_rejection", False)
    counts, _ = coupled_counts(model, 31, custom_generate="mc-sjd", jacobi_window=2, verifier="block")
    assert chi_square_pvalue(counts, exact)[1] < 1e-6


class PeakAfterLowTokens:
    """A legitimate processor whose law is a point mass with a denormal tail after token 0 or 1 (+95 nats on token
    3: the other tokens keep about exp(-95) < float32's smallest normal of the mass)."""

    def __call__(self, input_ids, scores):
        peak = (input_ids[:, -1] <= 1).to(scores.dtype)[:, None] * 95.0
        return scores + torch.nn.functional.one_hot(torch.full_like(input_ids[:, -1], 3), scores.shape[-1]) * peak


def test_siblings_stay_exact_where_a_draft_law_has_a_denormal_tail(model):
    """The siblings' proposal is q without the first draft, renormalised: by its exact sum, however small (a floor
    at finfo.tiny left it unnormalised, and every sibling with r(s) > 0 was accepted: rejected at p < 1e-17 at this
    size); sjd-vp's unbounded gain makes such laws too."""
    exact = exact_distribution(model, [COND], 3, top_k=VOCAB, processors=[PeakAfterLowTokens()])
    for knobs in ({"custom_generate": "sjd"}, {"custom_generate": "mc-sjd"},
                  {"custom_generate": "sjd-vp", "vp_growth_steps": 1, "vp_strength": 4.0, "vp_max_gain": None}):
        torch.manual_seed(0)
        out = model.generate(torch.full((20000, 1), COND), do_sample=True, top_k=VOCAB, max_new_tokens=3,
                             jacobi_window=2, jacobi_siblings=2, logits_processor=[PeakAfterLowTokens()],
                             return_dict_in_generate=True, **knobs)
        counts = collections.Counter(tuple(row) for row in out.sequences[:, 1:].tolist())
        _, pvalue, impossible = chi_square_pvalue(counts, exact)
        assert impossible == 0 and pvalue > 1e-3, knobs
        assert out.stats.num_siblings_accepted > 1000, knobs


def test_wrong_draft_distribution_is_detected(model):
    hf_sjd.VERIFIERS["uniform-q-test"] = UniformQVerifier
    hf_sjd.register_strategy("uniform-q-test", "deliberately wrong q (test only)", verifier="uniform-q-test")
    try:
        exact = exact_distribution(model, [COND], 3, top_k=3)
        counts, _ = sample_counts(model, "uniform-q-test")
        _, pvalue, _ = chi_square_pvalue(counts, exact)
        assert pvalue < 1e-20
    finally:
        del hf_sjd.VERIFIERS["uniform-q-test"], hf_sjd.STRATEGIES["uniform-q-test"]


def test_rows_are_independent(model):
    """Pairs of rows from one batch: the joint of (row 2i, row 2i+1) first tokens is the product law."""
    from scipy.stats import chi2_contingency

    counts, _ = sample_counts(model, "sjd")
    torch.manual_seed(2)
    out = model.generate(torch.full((NUM_SAMPLES, 1), COND), do_sample=True, top_k=3, max_new_tokens=3,
                         custom_generate="sjd", jacobi_window=2)
    first = out[:, 1].view(-1, 2)
    values = sorted(set(first.flatten().tolist()))
    table = torch.zeros(len(values), len(values))
    for a, b in first.tolist():
        table[values.index(a), values.index(b)] += 1
    assert chi2_contingency(table.cpu().numpy())[1] > 1e-3
