"""The phrase-library builder (``hf_sjd.phrase_builder``: ``hf-sjd build-phrases`` and
``scripts/build_phrase_library.py``) end to end on the reference model and local data: an image folder, a
``save_to_disk`` dataset, a streamed parquet dataset; bad input exits 2 and writes nothing.
(The Emu3 / Janus / Lumina-mGPT checkpoints: tests/adapters/test_phrase_builder.py.)"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_sjd import PhraseLibrary
from hf_sjd.phrase_builder import build, build_parser
from hf_sjd.reference.data import make_dataset, to_pil


def build_library(argv: list[str]):
    """The build from a command line (without the program name): the ``PhraseLibrary``, or the error raised."""
    return build(build_parser().parse_args(argv), shlex.join(["hf-sjd", "build-phrases", *argv]))


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
    fails(["--merges", "0"], r"--merges must be an integer >= 1 and <= 53687091, got 0")
    fails(["--num-proc", "0"], r"--num-proc must be an integer >= 1")
    fails(["--model", str(tmp_path / "nope")], r"--model .*nope: no such folder")
    fails(["--model", str(tmp_path / "ds")], r"--model .*ds: is not a checkpoint folder .*Supported families: Emu3")
    fails(["--image-column", "label"], r"--image-column 'label' is not an image column")
    fails(["--dataset", str(tmp_path / "missing")], r"--dataset .*missing: no such folder")
    (tmp_path / "images.txt").write_text("x")
    fails(["--dataset", str(tmp_path / "images.txt")], r"--dataset .*images.txt is a file; pass a folder")
    fails(["--revision", "v2"], r"--revision v2: --dataset .*ds is a local folder")
    dataset.save_to_disk(tmp_path / "one-split")  # a Dataset: its one split is what it holds
    fails(["--dataset", str(tmp_path / "one-split"), "--split", "test"], r"--split test: .*one-split holds one split")
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
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")  # a push without one is refused before the build
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
    message = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--image-size must be an integer >= 1 and <= 4096, got 0" in message


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


# --------------------------------------------------------------------------- sizes, resources, hangs, Ctrl-C
def no_work(monkeypatch):
    """Fail the test if the build gets as far as reading the model."""
    from hf_sjd import phrase_builder

    def refuse(*args, **kwargs):
        raise AssertionError("the build started work before refusing its arguments")

    monkeypatch.setattr(phrase_builder, "inspect_checkpoint", refuse)


@pytest.mark.parametrize("flags, message", [
    # a Rust abort (rc -6), an OverflowError and a kill for memory before these bounds
    (["--merges", "1000000000"], "--merges must be an integer >= 1 and <= 53687091, got 1000000000"),
    (["--merges", str(10**20)], f"--merges must be an integer >= 1 and <= 53687091, got {10**20}"),
    (["--image-size", "1000000"], "--image-size must be an integer >= 1 and <= 4096, got 1000000"),
    (["--image-size", "4096", "--batch-size", "64"], "--batch-size 64 of 4096 px images (--image-size) is "
                                                     "12884901888 bytes of float32 pixels per encoder batch; at most "
                                                     "4294967296: pass --batch-size <= 21"),
    (["--batch-size", str(2**31)], "--batch-size must be an integer >= 1 and <= 2147483647"),
    (["--row-length", str(10**20)], "--row-length must be an integer >= 0 and <= 2147483647"),
    (["--min-frequency", str(2**64)], "--min-frequency must be an integer >= 1 and <= 2147483647"),
    (["--max-images", str(10**20)], "--max-images must be an integer >= 1 and <= 2147483647"),
    (["--shuffle-buffer", str(10**20)], "--shuffle-buffer must be an integer >= 1 and <= 1048576"),
    (["--num-proc", "1000000"], "--num-proc must be an integer >= 1 and <= "),
    (["--threads", "1000000"], "--threads must be an integer >= 1 and <= "),
    (["--seed", "-1"], "--seed must be an integer >= 0 and <= 18446744073709551615, got -1"),
    (["--hub-timeout", "0"], "--hub-timeout must be a finite number > 0.0 and <= 86400.0, got 0.0"),
    (["--hub-timeout", "nan"], "--hub-timeout must be a finite number > 0.0 and <= 86400.0, got nan"),
    (["--device", "meta"], "--device meta holds no weights"),
    (["--dataset", "reference", "--split", "validation"], "--split validation: --dataset reference is one split"),
])
def test_every_size_has_an_upper_bound_checked_before_any_work(flags, message, tmp_path, capsys, monkeypatch):
    from hf_sjd import cli

    no_work(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build-phrases", "--dataset", str(tmp_path), "--out", str(tmp_path / "out"), *flags])  # (the last
        # --dataset wins)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in error, error
    assert not (tmp_path / "out").exists()


def test_sizes_that_depend_on_the_model_are_checked_before_tokenizing(image_folder, tmp_path, monkeypatch):
    """--row-length must split one image's codes (the reference VQ: 16 x 16), and the corpus must fit the
    trainer's counters: both known from the probe image, before the dataset is tokenized (the corpus bound is
    lowered to what this dataset reaches)."""
    import hf_sjd.phrases as phrases_module
    from hf_sjd import phrase_builder

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("the dataset was tokenized before the sizes were checked")

    monkeypatch.setattr(phrase_builder, "tokenize", no_tokenizing)
    common = ["--dataset", str(image_folder), "--out", str(tmp_path / "out"), "--no-progress"]
    with pytest.raises(ValueError, match=r"--row-length 100 does not split the 256 codes of one 64 px image \(16 x 16 "
                                         r"grid\) into whole rows; pass 0 \(whole images\) or a divisor of 256, e.g. "
                                         r"the grid width 16"):
        build_library(common + ["--row-length", "100"])
    monkeypatch.setattr(phrases_module, "MAX_CORPUS_TOKENS", 256 * 10)
    with pytest.raises(ValueError, match=r"--max-images 11 images of 256 codes \(64 px\) make a corpus of 2816 codes; "
                                         r".*at most 2560 codes: pass --max-images <= 10"):
        build_library(common + ["--max-images", "11"])
    with pytest.raises(ValueError, match=r"the dataset's 20 images of 256 codes .* pass --max-images <= 10"):
        build_library(common)
    assert not (tmp_path / "out").exists()


def write_zero_png(path: Path, width: int, height: int, alpha: bool = False) -> None:
    """An RGB (or RGBA) PNG of zeros, written row by row (PIL would hold the whole image in memory to write it)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    channels, color_type = (4, 6) if alpha else (3, 2)
    compressor, row = zlib.compressobj(1), bytes(1 + channels * width)  # filter byte 0 + the row's pixels
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def peak_rss_growth(call) -> float:
    """MB by which the process's peak resident memory grew during ``call()`` (Linux: the peak, VmHWM, is reset
    through /proc/self/clear_refs first, so an earlier, higher peak cannot hide the call's)."""
    import gc

    status = Path("/proc/self/status")

    def peak_kb() -> int:
        return next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmHWM:"))

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = peak_kb()
    call()
    return (peak_kb() - before) / 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak memory is read from Linux /proc")
