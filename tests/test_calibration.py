"""``jacobi_window="auto"`` from costs measured where the model runs (hf_sjd.calibration, issue 34).

Specification:
1. A profile holds t(n)/t(1) per forward rows, measured through the adapter's window forward: t(1)/t(1) = 1 and
   more tokens never cost less; it saves, loads and pins (a pinned profile is never re-timed, so seeded calls are
   reproducible); a file of another model or of another kind is refused.
2. The pick maximises c(L, m) / (t(L+1+m)/t(1)) over the cells; where no cell beats plain decoding, a model the
   adapter lets transformers sample is handed to transformers' own loop: token for token what vanilla sampling
   draws, at its cost.
3. The compression table moves towards what finished calls committed, and only finished calls: a call's plan is
   fixed before its first forward.
4. Exact with calibration on (a chi-square on the toy model with a profile that makes "auto" pick drafts).
5. Where timing is refused (HF_SJD_CALIBRATE=0, which the suite sets, or torch's deterministic mode) nothing is
   timed and the fields' defaults apply on a CPU.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, StoppingCriteria, StoppingCriteriaList

from hf_sjd import SJDConfig, calibration
from hf_sjd.jacobi import cost_model
from hf_sjd.calibration import TOKENS, CostProfile
from hf_sjd.mixin import JacobiDecodingMethod
from toy import COND, chi_square_pvalue, no_forward, sample_mc_sjd, toy_laws, toy_model


@pytest.fixture
def model():
    return toy_model()


@pytest.fixture
def timing(monkeypatch):
    monkeypatch.setenv("HF_SJD_CALIBRATE", "1")


def profile(model, steep: float) -> CostProfile:
    """A hand-made profile: a forward of n tokens costs 1 + steep * (n - 1) steps at every row count."""
    made = CostProfile.empty_for(model)
    made.ratios, made.source = {rows: {n: 1 + steep * (n - 1) for n in TOKENS} for rows in (1, 2, 4, 8)}, "hand-made"
    return made


def sample(model, rows=2, seed=0, **knobs):
    torch.manual_seed(seed)
    return model.generate(torch.full((rows, 1), COND), do_sample=True, top_k=3, max_new_tokens=24,
                          return_dict_in_generate=True, **knobs)


@pytest.mark.device
def test_a_measured_profile_is_a_cost_ratio_per_row_count(model, timing, tmp_path):
    measured = calibration.profile_for(model, model.sjd_adapter, rows=3, context=8)
    assert set(measured.ratios) == {1, 3} and measured.source == "measured"  # 2 rows: between the two
    for rows, ratios in measured.ratios.items():  # the counts up to 17 now; those a forward can hold below the
        # model's 64 positions where a pick asks for them
        assert list(ratios) == [n for n in TOKENS if n <= calibration.TIMED_FIRST] and ratios[1] == 1.0
        assert measured.untimed[rows] == [n for n in TOKENS if calibration.TIMED_FIRST < n < 64]
        assert all(a <= b for a, b in zip(list(ratios.values()), list(ratios.values())[1:]))
    assert calibration.profile_for(model, model.sjd_adapter, rows=3, context=8) is measured  # cached: timed once
    every = calibration.profile_for(model, model.sjd_adapter, rows=3, context=8, widest=None)  # the rest now
    assert every is measured and not any(every.untimed.values())
    assert all(list(ratios) == [n for n in TOKENS if n < 64] for ratios in every.ratios.values())
    measured.save(tmp_path / "costs.json")
    loaded = CostProfile.load(tmp_path / "costs.json")
    assert loaded.ratios == measured.ratios and loaded.source == str(tmp_path / "costs.json")
    assert loaded.cost(3, 17) == measured.cost(3, 17) and loaded.cost(3, 4) == pytest.approx(
        (measured.ratios[3][3] + measured.ratios[3][5]) / 2)  # linear between measured token counts


@pytest.mark.device
def test_a_pinned_profile_picks_the_same_cells_and_tokens_in_every_run(timing, tmp_path):
    """Two runs (two fresh copies of one model, as two processes would load it) with the profile file pinned: the
    same cells, hence the same tokens; a run learns only from its own finished calls."""
    first_model = toy_model()
    profile(first_model, steep=0.2).save(tmp_path / "costs.json")
    runs = []
    for model in (first_model, toy_model()):
        calibration.pin(model, tmp_path / "costs.json")
        runs.append([sample(model, custom_generate="sjd", seed=seed) for seed in (0, 1)])
    for one, other in zip(*runs):
        assert torch.equal(one.sequences, other.sequences) and one.stats.jacobi_window == other.stats.jacobi_window
    assert runs[0][0].stats.cost_source == str(tmp_path / "costs.json") and runs[0][0].stats.jacobi_window > 0


def test_ratios_come_from_side_by_side_runs_timed_after_the_forwards_settle(model, monkeypatch):
    """The first forwards after the prefix run slow (the allocator settles), and so does each count's first (its
    kernels' first use): WARMUP_FORWARDS one-token forwards and one round over the counts come untimed. Then each
    count is timed beside a one-token forward, because a forward bound by its host switches between two speeds on a
    shared machine (an H200's did: docs/results/gpu/calibration), and from the last of a run of each, because a
    forward after one of another count runs slower, and the second after a wider one still (on a CPU). Here a
    forward costs n, times 3 for the first 8 after the prefix and for each count's first, times 1.25 after a forward
    of another count, times 1.1 for the second after a wider one, and times 1.6 from the n-token forwards of the
    third count of the second timed round on: the ratios come out n (a run of forwards per count would read 1.6 n
    for the counts timed after the switch; two one-token forwards in a row, n / 1.1 for every count after a wider
    one; the one round that mixes the speeds is outvoted)."""
    sizes, seen = [], set()
    timed_from = calibration.WARMUP_FORWARDS + len(TOKENS)  # the prefix, the warm-up, the untimed round (n > 1)
    per_count = calibration.ONE_TOKEN_RUN + 2
    switch = timed_from + per_count * (len(TOKENS) - 1) + 2 * per_count + calibration.ONE_TOKEN_RUN

    class Adapter:
        def window_logits(self, model, input_ids, attention_mask, position_ids, cache, num_logits):
            sizes.append(input_ids.shape[1])

        def position_limit(self, model):
            return None

    class Timer:  # the durations that forward pattern gives, in the order the forwards ran
        def __init__(self):
            self.spans = []

        def start(self, device):
            return None

        def stop(self, started):
            n, index = sizes[-1], len(sizes)
            first = index <= 1 + 8 or n not in seen
            seen.add(n)
            moved = len(sizes) > 1 and sizes[-2] != n
            settling = len(sizes) > 2 and sizes[-2] == n < sizes[-3]
            self.spans.append(n * (3.0 if first else 1.0) * (1.25 if moved else 1.1 if settling else 1.0)
                              * (1.6 if index > switch else 1))

        def durations(self):
            return self.spans

    monkeypatch.setattr(calibration, "ForwardTimer", Timer)
    made = CostProfile.empty_for(model)
    made.measure(model, Adapter(), rows=2, context=4)  # five rounds: the bound read is the 4th of 5 (one round mixes)
    assert calibration.WARMUP_FORWARDS >= 8
    assert calibration.ONE_TOKEN_RUN >= 3
    assert len(sizes) == timed_from + 5 * per_count * (len(TOKENS) - 1)
    assert sizes[timed_from:timed_from + 2 * per_count] == [*[1] * calibration.ONE_TOKEN_RUN, TOKENS[1], TOKENS[1],
                                                            *[1] * calibration.ONE_TOKEN_RUN, TOKENS[2], TOKENS[2]]
    assert made.ratios[2] == pytest.approx({n: float(n) for n in TOKENS})


def test_a_loop_is_priced_by_its_work_against_its_own_forward(model):
    """A loop's work is priced as a share of its own forward: timed while the host ran 1.6x slower (a forward bound
    by its host changes speed between timed loops: docs/results/gpu), forward and work both slower, it costs the
    same; only the work's share against its forward moves the price."""
    made = profile(model, steep=0.05)
    key = calibration.probe_key
    made.loops = {calibration.PLAIN: {1: [0.010, 0.002]},  # a one-token forward, then transformers' own work
                  key("sjd", (4, 0)): {1: [0.010 * made.cost(1, 5), 0.003]},
                  key("sjd", (16, 0)): {1: [0.010 * made.cost(1, 17), 0.005]}}
    cells = [(8, 0), (16, 0), (32, 0)]
    steady = [made.step_cost("sjd", 1, cell, handed_off=True) for cell in cells]
    # in one-token forwards: transformers' work 0.2, the loop's 0.3 at 4 drafts and 0.2 more per 12 drafts
    assert steady == pytest.approx([(made.cost(1, window + 1) + 0.3 + 0.2 * (window - 4) / 12) / 1.2
                                    for window, _ in cells])
    for name in (key("sjd", (4, 0)), key("sjd", (16, 0))):
        made.loops[name] = {1: [1.6 * seconds for seconds in made.loops[name][1]]}
    assert [made.step_cost("sjd", 1, cell, handed_off=True) for cell in cells] == pytest.approx(steady)
    made.loops[key("sjd", (4, 0))][1][1] *= 2  # twice the work per forward: dearer
    assert made.step_cost("sjd", 1, (8, 0), handed_off=True) > steady[0]


