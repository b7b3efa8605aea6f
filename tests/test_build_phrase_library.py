"""The phrase-library builder (``hf_sjd.phrase_builder``: ``hf-sjd build-phrases`` and
``scripts/build_phrase_library.py``) end to end on the reference model and local data: an image folder, a
``save_to_disk`` dataset, a streamed parquet dataset; bad input exits 2 and writes nothing.
(The Emu3 / Janus / Lumina-mGPT checkpoints: tests/adapters/test_phrase_builder.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_sjd import PhraseLibrary
from hf_sjd.phrase_builder import build_library
from hf_sjd.reference.data import make_dataset, to_pil


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")


@pytest.fixture(scope="module")
def vq():
    from hf_sjd import reference

    return reference.load().vq


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """20 reference crops as PNGs: 17 RGB 64x64, one grayscale, one RGBA, one 96x80 (resized + cropped)."""
    folder = tmp_path_factory.mktemp("images")
    images, _ = make_dataset(2, seed=5)  # [32, 3, 64, 64]
    pils = to_pil(images[:20])
    pils[17] = pils[17].convert("L")
    pils[18] = pils[18].convert("RGBA")
    pils[18].putalpha(128)
    pils[19] = pils[19].resize((96, 80))
    for i, image in enumerate(pils):
        image.save(folder / f"{i:02d}.png")
    return folder


def expected_codes(folder: Path, vq) -> torch.Tensor:
    """What the script should feed BPE, computed without datasets."""
    from PIL import Image

    return codes_of([Image.open(path) for path in sorted(folder.glob("*.png"))], vq)


def codes_of(images: list, vq) -> torch.Tensor:
    from PIL import Image, ImageOps

    pixels = []
    for image in images:
        if image.mode == "RGBA":
            image = Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image)
        image = ImageOps.fit(image.convert("RGB"), (64, 64), method=Image.Resampling.BICUBIC)
        pixels.append(torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 127.5 - 1)
    return vq.encode(torch.stack(pixels)).flatten(1)  # [N, 256]


def test_end_to_end_on_image_folder(load_script, image_folder, vq, tmp_path):
    """The documented script (no --model: the shipped reference model) on a plain folder of images."""
    out = tmp_path / "lib"
    argv = ["--dataset", str(image_folder), "--merges", "40", "--out", str(out), "--batch-size", "8",
            "--no-progress"]
    assert load_script("build_phrase_library").main(argv) == 0
    library = PhraseLibrary.from_pretrained(out, fingerprint=vq.fingerprint(), codebook_size=512)
    assert len(library) == 40 and library.fingerprint == vq.fingerprint()
    expected = PhraseLibrary.from_token_sequences(expected_codes(image_folder, vq), num_merges=40, codebook_size=512)
    assert torch.equal(library.phrases, expected.phrases) and torch.equal(library.counts, expected.counts)
    meta = json.loads((out / "phrase_library.json").read_text())
    assert meta["source"]["dataset"] == str(image_folder) and meta["source"]["num_images"] == 20
    assert meta["grid"] == [16, 16] and meta["row_length"] is None and meta["corpus"]["tokens"] == 20 * 256
    assert meta["build"]["command"] == " ".join(["python", "scripts/build_phrase_library.py", *argv])
    assert meta["source"]["model"] == "hf_sjd/reference" and meta["source"]["family"] == "llamagen"
    rows = build_library(["--dataset", str(image_folder), "--merges", "40", "--out", str(tmp_path / "rows"),
                          "--row-length", "16", "--max-images", "10", "--no-progress"])
    assert rows.metadata["row_length"] == 16 and rows.max_length <= 16 and rows.metadata["corpus"]["tokens"] == 2560


def test_save_to_disk_dataset_and_errors(tmp_path, monkeypatch):
    import datasets

    images = to_pil(make_dataset(1, seed=6)[0][:4])
    dataset = datasets.Dataset.from_dict({"picture": images, "label": list(range(4))},
                                         features=datasets.Features({"picture": datasets.Image(),
                                                                     "label": datasets.Value("int64")}))
    datasets.DatasetDict({"train": dataset, "test": dataset.select([0])}).save_to_disk(tmp_path / "ds")
    common = ["--dataset", str(tmp_path / "ds"), "--merges", "5", "--no-progress"]
    library = build_library(common + ["--image-column", "picture", "--out", str(tmp_path / "a")])
    assert library.metadata["source"]["num_images"] == 4

    def fails(extra: list[str], pattern: str, error=ValueError):
        with pytest.raises(error, match=pattern):
            build_library(common + ["--image-column", "picture", "--out", str(tmp_path / "b")] + extra)
        assert not (tmp_path / "b" / "phrase_library.json").exists()

    with pytest.raises(ValueError, match=r"--image-column 'image' not in dataset .*available columns: \['picture', 'label'\]"):
        build_library(common + ["--out", str(tmp_path / "b")])
    fails(["--split", "val"], r"--split 'val' not in .*available splits: \['test', 'train'\]")
    fails(["--merges", "0"], r"--merges must be an integer >= 1, got 0")
    fails(["--num-proc", "0"], r"--num-proc must be an integer >= 1")
    fails(["--model", str(tmp_path / "nope")], r"--model .*nope: no such folder")
    fails(["--model", str(tmp_path / "ds")], r"--model .*ds: is not a checkpoint folder .*Supported families: Emu3")
    fails(["--image-column", "label"], r"--image-column 'label' is not an image column")
    fails(["--dataset", str(tmp_path / "missing")], r"--dataset .*missing: no such folder")
    (tmp_path / "parquet").mkdir()
    dataset.select([]).to_parquet(tmp_path / "parquet" / "train.parquet")
    fails(["--dataset", str(tmp_path / "parquet")], r"cannot load --dataset .*parquet --split 'train': .*no data")
    empty = dataset.select([])
    with monkeypatch.context() as patch:
        patch.setattr(datasets, "load_from_disk", lambda path: empty)
        fails([], r"dataset .*ds split 'train' is empty")
    (tmp_path / "file").write_text("x")
    fails(["--out", str(tmp_path / "file" / "sub")], r"--out .* is not writable")
    fails(["--out", str(tmp_path / "file")], r"--out .* exists and is not a folder")


def test_unreadable_image(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    to_pil(make_dataset(1, seed=7)[0][:2])[0].save(folder / "good.png")
    (folder / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    with pytest.raises(ValueError, match=r"cannot read image .*bad\.png"):
        build_library(["--dataset", str(folder), "--merges", "5", "--out", str(tmp_path / "o"), "--no-progress"])
    assert not (tmp_path / "o").exists()


def test_push_failure_keeps_local_library(image_folder, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    def offline(self, *args, **kwargs):
        raise ConnectionError("no route to the Hub")

    monkeypatch.setattr(HfApi, "create_repo", offline)
    out = tmp_path / "lib"
    with pytest.raises(RuntimeError, match=r"pushing to me/phrases failed .*no route.*saved at .*lib is intact"):
        build_library(["--dataset", str(image_folder), "--merges", "10", "--out", str(out), "--no-progress",
                    "--max-images", "4", "--push-to-hub", "me/phrases"])
    assert len(PhraseLibrary.from_pretrained(out)) == 10


def test_streaming_takes_the_first_n_of_the_shuffled_stream(vq, tmp_path):
    """--streaming on a local parquet dataset: --max-images N = the first N of shuffle(seed, buffer_size)."""
    import datasets

    images = to_pil(make_dataset(1, seed=8)[0][:12])
    (tmp_path / "parquet").mkdir()
    datasets.Dataset.from_dict({"image": images}, features=datasets.Features({"image": datasets.Image()})
                               ).to_parquet(tmp_path / "parquet" / "train.parquet")
    common = ["--dataset", str(tmp_path / "parquet"), "--streaming", "--merges", "20", "--no-progress"]
    library = build_library(common + ["--max-images", "5", "--shuffle-buffer", "4", "--seed", "3",
                                      "--out", str(tmp_path / "lib")])
    stream = datasets.load_dataset(str(tmp_path / "parquet"), split="train", streaming=True)
    chosen = [row["image"] for row in stream.shuffle(seed=3, buffer_size=4).take(5)]
    codes = codes_of(chosen, vq)
    assert not torch.equal(codes, codes_of(images[:5], vq))  # shuffled: not simply the first five rows
    expected = PhraseLibrary.from_token_sequences(codes, num_merges=20, codebook_size=512)
    assert torch.equal(library.phrases, expected.phrases) and torch.equal(library.counts, expected.counts)
    source = library.metadata["source"]
    assert (source["streaming"], source["num_images"], source["shuffle_buffer"]) == (True, 5, 4)
    whole = build_library(common + ["--out", str(tmp_path / "whole")])  # no --max-images: the whole stream
    assert whole.metadata["source"]["num_images"] == 12 and whole.metadata["corpus"]["tokens"] == 12 * 256


def test_cli_refuses_what_is_not_an_image_checkpoint(image_folder, tmp_path, capsys):
    """``hf-sjd build-phrases --model`` at a text-only model, a folder that is no checkpoint, a bare VQ folder:
    exit 2, a message naming --model and the supported families, nothing written."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_sjd import cli, reference

    LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(tmp_path / "text-only")
    out = tmp_path / "out"
    for model, reason in ((tmp_path / "text-only", "is a text-only LlamaForCausalLM"),
                          (image_folder, "is not a checkpoint folder"),
                          (reference.weights_dir() / "vq", "cannot read a transformers config"),
                          (tmp_path / "missing", "no such folder")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["build-phrases", "--model", str(model), "--dataset", str(image_folder), "--out", str(out),
                      "--no-progress"])
        message = capsys.readouterr().err
        assert exit_info.value.code == 2, message
        assert f"--model {model}: {reason}" in message and "Supported families: Emu3" in message
        assert "Janus" in message and "Lumina-mGPT" in message and "LlamaGen" in message
        assert not out.exists()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build-phrases", "--dataset", str(image_folder), "--image-size", "0", "--out", str(out)])
    assert exit_info.value.code == 2 and "--image-size must be an integer >= 1, got 0" in capsys.readouterr().err