def test_memory_follows_the_output_size_not_the_image_file(tmp_path):
    """A 12000 x 12000 PNG of zeros (a 2 MB file) decodes to 432 MB: it is refused from its header, naming the
    file. An 8000 x 8000 JPEG decodes at 1/8 scale (1000 x 1000) for a 64 px output, where a full decode takes
    64 MB and its RGB copy 192 MB more. Bound: 48 MB of peak growth, below either full decode by 16 MB or more;
    what remains is the file's bytes (2 MB), PIL's decoder buffers and the allocator's slack."""
    from PIL import Image

    from hf_sjd.phrase_builder import _to_rgb

    write_zero_png(tmp_path / "huge.png", 12000, 12000)
    Image.new("L", (8000, 8000)).save(tmp_path / "huge.jpg", quality=90)
    Image.new("L", (300, 200)).save(tmp_path / "small.jpg")
    Image.new("RGB", (300, 200)).save(tmp_path / "small.png")
    for name in ("small.jpg", "small.png"):  # PIL's plugins loaded before measuring
        assert _to_rgb(str(tmp_path / name), 64, "warm-up").size == (64, 64)

    def refused():
        with pytest.raises(ValueError, match=f"image {tmp_path / 'huge.png'} \\(row 3 of column 'image'\\) is 12000 x "
                                             "12000 = 144000000 pixels decoded; build-phrases decodes at most "
                                             "33554432 pixels per image"):
            _to_rgb(str(tmp_path / "huge.png"), 64, "row 3 of column 'image'")

    assert peak_rss_growth(refused) < 48
    out = []
    item = {"path": str(tmp_path / "huge.jpg"), "bytes": None}
    assert peak_rss_growth(lambda: out.append(_to_rgb(item, 64, "row 0 of column 'image'"))) < 48
    assert out[0].size == (64, 64) and out[0].mode == "RGB" and out[0].getextrema() == ((0, 0),) * 3


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak memory is read from Linux /proc")
def test_an_accepted_large_png_is_reduced_before_its_copies(tmp_path):
    """A 5000 x 5000 RGBA PNG (under the pixel bound) must be decoded whole: 100 MB. Compositing its alpha on
    white and converting to RGB at full size added three more full-size images (about 375 MB); box-reduced to
    twice the output first, they are output-sized, and only the reduction's premultiplied-alpha copy is full
    size. Bound: two decodes + 48 MB (the margin of the test above), below the old four-plus."""
    from hf_sjd.phrase_builder import _to_rgb

    write_zero_png(tmp_path / "large.png", 5000, 5000, alpha=True)
    write_zero_png(tmp_path / "small.png", 300, 200, alpha=True)
    assert _to_rgb(str(tmp_path / "small.png"), 64, "warm-up").size == (64, 64)
    out = []
    decode_mb = 5000 * 5000 * 4 / 2**20
    assert peak_rss_growth(lambda: out.append(_to_rgb(str(tmp_path / "large.png"), 64, "row 0"))) < 2 * decode_mb + 48
    assert out[0].size == (64, 64) and out[0].getextrema() == ((255, 255),) * 3  # transparent -> white


