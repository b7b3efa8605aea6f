"""scripts/build_phrase_library.py end to end on local data (an image folder, a save_to_disk dataset)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_sjd import PhraseLibrary
from hf_sjd.reference.data import make_dataset, to_pil


@pytest.fixture(scope="module")
def build(load_script):
    return load_script("build_phrase_library")


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
    from PIL import Image, ImageOps

    pixels = []
    for path in sorted(folder.glob("*.png")):
        image = Image.open(path)
        if image.mode == "RGBA":
            image = Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image)
        image = ImageOps.fit(image.convert("RGB"), (64, 64), method=Image.Resampling.BICUBIC)
        pixels.append(torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 127.5 - 1)
    return vq.encode(torch.stack(pixels)).flatten(1)  # [20, 256]


def test_end_to_end_on_image_folder(build, image_folder, vq, tmp_path):
    out = tmp_path / "lib"
    argv = ["--dataset", str(image_folder), "--merges", "40", "--out", str(out), "--batch-size", "8",
            "--no-progress"]
    library = build.main(argv)
    loaded = PhraseLibrary.from_pretrained(out, fingerprint=vq.fingerprint(), codebook_size=512)
    assert torch.equal(loaded.phrases, library.phrases) and len(loaded) == 40
    expected = PhraseLibrary.from_token_sequences(expected_codes(image_folder, vq), num_merges=40, codebook_size=512)
    assert torch.equal(library.phrases, expected.phrases) and torch.equal(library.counts, expected.counts)
    meta = json.loads((out / "phrase_library.json").read_text())
    assert meta["source"]["dataset"] == str(image_folder) and meta["source"]["num_images"] == 20
    assert meta["grid"] == [16, 16] and meta["row_length"] is None and meta["corpus"]["tokens"] == 20 * 256
    assert meta["build"]["command"].endswith(" ".join(argv))
    rows = build.main(["--dataset", str(image_folder), "--merges", "40", "--out", str(tmp_path / "rows"),
                       "--row-length", "16", "--max-images", "10", "--no-progress"])
    assert rows.metadata["row_length"] == 16 and rows.max_length <= 16 and rows.metadata["corpus"]["tokens"] == 2560


def test_save_to_disk_dataset_and_errors(build, tmp_path, monkeypatch):
    import datasets

    images = to_pil(make_dataset(1, seed=6)[0][:4])
    dataset = datasets.Dataset.from_dict({"picture": images, "label": list(range(4))},
                                         features=datasets.Features({"picture": datasets.Image(),
                                                                     "label": datasets.Value("int64")}))
    datasets.DatasetDict({"train": dataset, "test": dataset.select([0])}).save_to_disk(tmp_path / "ds")
    common = ["--dataset", str(tmp_path / "ds"), "--merges", "5", "--no-progress"]
    library = build.main(common + ["--image-column", "picture", "--out", str(tmp_path / "a")])
    assert library.metadata["source"]["num_images"] == 4

    def fails(extra: list[str], pattern: str, error=ValueError):
        with pytest.raises(error, match=pattern):
            build.main(common + ["--image-column", "picture", "--out", str(tmp_path / "b")] + extra)
        assert not (tmp_path / "b" / "phrase_library.json").exists()

    with pytest.raises(ValueError, match=r"--image-column 'image' not in dataset .*available columns: \['picture', 'label'\]"):
        build.main(common + ["--out", str(tmp_path / "b")])
    fails(["--split", "val"], r"--split 'val' not in .*available splits: \['test', 'train'\]")
    fails(["--merges", "0"], r"--merges must be an integer >= 1, got 0")
    fails(["--num-proc", "0"], r"--num-proc must be an integer >= 1")
    fails(["--model", str(tmp_path / "nope")], r"--model .*nope: no such folder")
    fails(["--model", str(tmp_path / "ds")], r"neither a reference-model folder")
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


def test_unreadable_image(build, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    to_pil(make_dataset(1, seed=7)[0][:2])[0].save(folder / "good.png")
    (folder / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    with pytest.raises(ValueError, match=r"cannot read image .*bad\.png"):
        build.main(["--dataset", str(folder), "--merges", "5", "--out", str(tmp_path / "o"), "--no-progress"])
    assert not (tmp_path / "o").exists()


def test_push_failure_keeps_local_library(build, image_folder, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    def offline(self, *args, **kwargs):
        raise ConnectionError("no route to the Hub")

    monkeypatch.setattr(HfApi, "create_repo", offline)
    out = tmp_path / "lib"
    with pytest.raises(RuntimeError, match=r"pushing to me/phrases failed .*no route.*saved at .*lib is intact"):
        build.main(["--dataset", str(image_folder), "--merges", "10", "--out", str(out), "--no-progress",
                    "--max-images", "4", "--push-to-hub", "me/phrases"])
    assert len(PhraseLibrary.from_pretrained(out)) == 10
