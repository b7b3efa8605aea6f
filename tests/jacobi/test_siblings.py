"""Siblings of the first draft (``jacobi_siblings``): the output keeps the model's law exactly whatever law they
are drawn from (``jacobi_sibling_law``), drawn without replacement (i.i.d. where a sparse q has a uniform
component), siblings are really accepted, and bad settings are refused before any work.

Same chi-square as ``test_frontier_exactness.py`` (6000 rows, top-3, toy model, 5 new tokens, 243 sequences),
with ``jacobi_window`` 1 or 2, with and without CFG, sparse and dense distributions, each coupling, EOS, a
processor that reads the prefix, and ``draft_init="random"``, whose fresh first slot (after a fully accepted
window) has a uniform q: its siblings must be drawn from that q too (i.i.d. where it is sparse, without
replacement where it is dense). On this peaked model siblings rescue a few hundred rows with target-derived q and
thousands with random init (asserted).

Controls, so the tests have power against the mistakes that matter:
- in the loop, drawing the token after an accepted sibling from the distribution after the *first draft* (a wrong
  tree forward or a wrong gather) is rejected at p < 1e-6 (window 1, 3 siblings, random init: ~3300 rescues);
- in :func:`verify_siblings` itself, resampling an unrescued row from r_1 instead of the last residual, and
  verifying siblings drawn without replacement against q instead of q_i, change the law by a few percent, which
  6000 toy rows cannot see, so they are tested on 200,000 direct draws; so is verifying siblings drawn from
  another law as if they were drawn from q.
"""

import collections

import pytest
import torch

from scipy.stats import chi2
from transformers import LogitsProcessorList

import hf_sjd
from hf_sjd import SJDConfig
from hf_sjd.jacobi import loop
from hf_sjd.jacobi.distributions import expand_window, sample_without_replacement, without_token
from hf_sjd.jacobi.verify.speculative import verify_siblings
from toy import (COND, NULL, NoRepeat, chi_square_pvalue, exact_distribution, no_forward, sample_mc_sjd,
                 syncs_between_forwards, until_eos)

NUM_SAMPLES, NUM_NEW = 6000, 5


def sample_counts(model, window, siblings, guidance_scale=None, **knobs):
    return sample_mc_sjd(model, NUM_SAMPLES, NUM_NEW, 4, guidance_scale, jacobi_window=window, jacobi_siblings=siblings,
                         grid_width=2, **knobs)

CASES = [  # (window, siblings, guidance, knobs)
    (1, 3, None, {"draft_init": "random"}),
    (1, 2, None, {}),
    (2, 3, None, {}),
    (2, 2, 3.0, {}),
    (2, 2, None, {"jacobi_sparse": False}),
    (1, 2, None, {"draft_init": "random"}),
    (2, 2, None, {"draft_coupling": "independent", "draft_init": "random"}),
    (2, 2, 3.0, {"draft_coupling": "gumbel"}),
    (1, 3, None, {"draft_init": "random", "jacobi_sparse": False}),  # a dense uniform q, drawn without replacement
    # siblings drawn from another law than the first draft's q (jacobi_sibling_law)
    (1, 3, None, {"jacobi_sibling_law": "mixture"}),
    (2, 2, 3.0, {"jacobi_sibling_law": "mixture"}),
    (2, 2, None, {"jacobi_sibling_law": "mixture", "jacobi_sparse": False}),
    (1, 3, None, {"draft_init": "random", "jacobi_sibling_law": "mixture"}),  # a uniform component: i.i.d. rows
]


@pytest.mark.device
@pytest.mark.parametrize("window,siblings,guidance,knobs", CASES, ids=lambda c: str(c))
def test_siblings_are_lossless(model, laws, window, siblings, guidance, knobs):
    counts, stats = sample_counts(model, window, siblings, guidance, **knobs)
    _, pvalue, impossible = chi_square_pvalue(counts, laws[guidance])
    assert impossible == 0
    assert pvalue > 1e-3
    assert stats.num_siblings_accepted > 300  # siblings really were accepted


