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

    --model   -> config.json model_type -> family class (FAMILY_CLASSES) -> hf_sjd.enable -> adapter
              -> its image processor (or --image-processor; LlamaGen-style models take raw pixels)
    --dataset -> RGB (alpha on white), resized + center-cropped to --image-size (default: the size the model
              generates at; Lumina-mGPT-768: pass 768) -> adapter.encode_images -> codes [N, h*w]
    codes     -> PhraseLibrary.from_token_sequences(fingerprint=adapter.tokenizer_fingerprint) -> --out

A model of another family, or one loaded without its image tokenizer, exits 2 before any image is read.
``--dataset``: a Hub id (default: a parquet copy of MS-COCO 2017), a local folder (``save_to_disk``, or
anything ``datasets.load_dataset`` reads), or ``reference`` (the reference model's training images, from their
seed). ``--max-images N``: a seeded random subset (with ``--streaming``: the first N of the shuffled stream).
Tokenization goes through ``Dataset.map``, whose cache a rerun reuses. Bad input exits 2 before any work (the
``MAX_*`` constants here and in ``hf_sjd.phrases`` bound every size); Ctrl-C leaves ``--out`` as it was.
``--row-length`` 0 (default, the paper's): BPE words are whole raster sequences, since raster decoding drafts
windows across row ends.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import math
import os
import shlex
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import phrases
from .checks import check_float, check_int
from .files import check_not_special, check_parent_writable, looks_local

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

# Upper bounds, checked before any work (the corpus and merge bounds are hf_sjd.phrases'):
MAX_IMAGE_SIZE = 4096  # 4 x the largest size a supported family generates at (1024 px)
MAX_PIXEL_BATCH_BYTES = 4 << 30  # one encoder batch as float32 [B, 3, size, size]
MAX_DECODED_PIXELS = 1 << 25  # one dataset image, decoded: an 8K frame; a small PNG can decode to GBs
MAX_SHUFFLE_BUFFER = 1 << 20  # images a stream holds in memory before it yields the first
MAX_HUB_TIMEOUT = 24 * 3600.0
# What the image preprocessing does, in Dataset.map's cache key: a change must not reuse older codes.
PREPROCESSING = "jpeg-draft-2x, reduce-2x, 16-bit-by-257, rgb-on-white, fit-bicubic"
_INTERRUPTED = threading.Event()  # SIGINT came during this build (see _interrupts_stay_interrupts)
_BUILDING = threading.Event()  # a build runs in this process: processes it forks ignore SIGINT


def _cpu_count() -> int:
    """CPUs this process may run on: the bound of --num-proc and --threads."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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
                             "sequences (default)")
    parser.add_argument("--min-frequency", type=int, default=2, help="minimum pair count to merge (default: 2)")
    parser.add_argument("--num-proc", type=int, default=1, help="processes for tokenization, CPU only (default: 1)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per encoder batch (default: 64)")
    parser.add_argument("--max-images", type=int, default=None, help="use a seeded random subset of this size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --max-images subset (default: 0)")
    parser.add_argument("--device", default=None, help="torch device of the model (default: cuda if available)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                        help="dtype the model is loaded in (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("phrase_library"), help="output folder (default: %(default)s)")
    parser.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="also push the library to this repo")
    parser.add_argument("--hub-timeout", type=float, default=None, metavar="SECONDS",
                        help="seconds each --push-to-hub request may wait to connect or for the Hub's next byte "
                             f"(default: {phrases.PUSH_TIMEOUT:g}, PhraseLibrary.push_to_hub's)")
    parser.add_argument("--no-progress", "--quiet", action="store_true", dest="no_progress",
                        help="hide progress bars (--quiet, as the other commands call it)")


def build_parser(prog: str = "hf-sjd build-phrases") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def validate_args(args: argparse.Namespace) -> None:
    """Cheap checks, before any model or dataset is loaded."""
    cpus, max_tokens = _cpu_count(), phrases.MAX_CORPUS_TOKENS
    for name, minimum, maximum in (
            ("merges", 1, phrases.MAX_NUM_MERGES), ("row_length", 0, max_tokens),
            ("min_frequency", 1, max_tokens), ("num_proc", 1, cpus), ("threads", 1, cpus),
            ("batch_size", 1, max_tokens), ("shuffle_buffer", 1, MAX_SHUFFLE_BUFFER),
            ("max_images", 1, max_tokens),  # every image is at least one code of the corpus
            ("image_size", 1, MAX_IMAGE_SIZE), ("seed", 0, 2**64 - 1)):
        value = getattr(args, name)
        if value is not None:  # None: an optional flag left unset
            check_int(f"--{name.replace('_', '-')}", value, minimum, maximum)
    if args.hub_timeout is not None:
        check_float("--hub-timeout", args.hub_timeout, 0.0, MAX_HUB_TIMEOUT, low_open=True)
    if args.image_size is not None:
        _check_pixel_batch(args.image_size, args.batch_size, "--image-size")
    if args.device is not None:
        try:
            device = torch.device(args.device)
        except RuntimeError as error:
            raise ValueError(f"--device {args.device!r} is not a torch device ({error})") from None
        if device.type == "meta":
            raise ValueError("--device meta holds no weights, so it encodes no image; pass cpu or an accelerator")
        _check_device_present(device, args.device)
    if args.dataset == REFERENCE_DATASET and args.split != "train":
        raise ValueError(f"--split {args.split}: --dataset {REFERENCE_DATASET} is one split, the reference model's "
                         "training images ('train')")
    if args.push_to_hub is not None:  # else found by the push, after the whole build
        from huggingface_hub import get_token
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(args.push_to_hub)
        except HFValidationError as error:
            raise ValueError(f"--push-to-hub {args.push_to_hub!r} is not a Hub repo id: {error}") from None
        if get_token() is None:
            raise ValueError(f"--push-to-hub {args.push_to_hub} needs a Hugging Face token with write access: run "
                             "`hf auth login` or set HF_TOKEN")
    if args.num_proc > 1 and _device(args).type != "cpu":
        raise ValueError(f"--num-proc {args.num_proc} runs the encoder in CPU worker processes; pass --device cpu "
                         f"or --num-proc 1")
    if args.num_proc > 1 and args.streaming:
        raise ValueError("--num-proc > 1 needs a map-style dataset; a --streaming dataset is read by one process")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a folder")
    check_not_special(args.out, "--out")
    check_parent_writable(args.out, "--out")
    phrases.check_no_foreign_files(args.out, "--out")  # save_pretrained checks too, but only at the end of the build


def _check_device_present(device: torch.device, flag_value: str) -> None:
    """``ValueError`` naming --device when this machine has no such accelerator (torch says so only later)."""
    if device.type == "cpu":
        return
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.xpu, torch.mps, ...
    available = getattr(backend, "is_available", None)
    count = getattr(backend, "device_count", None)
    if device.type == "mps":
        available, count = torch.backends.mps.is_available, lambda: 1
    if available is None:
        return  # a device type torch does not describe here: left to torch
    if not available():
        raise ValueError(f"--device {flag_value}: this machine has no {device.type} device torch can use; pass "
                         f"--device cpu or leave --device out")
    if device.index is not None and count is not None and device.index >= count():
        raise ValueError(f"--device {flag_value}: this machine has {count()} {device.type} device(s), "
                         f"{device.type}:0 to {device.type}:{count() - 1}")


def _check_pixel_batch(size: int, batch_size: int, size_from: str) -> None:
    """``ValueError`` naming --batch-size when one encoder batch of ``size`` px images exceeds the bound."""
    per_image = 3 * size * size * 4  # float32 [3, size, size]
    if batch_size * per_image > MAX_PIXEL_BATCH_BYTES:
        raise ValueError(f"--batch-size {batch_size} of {size} px images ({size_from}) is {batch_size * per_image} "
                         f"bytes of float32 pixels per encoder batch; at most {MAX_PIXEL_BATCH_BYTES}: pass "
                         f"--batch-size <= {max(1, MAX_PIXEL_BATCH_BYTES // per_image)}")


def _device(args: argparse.Namespace) -> torch.device:
    if args.device is not None:
        return torch.device(args.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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

    offline = False
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
        else:  # a Hub id: fail in seconds if unreachable
            from huggingface_hub import try_to_load_from_cache

            from .hub import head

            location = model
            _, reason = head(model, "config.json", revision=revision)
            offline = reason is not None  # then only the Hub cache can serve it
            if offline and not isinstance(try_to_load_from_cache(model, "config.json", revision=revision), str):
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
    if args.dataset == REFERENCE_DATASET:
        if importlib.util.find_spec("skimage") is None:  # (else a generator error)
            raise ValueError(f"--dataset {REFERENCE_DATASET} draws the reference model's training images from "
                             "scikit-image's photos: pip install scikit-image (or hf_sjd[bench])")
    elif not path.exists():
        if looks_local(args.dataset):
            raise ValueError(f"--dataset {args.dataset}: no such folder")
    elif not path.is_dir():  # (datasets reads no single file)
        raise ValueError(f"--dataset {args.dataset} is a file; pass a folder (of images, data files or a "
                         f"save_to_disk dataset) or a Hub dataset id")
    elif args.revision is not None:
        raise ValueError(f"--revision {args.revision}: --dataset {args.dataset} is a local folder; --revision "
                         "picks a Hub dataset's branch, tag or commit")
    elif (path / "state.json").is_file() and args.split != "train":
        raise ValueError(f"--split {args.split}: --dataset {args.dataset} holds one split (a Dataset.save_to_disk "
                         "folder); drop --split, or save a DatasetDict")
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
    """An image (undecoded ``{"bytes", "path"}``, a path, or a ``PIL.Image``) -> ``size`` x ``size`` RGB image.

    Memory follows the output: a JPEG decodes at reduced scale (``Image.draft``, as ``Image.thumbnail``), other
    formats are box-reduced to twice the output before any copy, and an image over ``MAX_DECODED_PIXELS`` is
    refused from its header."""
    from PIL import Image, ImageOps

    name = item.get("path") if isinstance(item, dict) else item if isinstance(item, str) else None
    label = f"{name} ({where})" if name else f"({where})"
    try:
        with warnings.catch_warnings():  # PIL's decompression-bomb warning: the bound below is tighter
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            if isinstance(item, Image.Image):
                image = item
            elif isinstance(item, str):
                image = Image.open(item)
            else:
                image = Image.open(io.BytesIO(item["bytes"])) if item.get("bytes") else Image.open(item["path"])
            image.draft(None, (2 * size, 2 * size))  # JPEG only (a no-op elsewhere), before anything is decoded
            width, height = image.size
            if width * height > MAX_DECODED_PIXELS:
                raise _TooLarge(f"image {label} is {width} x {height} = {width * height} pixels decoded; "
                                f"build-phrases decodes at most {MAX_DECODED_PIXELS} pixels per image (every "
                                f"image becomes {size} x {size}): downscale it, or leave it out of the dataset")
            image.load()
            if image is not item:  # a file this function opened: upright, as datasets and transformers decode it
                ImageOps.exif_transpose(image, in_place=True)
    except _TooLarge as error:
        raise ValueError(str(error)) from None
    except Exception as error:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ... for bad files
        raise ValueError(f"cannot read image {label}: {error}") from error
    factor = min(image.size) // (2 * size)
    if factor >= 2 and image.mode in _REDUCIBLE_MODES:
        image = image.reduce(factor)
    if image.mode.startswith("I"):  # integer grey: convert("RGB") clips at 255, so 16-bit values (up to 65535)
        sixteen_bit = image.mode.startswith("I;16")  # are scaled to 8 bits first: a 16-bit file always (a dark
        image = image.convert("I") if image.mode != "I" else image  # one is not 8-bit), 32-bit by its values
        if sixteen_bit or image.getextrema()[1] > 255:
            image = image.point(lambda value: value * (1 / 257), "L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        image = Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image.convert("RGBA"))
    if image.mode != "RGB":  # convert() copies even to the same mode
        image = image.convert("RGB")
    # Short side to `size`, center-crop (LlamaGen's, Emu3's preprocessing); fit resizes the crop box directly.
    return ImageOps.fit(image, (size, size), method=Image.Resampling.BICUBIC)


_REDUCIBLE_MODES = ("L", "LA", "RGB", "RGBA", "I", "F", "CMYK")  # what Image.reduce takes


class _TooLarge(Exception):
    """An image over MAX_DECODED_PIXELS (kept apart from the errors of unreadable files)."""


@dataclass
class ImageEncoder:
    """What one ``Dataset.map`` batch needs. In a ``--num-proc`` worker (a fork) torch runs on one thread: a
    forked child that uses the thread pool it inherited hangs."""

    adapter: object
    image_processor: object
    size: int
    parent_pid: int = field(default_factory=os.getpid)

    def __call__(self, batch: dict, indices: list[int], image_column: str) -> dict:
        _stop_if_interrupted()
        if os.getpid() != self.parent_pid and torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        images = [_to_rgb(item, self.size, f"row {index} of column {image_column!r}")
                  for item, index in zip(batch[image_column], indices)]
        codes = self.adapter.encode_images(images, self.image_processor)  # [B, h*w]
        return {"codes": codes.cpu().tolist()}


def _cache_fingerprint(dataset, encoder: ImageEncoder, checkpoint: Checkpoint, dtype: str) -> str:
    """``Dataset.map``'s cache key, naming the model instead of pickling it (datasets' default)."""
    from datasets.fingerprint import Hasher

    from . import __version__

    processor = encoder.image_processor.to_json_string() if encoder.image_processor is not None else None
    location = os.path.abspath(checkpoint.location) if os.path.isdir(checkpoint.location) else checkpoint.location
    return Hasher.hash(("hf_sjd.phrase_builder", __version__, dataset._fingerprint, location, checkpoint.revision,
                        getattr(checkpoint.config, "_commit_hash", None), encoder.adapter.tokenizer_fingerprint,
                        dtype, encoder.size, processor, PREPROCESSING, MAX_DECODED_PIXELS))


def tokenize(dataset, encoder: ImageEncoder, args: argparse.Namespace, checkpoint: Checkpoint) -> np.ndarray:
    """Images -> codes ``[N, h*w]`` (``Dataset.map(batched=True)``: cached unless streamed)."""
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
        max_tokens = phrases.MAX_CORPUS_TOKENS
        stream = dataset.map(encoder, **kwargs)
        codes = []
        for row in tqdm(stream, total=args.max_images, desc="tokenizing images", unit="image",
                        disable=args.no_progress):
            _stop_if_interrupted()
            codes.append(np.asarray(row["codes"], dtype=np.int64))
            if len(codes) * len(codes[0]) > max_tokens:  # a stream of unknown length, without --max-images
                raise ValueError(f"dataset {args.dataset} streams more than {max_tokens // len(codes[0])} "
                                 f"images of {len(codes[0])} codes, more codes than the BPE trainer can count "
                                 f"({max_tokens}): pass --max-images")
        if not codes:
            raise ValueError(f"dataset {args.dataset} split {args.split!r} streamed no images")
        return np.stack(codes)
    tokenized = dataset.map(encoder, num_proc=args.num_proc if args.num_proc > 1 else None,
                            new_fingerprint=_cache_fingerprint(dataset, encoder, checkpoint, args.dtype),
                            desc="tokenizing images", **kwargs)
    return np.asarray(tokenized.with_format("numpy")["codes"], dtype=np.int64)


@contextlib.contextmanager
def _interrupts_stay_interrupts():
    """Ctrl-C during a build ends it with ``KeyboardInterrupt``, whatever the libraries it runs do with it:

    * turned into another error on the way out (datasets' multi-process map): the one in the chain is raised;
    * swallowed (in a weakref callback or ``__del__``): SIGINT is also recorded, and
      :func:`_stop_if_interrupted` raises it at the next check (if Python's own handler is installed);
    * deadlocked (a ``--num-proc`` worker killed holding the pool's queue lock): processes forked during the
      build ignore SIGINT, and the interrupted parent stops them.
    """
    import signal

    _INTERRUPTED.clear()
    previous = signal.getsignal(signal.SIGINT)
    wrap = threading.current_thread() is threading.main_thread() and previous is signal.default_int_handler

    def record(signum, frame):
        _INTERRUPTED.set()
        previous(signum, frame)  # raises KeyboardInterrupt

    if wrap:
        signal.signal(signal.SIGINT, record)
        _BUILDING.set()
    try:
        yield
    except Exception as error:
        interrupt = _interrupt_in(error)
        if interrupt is not None:
            raise interrupt from None
        raise
    finally:
        if wrap:
            _BUILDING.clear()
            signal.signal(signal.SIGINT, previous)


def _ignore_sigint_in_workers() -> None:
    import signal

    if _BUILDING.is_set():
        _BUILDING.clear()  # the child is no build; its own children follow its (ignored) SIGINT anyway
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if hasattr(os, "register_at_fork"):  # for good (hooks cannot be unregistered): it acts only during a build
    os.register_at_fork(after_in_child=_ignore_sigint_in_workers)


def _stop_if_interrupted() -> None:
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt("interrupted (the first KeyboardInterrupt was swallowed by a library)")


def _interrupt_in(error: BaseException) -> KeyboardInterrupt | None:
    """The ``KeyboardInterrupt`` an exception was raised from or while handling, if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def build(args: argparse.Namespace, command: str):
    """Run the build for parsed ``args``; returns the saved ``PhraseLibrary``.

    ``ValueError`` for bad input (before any image is tokenized), ``RuntimeError`` when only ``--push-to-hub``
    failed (the saved library is intact); Ctrl-C is a ``KeyboardInterrupt`` and leaves ``--out`` as it was."""
    with _interrupts_stay_interrupts():
        return _build(args, command)


def _build(args: argparse.Namespace, command: str):
    validate_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.no_progress:
        import datasets

        datasets.disable_progress_bars()
    start = time.perf_counter()
    checkpoint = inspect_checkpoint(args.model, args.model_revision)  # config only: cheap, fails first
    image_processor = load_image_processor(checkpoint, args.image_processor)
    dataset = load_images(args)
    adapter = load_model(checkpoint, DTYPES[args.dtype], _device(args))
    try:
        size = args.image_size or adapter.encoder_image_size(image_processor)
    except ValueError as error:  # e.g. a LlamaGen checkpoint without its VQ tokenizer
        raise _model_error(checkpoint.name, str(error)) from error
    if args.image_size is None:
        if not 1 <= int(size) <= MAX_IMAGE_SIZE:
            raise _model_error(checkpoint.name, f"its image processor asks for {size} px images, outside [1, "
                                                f"{MAX_IMAGE_SIZE}]; pass --image-size")
        _check_pixel_batch(int(size), args.batch_size, "the model's default image size")
    encoder = ImageEncoder(adapter, image_processor, int(size))
    try:
        codes_per_image = _probe(encoder)
    except (ValueError, RuntimeError) as error:  # the adapter's size check, a processor / VQ shape mismatch
        where = f"--image-size {size}" if args.image_size else f"--model {checkpoint.name} (its image size {size} px)"
        raise ValueError(f"{where}: encoding one blank image failed before the dataset was read: {error}") from error
    _check_corpus(args, dataset, codes_per_image, int(size))
    codes = tokenize(dataset, encoder, args, checkpoint)  # [N, h*w]
    _stop_if_interrupted()
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
    library = phrases.PhraseLibrary.from_token_sequences(
        codes, num_merges=args.merges, row_length=args.row_length or None,
        codebook_size=adapter.draft_token_ids.numel(), fingerprint=adapter.tokenizer_fingerprint, source=source,
        grid=(side, side) if side * side == length else None, min_frequency=args.min_frequency,
        show_progress=not args.no_progress,
        extra_metadata={"build": {"command": command, "tokenize_seconds": round(tokenize_seconds, 1)}})
    _stop_if_interrupted()
    library.save_pretrained(args.out)  # the folder appears complete, or not at all
    print(f"{library}\nsaved to {args.out} ({time.perf_counter() - start:.1f} s)")
    if args.push_to_hub:
        timeout = {} if args.hub_timeout is None else {"timeout": args.hub_timeout}
        try:
            url = library.push_to_hub(args.push_to_hub, **timeout)
        except Exception as error:
            raise RuntimeError(f"pushing to {args.push_to_hub} failed ({type(error).__name__}: {error}); the library "
                               f"saved at {args.out} is intact") from error
        print(f"pushed to {url}")
    return library


def _probe(encoder: ImageEncoder) -> int:
    """The number of codes of one image, from a blank one: a size / processor mismatch fails before the map."""
    from PIL import Image

    codes = encoder({"image": [Image.new("RGB", (encoder.size, encoder.size), (127, 127, 127))]}, [0], "image")
    return len(codes["codes"][0])


def _check_corpus(args: argparse.Namespace, dataset, codes_per_image: int, size: int) -> None:
    """Before the dataset is tokenized: --row-length splits an image's codes into whole rows, and the corpus fits
    the BPE trainer (``MAX_CORPUS_TOKENS``)."""
    import datasets

    side = math.isqrt(codes_per_image)
    shape = f"{side} x {side} grid" if side * side == codes_per_image else "raster sequence"
    if args.row_length and codes_per_image % args.row_length:
        divisors = [d for d in range(1, min(codes_per_image, 4096) + 1) if codes_per_image % d == 0]
        raise ValueError(f"--row-length {args.row_length} does not split the {codes_per_image} codes of one {size} px "
                         f"image ({shape}) into whole rows; pass 0 (whole images) or a divisor of {codes_per_image}"
                         f"{f', e.g. the grid width {side}' if side * side == codes_per_image else ''} (divisors: "
                         f"{', '.join(map(str, divisors[:12]))}{' ...' if len(divisors) > 12 else ''})")
    most = phrases.MAX_CORPUS_TOKENS // codes_per_image
    # a map-style dataset is already cut to --max-images; a stream's length is known from --max-images only
    count = len(dataset) if isinstance(dataset, datasets.Dataset) else args.max_images
    flag = "--max-images" if args.max_images is not None else "the dataset's"
    if count is not None and count > most:
        raise ValueError(f"{flag} {count} images of {codes_per_image} codes ({size} px) make a corpus of "
                         f"{count * codes_per_image} codes; the BPE trainer counts pairs in 32-bit signed integers, "
                         f"so at most {phrases.MAX_CORPUS_TOKENS} codes: pass --max-images <= {most}")


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    """Exit status of a build: 0, 2 for bad input (usage + message), 1 when only the push failed."""
    try:
        build(args, command)
    except (ValueError, TypeError, FileNotFoundError) as error:
        parser.error(str(error))  # exits with status 2
    except RuntimeError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _exit_if_shutdown_hangs()
        raise
    return 0


SHUTDOWN_GRACE = 10.0  # seconds the interpreter may take to exit after Ctrl-C before the process ends itself


def _exit_if_shutdown_hangs() -> None:
    """After Ctrl-C, end the process with exit status 130 if the interpreter's exit hangs: it joins every
    non-daemon thread, and an interrupt inside a library can leave one nobody wakes. A daemon thread gives the
    exit ``SHUTDOWN_GRACE`` seconds once the main thread is done (never, where it goes on)."""
    def watch() -> None:
        main = threading.main_thread()
        while main.is_alive():
            time.sleep(0.1)
        time.sleep(SHUTDOWN_GRACE)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)  # 128 + SIGINT: what a shell reports for a program ended by Ctrl-C

    threading.Thread(target=watch, name="hf_sjd-exit-watch", daemon=True).start()


def main(argv: list[str] | None = None, prog: str = "hf-sjd build-phrases") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    return run(parser, parser.parse_args(argv), shlex.join([*shlex.split(prog), *argv]))


if __name__ == "__main__":
    sys.exit(main())
