"""`hf-sjd bench`: documented outputs, FD-ref sanity, sharding invariance, clean failures on bad input."""

import csv
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_sjd.bench import COUNTS, METRICS, build_parser, frechet_distance, real_images, validate
from hf_sjd.cli import main

ROOT = Path(__file__).resolve().parents[1]
# 2 prompts x 2 images, batch 2: two batches, so two processes get one batch each.
RUN = ["--prompts", "coffee,cat", "--num-images", "2", "--batch-size", "2", "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("bench") / "out"
    assert main(["bench", "--methods", "ar,sjd,prompt-lookup", "--seeds", "0,1", "--out", str(out), *RUN]) == 0
    return out


def test_writes_every_file_with_the_documented_schema(bench_out):
    names = {"results.json", "results.csv", "results.md", "scatter.png", "tokens_per_forward.png", "samples.png"}
    assert {p.name for p in bench_out.iterdir()} == names  # and no temporary files left behind
    for name in names - {"results.json", "results.csv", "results.md"}:
        assert (bench_out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    results = json.loads((bench_out / "results.json").read_text())
    assert results["schema_version"] == 1 and results["command"].startswith("hf-sjd bench --methods ar,sjd")
    assert results["config"]["seeds"] == [0, 1] and results["config"]["prompts"] == ["coffee", "cat"]
    assert set(results["metrics"]) == set(METRICS)
    assert results["reference"]["classifier_heldout_accuracy"] == pytest.approx(0.9941)
    fd = results["reference"]["fd_ref"]
    assert fd["real_images"] == 128 and fd["generated_images_per_seed"] == 4 and fd["feature_dim"] == 64
    assert fd["floor_real"]["mean"] > 0 and fd["floor_real"]["se"] is not None
    assert "torchmetrics" in results["reference"]["torchmetrics"]

    methods = results["methods"]
    assert list(methods) == ["ar", "sjd", "prompt-lookup"]
    for method, entry in methods.items():
        assert set(entry) == {"per_seed", "mean", "se", "totals", "tokens_per_forward"}
        assert set(entry["per_seed"]) == {"0", "1"}
        for row in entry["per_seed"].values():
            assert set(row) == {*METRICS, *COUNTS, "tokens_per_forward"}
            assert row["num_images"] == 4 and row["num_new_tokens"] == 4 * 256
            assert sum(row["tokens_per_forward"][1:]) > 0
            assert 0 < row["seconds_per_image"] < 60 and 0 <= row["loop_overhead"] < 1
            assert 0 <= row["class_accuracy"] <= 1 and 0 <= row["tv_to_ar"] <= 1
            assert -6.3 < row["mean_token_loglik"] < 0  # above log(1/512): better than uniform
            assert row["fd_ref"] > 0
        assert set(entry["mean"]) == set(METRICS) == set(entry["se"])
        assert entry["totals"]["num_new_tokens"] == 2 * 4 * 256
    ar, sjd, lookup = (methods[m]["per_seed"]["0"] for m in ("ar", "sjd", "prompt-lookup"))
    assert ar["step_compression"] == 1.0 and ar["nfe_per_call"] == 256 and ar["acceptance_rate"] is None
    assert ar["tokens_per_forward"] == [0, 4 * 256]
    assert sjd["step_compression"] > 1.5 and 0 < sjd["acceptance_rate"] < 1 and sjd["num_calls"] == 2
    assert sum(k * c for k, c in enumerate(sjd["tokens_per_forward"])) == 4 * 256  # histogram covers all tokens
    assert lookup["num_calls"] == 4 and lookup["step_compression"] >= 1  # one image per call, exact sampling
    assert sum(lookup["tokens_per_forward"]) == lookup["num_forward_passes"]
    assert methods["sjd"]["se"]["step_compression"] is not None

    with open(bench_out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["method", "seed", *METRICS, *COUNTS]
    assert [(r["method"], r["seed"]) for r in rows[:4]] == [("ar", "0"), ("ar", "1"), ("ar", "mean"), ("ar", "se")]
    assert float(rows[2]["step_compression"]) == 1.0

    table = (bench_out / "results.md").read_text()
    assert "| method | NFE/call | step compression |" in table
    assert re.search(r"\| sjd \| [\d.]+ ± [\d.]+ \| [\d.]+ ± [\d.]+ \|", table)


def test_fd_ref_separates_real_images_from_random_tokens():
    """Fresh real crops vs the held-out crops are near 0; decoded random tokens are far.

    Measured over seeds 0-2 with 4 images per class: real 1.0-2.3, random 361-373; the bounds leave ~4x
    margin on each side."""
    from hf_sjd.reference import CLASS_NAMES, load, load_classifier
    from hf_sjd.reference.data import make_dataset

    reference, classifier = load(), load_classifier()
    heldout = classifier.embed(make_dataset(64, seed=1)[0]).numpy()
    real = classifier.embed(real_images({name: 4 for name in CLASS_NAMES}, seed=0)).numpy()
    tokens = torch.randint(0, 512, (64, 256), generator=torch.Generator().manual_seed(0))
    random = classifier.embed(reference.vq.decode_to_tensor(tokens)).numpy()
    real_fd, random_fd = frechet_distance(real, heldout), frechet_distance(random, heldout)
    assert real_fd < 10 and random_fd > 100 and real_fd < 0.05 * random_fd
    assert frechet_distance(heldout, heldout) == pytest.approx(0, abs=1e-6)


def test_two_accelerate_processes_match_one(bench_out, tmp_path):
    """Batches are seeded from their items, so sharding them over 2 processes changes no total."""
    with socket.socket() as probe:  # a free port: other test runs may share this machine
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "sharded"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(port), "-m", "hf_sjd.bench", "--methods", "ar,sjd", "--seeds", "0",
               "--cpu", "--out", str(out), *RUN]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    sharded = json.loads((out / "results.json").read_text())
    single = json.loads((bench_out / "results.json").read_text())
    assert sharded["config"]["num_processes"] == 2
    for method in ("ar", "sjd"):
        a, b = sharded["methods"][method]["per_seed"]["0"], single["methods"][method]["per_seed"]["0"]
        assert {k: a[k] for k in COUNTS} == {k: b[k] for k in COUNTS}
        assert a["tokens_per_forward"] == b["tokens_per_forward"]
        assert a["fd_ref"] == pytest.approx(b["fd_ref"], rel=1e-6)  # the same images


@pytest.fixture()
def prompt_files(tmp_path):
    import datasets

    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"caption": ["coffee", "cat", "moon"]}).save_to_disk(str(folder))
    table = tmp_path / "prompts.csv"
    table.write_text("text\nbrick\ngrass\n")
    parti = tmp_path / "parti.csv"
    parti.write_text("Prompt\na red bicycle leaning on a wall\n")
    return folder, table, parti