def test_num_proc_workers_match_one_process(image_folder, vq, tmp_path):
    """--num-proc 2 forks tokenizer workers after the parent encoded its probe image (a subprocess with a
    timeout: a fork that inherits torch's thread pool would hang, not fail)."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "build_phrase_library.py"
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    result = subprocess.run([sys.executable, str(script), "--dataset", str(image_folder), "--merges", "30",
                             "--num-proc", "2", "--batch-size", "4", "--threads", "2", "--device", "cpu",
                             "--out", str(tmp_path / "lib"), "--no-progress"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = PhraseLibrary.from_token_sequences(expected_codes(image_folder, vq), num_merges=30, codebook_size=512)
    library = PhraseLibrary.from_pretrained(tmp_path / "lib")
    assert torch.equal(library.phrases, expected.phrases) and torch.equal(library.counts, expected.counts)


def closed_loopback_endpoint() -> str:
    """An HF endpoint nothing listens on (a loopback port bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_hub_model_id_fails_in_seconds_when_the_hub_is_unreachable(image_folder, tmp_path, capsys, monkeypatch):
    """``--model owner/name`` with the endpoint down: one HEAD without retries, then a clear exit 2 (transformers'
    own retries took ~41 s), and nothing written."""
    import time

    from huggingface_hub import constants

    from hf_sjd import cli

    monkeypatch.setattr(constants, "ENDPOINT", closed_loopback_endpoint())
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    out, start = tmp_path / "out", time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build-phrases", "--model", "nope/emu3", "--dataset", str(image_folder), "--out", str(out),
                  "--no-progress"])
    message = capsys.readouterr().err
    assert exit_info.value.code == 2, message
    assert "--model nope/emu3: cannot reach http://127.0.0.1" in message and "not in the Hub cache" in message
    assert time.perf_counter() - start < 10 and not out.exists()  # a guard against the retry loop, not a speed target


def test_default_library_of_a_hub_model_fails_in_seconds_when_the_hub_is_unreachable(monkeypatch):
    import time

    from huggingface_hub import constants

    import hf_sjd
    from hf_sjd.reference import load

    ref = load()
    hf_sjd.enable(ref.model)
    ref.model.config._name_or_path = "nope/sjd-reference-unreachable"  # as if loaded by Hub id
    monkeypatch.setattr(constants, "ENDPOINT", closed_loopback_endpoint())
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"phrases/ folder of its Hub repo nope/sjd-reference-unreachable, "
                                                r"which is not in the Hub cache and cannot be fetched \(cannot reach"):
        ref.model.sjd_adapter.default_phrase_library
    assert time.perf_counter() - start < 10
