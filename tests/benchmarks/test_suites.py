"""``python -m benchmarks SUITE``: documented outputs, every suite on a tiny setting, probes that clean up,
sharding invariance, clean failures on bad input, whole-folder outputs."""

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

import hf_sjd
from benchmarks.args import validate
from benchmarks.driver import build_parser, main
from benchmarks.probes import probe
from benchmarks.summaries import COUNTS, METRICS
from benchmarks.suites import SUITES, suite_rows
from hf_sjd.quality import frechet_distance

ROOT = Path(__file__).resolve().parents[2]
# 2 prompts x 1 image, batch 1: two batches, so two processes get one batch each.
RUN = ["--prompts", "coffee,cat", "--images-per-prompt", "1", "--batch-size", "1", "--threads", "1", "--quiet"]
CORE = ["core", "--sections", "methods", "--methods", "ar,sjd,prompt-lookup", "--seeds", "0,1"]


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "out"
    assert main([*CORE, "--out", str(out), *RUN]) == 0
    return out


def test_core_writes_every_file_with_the_documented_schema(bench_out):
    names = {"results.json", "results.csv", "results.md", "scatter.png", "tokens_per_forward.png", "samples.png"}
    assert {p.name for p in bench_out.iterdir()} == names | {".hf_sjd-output.json"}  # no temporary files left
    for name in names - {"results.json", "results.csv", "results.md"}:
        assert (bench_out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    results = json.loads((bench_out / "results.json").read_text())
    assert results["schema_version"] == 3 and results["suite"] == "core"
    assert results["command"].startswith("python -m benchmarks core --sections methods")
    assert results["config"]["seeds"] == [0, 1] and results["config"]["prompts"] == ["coffee", "cat"]
    assert {*METRICS} <= set(results["metrics"])
    assert results["reference"]["classifier_heldout_accuracy"] == pytest.approx(0.9941)
    fd = results["reference"]["fd_ref"]
    assert fd["real_images"] == 128 and fd["generated_images_per_seed"] == 2 and fd["feature_dim"] == 64
    assert fd["floor_real"]["mean"] > 0 and fd["floor_real"]["se"] is not None
    assert [s["name"] for s in results["sections"]] == ["methods"]
    assert results["sections"][0]["rows"] == ["ar", "sjd", "prompt-lookup"]

    rows = results["rows"]
    for key, entry in rows.items():
        assert {"method", "knobs", "label", "per_seed", "mean", "se", "totals", "tokens_per_forward", "vs_base",
                "d_loglik", "base", "probe"} <= set(entry)
        assert set(entry["per_seed"]) == {"0", "1"}
        for row in entry["per_seed"].values():
            assert set(row) == {*METRICS, *COUNTS, "tokens_per_forward", "forward_windows"}
            assert row["num_images"] == 2 and row["num_new_tokens"] == 2 * 256
            assert 0 < row["seconds_per_image"] and 0 <= row["loop_overhead"] < 1
            assert 0 <= row["class_accuracy"] <= 1 and 0 <= row["tv_to_ar"] <= 1
            assert -6.3 < row["mean_token_loglik"] < 0  # above log(1/512): better than uniform
            assert row["fd_ref"] > 0 and 0 <= row["repeat_rate"] < 1
        assert entry["totals"]["num_new_tokens"] == 2 * 2 * 256
    ar, sjd, lookup = (rows[m]["per_seed"]["0"] for m in ("ar", "sjd", "prompt-lookup"))
    assert ar["step_compression"] == 1.0 and ar["nfe_per_call"] == 256 and ar["acceptance_rate"] is None
    assert ar["tokens_per_forward"] == [0, 2 * 256]
    assert sjd["step_compression"] > 1.5 and 0 < sjd["acceptance_rate"] < 1 and sjd["num_calls"] == 2
    assert sum(sjd["forward_windows"]) == sjd["num_forward_passes"] and ar["forward_windows"] is None
    assert sum(k * c for k, c in enumerate(sjd["tokens_per_forward"])) == 2 * 256  # histogram covers all tokens
    assert lookup["num_calls"] == 2 and lookup["step_compression"] >= 1  # one image per call, exact sampling
    assert sum(lookup["tokens_per_forward"]) == lookup["num_forward_passes"]
    assert rows["sjd"]["se"]["step_compression"] is not None
    assert rows["sjd"]["d_loglik"]["n"] == 4 and rows["ar"]["d_loglik"] is None  # 2 seeds x 2 images, paired

    with open(bench_out / "results.csv", newline="") as handle:
        lines = list(csv.DictReader(handle))
    assert list(lines[0])[:4] == ["row", "method", "knobs", "seed"]
    assert [(r["row"], r["seed"]) for r in lines[:4]] == [("ar", "0"), ("ar", "1"), ("ar", "mean"), ("ar", "se")]
    assert float(lines[2]["step_compression"]) == 1.0

    table = (bench_out / "results.md").read_text()
    assert "Command: `python -m benchmarks core" in table and "## Every method" in table
    assert re.search(r"\| sjd \| - \| [\d.]+ ± [\d.]+ \| [\d.]+ ± [\d.]+ \|", table)


def _tiny(tmp_path, suite, *extra):
    out = tmp_path / suite
    assert main([suite, "--prompts", "coffee", "--images-per-prompt", "1", "--batch-size", "1",
                 "--seeds", "0", "--threads", "1", "--quiet", "--out", str(out), *extra]) == 0
    return json.loads((out / "results.json").read_text()), (out / "results.md").read_text()


def test_verifiers_suite_pairs_every_relaxed_row_with_sjd(tmp_path):
    results, table = _tiny(tmp_path, "verifiers", "--sections", "verifiers", "--window", "4")
    rows = results["rows"]
    assert [rows[k]["method"] for k in results["sections"][0]["rows"]] == ["ar", "sjd", "lantern", "gsd", "gsd"]
    assert rows["gsd/latent_embeddings=None"]["knobs"] == {"latent_embeddings": None}
    for key in ("lantern", "gsd", "gsd/latent_embeddings=None"):
        assert rows[key]["base"] == "sjd" and rows[key]["vs_base"]["n"] == 1
    assert "(vs sjd)" in table and "## Verifiers" in table


def test_vp_suite_growth_probe_and_prior_cost(tmp_path):
    before = (dict(hf_sjd.VERIFIERS), dict(hf_sjd.DRAFT_PRIORS))
    results, table = _tiny(tmp_path, "vp", "--sections", "cost", "--window", "4")
    cost = results["rows"]["sjd-vp/draft_prior=bench-vp-probe/probe=prior-cost"]["per_seed"]["0"]
    assert 0 < cost["prior_ms"] < cost["ms_per_forward"]  # the prior is part of each iteration
    assert (dict(hf_sjd.VERIFIERS), dict(hf_sjd.DRAFT_PRIORS)) == before  # the probe left nothing registered
    assert "## Cost of the prior" in table


def test_pv_suite_tau_ablation_and_verifier_cost(tmp_path):
    before = dict(hf_sjd.VERIFIERS)
    results, table = _tiny(tmp_path, "pv", "--sections", "tau,cost", "--window", "4")
    keys = results["sections"][0]["rows"]
    assert [results["rows"][k]["knobs"]["pv_tau"] for k in keys] == [0.001, 0.01, 0.1]
    assert "sjd" in results["rows"]  # the base row runs even when its section is not selected
    cost = results["rows"]["sjd-pv/probe=pv-cost"]["per_seed"]["0"]
    assert 0 < cost["verifier_ms"] < cost["ms_per_forward"]  # the verifier is part of each iteration
    assert dict(hf_sjd.VERIFIERS) == before  # the probe put the phrase verifier back
    assert "## Cost of phrase verification" in table and "equal adjacent" in table


def test_library_suite_times_a_tiny_build(tmp_path):
    results, table = _tiny(tmp_path, "library", "--library-tokens", "5120", "--library-merges", "20")
    builds = results["measurements"]["library-build"]["data"]["builds"]
    assert [b["tokens"] for b in builds[:2]] == [5120, 5120] and builds[0]["merges"] == 20
    assert builds[2]["corpus"].startswith("shipped") and results["rows"] == {} and results["sections"] == []
    assert (tmp_path / "library" / "measurements.png").exists() and "| corpus | tokens |" in table


@pytest.fixture(scope="module")
def tiny_subject():
    """A 1-layer LlamaGen-style model over a 4x4 grid of 64 codes (random weights), with what the rows need: VQ-like
    latents for LANTERN/GSD and a phrase library for phrase verification."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.loop_cost import motif_phrase_library

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=70, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=69,
                         bos_token_id=None, eos_token_id=None, image_token_range=[0, 64], image_grid=[4, 4],
                         null_condition_token_id=68, condition_token_ids={"coffee": 64})
    model = hf_sjd.enable(LlamaForCausalLM(config).eval())
    return SimpleNamespace(model=model, num_image_tokens=16, latent_embeddings=torch.randn(64, 8),
                           prompt_ids=lambda texts: torch.full((len(texts), 1), 64),
                           unconditional_ids=lambda batch: torch.full((batch, 1), 68),
                           library=motif_phrase_library(64))


@pytest.mark.parametrize("suite", [name for name in SUITES if SUITES[name].sections])
def test_every_suite_row_runs_with_its_knobs(tiny_subject, suite):
    """Each row's method takes its knobs (generate refuses a knob no component reads, and a deleted mode's),
    through the public API on a tiny model; ``"@"`` resources stand in as a small library."""
    from hf_sjd.sampling import generate_images, verifiers_of

    for row in suite_rows(SUITES[suite].sections):
        if row.method in ("ar", "prompt-lookup"):
            assert not row.knobs
            continue
        knobs = {k: v for k, v in row.knobs if not (isinstance(v, str) and v.startswith("@"))}
        if "phrase" in verifiers_of(row.method, knobs):
            knobs.update(phrase_library=tiny_subject.library, pv_ignore_fingerprint=True)
        with probe(row.probe):
            sequences, _ = generate_images(tiny_subject, tiny_subject.prompt_ids(["coffee"]), row.method, 20,
                                           row.guidance_scale or 1.0, row.window or 4, **knobs)
        assert sequences.shape == (1, 1 + 16), row.key


def test_no_row_exercises_a_deleted_mode():
    """The 1.0 surface: six strategy names; the deleted knobs and values appear in no row (their results stay in
    docs/results/, their code in git history)."""
    deleted_knobs = {"jacobi_window_rule", "jacobi_window_min", "jacobi_window_max", "jacobi_window_scale",
                     "jacobi_window_margin", "jacobi_window_ema", "jacobi_budget_siblings", "jacobi_sibling_sampling",
                     "jacobi_sibling_drafts", "draft_init_weight", "pv_commit", "vp_top_k", "vp_min_prob"}
    deleted_values = {("draft_init", v) for v in ("repeat-horizon", "row-above", "row-above-mix")} | {
        ("jacobi_sibling_law", "previous")}
    for suite in SUITES.values():
        for row in suite_rows(suite.sections):
            assert row.method in {"ar", "prompt-lookup", "sjd", "mc-sjd", "sjd-vp", "sjd-pv", "lantern", "gsd"}, row.key
            assert not set(dict(row.knobs)) & deleted_knobs and not set(row.knobs) & deleted_values, row.key


def test_frontier_suite_rows_pin_the_study_and_pair_like_for_like():
    """Fresh-draft rows pair with random init, Gumbel rows with maximal coupling at the same init, block rows with
    token-by-token verification at the same cell, the mixture law with the draft law, auto with pinned; every row
    pins its window and batch size (so the run's --window / --batch-size change no frontier number)."""
    from benchmarks.suites import COST_CONTEXT, SEVEN_B
    from benchmarks.suites import AUTO_GRID, FRONTIER_WINDOWS
    from hf_sjd.jacobi.cost_model import STEP_COMPRESSION, pick

    sections = {s.name: s for s in SUITES["frontier"].sections}
    assert list(sections) == ["fresh", "gumbel", "window", "batch", "quality", "siblings", "auto", "sibling-law",
                              "block", "straggler", "auto-rule"]
    random = "mc-sjd/w16/b1/draft_init=random"
    fresh = sections["fresh"].rows
    assert fresh[0].key == random and fresh[0].base is None and {r.base.key for r in fresh[1:]} == {random}
    assert [dict(r.knobs)["draft_init"] for r in fresh] == ["random", "last-target", "row-above-dist"]
    for r in sections["gumbel"].rows:
        knobs = dict(r.knobs)
        assert knobs.pop("draft_coupling") == "gumbel" and dict(r.base.knobs) == knobs
        assert r.base.key in {f.key for f in fresh}  # the base is the fresh row itself: it runs once
    assert sorted({r.window for r in sections["window"].rows}) == list(FRONTIER_WINDOWS)
    assert {r.batch_size for r in sections["batch"].rows} == {1, 8}
    assert set(AUTO_GRID) == set(STEP_COMPRESSION)  # the auto section measures every cell generate picks from
    assert [(r.window, dict(r.knobs).get("jacobi_siblings", 0)) for r in sections["auto"].rows] == list(AUTO_GRID)
    laws = sections["sibling-law"].rows
    for r in laws:
        knobs = dict(r.knobs)
        if knobs["jacobi_sibling_law"] == "draft":
            assert r.base is None
        else:
            assert knobs["jacobi_sibling_law"] == "mixture" and r.base in laws
            assert dict(r.base.knobs) == {**knobs, "jacobi_sibling_law": "draft"} and r.base.window == r.window
    paired = [r for r in sections["block"].rows if r.base is not None]
    assert {(r.method, r.window, r.batch_size, dict(r.knobs).get("jacobi_siblings", 0)) for r in paired} == {
        ("sjd", 16, 1, 0), *(("mc-sjd", w, 1, m) for w, m in ((16, 0), (32, 0), (16, 15), (32, 15))),
        ("mc-sjd", 16, 8, 0)}
    for r in paired:
        knobs = dict(r.knobs)
        assert knobs.pop("verifier") == "block" and dict(r.base.knobs).get("verifier", "speculative") == "speculative"
        if r.method == "mc-sjd":  # block verification with independent redraft (a coupling is refused with it)
            assert knobs.pop("draft_coupling") == "independent"
        assert {k: v for k, v in r.base.knobs if k != "verifier"} == knobs and r.base.window == r.window
    auto = [r for r in sections["auto-rule"].rows if r.base is not None]
    assert {r.batch_size for r in auto} == {1, 8}
    for r in auto:  # "auto" against the cell it picks for the full batch, pinned, both priced as 7B on CUDA
        assert (r.window, dict(r.knobs)["jacobi_siblings"], r.probe, r.base.probe) == ("auto", "auto", "cuda-7b",
                                                                                      "cuda-7b")
        assert (r.base.window, dict(r.base.knobs)["jacobi_siblings"]) == pick(SEVEN_B, r.batch_size, COST_CONTEXT)
    for r in suite_rows(sections.values()):
        assert r.batch_size is not None and (r.method == "ar" or r.window is not None), r.key


def test_methods_keep_only_their_rows_in_every_suite(tmp_path):
    """--methods means the same in every suite: the rows of those methods, their bases only if named too."""
    for suite, methods in (("vp", ["sjd-vp"]), ("frontier", ["sjd", "ar"]), ("core", ["ar", "sjd"])):
        parser, args = _parse([suite, "--methods", ",".join(methods), "--out", str(tmp_path / "out")])
        _, sections, _, _ = validate(parser, args)
        rows = suite_rows(sections)
        assert rows and {r.method for r in rows} == set(methods)
        assert all(r.base is None or r.base.method in methods for r in rows)


def test_frontier_cost_model_is_memory_bound_at_one_row_and_picks_the_best_modelled_window():
    from types import SimpleNamespace

    from benchmarks.measurements import MODEL_SIZES, cost_ratio, frontier_cost_model

    big = list(MODEL_SIZES)[-1]
    assert [round(cost_ratio(big, 1, w), 3) for w in (8, 16, 32, 64)] == [1.0] * 4  # weights dominate one row
    assert cost_ratio(big, 16, 64) > cost_ratio(big, 16, 32) > cost_ratio(big, 16, 16) >= 1.0
    curve = {8: 2.5, 16: 3.5, 32: 4.5, 64: 5.0}
    summary = {f"w{w}": {"method": "mc-sjd", "label": "x", "window": w, "batch_size": 1,
                         "mean": {"step_compression": c}} for w, c in curve.items()}
    out = frontier_cost_model(None, SimpleNamespace(summary=summary))
    picks = out["data"]["picks"]
    assert picks[f"mc-sjd, x|{big}|1"] == {"window": 64, "speedup": pytest.approx(5.0, rel=1e-3)}
    assert picks[f"mc-sjd, x|{big}|16"]["window"] < 64  # compute-bound: the long window no longer pays
    assert "Model, not a measurement" in out["text"] and out["data"]["kind"] == "model, not a measurement"
    empty = frontier_cost_model(None, SimpleNamespace(summary={}))
    assert empty["data"]["picks"] == {} and "No window pick" in empty["text"]


def test_frontier_suite_batch_section_reports_row_and_batch_compression(tmp_path):
    out = tmp_path / "frontier"
    assert main(["frontier", "--sections", "batch", "--prompts", "coffee,cat", "--images-per-prompt", "1",
                 "--seeds", "0", "--threads", "1", "--quiet", "--out", str(out)]) == 0
    results, table = json.loads((out / "results.json").read_text()), (out / "results.md").read_text()
    rows = results["rows"]
    for init in ("/draft_init=random", ""):
        one, eight = (rows[f"mc-sjd/w16/b{b}{init}"]["per_seed"]["0"] for b in (1, 8))
        assert one["num_calls"] == 2 and eight["num_calls"] == 1  # 2 images: two calls at batch 1, one at 8
        assert one["row_tokens_per_forward"] == pytest.approx(one["step_compression"])  # same at batch 1
        # a batch waits for its slowest row: its compression is at most the rows' own
        assert eight["step_compression"] <= eight["row_tokens_per_forward"]
        (call,) = rows[f"mc-sjd/w16/b8{init}"]["forwards_per_call"]  # what the batch-straggler measurement reads
        assert call["forwards"] == max(call["row_forwards"]) and len(call["row_forwards"]) == 2
        assert [c["row_forwards"] for c in rows[f"mc-sjd/w16/b1{init}"]["forwards_per_call"]] == [
            [c["forwards"]] for c in rows[f"mc-sjd/w16/b1{init}"]["forwards_per_call"]]
    assert "row tokens/forward" in table and "## Forward cost model (model, not a measurement)" in table
    assert "No window pick" in table  # the window section did not run


def test_fd_ref_separates_real_images_from_random_tokens():
    """Fresh real crops vs the held-out crops are near 0; decoded random tokens are far.

    Measured over seeds 0-2 with 4 images per class: real 1.0-2.3, random 361-373; the bounds leave ~4x
    margin on each side."""
    from hf_sjd.quality import ReferenceScorer
    from hf_sjd.reference import CLASS_NAMES, load, load_classifier

    reference = load()
    scorer = ReferenceScorer(reference, load_classifier())
    heldout = scorer.heldout(list(CLASS_NAMES))
    real = scorer.real_features([name for name in CLASS_NAMES for _ in range(4)], seed=0)
    tokens = torch.randint(0, 512, (64, 256), generator=torch.Generator().manual_seed(0))
    random = scorer.classifier.embed(reference.vq.decode_to_tensor(tokens))
    real_fd, random_fd = frechet_distance(real, heldout), frechet_distance(random, heldout)
    assert real_fd < 10 and random_fd > 100 and real_fd < 0.05 * random_fd
    assert frechet_distance(heldout, heldout) == pytest.approx(0, abs=1e-6)


def test_two_accelerate_processes_match_one(bench_out, tmp_path):
    """Batches are seeded from their items, so sharding them over 2 processes changes no total."""
    with socket.socket() as probe_socket:  # a free port: other test runs may share this machine
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    out = tmp_path / "sharded"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(port), "-m", "benchmarks", "core", "--sections", "methods",
               "--methods", "ar,sjd", "--seeds", "0", "--cpu", "--out", str(out), *RUN]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    sharded = json.loads((out / "results.json").read_text())
    single = json.loads((bench_out / "results.json").read_text())
    assert sharded["config"]["num_processes"] == 2
    for method in ("ar", "sjd"):
        a, b = sharded["rows"][method]["per_seed"]["0"], single["rows"][method]["per_seed"]["0"]
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
    _, _, prompts, _ = validate(*_parse(["core", "--prompt-dataset", str(folder), "--prompt-column", "caption", *out]))
    assert prompts == ["coffee", "cat", "moon"]
    _, _, prompts, _ = validate(*_parse(["core", "--prompt-dataset", str(table), "--prompt-column", "text",
                                         "--max-prompts", "1", *out]))
    assert prompts == ["brick"]