def test_a_huge_image_in_the_dataset_fails_the_build_naming_it(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    to_pil(make_dataset(1, seed=7)[0][:2])[0].save(folder / "good.png")
    write_zero_png(folder / "huge.png", 12000, 12000)
    with pytest.raises(ValueError, match=r"image .*huge\.png \(row \d of column 'image'\) is 12000 x 12000"):
        build_library(["--dataset", str(folder), "--merges", "5", "--out", str(tmp_path / "o"), "--no-progress"])
    assert not (tmp_path / "o").exists()


def test_push_to_a_hub_that_never_answers_is_bounded(image_folder, tmp_path, monkeypatch):
    """--push-to-hub to an endpoint that accepts and never answers: a RuntimeError naming the endpoint after
    --hub-timeout (exit 1 at the shell), the local library intact. The build runs in a thread so that a hang
    fails the test instead of stopping the suite."""
    import socket
    import threading

    from huggingface_hub import constants

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    outcome, out = [], tmp_path / "lib"

    def build():
        try:
            build_library(["--dataset", str(image_folder), "--merges", "10", "--out", str(out), "--no-progress",
                           "--max-images", "4", "--push-to-hub", "me/phrases", "--hub-timeout", "0.5"])
        except Exception as error:  # noqa: BLE001  checked below
            outcome.append(error)

    with server:
        thread = threading.Thread(target=build, daemon=True)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive(), "build-phrases --push-to-hub still waiting on a Hub that never answers"
    [error] = outcome
    assert isinstance(error, RuntimeError)
    assert str(error).startswith(f"pushing to me/phrases failed (TimeoutError: pushing the phrase library to "
                                 f"me/phrases: the Hub at {endpoint} did not answer within 0.5 s")
    assert str(error).endswith(f"the library saved at {out} is intact")
    assert len(PhraseLibrary.from_pretrained(out)) == 10


def test_out_is_refused_before_any_work_when_the_library_could_not_be_saved(tmp_path, monkeypatch):
    """The library folder is built next to --out and swapped in whole, so --out's parent must be writable even
    when --out is; and --out may hold only an earlier library. Both were found by the save, after the build.
    (Tests run as root: the read-only parent is simulated.)"""
    import os

    no_work(monkeypatch)
    parent = tmp_path / "volume"
    (parent / "out").mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != parent and real_access(path, mode, **kw))
    with pytest.raises(ValueError, match=f"--out '{parent / 'out'}' is not writable: its folder '{parent}' is not a "
                                         "writable folder, and the output is built next to it"):
        build_library(["--dataset", str(tmp_path), "--out", str(parent / "out")])
    monkeypatch.setattr(os, "access", real_access)
    (parent / "out" / "model.safetensors").write_text("weights")
    with pytest.raises(ValueError, match=r"--out .*out holds files that are not part of a phrase library "
                                         r"\(model\.safetensors\)"):
        build_library(["--dataset", str(tmp_path), "--out", str(parent / "out")])
    assert sorted(p.name for p in (parent / "out").iterdir()) == ["model.safetensors"]
    (parent / "out" / "model.safetensors").unlink()
    monkeypatch.chdir(parent / "out")  # an empty folder, or an earlier library: still not to be swapped away
    with pytest.raises(ValueError, match=r"--out '\.' is the current folder; outputs replace their folder as a whole"):
        build_library(["--dataset", str(tmp_path), "--out", "."])


