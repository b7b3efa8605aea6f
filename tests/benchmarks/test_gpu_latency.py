"""benchmarks/gpu_latency.py and benchmarks/gpu_check.sh smoke tests: tiny model on CPU (the real runs need a GPU
and a 1.3B or 7B model)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from hf_sjd.jacobi.cost_model import STEP_COMPRESSION, ModelShape

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_latency():
    from benchmarks import gpu_latency

    return gpu_latency


def test_tree_forward_is_the_one_the_loop_runs(gpu_latency):
    """gpu_latency times a sibling forward with its own copy of the loop's tree mask and positions (the harness
    uses the public API only): they must be what ``generate(..., jacobi_siblings=m)`` feeds the model."""
    import hf_sjd

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=63,
                         bos_token_id=None, eos_token_id=None, image_token_range=[0, 60], null_condition_token_id=61)
    model = hf_sjd.enable(LlamaForCausalLM(config).eval())
    window, siblings, prompt = 4, 3, 5
    seen = []

    def record(module, args, kwargs):
        seen.append((kwargs["attention_mask"], kwargs["position_ids"]))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        model.generate(torch.full((1, prompt), 60), do_sample=True, top_k=10, max_new_tokens=30,
                       custom_generate="sjd", jacobi_window=window, jacobi_siblings=siblings)
    finally:
        handle.remove()
    mask, positions = seen[2]  # a forward after the prefill: the window and its siblings
    width = window + 1 + siblings
    visible = mask[0, 0] if mask.dtype == torch.bool else (mask[0, 0] == 0 if mask.is_floating_point()
                                                            else mask[0, 0].bool())
    cached = visible.shape[-1] - width
    expected = gpu_latency.tree_visibility(torch.arange(cached + width), cached, siblings)
    assert torch.equal(visible.bool(), expected)
    base = positions[:, :1]  # the uncached token's position
    window_positions = base + torch.arange(window + 1)
    assert torch.equal(positions, gpu_latency.tree_positions(window_positions, siblings))


def test_cpu_tiny_smoke(gpu_latency, tmp_path):
    out = tmp_path / "latency.json"
    result = gpu_latency.main(["--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--context", "48",
                               "--window", "4", "--warmup", "1", "--repeats", "3", "--loop-tokens", "6",
                               "--compression", "2.5", "--loop-overhead", "0.2", "--ar-loop-overhead", "0.1",
                               "--out", str(out)])
    assert json.loads(out.read_text())["parameters"] == result["parameters"]
    t1, t5 = result["t_forward_1_s"], result["t_forward_5_s"]
    assert t1 > 0 and t5 > 0 and result["window_cost_ratio"] == pytest.approx(t5 / t1)
    assert result["speedup_forward_only"] == pytest.approx(2.5 * t1 / t5)
    assert result["speedup_with_loop_overhead"] == pytest.approx(2.5 * t1 / t5 * 0.8 / 0.9)
    assert result["loops"]["sjd_iterations"] >= 2 and result["loops"]["speedup_measured_loops"] > 0


def test_defaults_read_the_reference_benchmark(gpu_latency):
    """Defaults come from the core suite's results.json: the plain sjd row (the suite runs batch 8, CFG 1)."""
    args = gpu_latency.parse_args(["--device", "cpu", "--shape", "tiny", "--batch", "8"])
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
    result = gpu_latency.main(["--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--context", "24",
                               "--window", "4", "--warmup", "0", "--repeats", "1", "--compression", "2.0",
                               "--guidance-scale", "3", "--loop-cost", "ar,sjd", "--loop-cost-iterations", "3",
                               "--loop-cost-repeats", "1"])
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
        gpu_latency.parse_args(["--device", "cpu", "--shape", "tiny", "--loop-cost", "ar,beam"])
    assert exit_info.value.code == 2 and "--loop-cost" in capsys.readouterr().err


