"""The papers' evaluation in ``hf-sjd bench`` (issue 35): prompt sets, FID and CLIP score through torchmetrics,
the paired table with standard errors and differences to the baseline, resuming, sharding, saved images.

No weights or datasets can be downloaded here, so everything runs on what the tests build: a tiny random
``CLIPModel`` + processor saved with ``save_pretrained``, a tiny feature network for FID (torch.export), a COCO-style
captions file, a folder of reference images, and the tiny random Emu3 / Janus / Chameleon checkpoints of
tests/checkpoints.py. Random weights prove the pipeline, never a quality or a speed."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from checkpoints import WORDS, save_chameleon, save_emu3, save_janus, word_tokenizer
from hf_sjd.cli import main

ROOT = Path(__file__).resolve().parents[1]
CAPTIONS = ["a photo of a red apple", "a cat", "a red cat", "a photo of a coffee", "an apple of a cat"]


# -- what the tests build ----------------------------------------------------------------------------------
class _Pool(torch.nn.Module):
    """uint8 [N, 3, H, W] -> [N, 12]: the channel means of a 2 x 2 grid of cells (a tiny FID feature network)."""

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_avg_pool2d(pixels.float() / 255, 2).flatten(1)


class _NotFeatures(torch.nn.Module):
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels.float()  # [N, 3, H, W]: not [N, D]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """``{name: path}``: a tiny CLIP, feature networks, a COCO captions file, reference images, a prompt list."""
    from PIL import Image
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    root = tmp_path_factory.mktemp("assets")
    torch.manual_seed(0)
    text = dict(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=77, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).save_pretrained(root / "clip")
    tokenizer = word_tokenizer({"<pad>": 0, "<s>": 1, "</s>": 2}, range(3, 3 + 1 + len(WORDS)), bos_token="<s>",
                               eos_token="</s>", pad_token="<pad>")
    CLIPProcessor(CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
                  tokenizer).save_pretrained(root / "clip")
    torch.export.save(torch.export.export(_Pool(), (torch.zeros(2, 3, 299, 299, dtype=torch.uint8),),
                                          dynamic_shapes={"pixels": {0: torch.export.Dim("batch")}}), root / "pool.pt2")
    with warnings.catch_warnings():  # TorchScript is deprecated; still read, so one network is saved with it
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(_NotFeatures()), root / "not-features.pt")
    (root / "weights.pt2").write_bytes(b"not a saved network")
    notes = [{"id": 10 * i + k, "image_id": 100 + i, "caption": f"{c} {k}" if k else c}
             for i, c in enumerate(CAPTIONS) for k in (1, 0)]  # the plain caption: the lower id, listed last
    (root / "captions_val2017.json").write_text(json.dumps({"images": [], "annotations": notes[::-1]}))
    (root / "prompts.txt").write_text("a cat\n\n a red apple \n")
    generator = torch.Generator().manual_seed(1)
    (root / "reference").mkdir()
    for i in range(6):
        pixels = torch.randint(0, 256, (20 + i, 24, 3), dtype=torch.uint8, generator=generator)
        Image.fromarray(pixels.numpy()).save(root / "reference" / f"{i}.png")
    (root / "empty").mkdir()
    (root / "other" / "config.json").parent.mkdir()
    (root / "other" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return {p.name: p for p in root.iterdir()}


@pytest.fixture(scope="module")
def emu3(tmp_path_factory):
    return save_emu3(tmp_path_factory.mktemp("emu3"))


def _bench(*args, out, quiet=True) -> dict:
    assert main(["bench", *map(str, args), "--threads", "1", *(["--quiet"] if quiet else []), "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())


def _metric_flags(assets, cache):
    return ["--fid-reference", assets["reference"], "--fid-features", assets["pool.pt2"], "--fid-cache", cache,
            "--clip-model", assets["clip"]]


# -- prompt sets ---------------------------------------------------------------------------------------------
def test_prompt_sets_from_files_and_the_hub(assets, monkeypatch):
    """A COCO captions file gives each image's first caption (lowest annotation id) in image order; a .txt one
    prompt per non-empty line; [:N] a fixed subset in the set's order, the same on every call; a Hub set reads
    its dataset's column (``datasets.load_dataset``, stubbed: no network)."""
    import datasets

    from hf_sjd.prompts import load_prompt_set

    coco = str(assets["captions_val2017.json"])
    assert load_prompt_set(coco) == CAPTIONS
    assert load_prompt_set(str(assets["prompts.txt"])) == ["a cat", "a red apple"]
    subset = load_prompt_set(coco + "[:3]")
    assert len(subset) == 3 and subset == load_prompt_set(coco + "[:3]")
    assert [p for p in load_prompt_set(coco) if p in subset] == subset  # the set's order
    assert load_prompt_set("a cat,a dog") is None and load_prompt_set("a cat") is None  # prompts, not a set

    calls = []

    def hub(dataset_id, split):
        calls.append((dataset_id, split))
        return datasets.Dataset.from_dict({"captions": [["a cat", "x"], ["a dog"]], "Prompt": ["p", "q"]})

    monkeypatch.setattr(datasets, "load_dataset", hub)
    assert load_prompt_set("coco2017-val") == ["a cat", "a dog"] and load_prompt_set("parti[:1]") in (["p"], ["q"])
    assert calls == [("phiyodr/coco2017", "validation"), ("nateraw/parti-prompts", "train")]


