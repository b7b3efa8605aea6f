"""``python -m benchmarks SUITE --model DIR`` on checkpoints of every image family (tiny random Emu3 / Janus /
Chameleon saved with ``save_pretrained``, each with its processor or tokenizer): the speed columns are measured,
the reference-only columns are left out and results.md says why; bad ``--model`` input fails before any work.

Random weights: these check cost bookkeeping and shapes only, never a speed-up."""

import json

import pytest
import torch

from benchmarks.driver import main
from checkpoints import save_chameleon, save_emu3, save_janus

SPEED = ("nfe_per_call", "step_compression", "acceptance_rate", "seconds_per_image", "loop_overhead")
TINY = ["core", "--sections", "methods", "--prompts", "a red apple,a cat", "--images-per-prompt", "1",
        "--batch-size", "2", "--seeds", "0", "--top-k", "8", "--quiet"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {"emu3": save_emu3(root), "janus": save_janus(root), "chameleon": save_chameleon(root)}


# family -> (--methods, extra flags, new tokens per image, image-code positions per image)
CASES = {"emu3": ("ar,sjd", ["--image-size", "16", "--guidance-scale", "3"], 2 * 3 + 3, 4),  # 2x2 grid + EOLs
         "janus": ("ar,mc-sjd", [], 16, 16),  # 4x4 VQ grid, bare codes
         "chameleon": ("sjd,lantern", ["--guidance-scale", "3"], 2 * 3 + 1, 4)}  # 32 px: 2x2 grid + EOLs + eoss


@pytest.mark.parametrize("family", list(CASES))
def test_bench_runs_any_supported_checkpoint(checkpoints, family, tmp_path):
    methods, extra, new_tokens, _ = CASES[family]
    out = tmp_path / "out"
    assert main([*TINY, "--methods", methods, "--model", str(checkpoints[family]), "--out", str(out), *extra]) == 0
    results = json.loads((out / "results.json").read_text())
    config = results["config"]
    assert config["model_family"] == {"chameleon": "lumina-mgpt"}.get(family, family)
    assert config["prompts"] == ["a red apple", "a cat"] and config["prompt_source"] == "text prompts"
    assert results["reference"] is None
    rows = results["rows"]
    assert {entry["method"] for entry in rows.values()} == set(methods.split(","))  # --methods: those rows only
    for key, entry in rows.items():
        seed = entry["per_seed"]["0"]
        assert seed["num_images"] == 2 and seed["num_new_tokens"] == 2 * new_tokens, key
        assert seed["num_forward_passes"] >= 1 and seed["model_calls"] >= seed["num_forward_passes"]
        assert 0 < seed["seconds_per_image"] and 0 <= seed["loop_overhead"] < 1  # the forwards were counted
        assert seed["step_compression"] == pytest.approx(new_tokens / seed["nfe_per_call"])
        assert seed["fd_ref"] is None and seed["class_accuracy"] is None  # reference classifier only
        assert seed["mean_token_loglik"] < 0 and torch.isfinite(torch.tensor(seed["mean_token_loglik"]))
        if entry["method"] == "ar":
            assert seed["step_compression"] == 1.0 and seed["acceptance_rate"] is None
        else:
            assert 0 <= seed["acceptance_rate"] <= 1
            assert sum(k * c for k, c in enumerate(seed["tokens_per_forward"])) == 2 * new_tokens
    table = (out / "results.md").read_text()
    assert "FD-ref |" not in table and "class acc |" not in table
    assert "not the reference layout: FD-ref and class accuracy need the reference classifier and VQ" in table
    assert all(f"{label} |" in table for label in ("NFE/call", "step compression", "acceptance", "s/image"))
    if family != "chameleon":  # Lumina-mGPT ships no VQ decoder in transformers: no samples
        assert (out / "samples.png").read_bytes()[:4] == b"\x89PNG"
    else:
        assert not (out / "samples.png").exists()


def test_bad_model_input_fails_before_any_work(checkpoints, tmp_path, capsys):
    """Unsupported --model, a checkpoint without its tokenizer, rows a family cannot run, a suite that needs
    the reference: exit 2 naming the argument, nothing written (the loading itself is hf-sjd bench's, tested with
    it in tests/test_bench.py)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    text_only = tmp_path / "text-only"
    LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(text_only)
    bare = save_chameleon(tmp_path / "bare", tokenizer=False)
    out = tmp_path / "out"

    def fails(flags, *expected):
        with pytest.raises(SystemExit) as exit_info:
            main([*TINY, "--out", str(out), *flags])
        message = capsys.readouterr().err
        assert exit_info.value.code == 2, message
        for text in expected:
            assert text in message
        assert not out.exists()

    fails(["--methods", "sjd", "--model", str(text_only)], f"--model {text_only}", "text-only",
          "Supported families: Emu3")
    fails(["--methods", "sjd", "--model", str(tmp_path)], "--model", "Supported families: Emu3")
    fails(["--methods", "sjd", "--model", str(bare)], f"--model {bare}", "lumina-mgpt prompt is built with its "
          "tokenizer")
    fails(["--methods", "ar,sjd", "--model", str(checkpoints["chameleon"])], "the ar rows cannot run on lumina-mgpt")
    fails(["--methods", "sjd,prompt-lookup", "--model", str(checkpoints["janus"])],
          "the prompt-lookup rows cannot run on janus")
    fails(["--methods", "sjd", "--model", str(checkpoints["janus"]), "--image-size", "64"],
          "--image-size 64: Janus generates one size only, 8 px")
    fails(["--methods", "sjd-pv", "--model", str(checkpoints["janus"])], "--phrase-library", "no default phrase")
    fails(["--methods", "sjd", "--image-size", "64"], "--image-size applies to a --model checkpoint")
    with pytest.raises(SystemExit) as exit_info:
        main(["library", "--model", str(checkpoints["emu3"]), "--out", str(out)])
    assert exit_info.value.code == 2 and "suite library needs the reference layout" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the reference model keeps its class-name check
        main([*TINY, "--methods", "sjd", "--prompts", "a red apple", "--out", str(out)])
    assert "the reference model knows only: astronaut, cat" in capsys.readouterr().err
