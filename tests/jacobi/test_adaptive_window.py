"""The window rules (``jacobi_window_rule="adaptive"`` / ``"budget"`` / ``"auto"``): still exact, really adaptive,
no extra device read, bad knobs refused.

Exactness: the chi-square of ``test_frontier_exactness.py`` (6000 rows, top-3, toy model, 5 new tokens, 243
sequences). The adaptive rule is set to follow the last commit exactly (``ema=1``, ``a=1``, ``b=0``, ``L_min=1``),
so consecutive windows take every width in 1..3 and slots are dropped and re-exposed as the window shrinks and
grows. The budget rule (``L=1``, ``L_max=3``) widens the window of the rows left as the fast rows finish
(after 3 to 5 forwards), so the slow rows, the ones whose drafts were rejected, are the ones verified in wide
windows: a rule that read their outcomes would bias exactly them.
"""

import collections

import pytest
import torch

import hf_sjd
from hf_sjd import SJDConfig
from hf_sjd.jacobi.registry import Strategy
from hf_sjd.jacobi.verify import SpeculativeVerifier
from toy import COND, NULL, chi_square_pvalue, exact_distribution, syncs_between_forwards, until_eos

NUM_SAMPLES, NUM_NEW = 6000, 5
FOLLOW = {"jacobi_window_rule": "adaptive", "jacobi_window_min": 1, "jacobi_window_scale": 1.0,
          "jacobi_window_margin": 0, "jacobi_window_ema": 1.0}  # next width = last count (clamped)


@pytest.mark.parametrize("guidance", [None, 3.0], ids=["no-cfg", "cfg"])
def test_adaptive_window_is_lossless(model, guidance):
    exact = exact_distribution(model, [COND], NUM_NEW, top_k=3,
                               **({} if guidance is None else {"guidance_scale": guidance, "null_prompt": [NULL]}))
    extra = {} if guidance is None else {"guidance_scale": guidance,
                                         "negative_prompt_ids": torch.full((NUM_SAMPLES, 1), NULL)}
    torch.manual_seed(5)
    out = model.generate(torch.full((NUM_SAMPLES, 1), COND), do_sample=True, top_k=3, max_new_tokens=NUM_NEW,
                         custom_generate="mc-sjd", jacobi_window=3, grid_width=2, return_dict_in_generate=True,
                         **FOLLOW, **extra)
    counts = collections.Counter(tuple(row) for row in out.sequences[:, 1:].tolist())
    _, pvalue, impossible = chi_square_pvalue(counts, exact)
    assert impossible == 0 and pvalue > 1e-3
    assert out.stats.num_accepted > NUM_SAMPLES  # drafts were verified and accepted
    widths = out.stats.forward_windows.tolist()
    assert widths[1] and widths[2] and widths[3]  # the window really took several widths


def eos_ragged_run(model, guidance: float | None, seed: int, **knobs):
    """mc-sjd over NUM_SAMPLES rows whose EOS (a token of probability ~1/3 at every step) ends them after 1 to 5
    forwards, so a rule that reads the rows left changes the windows of the slow rows; returns (p-value against
    vanilla sampling stopped at the first EOS, impossible sequences, the run's stats)."""
    eos = NULL
    exact = collections.Counter()
    guided = {} if guidance is None else {"guidance_scale": guidance, "null_prompt": [NULL]}
    for sequence, prob in exact_distribution(model, [COND], NUM_NEW, top_k=3, **guided).items():
        exact[until_eos(sequence, eos)] += prob
    extra = {} if guidance is None else {"guidance_scale": guidance,
                                         "negative_prompt_ids": torch.full((NUM_SAMPLES, 1), NULL)}
    torch.manual_seed(seed)
    out = model.generate(torch.full((NUM_SAMPLES, 1), COND), do_sample=True, top_k=3, max_new_tokens=NUM_NEW,
                         eos_token_id=eos, custom_generate="mc-sjd", grid_width=2, return_dict_in_generate=True,
                         **knobs, **extra)
    counts = collections.Counter(until_eos(tuple(row), eos) for row in out.sequences[:, 1:].tolist())
    _, pvalue, impossible = chi_square_pvalue(counts, dict(exact))
    return pvalue, impossible, out.stats