def test_a_loop_whose_forwards_run_dearer_inside_it_is_priced_so(model):
    """Where each probe was timed beside transformers' loop (a third number: the seconds of that loop's one-token
    forward, the mean of its runs right before and after the probe), the step cost is scaled by how much dearer the
    probe's forward ran than the profile says (the median over the probes): here 1.2x at 4 drafts, 1.3x at 16 and
    1.25x with siblings, so 1.25x. Probes timed without it leave the cost as it was; plain decoding handed off
    costs one step; a row count not timed reads the nearest timed one against the profile's cost there."""
    made = profile(model, steep=0.05)
    key = calibration.probe_key
    made.loops = {calibration.PLAIN: {1: [0.010, 0.002]},
                  key("sjd", (4, 0)): {1: [0.010 * made.cost(1, 5), 0.003]},
                  key("sjd", (16, 0)): {1: [0.010 * made.cost(1, 17), 0.005]}}
    alone = made.step_cost("sjd", 1, (8, 0), handed_off=True)
    assert made.in_loop("sjd", 1) == 1.0
    for probe, dearer in (((4, 0), 1.2), ((16, 0), 1.3), ((4, 3), 1.25)):
        made.loops.setdefault(key("sjd", probe), {1: [0.010 * made.cost(1, sum(probe) + 1), 0.003]})
        made.loops[key("sjd", probe)][1] = [*made.loops[key("sjd", probe)][1][:2], 0.010 / dearer]
    assert made.in_loop("sjd", 1) == pytest.approx(1.25)
    made.loops.pop(key("sjd", (4, 3)))
    assert made.step_cost("sjd", 1, (8, 0), handed_off=True) == pytest.approx(1.25 * alone)
    assert made.step_cost("sjd", 1, (0, 0), handed_off=True) == 1.0  # transformers' own loop: one step
    made.ratios[4] = {n: 1 + 0.2 * (n - 1) for n in TOKENS}  # 4 rows: steeper; timed at 1 row only, k stays 1 row's
    assert made.in_loop("sjd", 4) == pytest.approx(1.25)