@pytest.mark.parametrize("where", ["image loader", "dataset iterator", "swallowed", "converted"])
def test_ctrl_c_stays_an_interrupt_and_leaves_nothing_on_disk(where, image_folder, tmp_path, monkeypatch):
    """Ctrl-C while images are read: a KeyboardInterrupt, never a dataset error, and --out is not created.
    "swallowed": a library catches the interrupt (Python drops one raised in a weakref callback: "Exception
    ignored in ..."), the build stops at its next check; "converted": a library raises another error while
    handling it (datasets' multi-process map: multiprocess.TimeoutError)."""
    import signal

    import datasets

    from hf_sjd import phrase_builder

    real = phrase_builder._to_rgb
    calls = []

    def interrupted(item, size, where_):
        calls.append(item)
        if len(calls) == 3:
            if where == "image loader":
                raise KeyboardInterrupt
            if where == "swallowed":
                try:
                    signal.raise_signal(signal.SIGINT)  # Ctrl-C, as the terminal sends it
                except KeyboardInterrupt:
                    pass  # ... and a library that drops it
        return real(item, size, where_)

    monkeypatch.setattr(phrase_builder, "_to_rgb", interrupted)
    argv = ["--dataset", str(image_folder), "--merges", "5", "--out", str(tmp_path / "out"), "--no-progress",
            "--batch-size", "2"]
    if where == "dataset iterator":
        real_iter = datasets.IterableDataset.__iter__

        def stream(self):
            for i, row in enumerate(real_iter(self)):
                if i == 2:
                    raise KeyboardInterrupt
                yield row

        monkeypatch.setattr(datasets.IterableDataset, "__iter__", stream)
        argv.append("--streaming")
    if where == "converted":
        def map_interrupted(self, *args, **kwargs):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise TimeoutError from None  # what multiprocess's pool raises while datasets tears it down

        monkeypatch.setattr(datasets.Dataset, "map", map_interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_library(argv)
    assert not (tmp_path / "out").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own handler is back


WORKER_INTERRUPT_SCRIPT = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job inherits SIG_IGN)
from hf_sjd import phrase_builder