@pytest.mark.device
def test_siblings_with_eos(model):
    """EOS (token 5, about a third of every step's mass) ends rows mid-window, after rescued siblings too."""
    law = collections.Counter()
    for sequence, prob in exact_distribution(model, [COND], NUM_NEW, top_k=3).items():
        law[until_eos(sequence, NULL)] += prob
    counts, stats = sample_counts(model, 1, 3, draft_init="random", eos_token_id=NULL)
    counts = collections.Counter(until_eos(sequence, NULL) for sequence in counts.elements())
    _, pvalue, impossible = chi_square_pvalue(counts, dict(law))
    assert impossible == 0 and pvalue > 1e-3
    assert stats.num_siblings_accepted > 300


@pytest.mark.device
def test_siblings_under_a_processor_that_reads_the_prefix(model):
    """The distribution after a sibling is processed with the sibling as the last token of its prefix."""
    law = exact_distribution(model, [COND], NUM_NEW, top_k=3, processors=[NoRepeat()])
    counts, stats = sample_counts(model, 1, 3, draft_init="random",
                                  logits_processor=LogitsProcessorList([NoRepeat()]))
    _, pvalue, impossible = chi_square_pvalue(counts, law)
    assert impossible == 0 and pvalue > 1e-3
    assert stats.num_siblings_accepted > 300


@pytest.mark.device
def test_the_token_after_a_sibling_from_the_wrong_distribution_is_detected(model, laws, monkeypatch):
    """Control: the token after an accepted sibling drawn from p after the first draft, not after the sibling."""
    original = loop.JacobiDecoder.verify_and_commit

    def wrong(self, window, target, siblings, sibling_target):
        if siblings is not None:
            sibling_target = expand_window(target[:, 1], siblings.shape[1])
        return original(self, window, target, siblings, sibling_target)

    monkeypatch.setattr(loop.JacobiDecoder, "verify_and_commit", wrong)
    counts, _ = sample_counts(model, 1, 3, draft_init="random")
    _, pvalue, _ = chi_square_pvalue(counts, laws[None])
    assert pvalue < 1e-6


def first_slot_tokens(p: torch.Tensor, q: torch.Tensor, siblings: int, trials: int, distinct: bool,
                      control: str | None = None, law: torch.Tensor | None = None) -> torch.Tensor:
    """[trials] tokens committed at one slot: main draft ~ q, exact test, then :func:`verify_siblings` of siblings
    drawn from ``law`` (default q) without replacement (``distinct``) or i.i.d. Controls: ``"first-residual"``
    resamples an unrescued row from r_1; ``"as-iid"`` verifies siblings drawn without replacement as if they were
    i.i.d. (q_i = q); ``"as-draft"`` verifies siblings drawn from ``law`` as if drawn from q."""
    law = q if law is None else law
    main = torch.multinomial(q, trials, replacement=True)
    if distinct:
        sibling_draws, drawn = sample_without_replacement(without_token(law.expand(trials, -1), main), siblings)
        sibling_draws = torch.where(drawn, sibling_draws, main[:, None])
    else:
        sibling_draws = torch.multinomial(law, trials * siblings, replacement=True).view(trials, siblings)
    accepted = torch.rand(trials) < (p[main] / q[main]).clamp(max=1)
    first_residual = ((p - q).clamp_min(0) / (p - q).clamp_min(0).sum()).expand(trials, -1)
    rows_distinct = torch.full((trials,), distinct and control != "as-iid")
    verified_law = q if control == "as-draft" else law
    rescued, index, residual = verify_siblings(first_residual, verified_law.expand(trials, -1), main, sibling_draws,
                                               rows_distinct, torch.rand(trials, siblings), ~accepted)
    residual = first_residual if control == "first-residual" else residual
    resampled = torch.multinomial(residual, 1).squeeze(1)
    return torch.where(accepted, main, torch.where(rescued, sibling_draws.gather(1, index[:, None]).squeeze(1),
                                                   resampled))