def test_each_probe_is_timed_beside_transformers_loop_where_plain_decoding_is_handed_off(model):
    """time_loops times transformers' loop before the first probe and after each (the in-loop cost's denominator:
    the mean of the two beside a probe, so a host that changes speed between them moves it as it moves the probe)
    where plain decoding is handed off to it, and not where it is not (guidance: plain decoding is the Jacobi
    loop's). Timed once per row count; a second loop at the same rows times transformers' loop beside it again."""
    calls, plain_seconds = [], iter([0.002, 0.004, 0.006, 0.010, 0.012, 0.014])

    def probe(cell, plain):
        calls.append((cell, plain))
        return [next(plain_seconds) if plain else 0.004, 0.001]

    made = profile(model, steep=0.05)
    calibration.time_loops(model, made, "sjd", 1, False, True, probe)
    plain = ((0, 0), True)
    assert calls == [plain, ((4, 0), False), plain, ((16, 0), False), plain]
    assert made.loops[calibration.PLAIN][1] == [0.002, 0.001]
    assert made.loops[calibration.probe_key("sjd", (4, 0))][1] == pytest.approx([0.004, 0.001, 0.003])
    assert made.loops[calibration.probe_key("sjd", (16, 0))][1] == pytest.approx([0.004, 0.001, 0.005])
    calls[:] = []
    calibration.time_loops(model, made, "sjd", 1, False, True, probe)
    assert calls == []  # timed at these rows already
    calibration.time_loops(model, made, "mc", 1, False, True, probe)
    assert calls == [plain, ((4, 0), False), plain, ((16, 0), False), plain]
    assert made.loops[calibration.PLAIN][1] == [0.002, 0.001]  # the first timing kept
    assert made.loops[calibration.probe_key("mc", (4, 0))][1] == pytest.approx([0.004, 0.001, 0.011])
    calls[:] = []
    calibration.time_loops(model, made, "sjd", 2, False, False, probe)
    assert calls == [((4, 0), False), ((16, 0), False)]
    assert made.loops[calibration.probe_key("sjd", (4, 0))][2] == [0.004, 0.001]