@pytest.mark.parametrize("spec, message", [
    ("coco2014-val[:5]", r"unknown prompt set 'coco2014-val'; allowed: coco2017-val\[:N\], parti\[:N\]"),
    ("{tmp}/missing.txt", r"no file '.*missing.txt'"),
    ("{tmp}/captions_val2017.json[:6]", r"\[:N\] must be in \[1, 5\]"),
    ("{tmp}/prompts.txt[:0]", r"\[:N\] must be in \[1, 2\]"),
])
def test_bad_prompt_sets(assets, spec, message):
    from hf_sjd.prompts import load_prompt_set

    with pytest.raises(ValueError, match=message):
        load_prompt_set(spec.format(tmp=assets["clip"].parent))


# -- metrics ---------------------------------------------------------------------------------------------------
def _images(seed: int, count: int = 4, side: int = 16):
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    return [Image.fromarray(torch.randint(0, 256, (side, side, 3), dtype=torch.uint8, generator=generator).numpy())
            for _ in range(count)]


def test_metrics_are_identical_for_identical_inputs_and_change_with_the_images(assets):
    from hf_sjd.quality import ClipScorer, FidFeatures, Frechet

    clip = ClipScorer(str(assets["clip"]), "cpu")
    images, other = _images(0), _images(1)
    prompts = ["a cat", "a red apple", "a cat", "a photo of a coffee"]
    scores = clip(images, prompts)
    assert len(scores) == 4 and all(s >= 0 for s in scores)
    assert clip(images, prompts) == scores and clip(other, prompts) != scores
    assert clip(images[:1], prompts[:1]) == scores[:1]  # an image's score does not depend on its batch
    features = FidFeatures(str(assets["pool.pt2"]), "cpu")
    a, b = features(images), features(other)
    assert a.shape == (4, 12) and torch.equal(a, features(images)) and not torch.equal(a, b)
    frechet = Frechet(features(_images(2, 8)))
    assert frechet(a) == frechet(a.clone()) and frechet(a) != frechet(b)


def test_torchmetrics_fid_agrees_with_the_closed_form():
    """:class:`Frechet` (torchmetrics' FID over given features) equals :func:`frechet_distance` (the eigh form)
    on full-rank samples, and is 0 for a set against itself."""
    from hf_sjd.quality import Frechet, frechet_distance

    generator = torch.Generator().manual_seed(0)
    real = torch.randn(200, 4, generator=generator, dtype=torch.float64)
    fake = 1.5 * torch.randn(100, 4, generator=generator, dtype=torch.float64) + 0.3
    assert Frechet(real)(fake) == pytest.approx(frechet_distance(fake, real), rel=1e-6)
    assert Frechet(real)(real) == pytest.approx(0.0, abs=1e-6)


