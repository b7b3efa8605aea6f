"""`hf-sjd generate`: outputs on success, clean failures on bad input."""

import json
import subprocess
import sys

import pytest
import torch

from hf_sjd.cli import main


def test_generate_writes_pngs_and_stats(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["generate", "coffee", "--num-images", "2", "--method", "ar,sjd", "--out", str(out),
                 "--quiet", "--top-k", "50"]) == 0
    for method in ("ar", "sjd"):
        pngs = sorted((out / method).glob("*.png"))
        assert [p.name for p in pngs] == ["coffee-0.png", "coffee-1.png"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # --device's default
    assert stats["methods"]["ar"]["num_forward_passes"] == 256
    assert stats["methods"]["ar"]["step_compression"] == pytest.approx(1.0)
    assert stats["methods"]["sjd"]["num_new_tokens"] == 512
    assert stats["methods"]["sjd"]["step_compression"] > 1.0
    assert stats["methods"]["sjd"]["speedup_vs_ar"] == pytest.approx(
        stats["methods"]["ar"]["seconds"] / stats["methods"]["sjd"]["seconds"])
    printed = capsys.readouterr().out
    sjd_line = next(line for line in printed.splitlines() if line.startswith("sjd: 2 images"))
    speedup = stats["methods"]["sjd"]["speedup_vs_ar"]
    assert "step compression" in sjd_line and f"{speedup:.2f}x the speed of ar" in sjd_line
    widths = stats["methods"]["sjd"]["forward_windows"]  # forwards by drafts per row, both batches together
    assert sum(widths) == stats["methods"]["sjd"]["num_forward_passes"]
    windows = stats["methods"]["sjd"]["windows"]  # the full batch's window of each call ("auto"'s pick)
    assert all(widths[w] for w in windows) and max(windows) == len(widths) - 1
    assert f"forwards (window{'s' if len(windows) > 1 else ''} {', '.join(map(str, windows))})" in sjd_line
    assert "forwards (" not in next(line for line in printed.splitlines() if line.startswith("ar: 2 images"))
    assert printed.count("Step compression counts forwards, not seconds") == 1  # one line, after the summaries
    assert [p.name for p in out.rglob(".*")] == [".hf_sjd-output.json"]  # no temporary files left behind


def test_every_method_runs_once_untimed_before_the_timed_calls(tmp_path, monkeypatch):
    """A first call pays what later ones do not (the calibration; on a GPU its context and kernels): each method's
    runs before any is timed, ar's too."""
    import hf_sjd.cli as cli

    calls = []
    real = cli.generate_images

    def recorded(reference, prompts, method, *args):
        calls.append(method)
        return real(reference, prompts, method, *args)

    monkeypatch.setattr(cli, "generate_images", recorded)
    assert main(["generate", "coffee", "--num-images", "1", "--method", "ar,sjd", "--window", "4", "--out",
                 str(tmp_path / "out"), "--quiet", "--top-k", "50"]) == 0
    assert calls == ["ar", "sjd", "ar", "sjd"]


def test_auto_runs_each_strategy_as_generate_runs_it(reference, monkeypatch):
    """The commands' ``--window auto`` (``generate_images(window=None)``) passes neither knob, so a strategy runs its
    own cell (``mc-sjd``: siblings ``"auto"`` too); an integer pins the window with no siblings."""
    from hf_sjd.sampling import generate_images

    seen, generate = [], reference.model.generate

    def spy(*args, **kwargs):
        seen.append({knob: kwargs.get(knob, "unset") for knob in ("jacobi_window", "jacobi_siblings")})
        return generate(*args, **kwargs)

    monkeypatch.setattr(reference.model, "generate", spy)
    for window in (None, 4):
        generate_images(reference, reference.prompt_ids(["coffee"]), "mc-sjd", 100, 1.0, window)
    assert seen == [{"jacobi_window": "unset", "jacobi_siblings": "unset"}, {"jacobi_window": 4, "jacobi_siblings": 0}]


def test_a_window_of_0_says_it_decoded_plainly(tmp_path, capsys):
    """``--window 0`` hands decoding to transformers' own loop: the line says so (no reason: it was asked for)."""
    out = tmp_path / "out"
    assert main(["generate", "coffee", "--num-images", "1", "--method", "sjd", "--window", "0", "--out", str(out),
                 "--quiet"]) == 0
    stats = json.loads((out / "stats.json").read_text())["methods"]["sjd"]
    assert stats["forward_windows"] == [256] and stats["tokens_per_forward"] == [0, 256]
    assert "256 forwards (plain decoding), step compression 1.00x" in capsys.readouterr().out


@pytest.mark.parametrize("windows, window, said", [
    (None, "auto", ""),  # ar: nothing drafted
    ([3], "auto", " (window 3)"),  # the full batch's window, not the shrunk last ones
    ([2, 4], "auto", " (windows 2, 4)"),  # the pick moved between calls
    ([0], "auto", " (plain decoding: no window was cheaper per token on this machine)"),
    ([0], 0, " (plain decoding)"),  # asked for: no reason to give
])
def test_the_summary_names_the_window_the_calls_ran(windows, window, said):
    from hf_sjd.cli import _what_ran

    assert _what_ran({} if windows is None else {"windows": windows}, window) == said


def test_a_pinned_window_wider_than_the_image_is_named_as_it_ran(tmp_path, capsys):
    """Every forward's width then occurs once (the window only shrinks): the line names the window, not the mode."""
    assert main(["generate", "coffee", "--num-images", "1", "--method", "sjd", "--window", "1000", "--out",
                 str(tmp_path / "out"), "--quiet"]) == 0
    assert "forwards (window 255), step compression" in capsys.readouterr().out


def broken_model(tmp_path, what: str):
    """A copy of the shipped weights with one thing wrong."""
    import shutil

    from hf_sjd.reference import weights_dir

    root = tmp_path / what
    shutil.copytree(weights_dir(), root)
    if what == "no-vq":
        shutil.rmtree(root / "vq")
    elif what == "corrupt":
        (root / "ar" / "model.safetensors").write_bytes(b"\x10\x00")
    else:
        shutil.rmtree(root / "ar" / "phrases")
    return root


@pytest.mark.parametrize("command", ["generate", "bench"])
@pytest.mark.parametrize("what, method, message", [
    ("no-vq", "sjd", r"--model: cannot load .*vq/config.json"),
    ("corrupt", "sjd", r"--model: cannot load .*SafetensorError"),
    ("no-phrases", "sjd-pv", r"phrase_library='phrases'.* does not exist: copy the library there, or (pass "
                             r"--phrase-library|run without a phrase-verification)"),
])
def test_a_broken_model_folder_exits_2_naming_the_flag(tmp_path, capsys, command, what, method, message):
    import re

    model, out = broken_model(tmp_path, what), tmp_path / "out"
    flags = ["coffee", "--method", method] if command == "generate" else ["--methods", method]
    with pytest.raises(SystemExit) as exit_info:
        main([command, *flags, "--model", str(model), "--num-images", "1", "--out", str(out)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert re.search(message, error) and "phrase_library=<" not in error  # a flag, not a Python keyword
    assert not out.exists()


def test_an_unknown_prompt_is_refused_before_the_model_loads(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "unicorn", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "unknown prompt 'unicorn'" in capsys.readouterr().err


def test_relaxed_verifier_methods_get_the_vq_latents(tmp_path):
    out = tmp_path / "out"
    assert main(["generate", "coffee", "--num-images", "1", "--method", "lantern,gsd", "--out", str(out),
                 "--quiet"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert set(stats["methods"]) == {"lantern", "gsd"}


@pytest.mark.parametrize("args, message", [
    (["unicorn"], "unknown prompt 'unicorn'; known prompts: astronaut"),
    (["coffee", "--num-images", "0"], "--num-images must be an integer >= 1, got 0"),
    (["coffee", "--top-k", "0"], r"--top-k must be an integer >= 1, got 0"),
    (["coffee", "--top-k", "513"], r"--top-k must be in \[1, 512\] \(the model's drafted image tokens\)"),
    (["coffee", "--method", "beam"], r"registered: ar, .*mc-sjd.*sjd"),
    (["coffee", "--method", "sjd-vp", "--window", "2"], r"--window 2 with sjd-vp: vp_growth_steps=3 needs"),
])
def test_bad_input_fails_cleanly(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *args, "--out", str(out)])
    assert exit_info.value.code == 2
    import re

    assert re.search(message, capsys.readouterr().err)
    assert not out.exists() or not any(out.iterdir())


def test_unwritable_out_fails_cleanly(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "coffee", "--out", str(blocker / "out")])
    assert exit_info.value.code == 2
    assert "is not writable" in capsys.readouterr().err


def test_module_entry_point_lists_methods():
    result = subprocess.run([sys.executable, "-m", "hf_sjd", "generate", "coffee", "--method", "nope"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "registered: ar" in result.stderr


def _no_model(monkeypatch):
    import hf_sjd.reference

    def no_work(*_, **__):
        raise AssertionError("model loaded before the input was validated")

    monkeypatch.setattr(hf_sjd.reference, "load", no_work)


@pytest.mark.parametrize("args, message", [
    (["--guidance-scale", "nan"], r"--guidance-scale must be a finite number >= 0.0, got nan"),
    (["--guidance-scale", "inf"], r"--guidance-scale must be a finite number >= 0.0, got inf"),
    (["--guidance-scale", "-1"], r"--guidance-scale must be a finite number >= 0.0, got -1.0"),
    (["--window", "-1"], r"--window must be 'auto' or an integer >= 0, got -1"),
    (["--threads", "0"], r"--threads must be None or an integer >= 1, got 0"),
    (["--threads", "-1"], r"--threads must be None or an integer >= 1, got -1"),
    (["--batch-size", "0"], r"--batch-size must be an integer >= 1, got 0"),
    (["--seed", "-1"], r"--seed must be an integer >= 0 and <= 9223372036854775807, got -1"),
    (["--method", "sjd,sjd"], r"--method: duplicate method in 'sjd,sjd'"),
    (["--device", "tpu"], r"--device 'tpu': allowed values: cpu, cuda, cuda:N"),
    (["--device", "cuda:99"], r"--device 'cuda:99': allowed values: cpu, cuda, cuda:N"),
])
def test_bad_knobs_exit_2_before_the_model_loads(tmp_path, capsys, monkeypatch, args, message):
    _no_model(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "coffee", *args, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    import re

    assert re.search(message, capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_top_k_is_bounded_by_the_loaded_models_codes(tmp_path, capsys, monkeypatch):
    import dataclasses

    import hf_sjd.reference
    import torch

    real = hf_sjd.reference.load
    monkeypatch.setattr(hf_sjd.reference, "load", lambda *a, **k: dataclasses.replace(
        real(*a, **k), draft_token_ids=torch.arange(100)))  # a model drafting 100 image tokens
    with pytest.raises(SystemExit):
        main(["generate", "coffee", "--top-k", "200", "--out", str(tmp_path / "out")])
    assert "--top-k must be in [1, 100]" in capsys.readouterr().err


def test_an_earlier_run_is_refused_then_replaced_whole(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["generate", "coffee", "--num-images", "1", "--method", "sjd", "--out", str(out), "--quiet"]) == 0
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "coffee", "--num-images", "1", "--out", str(out), "--quiet"])
    assert exit_info.value.code == 2 and "pass --overwrite" in capsys.readouterr().err
    earlier = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    import hf_sjd.cli as cli

    calls = []

    def interrupted(image, path):  # Ctrl-C while the second image is saved
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_save(image, path)

    real_save = cli.save_png
    monkeypatch.setattr(cli, "save_png", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["generate", "coffee", "--num-images", "2", "--batch-size", "2", "--out", str(out), "--overwrite",
              "--quiet"])
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == earlier
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    monkeypatch.setattr(cli, "save_png", real_save)
    assert main(["generate", "coffee", "--num-images", "1", "--out", str(out), "--overwrite", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".hf_sjd-output.json", "ar", "stats.json"]  # sjd/ went with it
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("out, message", [("/", "--out '/' is the root folder"),
                                          (".", "--out '.' is the current folder"),
                                          ("{tmp}/full", "holds files this program did not write")])
def test_out_is_checked_before_the_model_loads(tmp_path, capsys, monkeypatch, out, message):
    """``--overwrite`` replaces only an earlier run's folder: never the root, the current folder, or files of
    someone else's (issue 33 item 5)."""
    _no_model(monkeypatch)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("not ours")
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "coffee", "--out", out.format(tmp=tmp_path), "--overwrite"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["notes.txt"]


def test_loop_cost_is_no_longer_a_command(capsys):
    """It counts the loop from outside generate, with the research harness: python -m benchmarks loop-cost."""
    with pytest.raises(SystemExit) as exit_info:
        main(["loop-cost"])
    assert exit_info.value.code == 2 and "invalid choice: 'loop-cost'" in capsys.readouterr().err


def test_merged_stats_pool_counts():
    """Acceptance pools counts across batches (not a mean of per-batch rates); compression counts each
    batch's forwards once."""
    from hf_sjd.sampling import merge_stats

    def part(accepted, recovered, forwards, images=2):
        return {"num_images": images, "num_new_tokens": 256 * images, "num_forward_passes": forwards, "num_calls": 1,
                "seconds": 1.0, "model_seconds": 0.5, "model_calls": forwards, "num_accepted": accepted,
                "num_recovered": recovered, "tokens_per_forward": [0, 1] if accepted < 50 else [0, 1, 2],
                "forward_windows": [0] * (16 if accepted < 50 else 8) + [forwards]}

    total = merge_stats([part(10, 10, 128), part(90, 10, 64)])
    assert total["acceptance_rate"] == pytest.approx(100 / 120)  # the mean of rates would be 0.7
    assert total["step_compression"] == pytest.approx(256 / (192 / 2))
    assert total["tokens_per_forward"] == [0, 2, 2]  # histograms of different lengths are not cut short
    assert total["forward_windows"] == [0] * 8 + [64] + [0] * 7 + [128]


def test_device_without_cuda_is_refused_and_defaults_to_the_cpu(monkeypatch):
    """``--device`` (generate and bench): CUDA only where it is available; no flag: CUDA there, else the CPU."""
    from hf_sjd.checks import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check_device("--device", None) == torch.device("cpu")
    with pytest.raises(ValueError, match="--device 'cuda': allowed values"):
        check_device("--device", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("--device", None) == torch.device("cuda")
    assert check_device("--device", "cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="--device 'cuda:2'"):
        check_device("--device", "cuda:2")


@pytest.mark.parametrize("flag", ["--phrase-library", None])
@pytest.mark.parametrize("keyword", ["phrase_library=<local folder>", "phrase_library=<folder or Hub repo id>"])
def test_a_missing_default_library_names_the_commands_own_way_out(capsys, flag, keyword):
    """Every message the adapter gives for a default library it cannot find names the Python keyword; the commands
    name their flag (bench) or say to run without phrase verification (generate)."""
    import argparse
    import types

    from hf_sjd.adapters.base import MissingPhraseLibrary
    from hf_sjd.bench.subjects import default_phrase_library

    class Adapter:
        @property
        def default_phrase_library(self):
            raise MissingPhraseLibrary("the library is not there: check the connection, or ", keyword)

    with pytest.raises(FileNotFoundError, match=f"check the connection, or pass {keyword}$"):
        Adapter().default_phrase_library

    subject = types.SimpleNamespace(model=types.SimpleNamespace(sjd_adapter=Adapter()))
    with pytest.raises(SystemExit):
        default_phrase_library(argparse.ArgumentParser(prog="hf-sjd"), subject, "some/model", flag)
    error = capsys.readouterr().err
    assert "phrase_library=<" not in error
    assert ("pass --phrase-library <folder or Hub repo id>" if flag else "run without a phrase-verification") in error


def test_merged_stats_count_the_calls_of_merged_parts():
    from hf_sjd.sampling import merge_stats
    part = dict(num_images=2, num_new_tokens=64, num_forward_passes=16, seconds=1.0, model_seconds=0.5, model_calls=16,
                tokens_per_forward=[0, 4], num_calls=2)  # itself a merge of two calls of 8 forwards
    total = merge_stats([part, dict(part)])
    assert total["num_calls"] == 4 and total["step_compression"] == pytest.approx((128 / 4) / (32 / 4))