def test_a_batch_is_timed_at_its_rows_and_every_eighth_fold_below_and_read_linearly_between(model, timing,
                                                                                           monkeypatch):
    """The rows a batch's plan prices run from one image's (``fewest``: 2 with guidance) to the batch's: timed at the
    batch's and at ``fewest`` x 8^k below it, once per row count; a count between two timed ones costs the linear
    interpolation of theirs, one outside them the nearest's."""
    timed = []

    def measure(self, model, adapter, rows, context, repeats=5, widest=None):
        timed.append(rows)
        self.ratios[rows] = {1: 1.0, 17: 1.0 + rows}

    monkeypatch.setattr(CostProfile, "measure", measure)
    made = calibration.profile_for(model, model.sjd_adapter, rows=16, context=8, fewest=2)
    assert timed == [2, 16]
    assert made.cost(9, 17) == pytest.approx(3.0 + (17.0 - 3.0) * (9 - 2) / (16 - 2))
    assert made.cost(9, 9) == pytest.approx(1.0 + (made.cost(9, 17) - 1.0) / 2)  # and linear in tokens
    assert made.cost(1, 17) == 3.0 and made.cost(40, 17) == 17.0
    calibration.profile_for(model, model.sjd_adapter, rows=70, context=8)
    assert timed == [2, 16, 1, 8, 64, 70]
    calibration.profile_for(model, model.sjd_adapter, rows=8, context=8)
    assert timed == [2, 16, 1, 8, 64, 70]  # timed already
    calibration.forget(model)  # dropped: timed again
    assert calibration.profile_for(model, model.sjd_adapter, rows=8, context=8) is not made and timed[6:] == [1, 8]
    for bad, message in (({"fewest": 0}, "fewest must be an integer >= 1 and <= 8, got 0"),
                         ({"fewest": 9}, "fewest must be an integer >= 1 and <= 8, got 9"),
                         ({"widest": 0}, "widest must be None or an integer >= 1, got 0")):
        with pytest.raises(ValueError, match=message):
            calibration.profile_for(model, model.sjd_adapter, rows=8, context=8, **bad)


def test_wider_counts_are_timed_only_where_a_pick_would_take_them(model, timing, monkeypatch):
    """A pick prices a count not timed yet at the widest timed one's cost, a lower bound (more tokens never cost
    less), so a plan without such a cell is the plan that timing every count gives; a plan with one times the counts
    up to its width where it is priced (at a row count between two timed ones: the next count at each) and is picked
    again. Here a forward is cheap at one row (wide cells pay) and dear at 8 (they do not): the plan is the fully
    timed profile's, and at 8 rows the widest counts are never timed."""
    sizes, slope = [], {1: 0.02, 8: 0.3}

    class Adapter:
        def window_logits(self, model, input_ids, attention_mask, position_ids, cache, num_logits):
            sizes.append(tuple(input_ids.shape))

        def position_limit(self, model):
            return None

    class Timer:  # a forward of n tokens at r rows costs 1 + slope[r] (n - 1)
        def __init__(self):
            self.spans = []

        def start(self, device):
            return None

        def stop(self, started):
            rows, n = sizes[-1]
            self.spans.append(1 + slope[rows] * (n - 1))

        def durations(self):
            return self.spans

    def planned(profile):
        return cost_model.plan("auto", "auto", model, 8, 1, 64, True, table=calibration.REFERENCE_COMPRESSION["mc-sjd"],
                               cost=lambda rows, cell: profile.cost(rows, sum(cell) + 1))

    monkeypatch.setattr(calibration, "ForwardTimer", Timer)
    lazy = calibration.profile_for(model, Adapter(), rows=8, context=4)
    rounds = 0
    while calibration.widen(model, Adapter(), lazy, planned(lazy), 1, 4):
        rounds += 1
    lazy_forwards, sizes[:] = len(sizes), []
    full = CostProfile.empty_for(model)
    for rows in (1, 8):
        full.measure(model, Adapter(), rows, 4)
    assert planned(lazy) == planned(full) and rounds >= 1
    assert max(lazy.ratios[8]) < TOKENS[-1] and max(lazy.ratios[1]) > calibration.TIMED_FIRST
    assert lazy_forwards < len(sizes) and all(lazy.ratios[r][n] == full.ratios[r][n] for r in (1, 8)
                                              for n in lazy.ratios[r])
    other = toy_model()
    alone = calibration.profile_for(other, Adapter(), rows=1, context=4)  # one row: the widest pays there,
    assert calibration.widen(other, Adapter(), alone, ((64, 15),), 1, 4)  # and is timed in one go
    assert max(alone.ratios[1]) == TOKENS[-1] and not alone.untimed[1]
    pinned = calibration.pin(model, lazy)  # never timed again: a count not timed is extrapolated, as from a file
    assert pinned.cost(8, 81) > pinned.cost(8, max(lazy.ratios[8])) and lazy.untimed[8]
    assert not calibration.widen(model, Adapter(), pinned, ((64, 15),) * 8, 1, 4)