@pytest.mark.parametrize("guidance, budget_siblings", [(None, 0), (3.0, 0), (None, 2), (3.0, 2)],
                         ids=["no-cfg", "cfg", "no-cfg-siblings", "cfg-siblings"])
def test_budget_window_is_lossless(model, guidance, budget_siblings):
    # The rows left widen while they still have tokens to go. With jacobi_budget_siblings the rows left (under a
    # quarter of the batch: 4 tokens each, 3 drafts) also carry up to 2 siblings of their first draft, again read
    # off the number of rows left only.
    pvalue, impossible, stats = eos_ragged_run(model, guidance, seed=6, jacobi_window=1, jacobi_window_max=3,
                                               jacobi_window_rule="budget", jacobi_budget_siblings=budget_siblings)
    assert impossible == 0 and pvalue > 1e-3
    widths = stats.forward_windows.tolist()
    assert widths[1] and widths[2]  # the full batch at 1 draft per row, the rows left at 2 (then the end's shrink)
    assert (stats.num_siblings_accepted > 0) == (budget_siblings > 0)  # the rows left's siblings were verified


def half_plan(window, siblings, model, batch, *args, **kwargs):
    """Test plan for the auto rule: the rows left, once at most half the batch, verify 3 drafts and 2 siblings
    each; the others 1 draft (what cost_model.plan returns: the cell per number of rows left)."""
    return ((3, 2),) * (batch // 2) + ((1, 0),) * (batch - batch // 2)


@pytest.mark.parametrize("guidance", [None, 3.0], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize("coupling", ["maximal", "independent"])
def test_auto_window_rule_is_lossless(model, guidance, coupling, monkeypatch):
    # The auto rule runs whatever plan the cost model made; this plan changes window and siblings once half the
    # rows are done, so the slow rows are the ones verified in wide windows with siblings. The roofline's own
    # plans: tests/jacobi/test_cost_model.py.
    monkeypatch.setattr(hf_sjd.jacobi.cost_model, "plan", half_plan)
    pvalue, impossible, stats = eos_ragged_run(model, guidance, seed=7, draft_coupling=coupling)  # rule: "auto"
    assert impossible == 0 and pvalue > 1e-3
    widths = stats.forward_windows.tolist()
    assert widths[1] and widths[2]  # the full batch at 1 draft per row, the rows left at 2 (3, shrunk by the end)
    assert stats.num_siblings_accepted > 0  # and the rows left's siblings were verified


class ScriptedVerifier(SpeculativeVerifier):
    """Test only (lossy): rejects every draft for its first ``reject_calls`` calls, then accepts every draft."""

    reject_calls = 0

    def __init__(self) -> None:
        self.calls = 0

    def acceptance_probs(self, drafts, draft_probs, target_probs):
        self.calls += 1
        accept = self.calls > self.reject_calls
        return torch.full(drafts.shape, 1.0 if accept else 0.0, device=drafts.device)


class FirstRowAccepts(SpeculativeVerifier):
    """Test only (lossy): accepts every draft of the batch's first row, rejects every other row's."""

    def acceptance_probs(self, drafts, draft_probs, target_probs):
        accept = torch.zeros(drafts.shape, device=drafts.device)
        accept[0] = 1.0
        return accept


def forward_widths(model, monkeypatch, reject_calls: int | None, max_new: int = 40, **knobs) -> list[int]:
    """Drafts per row of every forward (its input width minus the uncached token, prefill aside), under the
    :class:`ScriptedVerifier` (``reject_calls``), or :class:`FirstRowAccepts` for ``None``."""
    verifier = (FirstRowAccepts if reject_calls is None
                else type("Scripted", (ScriptedVerifier,), {"reject_calls": reject_calls}))
    monkeypatch.setitem(hf_sjd.VERIFIERS, "scripted-test", verifier)
    monkeypatch.setitem(hf_sjd.STRATEGIES, "scripted-test", Strategy("scripted-test", "test", {
        "verifier": "scripted-test", "draft_coupling": "maximal"}))
    widths = []
    handle = model.register_forward_pre_hook(lambda _m, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                             with_kwargs=True)
    try:
        torch.manual_seed(0)
        out = model.generate(torch.full((2, 1), COND), do_sample=True, top_k=3, max_new_tokens=max_new,
                             custom_generate="scripted-test", return_dict_in_generate=True, **knobs)
    finally:
        handle.remove()
    drafts = [w - 1 for w in widths]  # one uncached token (the prompt, then the last committed token) per forward
    assert out.stats.forward_windows.tolist() == [drafts.count(n) for n in range(len(out.stats.forward_windows))]
    return drafts


def test_window_shrinks_to_the_minimum_when_nothing_is_accepted(model, monkeypatch):
    drafts = forward_widths(model, monkeypatch, reject_calls=10**9, jacobi_window=8,
                            **(FOLLOW | {"jacobi_window_min": 3}))
    # one token per forward: width 8 first (no past yet), then the minimum, then the shrink near max_new_tokens
    assert drafts == [8] + [3] * 36 + [2, 1, 0]
    fixed = forward_widths(model, monkeypatch, reject_calls=10**9, jacobi_window=8)
    assert fixed == [8] * 32 + [7, 6, 5, 4, 3, 2, 1, 0]  # the fixed rule, for contrast


def test_window_grows_back_to_the_upper_bound_when_everything_is_accepted(model, monkeypatch):
    drafts = forward_widths(model, monkeypatch, reject_calls=5, max_new=60, jacobi_window=8,
                            jacobi_window_rule="adaptive", jacobi_window_min=2, jacobi_window_scale=1.0,
                            jacobi_window_margin=0, jacobi_window_ema=0.5)
    # estimate (EMA, rate 0.5, from 8): 5 rejections (count 1) take it to 4.5, 2.75, 1.88, 1.44, 1.22 (width
    # ceil(estimate), at least 2); then every draft is accepted (count = width + 1): 2.11, 3.05, 4.03, 5.01, 6.01,
    # 7.00, 8.5, ... so the width climbs one step per forward back to 8, until the end of max_new_tokens
    assert drafts == [8, 5, 3, 2, 2, 2, 3, 4, 5, 6, 7, 8, 8, 3]


def test_budget_window_widens_as_rows_finish(model, monkeypatch):
    drafts = forward_widths(model, monkeypatch, reject_calls=None, max_new=20, jacobi_window=2,
                            jacobi_window_rule="budget", jacobi_window_max=8)
    # 2 rows x 3 input tokens per forward. Row 0 commits 3 tokens per forward and is done after 7 (20 tokens);
    # row 1 has committed 7 then, and alone it takes the 6 tokens: 5 drafts, accepted (it is now the first
    # row), 7 -> 13 -> 19, then the last token
    assert drafts == [2] * 7 + [5, 5, 0]
    fixed = forward_widths(model, monkeypatch, reject_calls=None, max_new=20, jacobi_window=2)
    assert fixed == [2] * 7 + [2, 2, 2, 2, 0]  # the fixed rule, for contrast


def drafts_and_siblings(model, monkeypatch, **knobs) -> tuple[list[tuple[int, int]], object]:
    """(drafts, siblings) per row of every forward of a batch of 2 under :class:`FirstRowAccepts` (row 0 accepts
    everything, row 1 nothing until it is the first row), 20 new tokens, and the run's stats."""
    seen = []
    original = hf_sjd.jacobi.loop.JacobiDecoder.forward

    def recording(self, uncached, window, siblings=None, branch=None):
        seen.append((window.size, 0 if siblings is None else siblings.shape[1]))
        return original(self, uncached, window, siblings, branch)

    monkeypatch.setattr(hf_sjd.jacobi.loop.JacobiDecoder, "forward", recording)
    monkeypatch.setitem(hf_sjd.VERIFIERS, "scripted-test", FirstRowAccepts)
    monkeypatch.setitem(hf_sjd.STRATEGIES, "scripted-test", Strategy("scripted-test", "test", {
        "verifier": "scripted-test", "draft_coupling": "maximal"}))
    torch.manual_seed(0)
    out = model.generate(torch.full((2, 1), COND), do_sample=True, top_k=3, max_new_tokens=20,
                         custom_generate="scripted-test", return_dict_in_generate=True, **knobs)
    return seen, out.stats


def test_budget_siblings_take_what_a_capped_window_leaves(model, monkeypatch):
    """The row left alone has the batch's 6 tokens; its window is capped at 3 drafts, so 2 of the 6 go to
    siblings (jacobi_budget_siblings = 4 allows more: the tokens bound them), and the full batch carries none."""
    seen, _ = drafts_and_siblings(model, monkeypatch, jacobi_window=2, jacobi_window_rule="budget",
                                  jacobi_window_max=3, jacobi_budget_siblings=4)
    # (drafts, siblings) per forward: the prefill and the full batch, 2 x (2 + 1) tokens; row 0 is done after 7
    # forwards (20 tokens at 3 per forward); row 1 alone takes the 6 tokens as 3 drafts (the cap), the uncached
    # token and 2 siblings, accepted whole, 7 -> 11 -> 15 -> 19, then the last token
    assert seen == [(2, 0)] * 7 + [(3, 2)] * 3 + [(0, 0)]


def test_auto_window_rule_follows_the_cost_models_plan_as_rows_finish(model, monkeypatch):
    """Priced as a 7B model on a GPU, the row left alone takes the cell the roofline picks for one row (the cell of
    highest compression, 15 siblings: its window shrunk here to the tokens it has left), where the full batch kept
    its 2 drafts."""
    seven_b = hf_sjd.jacobi.cost_model.ModelShape(params=7e9, layers=32, kv_width=4096)
    with hf_sjd.jacobi.cost_model.priced_as(seven_b):
        seen, stats = drafts_and_siblings(model, monkeypatch, jacobi_window=2, jacobi_siblings="auto",
                                          jacobi_window_rule="auto")
    one_row = hf_sjd.jacobi.cost_model.pick(seven_b, rows=1, context=1 + 10)
    table = hf_sjd.jacobi.cost_model.STEP_COMPRESSION
    assert one_row == max(table, key=table.get) and one_row[1] == 15
    assert (stats.jacobi_window, stats.jacobi_siblings) == (2, 0)
    assert stats.window_plan == (one_row, (2, 0))  # reported: the cell for 1 row left, then the full batch's
    # the prefill and the full batch: 2 drafts, no siblings (no measured cell has window 2). Row 0 commits 3 tokens
    # per forward and is done after 7; row 1 (7 tokens then) is alone: 12 drafts, all it has left but the last
    # token, with the one-row cell's 15 siblings, accepted whole (it is now the first row): 7 -> 20
    assert seen == [(2, 0)] * 7 + [(12, 15)]


@pytest.mark.parametrize("guidance", [None, 3.0], ids=["no-cfg", "cfg"])
def test_auto_window_rule_on_a_cpu_is_the_fixed_rule_token_for_token(model, guidance):
    prompts, mask = torch.tensor([[0, COND], [COND, COND]]), torch.tensor([[0, 1], [1, 1]])  # ragged, left-padded
    extra = {} if guidance is None else {"guidance_scale": guidance, "negative_prompt_ids": torch.full((2, 1), NULL)}
    runs = []
    for rule in ("auto", "fixed"):
        torch.manual_seed(3)
        runs.append(model.generate(prompts, attention_mask=mask, do_sample=True, top_k=3, max_new_tokens=24,
                                   custom_generate="mc-sjd", grid_width=2, jacobi_window_rule=rule,
                                   return_dict_in_generate=True, **extra))
    auto, fixed = runs
    assert auto.stats.window_plan is None  # no roofline on a CPU: one cell, the fixed rule
    assert torch.equal(auto.sequences, fixed.sequences)
    assert auto.stats.forward_windows.tolist() == fixed.stats.forward_windows.tolist()


@pytest.mark.parametrize("rule", ["adaptive", "budget"])
def test_window_rules_add_no_device_read(rule):
    """Syncs between forwards (simulated device): 2 per iteration (the summary read, the sparse overflow check),
    as with the fixed rule; the adaptive rule's width rides in the summary read, the budget rule's is host
    arithmetic."""
    assert syncs_between_forwards(jacobi_window_rule=rule) == syncs_between_forwards() == [2] * 6


@pytest.mark.parametrize("knobs,error,match", [
    ({"jacobi_window_rule": "foo"}, ValueError, "jacobi_window_rule='foo' is not supported; allowed values: "
                                                "'fixed', 'adaptive', 'budget', 'auto'"),
    ({"jacobi_window_min": 0}, ValueError, "jacobi_window_min must be None or an integer >= 1, got 0"),
    ({"jacobi_window_min": 2.5}, TypeError, "jacobi_window_min must be"),
    ({"jacobi_window_min": 17, "jacobi_window_rule": "adaptive"}, ValueError,
     "jacobi_window_min must be <= jacobi_window .* got jacobi_window_min=17 > jacobi_window=16"),
    ({"jacobi_window_max": 8, "jacobi_window_rule": "budget"}, ValueError,
     "jacobi_window_max must be >= jacobi_window .* got jacobi_window_max=8 < jacobi_window=16"),
    ({"jacobi_window_max": 0, "jacobi_window_rule": "budget"}, ValueError,
     "jacobi_window_max must be None or an integer >= 1, got 0"),
    # each bound belongs to one rule: the budget rule's full batch is jacobi_window, not jacobi_window_min
    ({"jacobi_window_min": 8, "jacobi_window_rule": "budget"}, ValueError,
     "jacobi_window_min=8 bounds the 'adaptive' window rule only .* jacobi_window_rule='budget'.* rows left widen "
     "up to jacobi_window_max"),
    ({"jacobi_window_max": 32, "jacobi_window_rule": "fixed"}, ValueError,
     "jacobi_window_max=32 bounds the 'budget' or 'auto' window rule only .* jacobi_window_rule='fixed'"),
    ({"jacobi_window_min": 8}, ValueError,  # the preset's rule is "auto", which only widens
     "jacobi_window_min=8 bounds the 'adaptive' window rule only .* jacobi_window_rule='auto'"),
    ({"jacobi_window_scale": 0.0}, ValueError, "jacobi_window_scale must be a finite number > 0.0"),
    ({"jacobi_window_margin": -1}, ValueError, "jacobi_window_margin must be an integer >= 0"),
    ({"jacobi_window_ema": 0.0}, ValueError, r"jacobi_window_ema must be a finite number > 0.0 and <= 1.0"),
    ({"jacobi_window_ema": float("nan")}, ValueError, "jacobi_window_ema must be a finite number"),
    ({"jacobi_budget_siblings": -1}, ValueError, "jacobi_budget_siblings must be an integer >= 0"),
    ({"jacobi_budget_siblings": 3}, ValueError, "jacobi_budget_siblings=3 gives siblings to the rows left by the "
                                                "budget rule: set jacobi_window_rule='budget'"),
])
def test_bad_window_rule_knobs_are_refused_before_any_work(model, knobs, error, match):
    with pytest.raises(error, match=match):
        model.generate(torch.full((1, 1), COND), do_sample=True, top_k=3, max_new_tokens=4,
                       custom_generate="mc-sjd", **knobs)


def test_window_min_defaults_below_a_small_window_and_follows_the_request_length():
    config = SJDConfig(jacobi_window=2, jacobi_window_rule="adaptive")
    config.validate()
    assert config.window_min() == 2  # the default 4 is lowered to the window, not an error
    budget = SJDConfig(jacobi_window=16, jacobi_window_rule="budget")
    budget.validate()
    assert (budget.window_min(), budget.window_max()) == (16, 32)  # the full batch at jacobi_window; tail <= 32
    wide = SJDConfig(jacobi_window=48, jacobi_window_rule="budget")
    wide.validate()
    assert wide.window_max() == 48  # the default 32 is raised to the window: the tail never narrows
    clamped = SJDConfig(jacobi_window=16, jacobi_window_min=8, jacobi_window_rule="adaptive").clamped_to(5)
    assert (clamped.jacobi_window, clamped.jacobi_window_min) == (4, 4)  # a short request lowers both bounds
    clamped = SJDConfig(jacobi_window=2, jacobi_window_rule="budget").clamped_to(max_new_tokens=5)
    assert (clamped.jacobi_window, clamped.window_max()) == (2, 4)  # and the budget rule's upper bound
