"""SJD-VP verification prior: the formula on hand-made trajectories, exactness of the lossless mode, and
the bias of the paper's literal mode.

Exactness sample size: 6000 rows over the 243 top-3 sequences of 5 tokens (bins with expectation < 5
pooled). The deliberately biased "paper" mode at strength 4 shifts the law by TV ~0.1, which this size
rejects at p < 1e-6; a correct sampler passes at level 1e-3 with probability 0.999.
"""

import collections
import dataclasses
import doctest
import math

import pytest
import torch

import hf_sjd
from hf_sjd.jacobi import priors
from hf_sjd.jacobi.priors import VerificationPredictionPrior
from hf_sjd.jacobi.verify import SpeculativeVerifier
from toy import COND, chi_square_pvalue, exact_distribution, no_forward, toy_model

NUM_SAMPLES = 6000


def observe(prior, trajectory, position=5, row=0):
    """Feed a probability trajectory [t, vocab] for one (row, position); return the fused probs of each step."""
    out = []
    for probs in trajectory:
        fused = prior(None, torch.tensor([probs]).log(), positions=torch.tensor([position]),
                      rows=torch.tensor([row]), carried=torch.tensor([True]))
        out.append(fused.softmax(-1)[0])
    return torch.stack(out)


def test_doctests():
    assert doctest.testmod(priors).failed == 0


def test_ewa_baseline():
    prior = VerificationPredictionPrior(window=4, beta=0.25)
    observe(prior, [[0.2, 0.8], [0.4, 0.6], [0.6, 0.4]])
    # p_bar = p1; then 0.25 * p_bar + 0.75 * p
    expected = 0.25 * (0.25 * 0.2 + 0.75 * 0.4) + 0.75 * 0.6
    assert prior.baseline[0, 5 % 5, 0].item() == pytest.approx(expected)
    assert prior.num_seen[0, 0].item() == 3


def growth_of(prior, trajectory, token=0):
    """M_t(token) after each observation of a trajectory (the prior's ``last_growth``)."""
    grew = []
    for probs in trajectory:
        observe(prior, [probs])
        grew.append(bool(prior.last_growth[0, token]))
    return grew


@pytest.mark.parametrize("steps", [1, 2, 3, 4])
def test_growth_mask_needs_n_consecutive_increases(steps):
    rising = [[0.1 * (i + 1), 1 - 0.1 * (i + 1)] for i in range(6)]  # token 0 grows every step
    assert growth_of(VerificationPredictionPrior(window=8, growth_steps=steps), rising) == [t >= steps for t in range(6)]
    # a dip at t = 3 breaks every chain that reaches back over it; N increases after it restore the mask
    dip = [[0.1, 0.9], [0.2, 0.8], [0.3, 0.7], [0.25, 0.75], [0.3, 0.7], [0.35, 0.65], [0.4, 0.6], [0.45, 0.55]]
    expected = [steps <= t < 3 or t >= 3 + steps for t in range(len(dip))]
    assert growth_of(VerificationPredictionPrior(window=8, growth_steps=steps), dip) == expected


def test_growth_boosts_by_the_log_gain_over_the_baseline():
    rising = [[0.1 * (i + 1), 1 - 0.1 * (i + 1)] for i in range(4)]
    fused = observe(VerificationPredictionPrior(window=8, growth_steps=2, strength=1.0), rising)
    assert torch.allclose(fused[:2], torch.tensor(rising[:2]), atol=1e-6)  # not yet two increases
    assert (fused[2:, 0] > torch.tensor(rising)[2:, 0]).all()


def test_fusion_formula_and_renormalisation():
    prior = VerificationPredictionPrior(window=4, growth_steps=1, strength=2.0, beta=0.5)
    fused = observe(prior, [[0.2, 0.3, 0.5], [0.4, 0.2, 0.4]])[1]
    # token 0 grew: log p' = log 0.4 + 2 * log(0.4 / 0.2); others unchanged, then renormalised
    weights = torch.tensor([0.4 * (0.4 / 0.2) ** 2, 0.2, 0.4])
    assert torch.allclose(fused, weights / weights.sum(), atol=1e-6)
    assert fused.sum().item() == pytest.approx(1.0)