def test_pin_refuses_another_model_and_a_file_that_is_no_profile(model, tmp_path):
    other = CostProfile("GPT2LMHeadModel:1234", "cpu", "float32", {1: {1: 1.0}})
    with pytest.raises(ValueError, match="was measured for GPT2LMHeadModel:1234 on cpu float32, not for this "
                                         "LlamaForCausalLM"):
        calibration.pin(model, other)
    (tmp_path / "bad.json").write_text('{"model": "x", "device": "cpu", "dtype": "float32", "ratios": {"1": {}}}')
    with pytest.raises(ValueError, match="is not a cost profile"):
        CostProfile.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="is not a cost profile written by CostProfile.save"):
        CostProfile.load(tmp_path / "missing.json")
    head = '{"model": "x", "device": "cpu", "dtype": "float32", '
    for body in ('"ratios": {"1": {"1": 1.0, "2": NaN, "17": 2.0}}}', '"ratios": {"1": {"1": 1.0, "17": 0.5}}}',
                 '"ratios": {"1": {"1": 1.0, "9": 1.5, "17": 1.2}}}',
                 '"ratios": {"1": {"1": 1.0}}, "loops": {"sjd": {"1": []}}}'):
        (tmp_path / "odd.json").write_text(head + body)
        with pytest.raises(ValueError, match="odd.json is not a cost profile written by CostProfile.save"):
            CostProfile.load(tmp_path / "odd.json")


def test_a_pinned_profile_is_refused_once_the_model_moves_to_another_dtype(model, timing, tmp_path):
    profile(model, steep=0.2).save(tmp_path / "costs.json")
    calibration.pin(model, tmp_path / "costs.json")
    model.to(torch.float64)
    with pytest.raises(ValueError, match=r"pinned from .*costs.json was measured on cpu float32, and the model has "
                                         r"moved to cpu float64"):
        sample(model, custom_generate="sjd")


@pytest.mark.parametrize("knobs, error", [
    ({"custom_generate": "sjd", "draft_token_ids": "abc"}, "draft_token_ids must be a sequence"),  # window "auto"
    ({"custom_generate": "mc-sjd", "jacobi_window": 8, "draft_token_ids": [1.5]}, "draft_token_ids must hold"),
    ({"custom_generate": "sjd-vp", "vp_verify": "paper", "jacobi_siblings": 2}, "needs drafts sampled from the q"),
])
def test_bad_component_input_is_refused_before_auto_times_anything(model, timing, knobs, error):
    """``"auto"`` times loops with forwards, which fall back on any error: every component is checked first."""
    with no_forward(model), pytest.raises((TypeError, ValueError), match=error):
        sample(model, **knobs)


def test_where_no_cell_pays_the_call_is_transformers_own_sampling(model, timing):
    """Every draft costs a full step: plain decoding wins, and the call is vanilla sampling, token for token."""
    calibration.pin(model, profile(model, steep=1.0))
    torch.manual_seed(3)
    vanilla = model.generate(torch.full((2, 1), COND), do_sample=True, top_k=3, max_new_tokens=24)
    out = sample(model, seed=3, custom_generate="sjd")
    assert torch.equal(out.sequences, vanilla)
    assert (out.stats.jacobi_window, out.stats.num_forward_passes, out.stats.cells) == (0, 24, {(0, 0): (48, 48)})


def test_cheap_drafts_are_picked_and_dear_ones_shrink_the_window(model, timing):
    calibration.pin(model, profile(model, steep=0.0))  # a memory-bound device: drafts are free
    free = sample(model, custom_generate="mc-sjd").stats
    calibration.pin(model, profile(model, steep=0.1))
    dear = sample(model, custom_generate="mc-sjd").stats
    assert free.jacobi_window + free.jacobi_siblings > dear.jacobi_window + dear.jacobi_siblings > 0


def test_the_compression_estimate_reads_only_finished_calls(model, timing, monkeypatch):
    """The table a call plans with is fixed before its first forward; what the call committed is folded in after
    it, so the next call plans with it."""
    calibration.pin(model, profile(model, steep=0.2))
    estimate = calibration.estimate_for(model, SJDConfig(draft_coupling="maximal"), batch=2)  # mc-sjd's, 2 rows
    seen = []

    class Snapshot(LogitsProcessor):  # records the estimate's totals while the call runs
        def __call__(self, input_ids, scores):
            seen.append({cell: tuple(total) for cell, total in estimate.totals.items()})
            return scores

    before = {cell: tuple(total) for cell, total in estimate.totals.items()}
    out = sample(model, custom_generate="mc-sjd", grid_width=2, logits_processor=[Snapshot()])
    assert seen and all(snapshot == before for snapshot in seen)  # unchanged during the call
    tokens = float(out.stats.num_new_tokens.float().mean())
    assert sum(t for t, _ in estimate.totals.values()) == pytest.approx(sum(t for t, _ in before.values()) + tokens)
    assert sum(f for _, f in estimate.totals.values()) == sum(f for _, f in before.values()) + \
        out.stats.num_forward_passes
    assert estimate.table() != calibration.CompressionEstimate(estimate.reference).table()