marker, real = Path(sys.argv[1]), phrase_builder._to_rgb

def to_rgb(item, size, where):  # shard 0 (files 00-09) is quick; shard 1 (10-19) is still busy at Ctrl-C
    if not isinstance(item, dict):  # the probe image
        return real(item, size, where)
    number = int(Path(item["path"]).stem)
    if number >= 10:
        time.sleep(2)
    image = real(item, size, where)
    if number == 9:  # in a worker process: record how it takes Ctrl-C
        marker.write_text(repr(signal.getsignal(signal.SIGINT)))
    return image

phrase_builder._to_rgb = to_rgb
sys.exit(phrase_builder.main(sys.argv[2:]))
"""


def test_ctrl_c_with_worker_processes_ends_the_build(image_folder, tmp_path):
    """Ctrl-C reaches the whole process group. The parent's KeyboardInterrupt came out as datasets' pool
    TimeoutError (exit 1), and a --num-proc worker killed by SIGINT at the wrong moment could leave the pool's
    queue lock taken, on which the parent's Pool.terminate then waited for good (seen: a hang until a second
    Ctrl-C). Workers now ignore SIGINT and the parent stops them. Here the interrupt comes with one worker
    idle and the other busy: the build ends as an interrupt within the guard, nothing written."""
    import os
    import signal
    import subprocess
    import sys
    import time

    marker, out = tmp_path / "shard-0-done", tmp_path / "lib"
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER_INTERRUPT_SCRIPT, str(marker), "--dataset", str(image_folder), "--merges", "5",
         "--num-proc", "2", "--batch-size", "1", "--threads", "1", "--device", "cpu", "--out", str(out),
         "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), process.communicate(timeout=60)[1][-3000:]
        time.sleep(1.0)  # the first worker is back waiting for a task
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, stderr = process.communicate(timeout=60)  # a guard against the deadlock, not a speed target
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGINT and stderr.rstrip().endswith("KeyboardInterrupt"), stderr[-3000:]
    assert not out.exists()
    assert marker.read_text() == repr(signal.SIG_IGN)  # workers leave Ctrl-C to the parent, which stops them


@pytest.mark.parametrize("flags, message", [
    (["--push-to-hub", "not/a/valid/id!!"], "--push-to-hub 'not/a/valid/id!!' is not a Hub repo id: Repo id must be"),
    (["--push-to-hub", "me/phrases"], "--push-to-hub me/phrases needs a Hugging Face token with write access: run "
                                      "`hf auth login` or set HF_TOKEN"),
])
def test_a_push_that_cannot_succeed_is_refused_before_the_build(flags, message, tmp_path, capsys, monkeypatch):
    """Both were found by the push, after the whole build (exit 1, 'pushing ... failed')."""
    from hf_sjd import cli

    no_work(monkeypatch)
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # no stored token either
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build-phrases", "--dataset", str(tmp_path), "--out", str(tmp_path / "out"), *flags])  # (the last
        # --dataset wins)
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in error, error


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_absent_device_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """--device cuda on a machine without it: torch said so only when the model moved (exit 1, after the
    dataset was loaded)."""
    from hf_sjd import cli

    no_work(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build-phrases", "--dataset", str(tmp_path), "--out", str(tmp_path / "out"), "--device", "cuda:1"])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "--device cuda:1: this machine has no cuda device torch can use; pass --device cpu" in error, error


def test_an_image_size_the_model_cannot_encode_names_the_flag(image_folder, tmp_path):
    with pytest.raises(ValueError, match=r"--image-size 48: encoding one blank image failed before the dataset was "
                                         r"read: llamagen: the VQ tokenizer takes 64x64 px images"):
        build_library(["--dataset", str(image_folder), "--image-size", "48", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


HANGING_EXIT_SCRIPT = """
import signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)
from hf_sjd import phrase_builder