def slot_pvalue(p: torch.Tensor, tokens: torch.Tensor) -> float:
    """Chi-square p-value of ``tokens`` against ``p`` (the slot tests' law: support = tokens 0-2, 2 degrees of
    freedom); never a token outside p's support."""
    counts = torch.bincount(tokens, minlength=5).double()
    assert counts[3:].sum() == 0
    expected = len(tokens) * p[:3]
    return chi2.sf(float(((counts[:3] - expected) ** 2 / expected).sum()), df=2)


@pytest.mark.parametrize("distinct", [True, False], ids=["without-replacement", "iid"])
def test_verify_siblings_commits_the_target_law_and_its_controls_are_detected(distinct):
    """200,000 direct draws of one slot (chi-square, 2 degrees of freedom). 4 siblings use up q's support of 5
    tokens without replacement (placeholders)."""
    torch.manual_seed(0)
    trials = 200_000
    p = torch.tensor([0.40, 0.40, 0.20, 0.00, 0.00])  # r_1 = (0.2, 0.6, 0.2), r_2 = (0, 5/6, 1/6): they differ
    q = torch.tensor([0.30, 0.10, 0.10, 0.30, 0.20])

    for siblings in (1, 3, 4):
        assert slot_pvalue(p, first_slot_tokens(p, q, siblings, trials, distinct)) > 1e-3
    for siblings in (1, 3):  # with 4 distinct siblings almost every row is rescued: the residual hardly matters
        assert slot_pvalue(p, first_slot_tokens(p, q, siblings, trials, distinct, control="first-residual")) < 1e-6
        if distinct:
            assert slot_pvalue(p, first_slot_tokens(p, q, siblings, trials, distinct, control="as-iid")) < 1e-6


@pytest.mark.parametrize("distinct", [True, False], ids=["without-replacement", "iid"])
def test_siblings_from_another_law_commit_the_target_law(distinct):
    """Siblings drawn from a law s other than q (``jacobi_sibling_law``) and verified against s: still p (200,000
    direct draws, chi-square, 2 degrees of freedom); verified as if drawn from q, the law is off (p < 1e-6)."""
    torch.manual_seed(1)
    trials = 200_000
    p = torch.tensor([0.40, 0.40, 0.20, 0.00, 0.00])
    q = torch.tensor([0.30, 0.10, 0.10, 0.30, 0.20])
    law = torch.tensor([0.05, 0.60, 0.05, 0.20, 0.10])  # puts its mass where r_1 = (0.2, 0.6, 0.2) does

    for siblings in (1, 3):
        assert slot_pvalue(p, first_slot_tokens(p, q, siblings, trials, distinct, law=law)) > 1e-3
        assert slot_pvalue(p, first_slot_tokens(p, q, siblings, trials, distinct, control="as-draft", law=law)) < 1e-6


def test_a_law_nearer_the_residual_rescues_more(model):
    """On the toy model the mixture with the last committed position's law rescues more first slots than q alone
    does (one sibling, the same seed and rows): the reason ``jacobi_sibling_law`` exists. The rescue counts are
    sums of 6000 bounded per-row indicators: their standard deviations are under 40."""
    rescued = {law: sample_counts(model, 2, 1, jacobi_sibling_law=law)[1].num_siblings_accepted
               for law in ("draft", "mixture")}
    assert rescued["mixture"] > rescued["draft"] + 100, rescued


@pytest.mark.device
def test_no_siblings_is_the_loop_without_them(model):
    """``jacobi_siblings=0`` draws nothing more: the tokens are those of a run that never heard of siblings."""
    torch.manual_seed(0)
    plain = model.generate(torch.full((64, 1), COND), do_sample=True, top_k=3, max_new_tokens=8,
                           custom_generate="mc-sjd", jacobi_window=3, grid_width=2)
    torch.manual_seed(0)
    zero = model.generate(torch.full((64, 1), COND), do_sample=True, top_k=3, max_new_tokens=8,
                          custom_generate="mc-sjd", jacobi_window=3, grid_width=2, jacobi_siblings=0)
    assert torch.equal(plain, zero)