def test_one_factor_scales_every_cell_a_call_did_not_run():
    """A model that compresses less than the reference (here: half) lowers the cells no call ran by the same factor
    as the one that ran, so the next pick does not move to an untried cell for its unscaled prior; plain decoding
    stays 1 and no cell falls below it."""
    reference = calibration.REFERENCE_COMPRESSION["mc-sjd"]
    estimate = calibration.CompressionEstimate(reference)
    assert estimate.table() == {cell: pytest.approx(value) for cell, value in reference.items()}  # no call yet
    estimate.record((16, 0), tokens_per_row=256, forwards=2 * 256 / reference[16, 0])
    scale = estimate.factor()
    assert 0.5 < scale < 1  # the calls' 0.5, pulled towards 1 by the prior's pseudo-forwards
    table = estimate.table()
    for cell in [(4, 0), (32, 0), (32, 3)]:
        assert table[cell] == pytest.approx(max(1.0, scale * reference[cell]))
    assert table[0, 0] == 1.0 and min(table.values()) >= 1.0
    assert table[16, 0] < scale * reference[16, 0]  # and the cell that ran moves towards its own calls
    estimate.record((0, 0), tokens_per_row=256, forwards=256)  # a hand-off says nothing about drafting
    assert estimate.factor() == scale


@pytest.mark.device
def test_auto_with_a_profile_is_lossless(timing):
    """mc-sjd's "auto" cells on a profile where drafts are cheap (window and siblings from the profile), 6000
    rows of 5 tokens against the exact law (the chi-square of tests/jacobi/test_exactness.py)."""
    model = toy_model()
    calibration.pin(model, profile(model, steep=0.01))
    counts, stats = sample_mc_sjd(model, 6000, 5, seed=11, grid_width=2)
    assert stats.jacobi_window >= 4 and stats.cost_source == "hand-made"
    _, pvalue, impossible = chi_square_pvalue(counts, toy_laws(model, 5)[None])
    assert impossible == 0 and pvalue > 1e-3


def test_timing_stays_below_the_models_last_position(timing):
    """GPT-2 has a table of n_positions learned positions; a prompt ending near the last one decodes with every
    strategy, token for token as transformers does: the calibration's dummy prefix and its probes stay below the
    table's end (they ran past it: an IndexError before the call's first forward)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import hf_sjd

    torch.manual_seed(0)
    gpt2 = hf_sjd.enable(GPT2LMHeadModel(GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2, vocab_size=64,
                                                    bos_token_id=0, eos_token_id=0)).eval())
    prompt = torch.randint(1, 64, (2, 50))
    kwargs = {"attention_mask": torch.ones_like(prompt), "do_sample": False, "max_new_tokens": 14,
              "pad_token_id": 0}
    with torch.no_grad():
        expected = gpt2.generate(prompt, **kwargs)
        for strategy in ("sjd", "mc-sjd"):
            out = gpt2.generate(prompt, custom_generate=strategy, return_dict_in_generate=True, **kwargs)
            assert torch.equal(out.sequences, expected) and out.stats.cost_source == "measured", strategy
    assert max(calibration._PROFILES[gpt2][0].ratios[2]) < 64


def test_the_timed_prefix_does_not_follow_a_max_new_tokens_never_used(timing, monkeypatch):
    """A text call that may end early (an EOS, a user's criterion) but asks for many new tokens: its first "auto"
    call times its profile over its prompt and the middle of what it surely generates, the probes' tokens (it timed
    half of max_new_tokens, up to MAX_CONTEXT: memory and time that followed what was asked). A call that runs to
    its length is timed at its middle length."""
    from toy import tiny_llama

    contexts, measure = [], CostProfile.measure
    monkeypatch.setattr(CostProfile, "measure", lambda self, model, adapter, rows, context, **kwargs: (
        contexts.append(context), measure(self, model, adapter, rows, context, **kwargs))[1])
    prompt = torch.tensor([[3, 4, 5]])
    first = int(tiny_llama(64, seed=2).generate(prompt, do_sample=False, max_new_tokens=1)[0, -1])
    class StopAtSeven(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 7)

    for ends in ({"eos_token_id": first}, {"stopping_criteria": StoppingCriteriaList([StopAtSeven()])}, {}):
        model = tiny_llama(64, seed=2)
        model.config.max_position_embeddings = 32768
        out = model.generate(prompt, do_sample=False, custom_generate="sjd", return_dict_in_generate=True,
                             max_new_tokens=200 if not ends else 1_000_000, **ends)
        assert out.stats.cost_source == "measured"
        assert set(contexts) == {3 + 100 if not ends else 3 + calibration.PROBE_TOKENS // 2}, ends
        contexts.clear()


def test_a_call_with_max_time_times_nothing_and_reads_what_earlier_calls_timed(timing, monkeypatch):
    """``max_time``'s clock starts before the decoding method: a first "auto" call that timed its costs spent the
    budget on the timing and returned one token. It times nothing (priced as where timing is refused), and reads a
    profile that an earlier call timed."""
    from toy import tiny_llama

    timed = []
    monkeypatch.setattr(CostProfile, "measure", lambda *args, **kwargs: timed.append(1))
    monkeypatch.setattr(calibration, "time_loops", lambda *args, **kwargs: timed.append(2))
    model, prompt = tiny_llama(64, seed=2), torch.tensor([[3, 4, 5]])
    out = model.generate(prompt, do_sample=False, custom_generate="sjd", return_dict_in_generate=True,
                         max_new_tokens=30, max_time=60.0)
    assert (timed, out.stats.cost_source, out.stats.jacobi_window) == ([], None, 16)
    assert torch.equal(out.sequences, model.generate(prompt, do_sample=False, max_new_tokens=30))
    calibration.pin(model, profile(model, steep=0.0))
    out = model.generate(prompt, do_sample=False, custom_generate="sjd", return_dict_in_generate=True,
                         max_new_tokens=30, max_time=60.0)
    assert (timed, out.stats.cost_source) == ([], "hand-made")
    calibration.forget(model)
    calibration.profile_for(model, model.sjd_adapter, rows=1, context=8)  # without max_time: timed (stub records)
    assert timed


def test_the_timing_loops_draw_from_torchs_stream_without_rewinding_it(model, timing):
    """A server's other threads sample while one thread's first "auto" call times its loops: the timing's draws come
    from torch's random stream as any sampling's do (it saved and restored the stream around each loop, so the next
    draws replayed what other threads had drawn meanwhile)."""
    import threading

    class DrawElsewhereOnce(LogitsProcessor):
        """At its first call (in a timing loop) another thread draws; later calls note the stream's state."""

        def __init__(self):
            self.drawn_from, self.later = None, []

        def __call__(self, input_ids, scores):
            if self.drawn_from is None:
                def draw():
                    self.drawn_from = torch.get_rng_state()
                    torch.rand(64)
                other = threading.Thread(target=draw)
                other.start()
                other.join()
            else:
                self.later.append(torch.get_rng_state())
            return scores

    processor = DrawElsewhereOnce()
    out = sample(model, custom_generate="sjd", logits_processor=[processor])
    assert out.stats.cost_source == "measured" and len(processor.later) > 24
    assert not any(torch.equal(state, processor.drawn_from) for state in processor.later)  # never rewound to it


