"""``hf-sjd bench``: exactly the methods and images asked for, one paired table (JSON, CSV, markdown), the speed-up
over ``ar`` from the same run, clean refusals before any work (the study suites' flags point to benchmarks/)."""

import csv
import json
import re

import pytest

from checkpoints import save_emu3
from hf_sjd.cli import main
from hf_sjd.reference import weights_dir

MARKER = ".hf_sjd-output.json"


def test_two_images_per_method_and_nothing_else(tmp_path, capsys):
    """``--methods ar,sjd --num-images 2``: 2 images of each method (4 in all), no other method, prompt or section."""
    out = tmp_path / "out"
    assert main(["bench", "--methods", "ar,sjd", "--num-images", "2", "--threads", "1", "--quiet",
                 "--out", str(out)]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == sorted(
        [MARKER, "manifest.json", "results.csv", "results.json", "results.md", "images", "records",
         *[f"{kind}/{m}" for kind in ("images", "records") for m in ("ar", "sjd")],
         *[f"images/{m}/{i:05d}.png" for m in ("ar", "sjd") for i in (0, 1)],
         "records/ar/batch-000000.pt", "records/sjd/batch-000000.pt"])
    results = json.loads((out / "results.json").read_text())
    rows = results["methods"]
    assert list(rows) == ["ar", "sjd"] and results["config"]["num_images"] == 2
    assert results["config"]["window"] == "auto"  # each strategy as generate runs it
    for row in rows.values():
        assert row["num_images"] == 2 and row["num_new_tokens"] == 2 * 256
    ar, sjd = rows["ar"], rows["sjd"]
    assert ar["step_compression"] == 1.0 and ar["num_forward_passes"] == 256 and ar["acceptance_rate"] is None
    assert sjd["step_compression"] == pytest.approx(256 / sjd["num_forward_passes"]) and sjd["step_compression"] > 1
    assert 0 < sjd["acceptance_rate"] < 1 and 0 <= sjd["loop_overhead"] < 1
    assert sjd["speedup"] == pytest.approx(ar["seconds"] / sjd["seconds"]) and ar["speedup"] == 1.0
    for row in rows.values():  # the reference layout ships its classifier: both quality columns
        assert 0 <= row["class_accuracy"] <= 1 and row["fd_ref"] > 0
    assert results["fd_ref_floor"] > 0
    assert sjd["fd_ref_delta"] == pytest.approx(sjd["fd_ref"] - ar["fd_ref"])  # paired, with its bootstrap interval
    assert sjd["fd_ref_delta_ci"][0] <= sjd["fd_ref_delta"] <= sjd["fd_ref_delta_ci"][1] and ar["fd_ref_se"] > 0
    with open(out / "results.csv", newline="") as handle:
        lines = list(csv.DictReader(handle))
    assert [line["method"] for line in lines] == ["ar", "sjd"]
    assert float(lines[1]["speedup"]) == pytest.approx(sjd["speedup"])
    table = (out / "results.md").read_text()
    assert re.search(r"\| sjd \| 2 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+x \| 0\.\d\d \|", table)
    assert "Step compression counts forwards, not seconds" in table and table in capsys.readouterr().out
    assert "s/image (batch 2)" in table and ", batch 2," in table  # the batch that ran (--batch-size 8, 2 images)


def test_a_checkpoint_gets_the_speed_columns_only(tmp_path):
    """``--model`` a supported checkpoint (a tiny random Emu3 with its processor): text prompts, no quality
    columns (they need the reference classifier); random weights: bookkeeping, never a speed-up."""
    model = save_emu3(tmp_path)
    out = tmp_path / "out"
    assert main(["bench", "--model", str(model), "--image-size", "16", "--prompts", "a red apple,a cat",
                 "--num-images", "3", "--batch-size", "2", "--top-k", "8", "--quiet", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["model_family"] == "emu3" and list(results["methods"]) == ["ar", "sjd", "mc-sjd"]
    for row in results["methods"].values():
        assert row["num_images"] == 3 and row["num_new_tokens"] == 3 * (2 * 3 + 3)  # 2x2 grid + row ends
        assert not {"fd_ref", "class_accuracy", "fid", "clip_score"} & set(row)  # FID / CLIP: when asked for
    assert len(list((out / "images" / "sjd").glob("*.png"))) == 3
    assert "FD-ref" not in (out / "results.md").read_text()


def test_family_prompt_builders(tmp_path):
    """One builder per family: its processor's image-generation mode / text + header; left padded."""
    from adapter_models import CHAM_START, EMU3_BOI, EMU3_WRAPPER, JANUS_BOI
    from checkpoints import save_chameleon, save_janus
    from hf_sjd.bench.subjects import load_checkpoint
    from hf_sjd.reference import CLASS_NAMES

    folders = {"emu3": save_emu3(tmp_path), "janus": save_janus(tmp_path), "chameleon": save_chameleon(tmp_path)}
    subjects = {f: load_checkpoint(str(path), 16 if f == "emu3" else None)[1]() for f, path in folders.items()}
    for subject in subjects.values():
        ids, mask = subject.prompt_inputs(["a cat", "a photo of a red apple"])
        assert ids.shape == mask.shape and mask[1].all() and not mask[0].all()  # left padded
        assert subject.default_prompts() == [f"a photo of a {c}" for c in CLASS_NAMES]
    ids, _ = subjects["emu3"].prompt_inputs(["a cat"])
    assert ids[0, -5:].tolist() == [EMU3_BOI, 52, 46, 52, EMU3_WRAPPER]  # <|image start|>2*2<|image token|>
    assert subjects["emu3"].num_image_tokens == 2 * 3 + 3
    ids, _ = subjects["janus"].prompt_inputs(["a cat"])
    assert ids[0, 0] == 14 and ids[0, -1] == JANUS_BOI  # chat template ("User: ..."), then <begin_of_image>
    ids, _ = subjects["chameleon"].prompt_inputs(["a cat"])
    assert ids[0, -3:].tolist() == subjects["chameleon"].adapter.image_header(32, 32) and ids[0, -3] == CHAM_START


def _no_model(monkeypatch):
    import hf_sjd.reference

    def no_work(*_, **__):
        raise AssertionError("model loaded before the input was validated")

    monkeypatch.setattr(hf_sjd.reference, "load", no_work)


@pytest.mark.parametrize("args, message", [
    (["--suite", "frontier"], r"--suite belongs to the study suites, which are not part of the package: .*python -m "
                              r"benchmarks SUITE --suite.*benchmarks/README.md"),
    (["--sections", "methods"], r"--sections belongs to the study suites"),
    (["--seeds", "0,1"], r"--seeds belongs to the study suites"),
    (["--cpu"], r"--cpu belongs to the study suites"),
    (["--methods", "ar,beam"], r"--methods: unknown method\(s\) \['beam'\]; registered: ar, .*sjd"),
    (["--methods", "prompt-lookup"], r"--methods: unknown method\(s\) \['prompt-lookup'\]"),
    (["--methods", "sjd,sjd"], r"--methods: duplicate method in 'sjd,sjd'"),
    (["--num-images", "0"], r"--num-images must be an integer >= 1, got 0"),
    (["--batch-size", "0"], r"--batch-size must be an integer >= 1, got 0"),
    (["--window", "0"], r"--window must be 'auto' or an integer >= 1, got 0"),
    (["--window", "big"], r"--window must be 'auto' or an integer >= 1, got big"),
    (["--window", "3", "--methods", "sjd,sjd-vp"], r"--window 3 with sjd-vp: vp_growth_steps=3 needs jacobi_window"),
    (["--prompts", ""], r"--prompts: no prompt given"),
    (["--prompts", "{latin1}"], r"--prompts .*cannot read .* as UTF-8 text"),
    (["--seed", "-1"], r"--seed must be an integer >= 0"),
    (["--guidance-scale", "nan"], r"--guidance-scale must be a finite number >= 0.0, got nan"),
    (["--dtype", "int8"], r"argument --dtype: invalid choice: 'int8' \(choose from '?float32'?, '?bfloat16'?"),
    (["--device", "tpu"], r"--device 'tpu': allowed values: cpu, cuda, cuda:N"),
    (["--out", "/", "--overwrite"], r"--out '/' is the root folder"),
    (["--out", ".", "--overwrite"], r"--out '.' is the current folder"),
    (["--out", "{full}"], r"--out .* exists and is not empty; pass --overwrite"),
    (["--out", "{full}", "--overwrite"], r"--out .* holds files this program did not write"),
    (["--fid-features", "inception"], r"--fid-features is read only with --fid-reference"),
])
def test_bad_input_exits_2_before_the_model_loads(tmp_path, capsys, monkeypatch, args, message):
    _no_model(monkeypatch)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("not ours")
    (full / "prompts.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    args = [a.format(full=full, latin1=full / "prompts.txt") for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]
    assert sorted(p.name for p in full.iterdir()) == ["keep.txt", "prompts.txt"]


@pytest.mark.parametrize("args, message", [
    (["--prompts", "coffee,unicorn"], r"--prompts: unknown prompt\(s\) \['unicorn'\]; the reference model knows"),
    (["--image-size", "64"], r"--image-size applies to a --model checkpoint"),
    (["--top-k", "513"], r"--top-k must be in \[1, 512\] \(the model's drafted image tokens\)"),
    (["--methods", "sjd", "--phrase-library", "x"], r"--phrase-library is read only by phrase-verification"),
    (["--methods", "sjd-pv", "--phrase-library", "{tmp}/missing"], r"--phrase-library .*missing"),
    (["--dtype", "bfloat16"], r"--dtype applies to a --model checkpoint"),
    (["--window", "2"], r"--window 2 with sjd-vp: vp_growth_steps=3 needs jacobi_window > 3"),  # a default method
    (["--model", "{ar}", "--prompts", "coffee", "--methods", "ar,lantern"],
     r"lantern cannot run on llamagen: its adapter has no VQ codebook vectors"),
])
def test_bad_input_that_needs_the_model_exits_2_before_any_generation(tmp_path, capsys, monkeypatch, args, message):
    import hf_sjd.bench as bench

    def no_work(*_, **__):
        raise AssertionError("generation started before the input was validated")

    monkeypatch.setattr(bench, "generate_images", no_work)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *[a.format(tmp=tmp_path, ar=weights_dir() / "ar") for a in args], "--out",
              str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_an_earlier_run_is_replaced_whole_only_with_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    run = ["bench", "--methods", "sjd", "--num-images", "1", "--threads", "1", "--quiet", "--out", str(out)]
    assert main(run) == 0
    with pytest.raises(SystemExit):
        main(run)
    assert "pass --overwrite" in capsys.readouterr().err
    assert main([*run, "--methods", "ar", "--overwrite"]) == 0  # the later --methods wins (argparse: last one)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "images", "manifest.json", "records",
                                                     "results.csv", "results.json", "results.md"]
    assert [p.name for p in (out / "records").iterdir()] == ["ar"]


def test_the_speed_columns_read_full_batches_and_calibrate_outside_the_timing(tmp_path, monkeypatch):
    """5 images at batch 3: the last batch holds 2, a row count of its own, which "auto" calibrates for in the untimed
    warm-up (not inside a timed batch); "s/image (batch 3)" is the full batches' rate; at batch 1 there is one
    s/image column."""
    import hf_sjd.bench as bench

    calls, timing = [], []  # batch sizes generated: (size, inside the timed loop)
    generate, run_item = bench._generate, bench._run_item
    monkeypatch.setattr(bench, "_generate", lambda run, method, prompts, seed: (
        calls.append((len(prompts), bool(timing))), generate(run, method, prompts, seed))[1])
    monkeypatch.setattr(bench, "_run_item", lambda *args: (timing.append(1), run_item(*args), timing.clear())[1])
    out = tmp_path / "out"
    assert main(["bench", "--methods", "ar", "--num-images", "5", "--batch-size", "3", "--threads", "1", "--quiet",
                 "--bootstrap", "0", "--out", str(out)]) == 0
    untimed = {size for size, timed in calls if not timed}
    assert {size for size, timed in calls if timed} == untimed == {3, 2}  # (no batch of 1 is timed)
    import torch

    records = [torch.load(f, weights_only=True)["stats"] for f in sorted((out / "records" / "ar").glob("*.pt"))]
    assert [r["num_images"] for r in records] == [3, 2]
    row = json.loads((out / "results.json").read_text())["methods"]["ar"]
    assert row["seconds_per_image"] == pytest.approx(records[0]["seconds"] / 3)  # the full batch's rate
    one = tmp_path / "one"
    assert main(["bench", "--methods", "ar", "--num-images", "1", "--batch-size", "1", "--threads", "1", "--quiet",
                 "--bootstrap", "0", "--out", str(one)]) == 0
    header = (one / "results.md").read_text()
    assert header.count("s/image (batch 1)") == 1
