#!/usr/bin/env python
"""Build an SJD-PV phrase library (arXiv:2603.06666): tokenize an image dataset with a model's VQ tokenizer,
run BPE over the code sequences, save the library atomically, optionally push it to the Hub.

    # MS-COCO 2017 train (the paper's corpus) through the shipped reference tokenizer
    python scripts/build_phrase_library.py --out coco-phrases --max-images 20000 --num-proc 2
    # the shipped reference library: 4000 of the reference AR model's training images
    python scripts/build_phrase_library.py --dataset reference --max-images 4000 \\
        --out hf_sjd/reference/weights/phrases
    # a local image folder or a `save_to_disk` dataset, pushed to the Hub
    python scripts/build_phrase_library.py --dataset ./images --merges 4000 --out lib --push-to-hub me/phrases

Datasets: ``--dataset`` is a Hub id (default ``detection-datasets/coco``: a script-free parquet copy of
MS-COCO 2017 with ``train``/``val`` splits and a decoded ``image`` column, the corpus the paper mines), a local
folder (a ``Dataset.save_to_disk`` folder, or anything ``datasets.load_dataset`` reads, e.g. an image folder),
or ``reference``: the reference AR model's training images regenerated from their seed
(``hf_sjd.reference.data.make_dataset(1400, seed=2)``, 22400 crops; ``--max-images`` takes a seeded subset).

Images are converted to RGB (grayscale expanded, alpha composited on white), resized and center-cropped to the
tokenizer's input size, and tokenized with ``Dataset.map(batched=True)``, which caches its result (a rerun
skips tokenization; with ``--num-proc`` > 1 an interrupted run reuses the finished shards).

``--row-length`` defaults to 0 = no row split: BPE words are whole raster sequences, as in the paper. On the
reference model (16x16 grid, 8000 merges, 4000 training images) splitting at rows (``--row-length 16``) gives
about the same library (8000 phrases, mean length 2.83 vs 2.84), but it matches fewer windows of the 1024
held-out images in raster order (67.3% vs 68.0% of positions start a phrase; mean longest match 2.22 vs 2.24
tokens): raster-order decoding drafts windows across row ends, and runs that wrap a row end (flat
backgrounds) are real statistics of the sequence the model predicts.
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import sys
import time
from pathlib import Path

import torch

DEFAULT_DATASET = "detection-datasets/coco"
REFERENCE_DATASET = "reference"
REFERENCE_IMAGES = {"num_per_class": 1400, "seed": 2}  # = scripts/train_reference_model.py's AR training set


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=DEFAULT_DATASET,
                        help=f"Hub dataset id, local folder, or '{REFERENCE_DATASET}' (default: %(default)s)")
    parser.add_argument("--split", default="train", help="dataset split (default: %(default)s)")
    parser.add_argument("--image-column", default="image", help="column holding the images (default: %(default)s)")
    parser.add_argument("--revision", default=None, help="dataset revision on the Hub (branch, tag or commit)")
    parser.add_argument("--model", default=None,
                        help="whose VQ tokenizer to use: a reference-model folder (with vq/), a VQTokenizer folder "
                             "or Hub id; default: the shipped reference model")
    parser.add_argument("--merges", type=int, default=8000, help="number of BPE merges M (default: %(default)s)")
    parser.add_argument("--row-length", type=int, default=0,
                        help="split sequences into rows of this many tokens (one BPE word per row); 0 = whole "
                             "sequences (default; see the docstring for the measurement)")
    parser.add_argument("--min-frequency", type=int, default=2, help="minimum pair count to merge (default: 2)")
    parser.add_argument("--num-proc", type=int, default=1, help="processes for tokenization (default: 1)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per tokenizer batch (default: 64)")
    parser.add_argument("--max-images", type=int, default=None, help="use a seeded random subset of this size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --max-images subset (default: 0)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("phrase_library"), help="output folder")
    parser.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="also push the library to this repo")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser.parse_args(argv)


def validate_args(args: argparse.Namespace) -> None:
    """Cheap checks, before any model or dataset is loaded."""
    for name, minimum in (("merges", 1), ("row_length", 0), ("min_frequency", 1), ("num_proc", 1),
                          ("batch_size", 1), ("max_images", 1), ("threads", 1)):
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {minimum}, got {value}")
    out = args.out.resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a folder")
    existing = out
    while not existing.exists():  # the folder is created later; its nearest existing parent must be writable
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {args.out} is not writable (no write permission on {existing})")


def load_vq(model: str | None):
    """Returns (VQTokenizer, model id for the metadata)."""
    from hf_sjd import reference
    from hf_sjd.reference.vq import VQTokenizer

    if model is None:
        return reference.load().vq, "hf_sjd/reference"
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "vq" / "config.json").is_file():
            return reference.load(path).vq, model
        if (path / "config.json").is_file():
            return VQTokenizer.from_pretrained(path), model
        raise ValueError(f"--model {model} is neither a reference-model folder (with vq/config.json) nor a "
                         "VQTokenizer folder (with config.json)")
    if model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ValueError(f"--model {model}: no such folder, and not a Hub repo id (owner/name)")
    return VQTokenizer.from_pretrained(model), model


def _reference_images(num_per_class: int, seed: int):
    from hf_sjd.reference.data import make_dataset, to_pil

    images, labels = make_dataset(num_per_class, seed=seed)
    for image, label in zip(to_pil(images), labels.tolist()):
        yield {"image": image, "label": label}


def load_images(args: argparse.Namespace):
    """The dataset split named by the arguments (checked: non-empty, has the image column)."""
    import datasets

    path = Path(args.dataset).expanduser()
    if args.dataset != REFERENCE_DATASET and not path.exists() and args.dataset.startswith((".", "/", "~")):
        raise ValueError(f"--dataset {args.dataset}: no such folder")
    try:
        if args.dataset == REFERENCE_DATASET:
            from hf_sjd.reference.data import CLASS_NAMES

            features = datasets.Features({"image": datasets.Image(),
                                          "label": datasets.ClassLabel(names=list(CLASS_NAMES))})
            dataset = datasets.Dataset.from_generator(_reference_images, features=features,
                                                      gen_kwargs=REFERENCE_IMAGES)
        elif path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
            dataset = datasets.load_from_disk(str(path))  # a Dataset/DatasetDict.save_to_disk folder
        else:  # a Hub id or a local folder of data files (image folder, parquet, ...)
            dataset = datasets.load_dataset(args.dataset, split=args.split, revision=args.revision)
    except Exception as error:  # name the argument whatever datasets raised (empty split, bad files, network)
        raise ValueError(f"cannot load --dataset {args.dataset} --split {args.split!r}: "
                         f"{type(error).__name__}: {error}") from error
    if isinstance(dataset, datasets.DatasetDict):
        if args.split not in dataset:
            raise ValueError(f"--split {args.split!r} not in {args.dataset}; available splits: {sorted(dataset)}")
        dataset = dataset[args.split]
    if args.image_column not in dataset.column_names:
        raise ValueError(f"--image-column {args.image_column!r} not in dataset {args.dataset}; available columns: "
                         f"{dataset.column_names}")
    if len(dataset) == 0:
        raise ValueError(f"dataset {args.dataset} split {args.split!r} is empty")
    if args.max_images is not None and args.max_images < len(dataset):
        dataset = dataset.shuffle(seed=args.seed).select(range(args.max_images))
    return dataset


def _to_rgb(item: dict, size: int, where: str):
    """Undecoded image (``{"bytes", "path"}``) -> ``size`` x ``size`` RGB PIL image."""
    from PIL import Image, ImageOps

    try:
        image = Image.open(io.BytesIO(item["bytes"])) if item.get("bytes") else Image.open(item["path"])
        image.load()
    except Exception as error:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ... for bad files
        raise ValueError(f"cannot read image {item.get('path') or ''} ({where}): {error}") from error
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image.convert("RGBA"))
    image = image.convert("RGB")
    # Resize the short side to `size` and center-crop, the usual AR-image preprocessing (LlamaGen, Emu3).
    return ImageOps.fit(image, (size, size), method=Image.Resampling.BICUBIC)


def _tokenize_batch(batch: dict, indices: list[int], vq, image_column: str, size: int) -> dict:
    import numpy as np

    images = [_to_rgb(item, size, f"row {index} of column {image_column!r}")
              for item, index in zip(batch[image_column], indices)]
    pixels = torch.from_numpy(np.stack([np.asarray(image) for image in images]))  # [B, H, W, 3] uint8
    pixels = pixels.permute(0, 3, 1, 2).float().div(127.5).sub(1.0)  # [B, 3, H, W] in [-1, 1]
    with torch.no_grad():
        codes = vq.encode(pixels).flatten(1)  # [B, grid*grid] raster order
    return {"codes": codes.tolist()}


def tokenize(dataset, vq, args: argparse.Namespace) -> torch.Tensor:
    """Images -> ``[N, grid*grid]`` codes via ``Dataset.map(batched=True)`` (cached by datasets)."""
    import datasets

    feature = dataset.features[args.image_column]
    if isinstance(feature, datasets.Image):
        dataset = dataset.cast_column(args.image_column, datasets.Image(decode=False))  # decode ourselves: clear errors
    elif isinstance(feature, datasets.Value) and feature.dtype == "string":
        dataset = dataset.cast_column(args.image_column, datasets.Image(decode=False))  # a column of file paths
    else:
        raise ValueError(f"--image-column {args.image_column!r} is not an image column (feature {feature})")
    tokenized = dataset.map(
        _tokenize_batch, batched=True, batch_size=args.batch_size, with_indices=True,
        num_proc=args.num_proc if args.num_proc > 1 else None, remove_columns=dataset.column_names,
        fn_kwargs={"vq": vq, "image_column": args.image_column, "size": vq.image_size},
        desc="tokenizing images")
    return tokenized.with_format("torch")["codes"]


def main(argv: list[str] | None = None):
    """Run the build; returns the ``PhraseLibrary``. Errors are raised (``ValueError`` for bad arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    validate_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.no_progress:
        import datasets

        datasets.disable_progress_bars()
    from hf_sjd import PhraseLibrary

    start = time.perf_counter()
    vq, model_id = load_vq(args.model)
    vq.eval()
    dataset = load_images(args)
    codes = tokenize(dataset, vq, args)  # [N, grid*grid]
    tokenize_seconds = time.perf_counter() - start
    grid = (vq.grid_size, vq.grid_size)
    source = {"dataset": args.dataset, "split": args.split, "revision": args.revision,
              "image_column": args.image_column, "num_images": len(codes), "max_images": args.max_images,
              "subset_seed": args.seed if args.max_images is not None else None, "model": model_id}
    if args.dataset == REFERENCE_DATASET:
        source["description"] = ("the reference AR model's training images: hf_sjd.reference.data.make_dataset("
                                 f"{REFERENCE_IMAGES['num_per_class']}, seed={REFERENCE_IMAGES['seed']}), "
                                 "quantised to 8-bit PNG")
    library = PhraseLibrary.from_token_sequences(
        codes, num_merges=args.merges, row_length=args.row_length or None, codebook_size=vq.codebook_size,
        fingerprint=vq.fingerprint(), source=source, grid=grid, min_frequency=args.min_frequency,
        show_progress=not args.no_progress,
        extra_metadata={"build": {"command": shlex.join(["python", "scripts/build_phrase_library.py", *argv]),
                                  "tokenize_seconds": round(tokenize_seconds, 1)}})
    args.out.mkdir(parents=True, exist_ok=True)
    library.save_pretrained(args.out)
    print(f"{library}\nsaved to {args.out} ({time.perf_counter() - start:.1f} s)")
    if args.push_to_hub:
        try:
            url = library.push_to_hub(args.push_to_hub)
        except Exception as error:
            raise RuntimeError(f"pushing to {args.push_to_hub} failed ({type(error).__name__}: {error}); the library "
                               f"saved at {args.out} is intact") from error
        print(f"pushed to {url}")
    return library


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        sys.exit(f"error: {error}")