def test_suite_defaults_fill_unset_flags_only(tmp_path):
    parser, args = _parse(["vp", "--out", str(tmp_path / "out")])
    suite, sections, _, seeds = validate(parser, args)
    assert (args.images_per_prompt, args.batch_size, seeds) == (1, 4, [0, 1]) and len(sections) == len(suite.sections)
    parser, args = _parse(["vp", "--batch-size", "2", "--seeds", "7", "--out", str(tmp_path / "out")])
    _, _, _, seeds = validate(parser, args)
    assert (args.batch_size, seeds) == (2, [7])


@pytest.mark.parametrize("args, message", [
    (["fastest"], r"suite='fastest' is not supported; allowed values: 'core', 'verifiers', 'vp', 'pv', 'library'"),
    (["vp", "--sections", "strategies,nope"],
     r"--sections: unknown section\(s\) \['nope'\] of suite vp; its sections: strategies, sweep"),
    (["pv", "--sections", "tau", "--methods", "ar,sjd-pv"], r"--methods: no row of suite pv \(tau\) runs ar; its "
                                                            r"methods there: sjd-pv"),
    (["core", "--num-images", "2"], "--num-images is hf-sjd bench's .*--images-per-prompt"),
    (["core", "--methods", "ar,beam"],
     r"--methods: unknown method\(s\) \['beam'\]; registered: ar, .*sjd.*prompt-lookup"),
    (["core", "--images-per-prompt", "0"], "--images-per-prompt must be an integer >= 1, got 0"),
    (["core", "--guidance-scale", "nan"], "--guidance-scale must be a finite number >= 0.0, got nan"),
    (["core", "--guidance-scale=-inf"], "--guidance-scale must be a finite number >= 0.0, got -inf"),
    (["core", "--window", "0"], "--window must be an integer >= 1, got 0"),
    (["core", "--threads", "0"], "--threads must be None or an integer >= 1, got 0"),
    (["core", "--seeds", "0,-1"], "--seeds must be an integer >= 0"),
    (["core", "--methods", "sjd,sjd"], "--methods: duplicate method"),
    (["verifiers", "--phrase-library", "x"], "--phrase-library is read only by phrase-verification"),
    (["library", "--library-merges", "0"], "--library-merges must be an integer >= 1, got 0"),
    (["core", "--prompts", "coffee,unicorn"], r"--prompts: unknown prompt\(s\) 'unicorn'; the reference model knows"),
    (["core", "--prompts", "coffee,cat,coffee"], r"--prompts: 'coffee' named more than once; name each prompt once"),
    (["core", "--prompt-dataset", "{tmp}/missing"], "--prompt-dataset: cannot load prompts from .*no such file"),
    (["core", "--prompt-dataset", "{saved}", "--prompt-column", "text"],
     "--prompt-dataset: .*no column 'text'; columns: caption"),
    (["core", "--prompt-dataset", "{parti}", "--prompt-column", "Prompt"],
     "--prompt-dataset .*: unknown prompt.*'a red bicycle"),
    (["core", "--methods", "prompt-lookup", "--guidance-scale", "3"],
     "--guidance-scale 3: prompt-lookup supports only"),
    (["core", "--seeds", "0,x"], "--seeds must be comma-separated integers"),
    (["core", "--out", "{full}"], "--out .* exists and is not empty; pass --overwrite"),
    (["core", "--out", "{full}", "--overwrite"], "--out .* holds files this program did not write"),
    (["core", "--out", "{full}/keep.txt/sub"], "--out .* is not writable"),
    (["core", "--out", "/", "--overwrite"], "--out '/' is the root folder"),
    (["core", "--out", ".", "--overwrite"], "--out '.' is the current folder"),
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
        main(args)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists() and [p.name for p in full.iterdir()] == ["keep.txt"]


# -- checks that need the model, whole-folder outputs, one definition of the rates --------------------------
def _bench_args(tmp_path, *extra):
    return ["core", "--sections", "methods", "--methods", "ar", "--prompts", "coffee", "--images-per-prompt", "1",
            "--batch-size", "1", "--seeds", "0", "--quiet", "--out", str(tmp_path / "out"), *extra]


def _no_generation(monkeypatch):
    import benchmarks.driver as driver

    def no_work(*_, **__):
        raise AssertionError("generation started before the input was validated")

    monkeypatch.setattr(driver, "run_batch", no_work)


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


def _fake_work(monkeypatch, counts):
    """run_batch and the FD floors replaced: ``counts[(row key, batch index)] = (accepted, recovered, forwards)``."""
    import numpy as np

    import benchmarks.driver as driver

    batches = driver.make_batches(["coffee", "cat"], 2, 2)

    def fake_batch(subject, scorer, row, batch, seed, settings, device, resources):
        index = batches.index(batch)
        accepted, recovered, forwards = counts[(row.key, index)]
        stats = {"num_images": len(batch), "num_new_tokens": 256 * len(batch), "num_forward_passes": forwards,
                 "num_calls": 1, "model_calls": forwards, "seconds": 1.0, "model_seconds": 0.5,
                 "tokens_per_forward": [0, 256 * len(batch)]}
        if row.method != "ar":
            stats.update(num_accepted=accepted, num_recovered=recovered)
        generator = torch.Generator().manual_seed(index)
        return {"row": row.key, "seed": seed, "items": batch, "peak_memory_mb": None, "stats": stats,
                "tokens": torch.randint(0, 512, (len(batch), 256), generator=generator).tolist(),
                "loglik": [-3.0] * len(batch), "repeat": [0.1] * len(batch), "probe": None,
                "features": torch.rand(len(batch), 64, generator=generator).double().tolist(),
                "correct": [True] * len(batch)}

    floor = {"per_seed": {}, "mean": None, "se": None}
    monkeypatch.setattr(driver, "run_batch", fake_batch)
    monkeypatch.setattr(driver, "reference_features", lambda *a, **k: {
        "features": np.random.default_rng(0).random((8, 64)), "feature_dim": 64, "real_images": 8,
        "generated_images_per_seed": 4, "floor_real": floor, "floor_vq": floor})


FAKE = ["core", "--sections", "methods", "--prompts", "coffee,cat", "--images-per-prompt", "2", "--batch-size", "2",
        "--seeds", "0", "--quiet"]


def test_generate_and_bench_report_the_same_rates_for_the_same_run(tmp_path, monkeypatch):
    """Two batches with acceptance 10/20 and 90/100: pooled 100/120, where a mean of rates says 0.7."""
    from hf_sjd.sampling import merge_stats

    counts = {("ar", 0): (0, 0, 256), ("ar", 1): (0, 0, 256), ("sjd", 0): (10, 10, 128), ("sjd", 1): (90, 10, 64)}
    _fake_work(monkeypatch, counts)
    assert main([*FAKE, "--methods", "ar,sjd", "--out", str(tmp_path / "out")]) == 0
    row = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]["sjd"]["per_seed"]["0"]
    batches = [{"num_images": 2, "num_new_tokens": 512, "num_forward_passes": f, "num_calls": 1, "model_calls": f,
                "seconds": 1.0, "model_seconds": 0.5, "num_accepted": a, "num_recovered": r,
                "tokens_per_forward": [0, 512]} for a, r, f in (counts[("sjd", 0)], counts[("sjd", 1)])]
    generate = merge_stats(batches)  # what `hf-sjd generate` prints for the same batches
    assert row["acceptance_rate"] == pytest.approx(generate["acceptance_rate"]) == pytest.approx(100 / 120)
    assert row["step_compression"] == pytest.approx(generate["step_compression"]) == pytest.approx(256 / 96)


def test_overwrite_replaces_the_outputs_as_a_whole(tmp_path, monkeypatch):
    """An earlier run's folder is replaced only as a whole: an interrupted rerun leaves it as it was."""
    import benchmarks.driver as driver

    _fake_work(monkeypatch, {("ar", 0): (0, 0, 256), ("ar", 1): (0, 0, 256)})
    out = tmp_path / "out"
    run = [*FAKE, "--methods", "ar", "--out", str(out), "--overwrite"]
    assert main(run) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"results.json", "results.csv", "results.md", "scatter.png", "tokens_per_forward.png",
                           "samples.png", ".hf_sjd-output.json"}
    real_plots = driver.plots

    def interrupted(*args, **kwargs):  # Ctrl-C in the output phase, after results.json/csv/md are written
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "plots", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(run)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left
    monkeypatch.setattr(driver, "plots", real_plots)
    assert main(run) == 0
    assert {p.name for p in out.iterdir()} == set(before)
    assert json.loads((out / "results.json").read_text())["schema_version"] == 3


def test_a_model_without_the_reference_classifier_skips_its_columns(tmp_path, capsys):
    """``--model`` with only ``ar/`` and ``vq/``: no FD-ref / class accuracy anywhere; ``library`` refuses."""
    import shutil

    from hf_sjd.reference import weights_dir

    model = tmp_path / "model"
    for part in ("ar", "vq"):
        shutil.copytree(weights_dir() / part, model / part)
    out = tmp_path / "out"
    assert main(["core", "--sections", "methods", "--methods", "ar", "--prompts", "coffee", "--images-per-prompt", "1",
                 "--batch-size", "1", "--seeds", "0", "--quiet", "--model", str(model), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["reference"] is None and results["config"]["model"] == str(model)
    assert results["rows"]["ar"]["mean"]["fd_ref"] is None and results["rows"]["ar"]["mean"]["class_accuracy"] is None
    table = (out / "results.md").read_text()
    assert "FD-ref |" not in table and "class acc |" not in table and "left out" in table
    with pytest.raises(SystemExit) as exit_info:
        main(["library", "--model", str(model), "--out", str(tmp_path / "lib")])
    assert exit_info.value.code == 2 and "suite library needs the reference layout" in capsys.readouterr().err
    assert not (tmp_path / "lib").exists()