def test_bootstrap_resamples_are_paired_and_seeded():
    """Every statistic of one call sees the same index sets: the difference of a statistic with itself is 0 in
    every resample; the same seed gives the same resamples; the SE of a mean is near sigma / sqrt(n)."""
    from hf_sjd.quality import bootstrap

    values = torch.randn(400, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    pairs = bootstrap(lambda i: [values[i].mean(), values[i].mean()], 400, 50)
    assert pairs.shape == (50, 2) and torch.equal(pairs[:, 0], pairs[:, 1])
    assert torch.equal(bootstrap(lambda i: values[i].mean(), 400, 50), pairs[:, 0])
    # 200 resamples: the SE estimate's relative error is about 1/sqrt(2 * 200) = 5%; 30% is > 5 of them
    assert float(bootstrap(lambda i: values[i].mean(), 400, 200).std()) == pytest.approx(1 / 400 ** 0.5, rel=0.3)


def test_reference_features_are_computed_once_per_network(assets, tmp_path, monkeypatch):
    from hf_sjd import quality
    from hf_sjd.quality import FidFeatures, reference_features

    pool = FidFeatures(str(assets["pool.pt2"]), "cpu")
    first = reference_features(str(assets["reference"]), pool, str(tmp_path))
    assert first.shape == (6, 12) and len(list(tmp_path.glob("fid-*.pt"))) == 1

    def no_images(*_, **__):
        raise AssertionError("reference images read again")

    monkeypatch.setattr(quality, "to_uint8", no_images)
    assert torch.equal(reference_features(str(assets["reference"]), pool, str(tmp_path)), first)
    assert torch.equal(reference_features(str(assets["reference"]) + "[:6]", pool, str(tmp_path)), first)
    monkeypatch.undo()
    fewer = reference_features(str(assets["reference"]) + "[:3]", pool, str(tmp_path))
    assert torch.equal(fewer, first[:3]) and len(list(tmp_path.glob("fid-*.pt"))) == 2



def test_a_hub_reference_dataset_is_cached_per_revision(assets, tmp_path, monkeypatch):
    """A Hub dataset's reference features are keyed by the loaded rows' fingerprint: the same revision reads the
    cache, another (new data under the same id and split) computes its own (``datasets.load_dataset`` stubbed)."""
    import datasets
    import numpy as np
    from PIL import Image

    from hf_sjd.quality import FidFeatures, reference_features

    def revision(value: int) -> datasets.Dataset:
        images = [Image.fromarray(np.full((16, 16, 3), value + i, np.uint8)) for i in range(3)]
        return datasets.Dataset.from_dict({"image": images}, features=datasets.Features({"image": datasets.Image()}))

    served = {"rows": revision(10)}
    monkeypatch.setattr(datasets, "load_dataset", lambda dataset_id, split: served["rows"])
    pool = FidFeatures(str(assets["pool.pt2"]), "cpu")
    first = reference_features("me/photos:val", pool, str(tmp_path))
    assert torch.equal(reference_features("me/photos:val", pool, str(tmp_path)), first)  # the cache
    assert len(list(tmp_path.glob("fid-*.pt"))) == 1
    served["rows"] = revision(200)  # the dataset's next revision
    assert not torch.equal(reference_features("me/photos:val", pool, str(tmp_path)), first)
    assert len(list(tmp_path.glob("fid-*.pt"))) == 2


# -- the bench: end to end -------------------------------------------------------------------------------------
def _png_text(path: Path) -> dict:
    from PIL import Image

    with Image.open(path) as image:
        return dict(image.text)


def test_emu3_paired_table_with_fid_clip_and_images(assets, emu3, tmp_path, capsys):
    """COCO-style captions on a tiny Emu3: every method on the same prompts and seeds, FID and CLIP score with
    their SEs and differences to ar, batch-1 latency, a PNG per image with its prompt and seed, the plot."""
    out = tmp_path / "out"
    results = _bench("--model", emu3, "--image-size", 16, "--methods", "ar,sjd", "--prompts",
                     f"{assets['captions_val2017.json']}[:4]", "--batch-size", 2, "--top-k", 8, "--bootstrap", 5,
                     "--latency-images", 1, "--save-images", *_metric_flags(assets, tmp_path / "cache"), out=out)
    rows = results["methods"]
    assert results["baseline"] == "ar" and len(results["config"]["prompts"]) == 4
    for method, row in rows.items():
        assert row["num_images"] == 4 and row["num_new_tokens"] == 4 * 9
        assert row["fid"] > 0 and row["fid_se"] > 0 and 0 <= row["clip_score"] and row["clip_score_se"] > 0
        assert row["seconds_per_image_se"] > 0 and row["latency_b1"] > 0  # 2 batches; 1 image at batch 1
        assert row["speedup"] == pytest.approx(rows["ar"]["seconds"] / row["seconds"])
    sjd = rows["sjd"]
    low, high = sjd["fid_delta_ci"]
    assert sjd["fid_delta"] == pytest.approx(sjd["fid"] - rows["ar"]["fid"]) and low < sjd["fid_delta"] < high
    assert sjd["clip_score_delta"] == pytest.approx(sjd["clip_score"] - rows["ar"]["clip_score"])
    assert "fid_delta" not in rows["ar"] and "clip_score_delta" not in rows["ar"]
    table = (out / "results.md").read_text()
    assert re.search(r"\| sjd \| 4 \| .*\| [\d.]+ ± [\d.]+ \| [+-][\d.]+ \[[+-][\d.]+, [+-][\d.]+\] \|", table)
    assert "FID - ar" in table and "CLIP - ar" in table and table in capsys.readouterr().out
    for method in ("ar", "sjd"):
        pngs = sorted((out / "images" / method).glob("*.png"))
        assert [p.name for p in pngs] == [f"{i:05d}.png" for i in range(4)]
        text = _png_text(pngs[3])
        assert text == {"prompt": results["config"]["prompts"][3], "seed": "2", "method": method, "index": "3"}
    for name in ("plot.png", "results.csv", "manifest.json"):
        assert (out / name).stat().st_size > 0
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert {"fid", "fid_se", "fid_delta_ci", "clip_score_delta_se", "latency_b1"} <= set(header)


def test_a_killed_run_resumes_from_its_saved_batches(assets, emu3, tmp_path, monkeypatch):
    """Killed after 3 of 4 batches, ``--resume`` generates only the missing one, and its table's quality numbers
    equal an uninterrupted run's (each batch is seeded from its first image, so a batch's images do not
    depend on which ran before it)."""
    import hf_sjd.bench as bench

    flags = ["--model", emu3, "--image-size", 16, "--methods", "ar,sjd", "--prompts", "a cat,a red apple",
             "--num-images", 4, "--batch-size", 2, "--top-k", 8, "--bootstrap", 3,
             *_metric_flags(assets, tmp_path / "cache")]
    whole = _bench(*flags, out=tmp_path / "whole")["methods"]
    real, done = bench._run_item, []

    def killed_after_three(*args):
        if len(done) == 3:
            raise KeyboardInterrupt
        real(*args)
        done.append(args[1:])

    monkeypatch.setattr(bench, "_run_item", killed_after_three)
    out = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        _bench(*flags, out=out)
    assert len(list((out / "records").rglob("*.pt"))) == 3 and not (out / "results.json").exists()
    with pytest.raises(SystemExit):  # without --resume the folder is refused, not replaced
        _bench(*flags, out=out)
    done.clear()
    monkeypatch.setattr(bench, "_run_item", lambda *args: (real(*args), done.append(args[1:])))
    resumed = _bench(*flags, "--resume", out=out)["methods"]
    assert done == [("sjd", 2, 2, False)]
    for method in ("ar", "sjd"):
        for key in ("num_forward_passes", "fid", "fid_se", "clip_score", "clip_score_se", "acceptance_rate"):
            assert resumed[method].get(key) == whole[method].get(key), (method, key)
    with pytest.raises(SystemExit):  # a resumed run must be the same run
        _bench(*flags, "--resume", "--top-k", 4, out=out)
    monkeypatch.chdir(Path(emu3).parent)  # the same checkpoint spelled another way is the same run: nothing to do
    done.clear()
    _bench(*[f"./{Path(emu3).name}" if flag is emu3 else flag for flag in flags], "--resume", out=out)
    assert done == []
    manifest = json.loads((out / "manifest.json").read_text())  # written before paths were recorded resolved
    (out / "manifest.json").write_text(json.dumps({**manifest, "model": f"./{Path(emu3).name}"}))
    _bench(*flags, "--resume", out=out)
    assert done == []


@pytest.mark.parametrize("family", ["janus", "lumina-mgpt"])
def test_janus_and_lumina_tables_with_fid_and_clip(assets, tmp_path, capsys, family):
    """Janus and Lumina-mGPT (no ar in transformers: the baseline is the first method; images need its VQGAN
    decoder, here a random one in the taming layout; its tokenizer comes from elsewhere, --processor)."""
    from hf_sjd.adapters.chameleon_vqgan import VQGANDecoder

    flags = ["--prompts", "a cat,a red apple", "--num-images", 3, "--batch-size", 3, "--top-k", 4, "--bootstrap", 3,
             *_metric_flags(assets, tmp_path / "cache")]
    if family == "janus":
        flags += ["--model", save_janus(tmp_path), "--methods", "ar,sjd"]
    else:
        from transformers import ChameleonConfig

        model = save_chameleon(tmp_path / "bare", tokenizer=False)  # as Lumina-mGPT's: its tokenizer is Chameleon's
        decoder = VQGANDecoder(ChameleonConfig.from_pretrained(model).vq_config)
        torch.save({"state_dict": decoder.state_dict()}, tmp_path / "vqgan.ckpt")
        flags += ["--model", model, "--processor", save_chameleon(tmp_path), "--methods", "sjd,mc-sjd",
                  "--vq-decoder", tmp_path / "vqgan.ckpt"]
        with pytest.raises(SystemExit):  # FID and CLIP need images: refused before any is generated
            _bench(*flags[:-2], out=tmp_path / "out")
        assert "--vq-decoder: FID and CLIP score need images" in capsys.readouterr().err
    results = _bench(*flags, out=tmp_path / "out")
    baseline = "ar" if family == "janus" else "sjd"
    assert results["baseline"] == baseline and results["config"]["model_family"] == family
    other = results["methods"]["sjd" if family == "janus" else "mc-sjd"]
    assert other["fid"] > 0 and other["clip_score"] >= 0 and other["fid_delta_se"] > 0
    assert other["clip_score_delta_ci"][0] <= other["clip_score_delta"] <= other["clip_score_delta_ci"][1]
    assert len(list((tmp_path / "out" / "images" / baseline).glob("*.png"))) == 3


def test_two_accelerate_processes_match_one(assets, emu3, tmp_path):
    """Batches are seeded from their first image, so sharding them over 2 processes changes no count or image
    feature, and the CLIP score only by float32 round-off (timings aside): the same pixels through the same CLIP can
    differ in the last bits from one process to another on some CPUs, and 100 x cos of a near-orthogonal pair (this
    random CLIP's) keeps that as a relative change near 1e-6."""
    flags = ["--model", emu3, "--image-size", 16, "--methods", "ar,sjd", "--prompts", "a cat,a red apple",
             "--num-images", 4, "--batch-size", 1, "--top-k", 8, "--bootstrap", 0, "--device", "cpu",
             *_metric_flags(assets, tmp_path / "cache")]
    single = _bench(*flags, out=tmp_path / "single")["methods"]
    with socket.socket() as probe:  # a free port: other test runs may share this machine
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(port), "-m", "hf_sjd.cli", "bench", *map(str, flags), "--quiet", "--out", str(tmp_path / "two")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    sharded = json.loads((tmp_path / "two" / "results.json").read_text())
    assert sharded["environment"]["processes"] == 2
    for method in ("ar", "sjd"):
        for key in ("num_forward_passes", "num_new_tokens", "tokens_per_forward", "fid"):
            assert sharded["methods"][method][key] == single[method][key], (method, key)
        # |cos| error of a float32 dot product over CLIP's embeddings: well under 1e-6, so 1e-4 on the 0-100 scale
        assert sharded["methods"][method]["clip_score"] == pytest.approx(single[method]["clip_score"], rel=0,
                                                                            abs=1e-4), method


# -- bad input: refused before any image -------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
@pytest.mark.parametrize("args, message", [
    (["--prompts", "coco2014-val[:5]"], r"--prompts 'coco2014-val\[:5\]': unknown prompt set 'coco2014-val'"),
    (["--prompts", "{a}/none.txt"], r"--prompts .*no file"),
    (["--fid-reference", "{a}/missing"], r"--fid-reference '.*missing': no folder"),
    (["--fid-reference", "{a}/empty"], r"--fid-reference '.*empty': no image in"),
    (["--fid-reference", "{a}/reference", "--fid-features", "{a}/not-features.pt"],
     r"--fid-features .*: a feature network maps uint8 \[N, 3, 299, 299\] to \[N, D\]; .* gave \(2, 3, 299, 299\)"),
    (["--fid-reference", "{a}/reference", "--fid-features", "{a}/weights.pt2"],
     r"is not a saved network \(torch.export.save"),
    (["--fid-reference", "{a}/reference", "--fid-features", "{a}/nothing.pt"],
     r"--fid-features .*: allowed values: inception, or the path of a saved"),
    (["--fid-reference", "{a}/reference", "--num-images", "1"], r"FID needs at least 2 images"),
    (["--fid-reference", "{a}/reference"], r"Inception weights are not on this machine .*download https://github"
                                           r".*weights-inception-2015-12-05-6726825d.pth into .*checkpoints"),
    (["--clip-model", "{a}/other"], r"--clip-model '.*other' is a 'gpt2' model, not CLIP"),
    (["--clip-model", "{a}/nowhere"], r"--clip-model .*nowhere.: no model config .*download it"),
    (["--resume", "--overwrite"], r"--resume continues the run in --out and --overwrite replaces it"),
    (["--vq-decoder", "{a}/none.ckpt"], r"--vq-decoder .*no such file"),
    (["--vq-decoder", "{a}/weights.pt2"], r"--vq-decoder applies to a --model checkpoint"),
    (["--processor", "{a}/clip"], r"--processor applies to a --model checkpoint"),
])
def test_bad_input_stops_before_any_image(assets, tmp_path, capsys, monkeypatch, args, message):
    import torch_fidelity.feature_extractor_inceptionv3 as inception
    from urllib.error import URLError

    import hf_sjd.bench as bench

    def offline(*_, **__):  # this machine is offline anyway; elsewhere the test must not download 90 MB
        raise URLError("offline")

    def no_images(*_, **__):
        raise AssertionError("an image was generated before the input was validated")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(inception, "load_state_dict_from_url", offline)
    monkeypatch.setattr(bench, "generate_images", no_images)
    argv = ["bench", *[a.format(a=assets["clip"].parent) for a in args], "--methods", "sjd"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv + ([] if "--num-images" in args else ["--num-images", "2"]) + ["--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