def test_bad_generate_tokens_exits_2(gpu_latency, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_latency.parse_args(["--device", "cpu", "--shape", "tiny", "--generate-tokens", "0"])
    assert exit_info.value.code == 2 and "--generate-tokens" in capsys.readouterr().err


def test_cpu_tiny_auto_check(gpu_latency, monkeypatch):
    """``--auto-check`` times every token count of the auto table's cells and picks under both costs: the
    roofline's pick is what ``generate`` makes for this shape on CUDA where timing is refused, the measured one
    maximises measured speed-up over the same cells; and it reports what ``generate`` picks with timing allowed
    (the suite refuses it elsewhere, tests/conftest.py)."""
    monkeypatch.setenv("HF_SJD_CALIBRATE", "1")
    result = gpu_latency.main(["--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--context", "24",
                               "--warmup", "0", "--repeats", "1", "--compression", "2.0", "--auto-check",
                               "--batch", "2", "--generate-tokens", "24"])
    check = result["auto_check"]
    tokens = {window + 1 + siblings for window, siblings in STEP_COMPRESSION}
    assert len(tokens) == len(STEP_COMPRESSION)  # a token count names its cell, so it is timed with its tree mask
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
    # the library's own calibration, timed through the adapter: a ratio per token count, never below 1, and the
    # pick that maximises speed-up under it
    calibrated = check["calibration_cost_ratio"]
    assert set(calibrated) == tokens and min(calibrated.values()) >= 1.0
    by_calibration = {cell: c / calibrated[sum(cell) + 1] for cell, c in STEP_COMPRESSION.items()}
    assert by_calibration[check["pick_calibration"]] == max(by_calibration.values())
    # what generate(custom_generate="mc-sjd") ran on its own: priced by a measured profile, every new token of
    # every row committed in the cells it reports
    ran = check["generate"]
    assert ran["cost_source"] == "measured" and ran["cells"]
    assert sum(tokens for tokens, _ in ran["cells"].values()) == 2 * 24


def test_7b_shape_is_the_cost_models_seven_b(gpu_latency):
    """``--shape 7b`` (built on the meta device: no memory) is the decoder the roofline's 7B figures describe:
    about 7e9 parameters, 32 layers, a 4096-wide KV cache per token and layer."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**gpu_latency.SHAPES["7b"]))
    shape = ModelShape.of(model)
    assert 6.5e9 < shape.params < 7.5e9 and (shape.layers, shape.kv_width) == (32, 4096)


def test_summarize_prices_both_picks_at_the_measured_cost(gpu_latency, tmp_path):
    """Each pick's speed-up in the table is c(L, m) over the *measured* t(n)/t(1) of its token count."""
    measured = {str(n): 1.0 for n in {window + 1 + siblings for window, siblings in STEP_COMPRESSION}}
    measured["80"] = 2.0  # 64 + 15 costs two steps on this pretend device
    check = {"forward_rows": 1, "measured_cost_ratio": measured, "pick_roofline": [64, 15], "pick_measured": [32, 15],
             "generate": {"cells": {"16+0": [40, 10], "32+3": [90, 20]}}}
    (tmp_path / "a.json").write_text(json.dumps({"device": "pretend", "shape": "7b", "auto_check": check}))
    (tmp_path / "no-check.json").write_text(json.dumps({"device": "pretend"}))  # a loop-cost file: not a row
    lines = gpu_latency.summarize(tmp_path).splitlines()
    assert len(lines) == 3
    assert f"64 + 15: {STEP_COMPRESSION[64, 15]:.2f}, {STEP_COMPRESSION[64, 15] / 2:.2f}x" in lines[2]
    assert f"32 + 15: {STEP_COMPRESSION[32, 15]:.2f}, {STEP_COMPRESSION[32, 15]:.2f}x" in lines[2]
    assert "| - | 32+3 |" in lines[2]  # no calibration pick in this file; the widest cell generate ran


def run_gpu_check(out: Path, *flags: str, python: str = sys.executable, wheels: Path | None = None
                  ) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_LOOP_COST": "0", "GPU_CHECK_SPEED": "0", "GPU_CHECK_TESTS": "0",
           "PYTHON": python, "TMPDIR": str(out.parent),
           "GPU_CHECK_WHEELS": str(wheels or out.parent / "no-wheels")}  # not whatever a checkout's .whl/ holds
    return subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh"), *flags], env=env, capture_output=True,
                          text=True, timeout=300)


def fake_wheel(path: Path) -> None:
    """A one-module wheel (pip installs it offline, as the device does the carried ones)."""
    name, info = "gpu_check_probe", "gpu_check_probe-0.1.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}.py", "")
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 0.1\n")
        wheel.writestr(f"{info}/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", f"{name}.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")