def test_siblings_are_drawn_without_replacement():
    """No sibling repeats the first draft or another sibling while q has tokens left (3 here, top-3: the third
    sibling is a placeholder): a rejected token could never be accepted again (docs/results/frontier_siblings
    compares with i.i.d. siblings)."""
    from hf_sjd.jacobi.distributions import SparseProbs
    from hf_sjd.jacobi.drafting import Drafter, DraftWindow

    table = torch.zeros(7)
    q = SparseProbs(torch.tensor([[0, 2, 4]]).expand(500, -1), torch.tensor([[0.6, 0.3, 0.1]]).expand(500, -1),
                    None, table)
    window = DraftWindow(torch.full((500, 1), 2), expand_window(q, 1), None, None)
    drafter = Drafter(torch.arange(6), 6)
    torch.manual_seed(0)
    siblings = drafter.siblings(window, 3)
    assert sorted(siblings[:, :2].flatten().unique().tolist()) == [0, 4]  # never the first draft, 2
    assert torch.equal(siblings[:, 0] != siblings[:, 1], torch.ones(500, dtype=torch.bool))
    assert torch.equal(siblings[:, 2], torch.full((500,), 2))  # support used up: the placeholder
    assert drafter.distinct_siblings(q) is True


@pytest.mark.parametrize("knobs,match", [
    ({"jacobi_siblings": -1}, "jacobi_siblings must be an integer >= 0, got -1"),
    ({"jacobi_siblings": 2, "jacobi_sibling_law": "previous"},
     "jacobi_sibling_law='previous' is not supported; allowed values: 'draft', 'mixture'"),
    ({"jacobi_siblings": 2, "verifier": "lantern", "latent_embeddings": torch.randn(6, 2)},
     r"exact speculative verification \(verifier='speculative' or 'block'\); got verifier='lantern'"),
    ({"jacobi_siblings": 2, "verifier": "gsd"}, "exact speculative verification .* got verifier='gsd'"),
])
def test_bad_siblings_settings_are_refused_before_any_work(model, knobs, match):
    with no_forward(model):
        with pytest.raises(ValueError, match=match):
            model.generate(torch.full((1, 1), COND), do_sample=True, top_k=3, max_new_tokens=4,
                           custom_generate="mc-sjd", grid_width=2, **knobs)


def test_siblings_need_an_attention_that_takes_a_4d_mask(model, monkeypatch):
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'.*attn_implementation='sdpa'"):
        model.generate(torch.full((1, 1), COND), do_sample=True, top_k=3, max_new_tokens=4,
                       custom_generate="mc-sjd", grid_width=2, jacobi_siblings=2)


def test_auto_siblings_fall_back_to_none_where_siblings_cannot_run(model, monkeypatch):
    """``jacobi_siblings="auto"`` never asks for what would be refused: 0 with a flash-style attention."""
    from hf_sjd.mixin import JacobiDecodingMethod

    method = JacobiDecodingMethod(SJDConfig(), model.sjd_adapter)
    assert method._siblings_allowed(model)
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")
    assert not method._siblings_allowed(model)
    lantern = JacobiDecodingMethod(SJDConfig(verifier="lantern"), model.sjd_adapter)
    assert not lantern._siblings_allowed(model)


@pytest.mark.parametrize("sparse, reads", [(True, 2), (False, 1)])
def test_siblings_add_no_device_read(sparse, reads):
    """Syncs between forwards (simulated device): the same per iteration with siblings as without, whatever their
    law: the summary read, and in a sparse loop the overflow check, which covers the siblings' distributions too."""
    assert syncs_between_forwards(jacobi_siblings=3, jacobi_sparse=sparse) == \
        syncs_between_forwards(jacobi_sparse=sparse) == [reads] * 6
    assert syncs_between_forwards(jacobi_siblings=3, jacobi_sibling_law="mixture", jacobi_sparse=sparse) == \
        [reads] * 6
