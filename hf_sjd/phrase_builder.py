"""Build an SJD-PV phrase library (arXiv:2603.06666) from a model's own image tokenizer: ``hf-sjd build-phrases``.

    # MS-COCO 2017 train (the paper's corpus) through Emu3's VQ, streamed: no full download
    hf-sjd build-phrases --model BAAI/Emu3-Gen-hf --dataset detection-datasets/coco --streaming \\
        --max-images 10000 --out emu3-coco-phrases --device cuda --dtype bfloat16
    # a local checkpoint folder (Janus, Chameleon / Lumina-mGPT, Emu3) over a folder of images
    hf-sjd build-phrases --model ./janus-pro-1b --dataset ./images --merges 4000 --out janus-phrases
    # the shipped reference library: 4000 of the reference AR model's training images
    hf-sjd build-phrases --dataset reference --max-images 4000 --out phrases
    # (python scripts/build_phrase_library.py takes the same arguments)

Pipeline (every check runs before the dataset is tokenized)::

    --model  -> config.json (model_type) -> family class .from_pretrained -> hf_sjd.enable -> adapter
             -> its image processor (AutoImageProcessor, or --image-processor; the reference model has none)
    --dataset -> images -> RGB (alpha on white), resized + center-cropped to --image-size x --image-size
             -> adapter.encode_images(images, image_processor) -> codes
    codes -> PhraseLibrary.from_token_sequences(fingerprint=adapter.tokenizer_fingerprint) -> --out

=============  ==========================  ==============================================================
name           shape                       meaning
=============  ==========================  ==============================================================
codes          [N, h*w] int64              VQ codes of N images in raster order; code ``c`` is model
                                           token ``adapter.draft_token_ids[c]`` (``PhraseVerifier``'s map)
codebook size  ``len(draft_token_ids)``    Emu3: visual tokens; Janus: VQ codes; Lumina-mGPT: image tokens
grid           (h, w)                      the code grid of one --image-size square (Emu3 8 px per code,
                                           Janus / Chameleon 16 px, the reference VQ 4 px)
=============  ==========================  ==============================================================

Families (``config.json`` ``model_type`` -> class): ``emu3`` -> ``Emu3ForConditionalGeneration``,
``janus`` -> ``JanusForConditionalGeneration``, ``chameleon`` (Chameleon, Lumina-mGPT) ->
``ChameleonForConditionalGeneration``, ``llama`` with ``image_token_range`` (LlamaGen-style, e.g. the
shipped reference model; a folder laid out as ``ar/`` + ``vq/``) -> ``LlamaForCausalLM``. Anything else
(a text-only model, a folder without ``config.json``, a checkpoint without its image processor) is refused
with exit status 2 before any image is read: a library from a wrongly loaded tokenizer is worse than none.

``--image-size`` defaults to the size the model generates at: Emu3 720 px (``Emu3Processor``'s default
area, 90 x 90 codes), Janus its VQ grid (384 px for Janus-Pro), Chameleon the processor's crop size (512;
Lumina-mGPT-768 generates 768 px: pass ``--image-size 768``), the reference VQ 64 px.

Datasets: ``--dataset`` is a Hub id (default ``detection-datasets/coco``: a script-free parquet copy of
MS-COCO 2017 with ``train``/``val`` splits and a decoded ``image`` column, the corpus the paper mines), a local
folder (a ``Dataset.save_to_disk`` folder, or anything ``datasets.load_dataset`` reads: a plain folder of
images or an ``imagefolder`` layout, parquet files, ...), or ``reference``: the reference AR model's
training images regenerated from their seed (``hf_sjd.reference.data.make_dataset(1400, seed=2)``, 22400
crops). ``--max-images N`` takes a seeded random subset; with ``--streaming`` the dataset is read as a
stream (``load_dataset(..., streaming=True)``: COCO-scale corpora without downloading the split) and
``--max-images`` takes the first N of the stream shuffled with ``IterableDataset.shuffle(seed,
buffer_size=--shuffle-buffer)``.

Without ``--streaming`` images are tokenized with ``Dataset.map(batched=True)``, which caches its result
(a rerun skips tokenization; with ``--num-proc`` > 1 an interrupted run reuses the finished shards).

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
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .files import looks_local

DEFAULT_DATASET = "detection-datasets/coco"
REFERENCE_DATASET = "reference"
REFERENCE_IMAGES = {"num_per_class": 1400, "seed": 2}  # = scripts/train_reference_model.py's AR training set
# config.json model_type -> the transformers class the family's adapter recognises.
FAMILY_CLASSES = {"emu3": "Emu3ForConditionalGeneration", "janus": "JanusForConditionalGeneration",
                  "chameleon": "ChameleonForConditionalGeneration", "llama": "LlamaForCausalLM"}
SUPPORTED_FAMILIES = ("Emu3 (model_type 'emu3', e.g. BAAI/Emu3-Gen-hf), Janus / Janus-Pro ('janus'), "
                      "Chameleon / Lumina-mGPT ('chameleon'), LlamaGen-style LlamaForCausalLM with image_token_range "
                      "('llama', e.g. the shipped reference model: a folder with ar/ and vq/)")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The builder's flags (shared by ``hf-sjd build-phrases`` and ``scripts/build_phrase_library.py``)."""
    parser.add_argument("--model", default=None,
                        help="whose image tokenizer to use: a checkpoint folder or Hub id of a supported family, or a "
                             "reference-layout folder (ar/ + vq/); default: the shipped reference model")
    parser.add_argument("--model-revision", default=None, help="model revision on the Hub (branch, tag or commit)")
    parser.add_argument("--image-processor", default=None,
                        help="folder or Hub id of the image processor, for checkpoints that ship none (Lumina-mGPT: "
                             "facebook/chameleon-7b's); default: the --model's own preprocessor_config.json")
    parser.add_argument("--dataset", default=DEFAULT_DATASET,
                        help=f"Hub dataset id, local folder, or '{REFERENCE_DATASET}' (default: %(default)s)")
    parser.add_argument("--split", default="train", help="dataset split (default: %(default)s)")
    parser.add_argument("--image-column", default="image", help="column holding the images (default: %(default)s)")
    parser.add_argument("--revision", default=None, help="dataset revision on the Hub (branch, tag or commit)")
    parser.add_argument("--streaming", action="store_true",
                        help="read the dataset as a stream (no full download); --max-images takes the first N of "
                             "the shuffled stream")
    parser.add_argument("--shuffle-buffer", type=int, default=1000,
                        help="shuffle buffer of --streaming --max-images, in images (default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="square side in pixels images are resized and center-cropped to (default: the size the "
                             "model generates at; see above)")
    parser.add_argument("--merges", type=int, default=8000, help="number of BPE merges M (default: %(default)s)")
    parser.add_argument("--row-length", type=int, default=0,
                        help="split sequences into rows of this many tokens (one BPE word per row); 0 = whole "
                             "sequences (default; see above for the measurement)")
    parser.add_argument("--min-frequency", type=int, default=2, help="minimum pair count to merge (default: 2)")
    parser.add_argument("--num-proc", type=int, default=1, help="processes for tokenization, CPU only (default: 1)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per encoder batch (default: 64)")
    parser.add_argument("--max-images", type=int, default=None, help="use a seeded random subset of this size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --max-images subset (default: 0)")
    parser.add_argument("--device", default=None, help="torch device of the model (default: cuda if available)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                        help="dtype the model is loaded in (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("phrase_library"), help="output folder")
    parser.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="also push the library to this repo")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def build_parser(prog: str = "hf-sjd build-phrases") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def validate_args(args: argparse.Namespace) -> None:
    """Cheap checks, before any model or dataset is loaded."""
    from .checks import check_int

    for name, minimum in (("merges", 1), ("row_length", 0), ("min_frequency", 1), ("num_proc", 1),
                          ("batch_size", 1), ("shuffle_buffer", 1), ("max_images", 1), ("threads", 1),
                          ("image_size", 1)):
        value = getattr(args, name)
        if value is not None:  # None: an optional flag left unset
            check_int(f"--{name.replace('_', '-')}", value, minimum)
    if args.device is not None:
        try:
            torch.device(args.device)
        except RuntimeError as error:
            raise ValueError(f"--device {args.device!r} is not a torch device ({error})") from None
    if args.num_proc > 1 and _device(args).type != "cpu":
        raise ValueError(f"--num-proc {args.num_proc} runs the encoder in CPU worker processes; pass --device cpu "
                         f"or --num-proc 1")
    if args.num_proc > 1 and args.streaming:
        raise ValueError("--num-proc > 1 needs a map-style dataset; a --streaming dataset is read by one process")
    out = args.out.resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a folder")
    existing = out
    while not existing.exists():  # the folder is created later; its nearest existing parent must be writable
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {args.out} is not writable (no write permission on {existing})")


def _device(args: argparse.Namespace) -> torch.device:
    if args.device is not None:
        return torch.device(args.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# -- the model -------------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """A ``--model`` resolved from its config alone (no weights loaded yet)."""

    name: str  # what the user passed (or "hf_sjd/reference"), recorded in the library's metadata
    location: str  # folder or Hub id of the model's config.json and weights
    model_type: str
    config: object  # transformers PretrainedConfig
    revision: str | None = None
    local_files_only: bool = False  # the Hub could not be reached: read its cache only


def _model_error(model: str | None, reason: str) -> ValueError:
    return ValueError(f"--model {model}: {reason}. Supported families: {SUPPORTED_FAMILIES}")


def inspect_checkpoint(model: str | None, revision: str | None = None) -> Checkpoint:
    """Resolve ``--model`` to its config and family; a folder that is not a supported checkpoint raises."""
    from transformers import AutoConfig

    from . import reference

    if model is None:
        name, location = "hf_sjd/reference", str(reference.weights_dir() / "ar")
    else:
        name, path = model, Path(model).expanduser()
        if path.is_dir():
            if (path / "ar" / "config.json").is_file():  # the reference layout: <root>/ar + <root>/vq
                location = str(path / "ar")
            elif (path / "config.json").is_file():
                location = str(path)
            else:
                raise _model_error(model, "is not a checkpoint folder (no config.json, and no ar/config.json of "
                                          "the reference layout)")
        elif looks_local(model) or model.count("/") != 1:
            raise _model_error(model, "no such folder, and not a Hub repo id (owner/name)")
        else:
            location = model
    offline = False
    if location == model and not Path(model).expanduser().is_dir():  # a Hub id: fail in seconds if unreachable
        from .hub import unreachable

        reason = unreachable(model, "config.json", revision=revision)
        offline = reason is not None  # then only the Hub cache can serve it
        if offline and not _cached(model, revision):
            raise _model_error(model, f"{reason}, and it is not in the Hub cache: check the connection (and "
                                      "HF_ENDPOINT), or pass a local checkpoint folder")
    try:
        config = AutoConfig.from_pretrained(location, revision=revision, local_files_only=offline)
    except Exception as error:  # unrecognised model_type, missing file, offline Hub, malformed json, ...
        raise _model_error(model, f"cannot read a transformers config from {location} "
                                  f"({type(error).__name__}: {error})") from error
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILY_CLASSES:
        raise _model_error(model, f"model_type {model_type!r} has no image tokenizer hf_sjd can use")
    if model_type == "llama" and getattr(config, "image_token_range", None) is None:
        raise _model_error(model, "is a text-only LlamaForCausalLM (its config has no image_token_range, so it is not "
                                  "a LlamaGen-style image model)")
    return Checkpoint(name=name, location=location, model_type=model_type, config=config, revision=revision,
                      local_files_only=offline)


def _cached(repo_id: str, revision: str | None) -> bool:
    """Whether the Hub cache holds ``repo_id``'s config.json at ``revision``."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)


def load_image_processor(checkpoint: Checkpoint, source: str | None = None):
    """The checkpoint's own image processor, or the one at ``source`` (``--image-processor``); ``None`` for
    LlamaGen-style models (their VQ takes raw pixels)."""
    if checkpoint.model_type == "llama":
        if source is not None:
            raise ValueError(f"--image-processor {source}: LlamaGen-style models ({checkpoint.name}) take raw "
                             f"pixels through their VQ tokenizer; drop --image-processor")
        return None
    from transformers import AutoImageProcessor

    try:
        if source is not None:
            return AutoImageProcessor.from_pretrained(source)
        return AutoImageProcessor.from_pretrained(checkpoint.location, revision=checkpoint.revision,
                                                  local_files_only=checkpoint.local_files_only)
    except Exception as error:  # no preprocessor_config.json, offline, unknown processor class
        if source is not None:
            raise ValueError(f"--image-processor {source}: cannot load an image processor "
                             f"({type(error).__name__}: {error})") from error
        raise _model_error(checkpoint.name, f"has no usable image processor (preprocessor_config.json) at "
                                            f"{checkpoint.location} ({type(error).__name__}: {error}); save the "
                                            f"model's image processor next to it with save_pretrained, or pass "
                                            f"--image-processor") from error


def load_model(checkpoint: Checkpoint, dtype: torch.dtype, device: torch.device):
    """Load the family's class, enable it and return its adapter (which must have an image encoder)."""
    import transformers

    import hf_sjd
    from .adapters import ImageGenerationAdapter

    model_class = getattr(transformers, FAMILY_CLASSES[checkpoint.model_type])
    try:
        model = model_class.from_pretrained(checkpoint.location, revision=checkpoint.revision, dtype=dtype,
                                            local_files_only=checkpoint.local_files_only)
    except Exception as error:  # missing or mismatched weights, offline Hub
        raise _model_error(checkpoint.name, f"cannot load {model_class.__name__} from {checkpoint.location} "
                                            f"({type(error).__name__}: {error})") from error
    adapter = hf_sjd.enable(model.to(device).eval()).sjd_adapter
    if type(adapter).encode_images is ImageGenerationAdapter.encode_images:
        raise _model_error(checkpoint.name, f"its adapter ({adapter.family!r}) has no image encoder")
    return adapter


# -- the images ------------------------------------------------------------------------------------------
def _reference_images(num_per_class: int, seed: int):
    from .reference.data import make_dataset, to_pil

    images, labels = make_dataset(num_per_class, seed=seed)
    for image, label in zip(to_pil(images), labels.tolist()):
        yield {"image": image, "label": label}


def load_images(args: argparse.Namespace):
    """The dataset split named by the arguments (checked: has the image column; non-empty unless streamed).

    Returns a ``Dataset``, or an ``IterableDataset`` with ``--streaming``; ``--max-images`` applied."""
    import datasets

    path = Path(args.dataset).expanduser()
    if args.dataset != REFERENCE_DATASET and not path.exists() and looks_local(args.dataset):
        raise ValueError(f"--dataset {args.dataset}: no such folder")
    try:
        if args.dataset == REFERENCE_DATASET:
            from .reference.data import CLASS_NAMES

            features = datasets.Features({"image": datasets.Image(),
                                          "label": datasets.ClassLabel(names=list(CLASS_NAMES))})
            dataset = datasets.Dataset.from_generator(_reference_images, features=features,
                                                      gen_kwargs=REFERENCE_IMAGES)
        elif path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
            dataset = datasets.load_from_disk(str(path))  # a Dataset/DatasetDict.save_to_disk folder
        else:  # a Hub id or a local folder of data files (image folder, parquet, ...)
            dataset = datasets.load_dataset(args.dataset, split=args.split, revision=args.revision,
                                            streaming=args.streaming)
    except Exception as error:  # name the argument whatever datasets raised (empty split, bad files, network)
        raise ValueError(f"cannot load --dataset {args.dataset} --split {args.split!r}: "
                         f"{type(error).__name__}: {error}") from error
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if args.split not in dataset:
            raise ValueError(f"--split {args.split!r} not in {args.dataset}; available splits: {sorted(dataset)}")
        dataset = dataset[args.split]
    columns = dataset.column_names
    if columns is not None and args.image_column not in columns:
        raise ValueError(f"--image-column {args.image_column!r} not in dataset {args.dataset}; available columns: "
                         f"{columns}")
    if isinstance(dataset, datasets.Dataset):
        if len(dataset) == 0:
            raise ValueError(f"dataset {args.dataset} split {args.split!r} is empty")
        if args.streaming:  # a save_to_disk folder or the reference images, read as a stream too
            dataset = dataset.to_iterable_dataset()
        elif args.max_images is not None and args.max_images < len(dataset):
            return dataset.shuffle(seed=args.seed).select(range(args.max_images))
    if args.streaming and args.max_images is not None:
        dataset = dataset.shuffle(seed=args.seed, buffer_size=args.shuffle_buffer).take(args.max_images)
    return dataset


def _to_rgb(item, size: int, where: str):
    """An image (undecoded ``{"bytes", "path"}``, a path, or a ``PIL.Image``) -> ``size`` x ``size`` RGB image."""
    from PIL import Image, ImageOps

    try:
        if isinstance(item, Image.Image):
            image = item
        elif isinstance(item, str):
            image = Image.open(item)
        else:
            image = Image.open(io.BytesIO(item["bytes"])) if item.get("bytes") else Image.open(item["path"])
        image.load()
    except Exception as error:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ... for bad files
        name = item.get("path") if isinstance(item, dict) else item if isinstance(item, str) else ""
        raise ValueError(f"cannot read image {name or ''} ({where}): {error}") from error
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image.convert("RGBA"))
    image = image.convert("RGB")
    # Resize the short side to `size` and center-crop, the usual AR-image preprocessing (LlamaGen, Emu3).
    return ImageOps.fit(image, (size, size), method=Image.Resampling.BICUBIC)


@dataclass
class ImageEncoder:
    """What one ``Dataset.map`` batch needs: the adapter, its image processor, the square size.

    In a ``--num-proc`` worker (a fork of the builder) torch runs on one thread: a forked child that uses
    the intra-op thread pool it inherited hangs, and ``num_proc`` processes already use the cores."""

    adapter: object
    image_processor: object
    size: int
    parent_pid: int = field(default_factory=os.getpid)

    def __call__(self, batch: dict, indices: list[int], image_column: str) -> dict:
        if os.getpid() != self.parent_pid and torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        images = [_to_rgb(item, self.size, f"row {index} of column {image_column!r}")
                  for item, index in zip(batch[image_column], indices)]
        codes = self.adapter.encode_images(images, self.image_processor)  # [B, h*w]
        return {"codes": codes.cpu().tolist()}


def _cache_fingerprint(dataset, encoder: ImageEncoder, checkpoint: Checkpoint, dtype: str) -> str:
    """``Dataset.map``'s cache key. datasets would otherwise hash the encoder by pickling it, i.e. the whole
    model; the model is named by its location, revision, codebook fingerprint and dtype instead."""
    from datasets.fingerprint import Hasher

    from . import __version__

    processor = encoder.image_processor.to_json_string() if encoder.image_processor is not None else None
    location = os.path.abspath(checkpoint.location) if os.path.isdir(checkpoint.location) else checkpoint.location
    return Hasher.hash(("hf_sjd.phrase_builder", __version__, dataset._fingerprint, location, checkpoint.revision,
                        getattr(checkpoint.config, "_commit_hash", None), encoder.adapter.tokenizer_fingerprint,
                        dtype, encoder.size, processor))


def tokenize(dataset, encoder: ImageEncoder, args: argparse.Namespace, checkpoint: Checkpoint) -> np.ndarray:
    """Images -> codes ``[N, h*w]`` (``Dataset.map(batched=True)``: cached unless streamed). Arrays, not
    lists: 10k Emu3 images are 81M codes (650 MB as int64, several GB as Python ints)."""
    import datasets
    from tqdm.auto import tqdm

    features = dataset.features
    if features is not None:
        feature = features[args.image_column]
        is_paths = isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
        if not (isinstance(feature, datasets.Image) or is_paths):
            raise ValueError(f"--image-column {args.image_column!r} is not an image column (feature {feature})")
        # decode ourselves: clear errors naming the file, and no decoded copy in the cache
        dataset = dataset.cast_column(args.image_column, datasets.Image(decode=False))
    dataset = dataset.select_columns([args.image_column])
    kwargs = {"batched": True, "batch_size": args.batch_size, "with_indices": True,
              "remove_columns": [args.image_column],
              "fn_kwargs": {"image_column": args.image_column}}
    if isinstance(dataset, datasets.IterableDataset):
        stream = dataset.map(encoder, **kwargs)
        codes = [np.asarray(row["codes"], dtype=np.int64)
                 for row in tqdm(stream, total=args.max_images, desc="tokenizing images", unit="image",
                                 disable=args.no_progress)]
        if not codes:
            raise ValueError(f"dataset {args.dataset} split {args.split!r} streamed no images")
        return np.stack(codes)
    tokenized = dataset.map(encoder, num_proc=args.num_proc if args.num_proc > 1 else None,
                            new_fingerprint=_cache_fingerprint(dataset, encoder, checkpoint, args.dtype),
                            desc="tokenizing images", **kwargs)
    return np.asarray(tokenized.with_format("numpy")["codes"], dtype=np.int64)


# -- the build -------------------------------------------------------------------------------------------
def build(args: argparse.Namespace, command: str):
    """Run the build for parsed ``args``; returns the saved ``PhraseLibrary``.

    Raises ``ValueError`` for bad input (before any image is tokenized) and ``RuntimeError`` when only
    ``--push-to-hub`` failed (the local library is then saved and intact)."""
    validate_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.no_progress:
        import datasets

        datasets.disable_progress_bars()
    from .phrases import PhraseLibrary

    start = time.perf_counter()
    checkpoint = inspect_checkpoint(args.model, args.model_revision)  # config only: cheap, fails first
    image_processor = load_image_processor(checkpoint, args.image_processor)
    dataset = load_images(args)
    adapter = load_model(checkpoint, DTYPES[args.dtype], _device(args))
    try:
        size = args.image_size or adapter.encoder_image_size(image_processor)
    except ValueError as error:  # e.g. a LlamaGen checkpoint without its VQ tokenizer
        raise _model_error(checkpoint.name, str(error)) from error
    encoder = ImageEncoder(adapter, image_processor, int(size))
    _probe(encoder)
    codes = tokenize(dataset, encoder, args, checkpoint)  # [N, h*w]
    tokenize_seconds = time.perf_counter() - start
    length = codes.shape[1]
    side = math.isqrt(length)
    source = {"dataset": args.dataset, "split": args.split, "revision": args.revision,
              "image_column": args.image_column, "num_images": len(codes), "max_images": args.max_images,
              "subset_seed": args.seed if args.max_images is not None else None, "streaming": args.streaming,
              "shuffle_buffer": args.shuffle_buffer if args.streaming and args.max_images is not None else None,
              "model": checkpoint.name, "model_revision": args.model_revision, "family": adapter.family,
              "image_size": int(size)}
    if args.dataset == REFERENCE_DATASET:
        source["description"] = ("the reference AR model's training images: hf_sjd.reference.data.make_dataset("
                                 f"{REFERENCE_IMAGES['num_per_class']}, seed={REFERENCE_IMAGES['seed']}), "
                                 "quantised to 8-bit PNG")
    library = PhraseLibrary.from_token_sequences(
        codes, num_merges=args.merges, row_length=args.row_length or None,
        codebook_size=adapter.draft_token_ids.numel(), fingerprint=adapter.tokenizer_fingerprint, source=source,
        grid=(side, side) if side * side == length else None, min_frequency=args.min_frequency,
        show_progress=not args.no_progress,
        extra_metadata={"build": {"command": command, "tokenize_seconds": round(tokenize_seconds, 1)}})
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


def _probe(encoder: ImageEncoder) -> None:
    """Encode one blank image before the dataset, so a size / processor mismatch fails now, not after a long map."""
    from PIL import Image

    encoder({"image": [Image.new("RGB", (encoder.size, encoder.size), (127, 127, 127))]}, [0], "image")


def build_library(argv: list[str], prog: str = "hf-sjd build-phrases"):
    """The build from a command line (without the program name); returns the ``PhraseLibrary``, raises on errors."""
    args = build_parser(prog).parse_args(argv)
    return build(args, shlex.join([*shlex.split(prog), *argv]))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    """Exit status of a build: 0, 2 for bad input (usage + message), 1 when only the push failed."""
    try:
        build(args, command)
    except (ValueError, TypeError, FileNotFoundError) as error:
        parser.error(str(error))  # exits with status 2
    except RuntimeError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None, prog: str = "hf-sjd build-phrases") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    return run(parser, parser.parse_args(argv), shlex.join([*shlex.split(prog), *argv]))


if __name__ == "__main__":
    sys.exit(main())