def test_preset_speedups_price_the_devices_compression_at_the_7b_cost(gpu_latency, tmp_path):
    """Each preset's modelled speed-up: its compression on the device over the 7B's t(n)/t(1) of the widest cell it
    ran (never below 1), and with the loop's work per iteration beside the forward; only CFG 1 rows, and only the
    batch sizes a 7B file was measured at."""
    def seven(rows: int, ratio: float) -> dict:
        return {"forward_rows": rows, "shape": "7b", "device": "pretend", "dtype": "bfloat16", "t_forward_1_s": 0.03,
                "auto_check": {"measured_cost_ratio": {"9": 1.0, "17": ratio, "33": 2 * ratio}}}

    def entry(cells, compression):
        return {"cells": cells, "compression": compression}

    (tmp_path / "speed").mkdir()
    (tmp_path / "speed/results.json").write_text(json.dumps({"measurements": {"speed": {"data": {
        "mc-sjd|b1|g1": entry([[8, 0], [16, 0]], 3.0), "mc-sjd|b1|g3": entry([[16, 0]], 9.0),
        "sjd|b8|g1": entry([[16, 0]], 2.0), "sjd|b4|g1": entry([[16, 0]], 2.0),
        "ar, inference mode|b1|g1": {"speedup": 1.1, "seconds": 1.0}}}}}))
    (tmp_path / "auto-7b-rows1.json").write_text(json.dumps(seven(1, 1.5)))
    (tmp_path / "auto-7b-batch8.json").write_text(json.dumps(seven(8, 0.8)))
    cases = [{"vocab_size": 65536, "method": method, "batch": 1, "outside_ms_per_iter": {"median": ms}}
             for method, ms in (("ar", 2.0), ("mc-sjd", 5.0))]
    (tmp_path / "loop-cost.json").write_text(json.dumps({"cases": cases}))
    lines = gpu_latency.preset_speedups(tmp_path).splitlines()
    assert len(lines) == 4  # mc-sjd at batch 1 and sjd at batch 8: CFG 3 and batch 4 are left out
    assert lines[2] == f"| mc-sjd | 1 | 16 + 0 | 3.00 | 1.50 | 2.00x | {3.0 * 0.032 / (0.045 + 0.005):.2f}x |"
    assert lines[3] == "| sjd | 8 | 16 + 0 | 2.00 | 1.00 | 2.00x | - |"  # a dip below 1 prices as 1; no loop cost
    (tmp_path / "loop-cost.json").unlink()
    assert gpu_latency.preset_speedups(tmp_path) == ""


def test_gpu_check_runs_every_step_into_out(tmp_path):
    """The prepared device run, on a tiny CPU model: the three auto checks (one row, batch 8, batch 8 with CFG),
    the summary of them and the log, flat under $OUT (the device returns no deeper files)."""
    out, wheels = tmp_path / "out", tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels / "gpu_check_probe-0.1-py3-none-any.whl")  # what a session carries as .whl/
    done = run_gpu_check(out, "--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--context", "24",
                         "--warmup", "0", "--repeats", "1", "--compression", "2.0", wheels=wheels)
    assert done.returncode == 0, done.stdout[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["auto-7b-batch8.json", "auto-7b-cfg.json",
                                                     "auto-7b-rows1.json", "log.txt", "summary.md"]
    assert (tmp_path / "gpu_check_site" / "gpu_check_probe.py").exists()  # the carried wheels, installed first
    rows = {json.loads((out / f"auto-7b-{name}.json").read_text())["forward_rows"] for name in
            ("rows1", "batch8", "cfg")}
    assert rows == {1, 8, 16}
    summary = (out / "summary.md").read_text()
    log = (out / "log.txt").read_text()
    assert summary.count("| auto-7b-") == 6 and summary in log  # a row of picks and a row of costs per file
    assert f"| transformers {transformers.__version__} |" in log  # what ran, recorded first


def test_gpu_check_exits_nonzero_when_a_step_fails(tmp_path):
    """Every step still runs after one fails (a device run is too dear to stop at the first), and the script's
    exit status says one did (``false`` as the interpreter: each step fails at once)."""
    done = run_gpu_check(tmp_path / "out", python="false")
    assert done.returncode == 1 and done.stdout.count("failed (exit 1)") == 3


def test_gpu_check_runs_in_two_parts(tmp_path, monkeypatch):
    """GPU_CHECK_7B=0 leaves out the three 7B steps (the device runs a command for at most 10 minutes: the script
    runs as the 7B steps, then the rest; ``false`` as the interpreter: a step that ran would say it failed)."""
    monkeypatch.setenv("GPU_CHECK_7B", "0")
    done = run_gpu_check(tmp_path / "out", python="false")
    assert done.returncode == 1 and "== auto-7b" not in done.stdout and "failed (exit" not in done.stdout


def test_the_calibration_trace_times_every_count_three_ways_in_both_orders(tmp_path):
    """benchmarks/calibration_trace.py, the GPU diagnosis of docs/results/gpu/calibration, on a tiny CPU model."""
    from benchmarks import calibration_trace

    from hf_sjd.calibration import TOKENS

    torch.set_num_threads(1)
    out = tmp_path / "trace.json"
    result = calibration_trace.main(["--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--repeats", "2",
                                     "--calibrations", "1", "--context", "16", "--out", str(out)])
    assert json.loads(out.read_text())["passes"].keys() == {"ascending", "descending"}
    for order, ways in result["passes"].items():
        assert set(ways) == {"library", "synced", "harness"}
        for times in ways.values():
            assert list(times) == (list(TOKENS) if order == "ascending" else list(TOKENS)[::-1])
            assert all(len(seconds) == 2 and min(seconds) > 0 for seconds in times.values())
    (ratios,) = result["calibrations"]
    assert ratios[1] == 1.0 and list(ratios) == list(TOKENS)
    assert len(result["settle"]) == calibration_trace.SETTLE and min(result["settle"]) > 0