phrase_builder.SHUTDOWN_GRACE = 1.0
never = threading.Event()
real = phrase_builder._to_rgb

def to_rgb(item, size, where):
    if isinstance(item, dict):  # a dataset image: Ctrl-C lands while a library's worker thread waits for good
        threading.Thread(target=never.wait).start()  # not a daemon: Python's exit joins it
        raise KeyboardInterrupt
    return real(item, size, where)

phrase_builder._to_rgb = to_rgb
sys.exit(phrase_builder.main(sys.argv[1:]))
"""


def test_ctrl_c_ends_the_program_even_when_a_library_thread_would_hold_its_exit(image_folder, tmp_path):
    """Seen at the shell: after Ctrl-C the traceback was printed and the process never ended (Python's exit joins
    every non-daemon thread; a library's worker was never told to stop). The CLI gives the exit a grace period
    (1 s here), then ends with status 130."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    result = subprocess.run([sys.executable, "-c", HANGING_EXIT_SCRIPT, "--dataset", str(image_folder), "--merges", "5",
                             "--out", str(tmp_path / "lib"), "--no-progress"],
                            env=env, capture_output=True, text=True, timeout=120)  # the guard against the hang
    assert result.returncode == 130 and result.stderr.rstrip().endswith("KeyboardInterrupt"), result.stderr[-3000:]
    assert not (tmp_path / "lib").exists()


def test_a_dark_sixteen_bit_image_is_read_dark_whatever_its_brightest_pixel(tmp_path):
    """A 16-bit file's values are 16-bit even when all are <= 255 (a nearly black picture): it reads as the same
    picture with one pixel a step brighter, not as a bright 8-bit one."""
    from PIL import Image

    from hf_sjd.phrase_builder import _to_rgb

    grey = np.tile(np.linspace(0, 255, 64).astype(np.uint16), (64, 1))
    brighter = grey.copy()
    brighter[0, 0] = 256
    read = []
    for name, values in (("dark", grey), ("brighter", brighter)):
        Image.fromarray(values).save(tmp_path / f"{name}.png")
        assert Image.open(tmp_path / f"{name}.png").mode.startswith("I;16")
        read.append(np.asarray(_to_rgb(str(tmp_path / f"{name}.png"), 64, name)))
    assert read[0].max() <= 1 and np.array_equal(read[0], read[1])


def test_sixteen_bit_and_exif_rotated_images_are_read_as_they_show(vq, tmp_path):
    """A 16-bit grey PNG is scaled to 8 bits (convert("RGB") alone clips it to white), and a photo stored sideways
    with an EXIF orientation is turned upright (as datasets and transformers decode it): each gives the library of
    the same picture stored plainly."""
    from PIL import Image

    pictures = to_pil(make_dataset(1, seed=7)[0][:6])
    for name in ("plain", "sixteen", "tagged"):
        (tmp_path / name).mkdir()
    for i, picture in enumerate(pictures):
        grey = np.asarray(picture.convert("L"))
        Image.fromarray(grey).convert("RGB").save(tmp_path / "plain" / f"{i}.png")
        Image.fromarray(grey.astype(np.uint16) * 257).save(tmp_path / "sixteen" / f"{i}.png")
        exif = Image.Exif()
        exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
        Image.fromarray(grey).convert("RGB").transpose(Image.Transpose.ROTATE_90).save(
            tmp_path / "tagged" / f"{i}.png", exif=exif)
    assert Image.open(tmp_path / "sixteen" / "0.png").mode.startswith("I")
    built = {name: build_library(["--dataset", str(tmp_path / name), "--merges", "20", "--no-progress",
                                  "--out", str(tmp_path / f"lib-{name}")]) for name in ("plain", "sixteen", "tagged")}
    for name in ("sixteen", "tagged"):
        assert built[name].phrase_list() == built["plain"].phrase_list(), name