def test_refused_timing_times_nothing(model, monkeypatch):
    assert calibration.profile_for(model, model.sjd_adapter, rows=2, context=8) is None  # the suite's setting
    monkeypatch.setenv("HF_SJD_CALIBRATE", "1")
    torch.use_deterministic_algorithms(True)
    try:
        assert calibration.profile_for(model, model.sjd_adapter, rows=2, context=8) is None
    finally:
        torch.use_deterministic_algorithms(False)
    monkeypatch.setenv("HF_SJD_CALIBRATE", "0")
    out = sample(model, custom_generate="sjd")
    assert (out.stats.jacobi_window, out.stats.cost_source) == (16, None)


def test_the_reference_tables_are_the_measured_means():
    """Every cell of REFERENCE_COMPRESSION without siblings below window 8 (and sjd's at every window) is the mean
    step compression of its row in docs/results/cells (sjd) and docs/results/cells_mc_sjd (the mc-sjd preset as it
    is; the cells from window 8: tests/jacobi/test_cost_model.py)."""
    import json
    from pathlib import Path

    def means(folder: str, method: str) -> dict[int, float]:
        results = json.loads((Path(__file__).resolve().parents[1] / f"docs/results/{folder}/results.json").read_text())
        keys = next(s for s in results["sections"] if s["name"] == "cells")["rows"]
        return {results["rows"][key]["window"]: results["rows"][key]["mean"]["step_compression"] for key in keys
                if results["rows"][key]["method"] == method}

    for family, folder in (("sjd", "cells"), ("mc-sjd", "cells_mc_sjd")):
        measured = means(folder, family)
        assert measured, family
        for window, value in measured.items():
            assert calibration.REFERENCE_COMPRESSION[family][(window, 0)] == pytest.approx(value, abs=0.005), window
        if family == "sjd":
            assert set(measured) == {w for w, _ in calibration.REFERENCE_COMPRESSION["sjd"]} - {0}
        else:
            table = {w for w, _ in calibration.REFERENCE_COMPRESSION["mc-sjd"]}
            assert set(measured) == table - {0} - {w for w, _ in cost_model.STEP_COMPRESSION}


