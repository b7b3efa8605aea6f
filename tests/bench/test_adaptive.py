"""The frontier suite's adaptive- and budget-window sections and their cost models (``adaptive-cost-model``,
``siblings-cost-model``)."""

from types import SimpleNamespace

import pytest

from hf_sjd.bench.measurements import (ADAPTIVE_SIZE, adaptive_cost_model, cost_ratio, mean_cost_ratio,
                                       siblings_cost_model)
from hf_sjd.bench.suites import SUITES


def test_adaptive_rows_pair_with_the_fixed_window_at_their_upper_bound():
    sections = {s.name: s for s in SUITES["frontier"].sections}
    for r in sections["adaptive"].rows + sections["adaptive-sweep"].rows:
        knobs = dict(r.knobs)
        if knobs.get("jacobi_window_rule") == "adaptive":
            assert (r.base.window, r.base.batch_size, r.base.knobs) == (r.window, r.batch_size, ())
        else:
            assert r.base is None and knobs == {}  # the mc-sjd preset at a fixed window
    assert {dict(r.knobs)["jacobi_window_ema"] for r in sections["adaptive-sweep"].rows} == {0.3, 0.7}


def test_budget_rows_pair_with_the_fixed_window_of_their_full_batch():
    rows = {s.name: s for s in SUITES["frontier"].sections}["budget"].rows
    budget = [r for r in rows if dict(r.knobs).get("jacobi_window_rule") == "budget"]
    assert [dict(r.knobs)["jacobi_window_max"] for r in budget] == [32, 64, 32]
    assert {r.batch_size for r in budget} == {8}
    for r in budget:  # the full batch runs at the base's fixed window: the difference is the stragglers' width
        assert r.window == r.base.window == 16 and r.base.batch_size == 8
        assert dict(r.knobs).get("jacobi_siblings") == dict(r.base.knobs).get("jacobi_siblings")
    assert {(r.window, r.batch_size) for r in rows if not r.knobs} == {(16, 1), (16, 8)}  # batch 8 vs batch 1


def test_cost_model_charges_every_forward_at_its_own_width():
    assert mean_cost_ratio(ADAPTIVE_SIZE, 32, [0] * 32 + [5]) == pytest.approx(cost_ratio(ADAPTIVE_SIZE, 32, 32))
    mixed = [0] * 33
    mixed[4], mixed[32] = 1, 1  # convex roofline: half at 4, half at 32 costs more than two forwards at 18
    assert mean_cost_ratio(ADAPTIVE_SIZE, 32, mixed) > cost_ratio(ADAPTIVE_SIZE, 32, 18)

    def entry(batch, window, compression, widths, **knobs):
        label = "adaptive" if knobs else "fixed"
        return {"label": label, "batch_size": batch, "window": window, "forward_windows": widths,
                "mean": {"step_compression": compression, "drafts_per_forward": mean_width(widths)}}

    def mean_width(widths):
        return sum(k * n for k, n in enumerate(widths)) / sum(widths)

    wide, narrow = [0] * 32 + [10], [0] * 8 + [10] + [0] * 24
    summary = {"mc-sjd/w32/b1": entry(1, 32, 4.8, wide), "mc-sjd/w32/b8": entry(8, 32, 3.7, wide),
               "mc-sjd/w32/b8/jacobi_window_rule=adaptive": entry(8, 32, 3.0, narrow, rule="adaptive")}
    out = adaptive_cost_model(None, SimpleNamespace(summary=summary))
    rows, best = out["data"]["rows"], out["data"]["best"]
    assert rows["mc-sjd/w32/b1"]["speedup"]["1"] == pytest.approx(4.8)  # one row: weights dominate, L is free
    assert best["1"]["row"] == "mc-sjd/w32/b1" and best["8"]["row"] == "mc-sjd/w32/b8"  # stand-ins by batch
    assert best["32"]["row"] == "mc-sjd/w32/b8/jacobi_window_rule=adaptive"  # compute-bound: the narrow one wins
    assert "Model, not a measurement" in out["text"] and out["data"]["kind"] == "model, not a measurement"
    assert "did not run" in adaptive_cost_model(None, SimpleNamespace(summary={}))["text"]


def test_siblings_cost_model_charges_the_siblings_and_picks_per_row_count():
    """Siblings ride in every forward: at 16 rows (compute-bound) 7 of them cost more than their gain, at 1 row
    they are free, so the pick differs by row count."""
    def entry(batch, window, compression, siblings=0):
        widths = [0] * window + [10]
        return {"label": f"{siblings} siblings", "batch_size": batch, "window": window, "forward_windows": widths,
                "knobs": {"jacobi_siblings": siblings} if siblings else {}, "mean": {"step_compression": compression}}

    summary = {"mc-sjd/w16/b1": entry(1, 16, 4.0), "mc-sjd/w16/b1/jacobi_siblings=7": entry(1, 16, 4.4, 7),
               "mc-sjd/w16/b8": entry(8, 16, 3.3), "mc-sjd/w16/b8/jacobi_siblings=7": entry(8, 16, 3.5, 7)}
    out = siblings_cost_model(None, SimpleNamespace(summary=summary))
    rows, best = out["data"]["rows"], out["data"]["best"]
    assert rows["mc-sjd/w16/b8/jacobi_siblings=7"]["speedup"]["16"] == pytest.approx(
        3.5 / cost_ratio(ADAPTIVE_SIZE, 16, 16 + 7))
    assert best["1"]["row"] == "mc-sjd/w16/b1/jacobi_siblings=7" and best["1"]["siblings"] == 7
    assert best["16"]["row"] == "mc-sjd/w16/b8" and best["16"]["siblings"] == 0
    assert "1 rows: window 16 + 7 siblings (4.40x)" in out["text"]
    assert "did not run" in siblings_cost_model(None, SimpleNamespace(summary={}))["text"]


def test_auto_cost_model_prints_the_shipped_picks_and_this_runs():
    """The auto measurement reports, per model size and row count, the pick ``generate`` makes (shipped table)
    and, once the auto section ran, the pick from this run's cells."""
    from hf_sjd.bench.measurements import MODEL_SIZES, auto_cost_model
    from hf_sjd.bench.suites import AUTO_GRID
    from hf_sjd.jacobi.cost_model import pick

    sections = {s.name: s for s in SUITES["frontier"].sections}
    keys = [r.key for r in sections["auto"].rows]
    assert [(r.window, dict(r.knobs).get("jacobi_siblings", 0), r.batch_size) for r in sections["auto"].rows] == \
        [(*cell, 1) for cell in AUTO_GRID]
    shipped = auto_cost_model(None, SimpleNamespace(summary={}))["data"]
    seven_b = next(size for size in MODEL_SIZES if size.startswith("7B"))
    assert (shipped["picks"][f"{seven_b}|shipped|16"]["window"], shipped["picks"][f"{seven_b}|shipped|16"]
            ["siblings"]) == pick(MODEL_SIZES[seven_b], 16, 1024) and not shipped["measured"]
    flat = {key: {"mean": {"step_compression": 3.0 + (cell == (16, 3))}} for key, cell in zip(keys, AUTO_GRID)}
    out = auto_cost_model(None, SimpleNamespace(summary=flat))
    run = out["data"]["picks"][f"{seven_b}|this run|1"]
    assert (run["window"], run["siblings"]) == (16, 3)  # one row: tokens are free, the best cell wins
    assert "this run" in out["text"] and "Model, not a measurement" in out["text"]
