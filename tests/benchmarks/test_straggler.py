"""The frontier suite's ``straggler`` section and its ``batch-straggler`` measurement: why batch 8 keeps less step
compression than batch 1, as (a row's own forwards in a batch) x (waiting for the batch's slowest row)."""

import itertools
import random
from types import SimpleNamespace

from benchmarks.measurements import batch_straggler, expected_max
from benchmarks.suites import SUITES, _straggler_pairs


def test_expected_max_is_the_mean_over_every_draw():
    values = [3, 1, 4, 1, 5]  # ties included
    for n in (1, 2, 3):
        draws = list(itertools.product(values, repeat=n))
        assert abs(expected_max(values, n) - sum(map(max, draws)) / len(draws)) < 1e-12


def test_pairs_compare_the_same_knobs_at_batch_1_and_8():
    rows = {r.key for r in {s.name: s for s in SUITES["frontier"].sections}["straggler"].rows}
    for one, many in _straggler_pairs():
        assert (one.batch_size, many.batch_size) == (1, 8) and {one.key, many.key} <= rows
        assert one.window == many.window and dict(one.knobs) == dict(many.knobs)


def _calls(forwards: dict, batches: list[list], seed: int, slowdown: float) -> list[dict]:
    """Batch calls over ``forwards`` (item -> batch-1 forwards): each row needs ``slowdown`` x its batch-1
    forwards, the call as many as its slowest row."""
    calls = []
    for items in batches:
        rows = [slowdown * forwards[item] for item in items]
        calls.append({"seed": seed, "items": [list(i) for i in items], "forwards": max(rows), "row_forwards": rows})
    return calls


def test_the_measured_ratio_factors_into_the_row_in_a_batch_and_the_slowest_row():
    generator = random.Random(0)
    items = [(f"class {c}", i) for i in range(4) for c in range(16)]
    forwards = {item: generator.randint(50, 80) for item in items}
    one, many = _straggler_pairs()[0]
    summary = {
        one.key: {"label": "one", "window": 16,
                  "forwards_per_call": [{"seed": 0, "items": [list(i)], "forwards": forwards[i], "row_forwards": None}
                                        for i in items]},
        many.key: {"label": "many", "window": 16,
                   "forwards_per_call": _calls(forwards, [items[s:s + 8] for s in range(0, 64, 8)], 0, 1.1)}}
    out = batch_straggler(None, SimpleNamespace(summary=summary))
    (entry,) = out["data"]["pairs"].values()
    assert abs(entry["measured_ratio"] - entry["row_in_batch"] * entry["slowest_row"]) < 1e-12
    assert abs(entry["row_in_batch"] - 1 / 1.1) < 1e-12  # each row needed 1.1 x its batch-1 forwards
    # the same images' batch-1 maxima predict the batch exactly when rows decode in a batch as alone (up to 1.1)
    assert abs(entry["predicted_ratio_same_images"] - 1.1 * entry["measured_ratio"]) < 1e-12
    mean = sum(forwards.values()) / len(forwards)
    assert abs(entry["predicted_ratio_spread"] - mean / expected_max(list(forwards.values()), 8)) < 1e-12
    assert entry["slowest_row"] < 1 and "| one, window 16 | many |" in out["text"]


def test_without_the_section_it_says_so():
    assert "did not run" in batch_straggler(None, SimpleNamespace(summary={}))["text"]


def test_cost_model_charges_every_forward_at_its_own_width():
    from benchmarks.measurements import SEVEN_B_SIZE, cost_ratio, mean_cost_ratio

    assert mean_cost_ratio(SEVEN_B_SIZE, 32, [0] * 32 + [5]) == cost_ratio(SEVEN_B_SIZE, 32, 32)
    mixed = [0] * 33
    mixed[4], mixed[32] = 1, 1  # convex roofline: half at 4, half at 32 costs more than two forwards at 18
    assert mean_cost_ratio(SEVEN_B_SIZE, 32, mixed) > cost_ratio(SEVEN_B_SIZE, 32, 18)
    assert mean_cost_ratio(SEVEN_B_SIZE, 32, [0] * 16 + [1], extra=15) == cost_ratio(SEVEN_B_SIZE, 32, 31)