def test_bounded_variant_clips_the_gain():
    jump = [[0.999, 1e-9, 0.001 - 1e-9], [0.9, 0.05, 0.05]]  # token 1: 1e-9 -> 0.05, raw log gain ~17.7
    raw = observe(VerificationPredictionPrior(window=4, growth_steps=1, max_gain=None), jump)[1]
    assert raw[1] > 0.99  # the unbounded gain hands the draft to a token that just appeared
    clipped = observe(VerificationPredictionPrior(window=4, growth_steps=1, max_gain=1.0), jump)[1]
    weights = torch.tensor([0.9, 0.05 * math.e, 0.05 * math.e])  # both grew; gain clipped to 1
    assert torch.allclose(clipped, weights / weights.sum(), atol=1e-5)


def test_history_is_per_row_and_per_position_and_recycled():
    prior = VerificationPredictionPrior(window=3, growth_steps=1)
    observe(prior, [[0.2, 0.8]], position=2, row=0)
    observe(prior, [[0.9, 0.1]], position=2, row=1)  # another row: its own history
    assert observe(prior, [[0.4, 0.6]], position=2, row=0)[0][0] > 0.4  # row 0 grew from 0.2
    # position 6 maps to the same ring slot (6 % 4 == 2) as position 2: a new position starts a new history
    assert torch.allclose(observe(prior, [[0.5, 0.5]], position=6, row=0)[0], torch.tensor([0.5, 0.5]))
    assert prior.history.shape == (2, 4, 1, 2)  # rows x (window + 1) x N x vocab: bounded by the window


def test_uncarried_slots_are_neither_changed_nor_recorded():
    prior = VerificationPredictionPrior(window=3, growth_steps=1)
    scores = torch.tensor([[0.3, 0.7]]).log()
    out = prior(None, scores, positions=torch.tensor([1]), rows=torch.tensor([0]), carried=torch.tensor([False]))
    assert torch.equal(out, scores) and prior.num_seen.sum() == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"vp_growth_steps": 0}, "vp_growth_steps must be an integer >= 1"),
    ({"vp_beta": 1.0}, "vp_beta must be a finite number > 0.0 and < 1.0"),
    ({"vp_strength": -1.0}, "vp_strength must be a finite number >= 0"),
    ({"vp_strength": float("nan")}, "vp_strength must be a finite number >= 0"),
    ({"vp_strength": "1"}, "vp_strength must be a finite number >= 0"),
    ({"vp_growth_steps": True}, "vp_growth_steps must be an integer >= 1, got True"),
    ({"vp_verify": "loose"}, "vp_verify='loose' is not supported; allowed values: 'lossless', 'paper'"),
    ({"vp_max_gain": 0.0}, "vp_max_gain must be None or a finite number > 0"),
])
def test_bad_knobs_fail_before_any_forward(kwargs, match):
    model = toy_model()
    with no_forward(model), pytest.raises((ValueError, TypeError), match=match):
        model.generate(torch.full((1, 1), COND), do_sample=True, max_new_tokens=3, custom_generate="sjd-vp", **kwargs)


# -- exactness ------------------------------------------------------------------------------------------
class FusionProbe(VerificationPredictionPrior):
    """Records which redrafted slots the prior actually changed (to count how many of them get verified)."""

    def __call__(self, input_ids, scores, positions, rows, carried):
        fused = super().__call__(input_ids, scores, positions=positions, rows=rows, carried=carried)
        changed = (fused.softmax(-1) - scores.softmax(-1)).abs().amax(-1) > 1e-4  # [n]
        self.changed_slots = changed.view(len(rows.unique_consecutive()), -1)
        return fused


class CountingVerifier(SpeculativeVerifier):
    """Counts verified drafts that came from a changed (fused) distribution."""

    probe: FusionProbe | None = None
    verified_fused = 0

    def __call__(self, drafts, draft_probs, target_probs, uniforms):
        result = super().__call__(drafts, draft_probs, target_probs, uniforms)
        changed = getattr(self.probe, "changed_slots", None)
        if changed is not None and changed.shape == drafts.shape:
            checked = torch.arange(drafts.shape[1]) <= result.num_accepted[:, None]  # up to the first rejection
            type(self).verified_fused += int((changed & checked).sum())
        return result