def test_the_timer_gaps_are_the_time_between_forwards_only():
    """The loop's work per iteration is read between forwards: what runs before the first forward (a probe's
    setup) is in no gap. Sub-intervals of one monotonic clock, so the bounds hold however loaded the machine is."""
    import time

    from hf_sjd.timing import ForwardTimer

    layer, timer = torch.nn.Linear(2, 2), ForwardTimer()
    started = time.perf_counter()
    with timer.hooked(layer):
        time.sleep(0.05)  # setup before the first forward
        layer(torch.ones(1, 2))
        time.sleep(0.02)  # the loop's work
        layer(torch.ones(1, 2))
    elapsed = time.perf_counter() - started
    (gap,) = timer.gaps()
    assert 0.02 <= gap <= elapsed - 0.05 - sum(timer.durations())


def test_a_probe_times_the_work_between_forwards_not_the_setup(model, timing, monkeypatch):
    """A loop whose setup is slow but whose iterations are cheap is priced by its iterations."""
    import time

    from hf_sjd.jacobi import loop

    run = loop.JacobiDecoder.run

    def slow_setup(self, *args, **kwargs):
        time.sleep(1.0)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(loop.JacobiDecoder, "run", slow_setup)
    sample(model, custom_generate="sjd")
    timed = calibration._PROFILES[model][0].loops
    works = [at[max(at)][1] for name, at in timed.items() if name != calibration.PLAIN]
    # the setup spread over a probe's iterations (at most 33 forwards) would be over 30 ms each; an iteration's own
    # work is about a millisecond here, several under a loaded machine's load
    assert works and max(works) < 0.015


def test_the_cost_bound_lies_above_the_median_as_often_as_it_says():
    """median_upper_bound over five timings exceeds their law's median with probability 26/32 whatever the law: over
    4000 sets of five draws of a right-skewed law (lognormal, median 1) the share above 1 is 26/32 within four
    standard errors (sqrt(0.8125 * 0.1875 / 4000) = 0.0062); 26/32 is at least the level asked for."""
    generator = torch.Generator().manual_seed(0)
    draws = torch.randn(4000, 5, generator=generator, dtype=torch.float64).mul(0.5).exp()
    share = sum(calibration.median_upper_bound(row.tolist()) > 1.0 for row in draws) / len(draws)
    assert abs(share - 26 / 32) < 4 * (26 / 32 * 6 / 32 / len(draws)) ** 0.5 and 26 / 32 >= calibration.BOUND_LEVEL
    assert calibration.median_upper_bound([2.0, 1.0, 3.0]) == 3.0  # three: no x(k) below the max reaches 0.8


class NothingAllowed(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return torch.full_like(scores, -float("inf"))


def test_processors_that_allow_nothing_get_the_calls_own_error_with_timing_on(model, timing, monkeypatch):
    """The calibration's probes run the call's processors on its prompt; where those fail, the call raises its
    own documented error (it raised torch's RuntimeError from transformers' sampling inside a probe). Forward costs
    under which a window pays (a pick of plain decoding would raise transformers' own error, as vanilla does): the
    probes still run."""
    def flat(self, model, adapter, rows, context, **kwargs):  # a forward of n tokens costs what one token does
        self.ratios.setdefault(rows, {}).update({n: 1.0 for n in TOKENS})
        return True

    monkeypatch.setattr(CostProfile, "measure", flat)
    probes = []
    probe = JacobiDecodingMethod._probe
    monkeypatch.setattr(JacobiDecodingMethod, "_probe", lambda *args, **kwargs: (probes.append(1),
                                                                                 probe(*args, **kwargs))[1])
    for knobs in ({}, {"draft_token_ids": [0, 1, 2, 3]}):
        for strategy in ("sjd", "mc-sjd"):
            with pytest.raises(ValueError, match="leave no token allowed at generated position 0"):
                model.generate(torch.full((1, 1), COND), do_sample=True, max_new_tokens=8, custom_generate=strategy,
                               logits_processor=[NothingAllowed()], **knobs)
    assert probes  # the processors ran in the calibration's probes too


def test_cost_is_linear_in_rows_between_measured_row_counts():
    from hf_sjd.calibration import CostProfile
    profile = CostProfile(model="m", device="cpu", dtype="float32", ratios={1: {1: 1.0, 8: 2.0}, 8: {1: 1.0, 8: 4.0}})
    assert profile.cost(2, 8) == pytest.approx(2 + 2 / 7)
    assert profile.cost(7, 8) == pytest.approx(2 + 12 / 7)


def test_doctests():
    import doctest

    from hf_sjd import calibration
    from hf_sjd.jacobi import stats

    assert doctest.testmod(calibration).failed == 0 and doctest.testmod(stats).failed == 0
