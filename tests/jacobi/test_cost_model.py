"""The cost model behind ``jacobi_window="auto"`` / ``jacobi_siblings="auto"`` (the mc-sjd preset).

Specification:
1. The shipped step compressions are the measured ones: the mean over the seeds of ``docs/results/frontier_auto_token``
   (the auto section under the preset as it is: token-by-token verification, siblings from the mixture law).
2. The roofline: a large model's forward of one row is memory-bound (extra tokens cost nothing), one of many rows
   is compute-bound (each token costs), and no forward costs less than one of fewer tokens.
3. The pick maximises compression / cost among the measured cells that agree with what the user fixed.
4. In ``generate``: on CPU ``"auto"`` is window 16 without siblings; an explicit knob wins over the preset's
   ``"auto"``; the resolved values are reported in ``out.stats``; bad values are refused before any forward.
5. The plan: the full batch's cell is the pick for the full batch; with fewer rows left, the pick for those rows
   among the cells at least as wide (an explicit knob kept); where no roofline applies, or nothing is "auto", the
   full batch's cell throughout. ``SJDConfig.for_call`` caps it at ``max_new_tokens - 1``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_sjd import STRATEGIES
from hf_sjd.jacobi import cost_model
from hf_sjd.jacobi.config import SJDConfig
from hf_sjd.jacobi.cost_model import STEP_COMPRESSION, ModelShape, cost_ratio, pick, plan, priced_as, speedup

from toy import COND, no_forward, toy_model

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
SEVEN_B = ModelShape(params=7e9, layers=32, kv_width=4096)


def section_rows(folder: str, section: str) -> list[list[dict]]:
    """Per seed of ``docs/results/<folder>``: the rows of ``section`` (at least three seeds)."""
    runs = sorted((RESULTS / folder).glob("seed*/results.json"))
    assert len(runs) >= 3, f"expected the {section} section's seeds under {RESULTS / folder}"
    out = []
    for run in runs:
        results = json.loads(run.read_text())
        keys = next(s for s in results["sections"] if s["name"] == section)["rows"]
        out.append([results["rows"][key] for key in keys])
    return out


def test_shipped_compressions_are_the_measured_means():
    """Each cell of the table is the mean step compression of its row of the auto section over its seeds, run with
    the preset as it is (token-by-token verification, maximal coupling, siblings from the mixture law)."""
    preset = STRATEGIES["mc-sjd"].preset
    assert (preset["jacobi_sibling_law"], preset["verifier"], preset["draft_coupling"]) == (
        "mixture", "speculative", "maximal")
    measured: dict[tuple[int, int], list[float]] = {}
    for rows in section_rows("frontier_auto_token", "auto"):
        for entry in rows:
            assert entry["batch_size"] == 1
            cell = (entry["window"], dict(entry["knobs"]).get("jacobi_siblings", 0))
            measured.setdefault(cell, []).append(entry["mean"]["step_compression"])
    assert list(measured) == list(STEP_COMPRESSION)
    for cell, values in measured.items():
        assert len(values) >= 3, cell
        assert STEP_COMPRESSION[cell] == pytest.approx(sum(values) / len(values), abs=0.005), cell


def test_roofline_one_row_is_memory_bound_many_rows_compute_bound():
    assert cost_ratio(SEVEN_B, rows=1, n=65, context=1024) == pytest.approx(1.0)
    assert cost_ratio(SEVEN_B, rows=16, n=33, context=1024) > 1.2
    assert cost_ratio(SEVEN_B, rows=64, n=33, context=1024) > 2.0
    for rows in (1, 8, 16, 64):
        costs = [cost_ratio(SEVEN_B, rows, n, 1024) for n in range(1, 80)]
        assert costs[0] == 1.0 and all(a <= b for a, b in zip(costs, costs[1:]))


def test_pick_maximises_modelled_speedup_among_agreeing_cells():
    for rows in (1, 2, 8, 16, 32, 64):
        best = pick(SEVEN_B, rows, 1024)
        speed = {cell: c / cost_ratio(SEVEN_B, rows, sum(cell) + 1, 1024) for cell, c in STEP_COMPRESSION.items()}
        assert speed[best] == max(speed.values())
    # one row: every cell's forward is memory-bound, so the pick is the cell of highest compression
    assert pick(SEVEN_B, 1, 1024) == max(STEP_COMPRESSION, key=STEP_COMPRESSION.get)
    assert pick(SEVEN_B, 1, 1024, window=16) == max(((16, m) for m in (0, 3, 7, 15)), key=STEP_COMPRESSION.get)
    assert pick(SEVEN_B, 1, 1024, siblings=0) == max(((w, 0) for w in (8, 16, 32, 64)), key=STEP_COMPRESSION.get)
    assert pick(SEVEN_B, 128, 1024) == (8, 0)  # batch 64 with CFG: the tokens cost, siblings do not pay
    assert pick(SEVEN_B, 16, 1024)[1] < pick(SEVEN_B, 1, 1024)[1]  # fewer siblings as the FLOPs take over
    assert pick(SEVEN_B, 1, 1024, siblings_allowed=False)[1] == 0
    assert pick(SEVEN_B, 1, 1024, window=24) == (24, 0)  # no measured cell at window 24: no siblings
    assert pick(SEVEN_B, 1, 1024, siblings=5) == (16, 5)  # none with 5 siblings: the default window


def tiny_llama(kv_heads: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=kv_heads)).eval()


def test_model_shape_counts_grouped_query_heads():
    model = tiny_llama(kv_heads=2)
    shape = ModelShape.of(model)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert (shape.layers, shape.kv_width, shape.bytes_per_value) == (3, 2 * 8, 4)  # 2 KV heads of size 32 / 4


def test_plan_by_device():
    model = tiny_llama()
    assert plan("auto", "auto", model, 1, 1, context=64, siblings_allowed=True) == ((16, 0),)  # CPU
    assert plan(32, "auto", model, 1, 1, context=64, siblings_allowed=True) == ((32, 0),)
    assert plan(0, "auto", model, 2, 1, context=64, siblings_allowed=True) == ((0, 0),) * 2  # 0 is not "unset"
    assert plan(8, 3, model, 2, 1, context=64, siblings_allowed=True, device_type="cuda") == ((8, 3),) * 2
    cuda = plan("auto", "auto", model, 1, 1, context=64, siblings_allowed=True, device_type="cuda")
    assert cuda == (pick(ModelShape.of(model), 1, 64),)
    assert plan("auto", "auto", model, 1, 1, context=64, siblings_allowed=False, device_type="cuda")[0][1] == 0


def test_plan_picks_again_for_the_rows_left():
    model = tiny_llama()
    for rows_per_image in (1, 2):  # without and with guidance
        with priced_as(SEVEN_B):
            cells = plan("auto", "auto", model, batch=8, rows_per_image=rows_per_image, context=1024,
                         siblings_allowed=True)
        full = pick(SEVEN_B, 8 * rows_per_image, 1024)
        assert len(cells) == 8 and cells[-1] == full
        for left, cell in enumerate(cells[:-1], start=1):
            wide_enough = {c: v for c, v in STEP_COMPRESSION.items() if c[0] >= full[0]}
            rows = left * rows_per_image
            assert speedup(SEVEN_B, rows, 1024, cell) == max(speedup(SEVEN_B, rows, 1024, c) for c in wide_enough)
        assert cells[0][0] >= full[0] and cells[0][1] > full[1]  # one row left: as wide or wider, more siblings
    with priced_as(SEVEN_B):
        assert {m for _, m in plan("auto", 0, model, 8, 1, 1024, True)} == {0}  # an explicit count is kept
        explicit = plan(16, "auto", model, 8, 1, 1024, True)
        assert {L for L, _ in explicit} == {16} and len({m for _, m in explicit}) > 1  # siblings picked again
        assert {m for _, m in plan("auto", "auto", model, 8, 1, 1024, siblings_allowed=False)} == {0}
        assert plan(24, 3, model, 8, 1, 1024, True) == ((24, 3),) * 8  # nothing "auto": one cell
        assert plan(24, "auto", model, 8, 1, 1024, True) == ((24, 0),) * 8  # no measured cell: the default
    cpu = plan("auto", "auto", model, batch=8, rows_per_image=1, context=1024, siblings_allowed=True)
    assert cpu == ((16, 0),) * 8  # no roofline on a CPU: the fixed rule


def test_priced_as_is_undone_on_exit_also_when_the_block_raises():
    model = tiny_llama()
    with pytest.raises(RuntimeError), priced_as(SEVEN_B):
        # one row is memory-bound: the cell of highest compression
        assert plan("auto", "auto", model, 1, 1, context=64, siblings_allowed=True) == \
            (max(STEP_COMPRESSION, key=STEP_COMPRESSION.get),)
        raise RuntimeError
    assert plan("auto", "auto", model, 1, 1, context=64, siblings_allowed=True) == ((16, 0),)


def test_for_call_fixes_the_plan_and_caps_it_at_the_request():
    config = SJDConfig(jacobi_window="auto", jacobi_siblings="auto")
    cpu = config.for_call(tiny_llama(), batch=8, prompt_length=10, max_new_tokens=2048, siblings_allowed=True)
    assert cpu.plan == ((16, 0),) * 8 and (cpu.jacobi_window, cpu.jacobi_siblings, cpu.widest) == (16, 0, 16)
    with priced_as(SEVEN_B):
        eight = config.for_call(tiny_llama(), batch=8, prompt_length=24, max_new_tokens=2000, siblings_allowed=True)
        assert eight.plan == plan("auto", "auto", tiny_llama(), 8, 1, 1024, True)
        short = config.for_call(tiny_llama(), batch=8, prompt_length=24, max_new_tokens=9, siblings_allowed=True)
    assert (eight.jacobi_window, eight.jacobi_siblings) == eight.plan[-1]
    assert eight.widest == max(L for L, _ in eight.plan)  # what the buffers hold
    assert {L for L, _ in short.plan} == {8}  # the last new token is never a draft: at most max_new_tokens - 1
    with pytest.raises(Exception):  # frozen: one resolution per call, never edited in place
        eight.jacobi_window = 4


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return toy_model()


def run(model, **kwargs):
    torch.manual_seed(0)
    return model.generate(torch.tensor([[COND]]), do_sample=True, top_k=4, max_new_tokens=40,
                          return_dict_in_generate=True, **kwargs).stats


def test_generate_reports_the_resolved_window_and_siblings(model):
    stats = run(model, custom_generate="mc-sjd")  # the preset's "auto", on CPU
    assert (stats.jacobi_window, stats.jacobi_siblings) == (16, 0)
    assert len(stats.forward_windows) == 17
    stats = run(model, custom_generate="mc-sjd", jacobi_window=8, jacobi_siblings=2)  # explicit wins
    assert (stats.jacobi_window, stats.jacobi_siblings) == (8, 2)
    stats = run(model, custom_generate="sjd", jacobi_window="auto")  # any strategy may ask for it
    assert (stats.jacobi_window, stats.jacobi_siblings) == (16, 0)
    stats = run(model, custom_generate="mc-sjd", jacobi_window=0)  # plain decoding, though siblings are "auto"
    assert (stats.jacobi_window, stats.jacobi_siblings) == (0, 0)
    forwards = stats.num_forward_passes  # transformers' own loop ran: its histograms read as a window of 0
    assert stats.forward_windows.tolist() == [forwards] and stats.tokens_per_forward.tolist() == [0, forwards]
    assert stats.drafts_per_forward == 0.0 and stats.cells == {(0, 0): (int(stats.num_new_tokens.sum()), forwards)}


@pytest.mark.parametrize("knob, value", [("jacobi_window", "wide"), ("jacobi_window", -1),
                                         ("jacobi_siblings", "many"), ("jacobi_siblings", -1)])
def test_bad_values_refused_before_any_forward(model, knob, value):
    with no_forward(model):
        with pytest.raises((TypeError, ValueError), match=rf"{knob} must be an integer.*or 'auto'"):
            run(model, custom_generate="mc-sjd", **{knob: value})


def test_auto_is_the_field_default_and_picks_16_without_siblings_where_nothing_prices_a_cell():
    assert (SJDConfig().jacobi_window, SJDConfig().jacobi_siblings) == ("auto", 0)
    assert (cost_model.DEFAULT_WINDOW, cost_model.DEFAULT_SIBLINGS) == (16, 0)


def test_doctests():
    import doctest

    assert doctest.testmod(cost_model).failed == 0