@pytest.fixture
def probes():
    def build_prior(config, adapter, draft_ids, options):
        prior = FusionProbe(config.jacobi_window, **dataclasses.asdict(options))
        CountingVerifier.probe = prior
        return prior

    hf_sjd.DRAFT_PRIORS["vp-probe"] = type("ProbeFactory", (), {"from_config": staticmethod(build_prior),
                                                              "options_class": priors.VPOptions})
    hf_sjd.VERIFIERS["counting"] = CountingVerifier
    CountingVerifier.verified_fused = 0
    yield CountingVerifier
    del hf_sjd.DRAFT_PRIORS["vp-probe"], hf_sjd.VERIFIERS["counting"]


def vp_counts(model, **kwargs):
    torch.manual_seed(3)
    out = model.generate(torch.full((NUM_SAMPLES, 1), COND), do_sample=True, top_k=3, max_new_tokens=5,
                         custom_generate="sjd", jacobi_window=4, draft_prior="vp-probe", verifier="counting",
                         vp_growth_steps=1, return_dict_in_generate=True, **kwargs)
    return collections.Counter(tuple(r) for r in out.sequences[:, 1:].tolist()), out.stats


@pytest.fixture(scope="module")
def model_and_law():
    model = toy_model()
    return model, exact_distribution(model, [COND], 5, top_k=3)


@pytest.mark.device
@pytest.mark.parametrize("coupling, max_gain", [("independent", 1.0), ("maximal", 1.0), ("independent", None)])
def test_lossless_vp_follows_exact_distribution(model_and_law, probes, coupling, max_gain):
    model, exact = model_and_law
    counts, stats = vp_counts(model, vp_strength=4.0, draft_coupling=coupling, vp_max_gain=max_gain)
    _, pvalue, impossible = chi_square_pvalue(counts, exact)
    assert impossible == 0 and pvalue > 1e-3
    assert probes.verified_fused > NUM_SAMPLES / 2  # fused drafts really were verified


@pytest.mark.device
def test_paper_mode_is_biased(model_and_law, probes):
    model, exact = model_and_law
    counts, _ = vp_counts(model, vp_strength=4.0, vp_verify="paper")
    _, pvalue, _ = chi_square_pvalue(counts, exact)
    assert probes.verified_fused > NUM_SAMPLES / 2
    assert pvalue < 1e-6


def test_a_window_the_growth_mask_cannot_fire_in_is_refused_and_a_wide_n_allocates_by_the_window():
    """A position is verified in at most jacobi_window forwards: vp_growth_steps >= an explicit window would change
    nothing (refused, naming both); under "auto" the history holds no more than the window's observations."""
    model = toy_model()
    with no_forward(model), pytest.raises(ValueError, match="vp_growth_steps=3 needs jacobi_window > 3, got 3"):
        model.generate(torch.full((1, 1), COND), custom_generate="sjd-vp", jacobi_window=3, max_new_tokens=4)
    prior = VerificationPredictionPrior(window=4, growth_steps=10**9)
    fused = observe(prior, [[0.5, 0.5], [0.6, 0.4]])
    assert prior.history.shape[2] == 5 and not prior.last_growth.any()
    assert torch.allclose(fused[1], torch.tensor([0.6, 0.4]))


def test_an_unchanged_distribution_did_not_grow_and_a_gain_below_the_baseline_is_clipped_to_zero():
    from hf_sjd.jacobi.priors import VerificationPredictionPrior
    at = dict(positions=torch.tensor([3]), rows=torch.tensor([0]), carried=torch.tensor([True]))

    def run(*observations):
        prior = VerificationPredictionPrior(window=4, growth_steps=1, strength=1.0, beta=0.5)
        out = [prior(None, torch.tensor([p]).log(), **at).softmax(-1) for p in observations]
        return out[-1]

    # the same p twice: M_t needs p_t > p_{t-1} (strict), so nothing is boosted
    assert torch.allclose(run([0.5, 0.5], [0.6, 0.4], [0.6, 0.4]), torch.tensor([[0.6, 0.4]]), atol=1e-6)
    # token 0 grew 0.1 -> 0.2 but lies below its baseline 0.5: S_t < 0 is clipped to 0, p unchanged
    assert torch.allclose(run([0.9, 0.1], [0.1, 0.9], [0.2, 0.8]), torch.tensor([[0.2, 0.8]]), atol=1e-6)
