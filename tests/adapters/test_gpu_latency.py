"""scripts/gpu_latency.py smoke test: tiny model on CPU (the real run needs a GPU and a 1.3B model)."""

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def gpu_latency(load_script):
    return load_script("gpu_latency")


def test_cpu_tiny_smoke(gpu_latency, tmp_path):
    out = tmp_path / "latency.json"
    result = gpu_latency.main(["--device", "cpu", "--tiny", "--dtype", "float32", "--context", "48", "--window", "4",
                               "--warmup", "1", "--repeats", "3", "--loop-tokens", "6", "--compression", "2.5",
                               "--loop-overhead", "0.2", "--ar-loop-overhead", "0.1", "--out", str(out)])
    assert json.loads(out.read_text())["parameters"] == result["parameters"]
    t1, t5 = result["t_forward_1_s"], result["t_forward_5_s"]
    assert t1 > 0 and t5 > 0 and result["window_cost_ratio"] == pytest.approx(t5 / t1)
    assert result["speedup_forward_only"] == pytest.approx(2.5 * t1 / t5)
    assert result["speedup_with_loop_overhead"] == pytest.approx(2.5 * t1 / t5 * 0.8 / 0.9)
    assert result["loops"]["sjd_iterations"] >= 2 and result["loops"]["speedup_measured_loops"] > 0


def test_defaults_read_the_reference_benchmark(gpu_latency):
    """Defaults come from the core suite's results.json: the plain sjd row (the suite runs batch 8, CFG 1)."""
    args = gpu_latency.parse_args(["--device", "cpu", "--tiny", "--batch", "8"])
    reference = gpu_latency.reference_numbers(args)
    core = json.loads(Path(args.core_json).read_text())
    sjd = next(r for r in core["rows"].values() if r["method"] == "sjd" and not r["knobs"] and r["guidance_scale"] == 1)
    ar = next(r for r in core["rows"].values() if r["method"] == "ar" and not r["knobs"] and r["guidance_scale"] == 1)
    assert reference["compression"] == sjd["mean"]["step_compression"] > 1
    assert reference["loop_overhead"] == sjd["mean"]["loop_overhead"]
    assert reference["ar_loop_overhead"] == ar["mean"]["loop_overhead"]
    assert "batch 8" in reference["source"] and "CFG 1" in reference["source"]
    assert gpu_latency.SHAPES["1.3b"]["hidden_size"] == 2048  # ~1.3B parameters (checked in the README section)


def test_cpu_tiny_loop_cost(gpu_latency):
    result = gpu_latency.main(["--device", "cpu", "--tiny", "--dtype", "float32", "--context", "24", "--window", "4",
                               "--warmup", "0", "--repeats", "1", "--compression", "2.0", "--guidance-scale", "3",
                               "--loop-cost", "ar,sjd", "--loop-cost-iterations", "3", "--loop-cost-repeats", "1"])
    cases = result["loop_cost"]
    assert [(c["method"], c["guidance_scale"]) for c in cases] == [("ar", 1.0), ("ar", 3.0), ("sjd", 1.0),
                                                                    ("sjd", 3.0)]
    for case in cases:
        assert case["batch"] == 1 and case["iterations"] == 3 and case["random_weights"]
        assert case["ops_per_iter"] > 0 and case["outside_ms_per_iter"]["best"] > 0
    assert cases[1]["forwards_per_step"] == 2  # transformers' CFG: a second (unconditional) forward per step
    assert cases[2]["window"] == 4 and 1 <= cases[2]["step_compression"] <= 5


def test_bad_loop_cost_method_exits_2(gpu_latency, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_latency.parse_args(["--device", "cpu", "--tiny", "--loop-cost", "ar,beam"])
    assert exit_info.value.code == 2 and "--loop-cost" in capsys.readouterr().err


def test_cpu_tiny_auto_check(gpu_latency):
    """``--auto-check`` times every token count of the auto table's cells and picks under both costs: the
    roofline's pick is what ``generate`` makes for this shape on CUDA, the measured one maximises measured
    speed-up over the same cells."""
    from hf_sjd.jacobi.cost_model import STEP_COMPRESSION

    result = gpu_latency.main(["--device", "cpu", "--tiny", "--dtype", "float32", "--context", "24", "--warmup",
                               "0", "--repeats", "1", "--compression", "2.0", "--auto-check", "--batch", "2"])
    check = result["auto_check"]
    tokens = {window + 1 + siblings for window, siblings in STEP_COMPRESSION}
    assert set(check["measured_cost_ratio"]) == set(check["roofline_cost_ratio"]) == tokens
    assert check["forward_rows"] == 2 and all(v > 0 for v in check["measured_cost_ratio"].values())
    measured = check["measured_cost_ratio"]
    speed = {cell: c / measured[sum(cell) + 1] for cell, c in STEP_COMPRESSION.items()}
    assert speed[check["pick_measured"]] == max(speed.values())
    assert check["pick_roofline"] in STEP_COMPRESSION
    # --batch 2: the auto rule's plan, its last cell the full batch's pick under each cost, its first the pick
    # for one row left (measured on a cache of one row) among the cells at least as wide
    assert check["plan_measured"][-1] == check["pick_measured"] and check["plan_roofline"][-1] == check["pick_roofline"]
    one_row = check["measured_cost_ratio_by_rows"][1]
    wide = {cell: c / one_row[sum(cell) + 1] for cell, c in STEP_COMPRESSION.items()
            if cell[0] >= check["pick_measured"][0]}
    assert wide[check["plan_measured"][0]] == max(wide.values())
