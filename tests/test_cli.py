"""`hf-sjd generate`: outputs on success, clean failures on bad input."""

import json
import subprocess
import sys

import pytest

from hf_sjd.cli import main


def test_generate_writes_pngs_and_stats(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["generate", "coffee", "--num-images", "2", "--method", "ar,sjd", "--out", str(out),
                 "--quiet", "--top-k", "50"]) == 0
    for method in ("ar", "sjd"):
        pngs = sorted((out / method).glob("*.png"))
        assert [p.name for p in pngs] == ["coffee-0.png", "coffee-1.png"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["methods"]["ar"]["num_forward_passes"] == 256
    assert stats["methods"]["ar"]["step_compression"] == pytest.approx(1.0)
    assert stats["methods"]["sjd"]["num_new_tokens"] == 512
    assert stats["methods"]["sjd"]["step_compression"] > 1.0
    printed = capsys.readouterr().out
    assert "sjd: 2 images" in printed and "step compression" in printed
    assert not list(out.rglob(".*"))  # no temporary files left behind


def test_relaxed_verifier_methods_get_the_vq_latents(tmp_path):
    out = tmp_path / "out"
    assert main(["generate", "coffee", "--num-images", "1", "--method", "lantern,gsd", "--out", str(out),
                 "--quiet"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert set(stats["methods"]) == {"lantern", "gsd"}


@pytest.mark.parametrize("args, message", [
    (["unicorn"], "unknown prompt 'unicorn'; known prompts: astronaut"),
    (["coffee", "--num-images", "0"], "--num-images must be >= 1"),
    (["coffee", "--top-k", "0"], r"--top-k must be in \[1, 512\]"),
    (["coffee", "--top-k", "513"], r"--top-k must be in \[1, 512\]"),
    (["coffee", "--method", "beam"], r"registered: ar, .*mc-sjd.*sjd"),
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