def _parse(args):
    parser = build_parser()
    return parser, parser.parse_args(args)


def test_prompt_datasets_load_from_disk_and_csv(prompt_files, tmp_path):
    folder, table, _ = prompt_files
    out = ["--out", str(tmp_path / "out")]
    _, prompts, _ = validate(*_parse(["--prompt-dataset", str(folder), "--prompt-column", "caption", *out]))
    assert prompts == ["coffee", "cat", "moon"]
    _, prompts, _ = validate(*_parse(["--prompt-dataset", str(table), "--prompt-column", "text",
                                      "--max-prompts", "1", *out]))
    assert prompts == ["brick"]


@pytest.mark.parametrize("args, message", [
    (["--methods", "ar,beam"], r"--methods: unknown method\(s\) \['beam'\]; registered: ar, .*sjd.*prompt-lookup"),
    (["--num-images", "0"], "--num-images must be an integer >= 1, got 0"),
    (["--guidance-scale", "nan"], "--guidance-scale must be a finite number >= 0.0, got nan"),
    (["--guidance-scale=-inf"], "--guidance-scale must be a finite number >= 0.0, got -inf"),
    (["--window", "0"], "--window must be an integer >= 1, got 0"),
    (["--threads", "0"], "--threads must be None or an integer >= 1, got 0"),
    (["--threads", "-1"], "--threads must be None or an integer >= 1, got -1"),
    (["--seeds", "0,-1"], "--seeds must be an integer >= 0"),
    (["--methods", "sjd,sjd"], "--methods: duplicate method"),
    (["--methods", "ar,sjd", "--phrase-library", "x"], "--phrase-library is read only by phrase-verification"),
    (["--prompts", "coffee,unicorn"], r"--prompts: unknown prompt\(s\) 'unicorn'; the reference model knows only"),
    (["--prompts", "coffee,cat,coffee"], r"--prompts: 'coffee' named more than once; name each prompt once"),
    (["--prompt-dataset", "{tmp}/missing"], "--prompt-dataset: cannot load prompts from .*no such file or folder"),
    (["--prompt-dataset", "{saved}", "--prompt-column", "text"],
     "--prompt-dataset: .*no column 'text'; columns: caption"),
    (["--prompt-dataset", "{parti}", "--prompt-column", "Prompt"],
     "--prompt-dataset .*: unknown prompt.*'a red bicycle"),
    (["--methods", "prompt-lookup", "--guidance-scale", "3"], "--guidance-scale 3: prompt-lookup supports only 1"),
    (["--seeds", "0,x"], "--seeds must be comma-separated integers"),
    (["--out", "{full}"], "--out .* exists and is not empty; pass --overwrite"),
    (["--out", "{full}/keep.txt/sub"], "--out .* is not writable"),
])
def test_bad_input_exits_2_naming_the_argument(tmp_path, capsys, monkeypatch, prompt_files, args, message):
    import hf_sjd.reference

    def no_work(*_, **__):
        raise AssertionError("model loaded before the input was validated")

    monkeypatch.setattr(hf_sjd.reference, "load", no_work)
    folder, _, parti = prompt_files
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("not ours")
    args = [a.format(tmp=tmp_path, saved=folder, parti=parti, full=full) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists() and [p.name for p in full.iterdir()] == ["keep.txt"]


# -- checks that need the model, whole-folder outputs, one definition of the rates --------------------------
def _bench_args(tmp_path, *extra):
    return ["bench", "--methods", "ar", "--prompts", "coffee", "--num-images", "1", "--batch-size", "1", "--quiet",
            "--out", str(tmp_path / "out"), *extra]


def _no_generation(monkeypatch):
    import hf_sjd.bench as bench

    def no_work(*_, **__):
        raise AssertionError("generation started before the input was validated")

    monkeypatch.setattr(bench, "run_batch", no_work)


def test_top_k_is_bounded_by_the_loaded_models_codes(tmp_path, capsys, monkeypatch):
    import dataclasses

    import hf_sjd.reference

    _no_generation(monkeypatch)
    real = hf_sjd.reference.load
    monkeypatch.setattr(hf_sjd.reference, "load", lambda *a, **k: dataclasses.replace(
        real(*a, **k), draft_token_ids=torch.arange(100)))
    with pytest.raises(SystemExit) as exit_info:
        main(_bench_args(tmp_path, "--top-k", "200"))
    assert exit_info.value.code == 2 and "--top-k must be in [1, 100]" in capsys.readouterr().err


def test_phrase_library_is_checked_before_any_generation(tmp_path, capsys, monkeypatch):
    from hf_sjd import PhraseLibrary

    _no_generation(monkeypatch)
    PhraseLibrary.from_token_sequences(torch.tensor([[0, 1, 0, 1]] * 3), num_merges=1, codebook_size=512,
                                       fingerprint="another tokenizer").save_pretrained(tmp_path / "lib")
    for library, message in ((tmp_path / "missing", "no such folder"),
                             (tmp_path / "lib", "fingerprint 'another tokenizer'")):
        with pytest.raises(SystemExit) as exit_info:
            main(_bench_args(tmp_path, "--methods", "sjd-pv", "--phrase-library", str(library)))
        assert exit_info.value.code == 2
        assert re.search(f"--phrase-library .*{message}", capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def _fake_records(methods, seeds, batches, counts):
    """Records as run_batch returns them; ``counts[(method, batch index)] = (accepted, recovered, forwards)``."""
    records = []
    for seed in seeds:
        for method in methods:
            for index, batch in enumerate(batches):
                accepted, recovered, forwards = counts[(method, index)]
                stats = {"num_images": len(batch), "num_new_tokens": 256 * len(batch), "num_forward_passes": forwards,
                         "num_calls": 1, "model_calls": forwards, "seconds": 1.0, "model_seconds": 0.5,
                         "tokens_per_forward": [0, 256 * len(batch)]}
                if method != "ar":
                    stats.update(num_accepted=accepted, num_recovered=recovered)
                generator = torch.Generator().manual_seed(index)
                records.append({"method": method, "seed": seed, "items": batch, "peak_memory_mb": None, "stats": stats,
                                "tokens": torch.randint(0, 512, (len(batch), 256), generator=generator).tolist(),
                                "loglik": [-3.0] * len(batch),
                                "features": torch.rand(len(batch), 64, generator=generator).double().tolist(),
                                "correct": [True] * len(batch)})
    return records


def _fake_work(monkeypatch, counts):
    import numpy as np

    import hf_sjd.bench as bench

    def fake_batch(reference, classifier, method, batch, seed, args, device):
        index = bench.make_batches(["coffee", "cat"], 2, 2).index(batch)
        return _fake_records([method], [seed], [batch], {(method, 0): counts[(method, index)]})[0]

    floor = {"per_seed": {}, "mean": None, "se": None}
    monkeypatch.setattr(bench, "run_batch", fake_batch)
    monkeypatch.setattr(bench, "reference_features", lambda *a, **k: {
        "features": np.random.default_rng(0).random((8, 64)), "feature_dim": 64, "real_images": 8,
        "generated_images_per_seed": 4, "floor_real": floor, "floor_vq": floor})


def test_generate_and_bench_report_the_same_rates_for_the_same_run(tmp_path, monkeypatch):
    """Two batches with acceptance 10/20 and 90/100: pooled 100/120, where a mean of rates says 0.7."""
    from hf_sjd.sampling import merge_stats

    counts = {("ar", 0): (0, 0, 256), ("ar", 1): (0, 0, 256), ("sjd", 0): (10, 10, 128), ("sjd", 1): (90, 10, 64)}
    _fake_work(monkeypatch, counts)
    assert main(["bench", "--methods", "ar,sjd", "--prompts", "coffee,cat", "--num-images", "2", "--batch-size", "2",
                 "--quiet", "--out", str(tmp_path / "out")]) == 0
    row = json.loads((tmp_path / "out" / "results.json").read_text())["methods"]["sjd"]["per_seed"]["0"]
    batches = [r["stats"] for r in _fake_records(["sjd"], [0], [[("coffee", 0), ("cat", 0)]] * 2,
                                                   {("sjd", 0): counts[("sjd", 0)], ("sjd", 1): counts[("sjd", 1)]})]
    generate = merge_stats(batches)  # what `hf-sjd generate` prints for the same batches
    assert row["acceptance_rate"] == pytest.approx(generate["acceptance_rate"]) == pytest.approx(100 / 120)
    assert row["step_compression"] == pytest.approx(generate["step_compression"]) == pytest.approx(256 / 96)


def test_overwrite_replaces_the_outputs_as_a_whole(tmp_path, monkeypatch):
    import hf_sjd.bench as bench

    counts = {("ar", 0): (0, 0, 256), ("ar", 1): (0, 0, 256)}
    _fake_work(monkeypatch, counts)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("results.json", "results.csv", "scatter.png", "notes.txt"):
        (out / name).write_text("old run")
    real_plots = bench.plots

    def interrupted(*args, **kwargs):  # Ctrl-C in the output phase, after results.json/csv/md are written
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "plots", interrupted)
    run = ["bench", "--methods", "ar", "--prompts", "coffee,cat", "--num-images", "2", "--batch-size", "2", "--quiet",
           "--out", str(out), "--overwrite"]
    with pytest.raises(KeyboardInterrupt):
        main(run)
    assert {p.name: p.read_text() for p in out.iterdir()} == dict.fromkeys(
        ("results.json", "results.csv", "scatter.png", "notes.txt"), "old run")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left
    monkeypatch.setattr(bench, "plots", real_plots)
    assert main(run) == 0
    assert {p.name for p in out.iterdir()} == {"results.json", "results.csv", "results.md", "scatter.png",
                                               "tokens_per_forward.png", "samples.png"}
    assert json.loads((out / "results.json").read_text())["schema_version"] == 1
