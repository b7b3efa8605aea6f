"""``hf-sjd bench``: every decoding method on the same prompts and seeds, speed and quality side by side.

    hf-sjd bench --methods ar,sjd,mc-sjd,lantern,gsd,prompt-lookup --prompts all --num-images 1 \\
        --batch-size 8 --seeds 0,1 --threads 1 --out results/ [--overwrite] [--top-k 100] \\
        [--guidance-scale 1.0] [--window 16]
    accelerate launch --multi_gpu --num_processes 2 -m hf_sjd.bench ... [--cpu]   # same flags, batches sharded

Methods: ``ar`` (transformers' ``generate(do_sample=True)``), every registered Jacobi strategy
(``hf_sjd.STRATEGIES``), and ``prompt-lookup`` (transformers' prompt-lookup decoding,
``prompt_lookup_num_tokens``). transformers only runs prompt lookup at batch size 1, so it runs one image at
a time; with sampling it is exact (each position samples from the processed target and drafts are kept while
they match), but its unbatched CFG processor does not follow multi-token verification, so ``prompt-lookup``
refuses ``--guidance-scale`` other than 1.

Prompts: the reference classes (``--prompts all`` or a comma list), or a column of a ``datasets`` data set
(``--prompt-dataset ID_OR_PATH --prompt-column prompt``: a Hub id, a ``save_to_disk`` folder or a
csv/json/jsonl/parquet file). The shipped reference model only understands its 16 class names, so other
prompts are rejected for it.

Work items are ``(prompt, image index)`` pairs (index-major, so a batch mixes prompts), cut into batches of
``--batch-size``. Each batch is seeded from ``(seed, its items)`` and all methods see the same seed per batch
(paired comparison). Under ``accelerate launch`` whole batches are split between processes
(``PartialState.split_between_processes``) and gathered on the main process (``gather_object``), so the
number of processes changes neither the samples nor the totals. CPU processes: accelerate 1.15's
``accelerate launch --cpu --num_processes N`` starts a single process (multi-process CPU goes through
``mpirun``), so use ``accelerate launch --multi_gpu --num_processes N -m hf_sjd.bench ... --cpu`` (torchrun
under the hood; gloo on CPU) or ``torchrun --nproc_per_node N -m hf_sjd.bench ...``; the bench warns when it
finds itself alone under a multi-process ``--cpu`` launch.

Outputs in ``--out``, all of one run together: they are written into a sibling temporary folder that then
replaces ``--out`` as a whole (``hf_sjd.files.atomic_folder``), so an interrupted run leaves the previous
outputs (or nothing) and never a mix. ``--out`` must be empty or missing; ``--overwrite`` replaces it,
deleting whatever it held.

Every flag is checked (type, finiteness, range) before any work; the checks that need the model
(``--top-k`` against the loaded model's drafted image tokens, ``--phrase-library`` loaded and matched
against its tokenizer fingerprint) run right after loading it, before any generation. Bad input exits
with status 2 and a message naming the flag.

* ``results.json``::

    {"schema_version": 1, "command": str,
     "config": {"methods", "prompts", "prompt_source", "num_images", "batch_size", "seeds", "top_k",
                "guidance_scale", "window", "prompt_lookup_num_tokens", "phrase_library", "threads",
                "num_processes", "device"},
     "environment": {"torch", "transformers", "peak_memory": what peak_memory_mb measures},
     "metrics": {metric: description},
     "reference": {"classifier_heldout_accuracy": float, "fd_ref": {"feature_dim", "real_images",
                   "generated_images_per_seed", "floor_real": {"per_seed", "mean", "se"},
                   "floor_vq": {"per_seed", "mean", "se"}}, "torchmetrics": str},
     "methods": {method: {
         "per_seed": {seed (str): {metric: float|null, "num_images", "num_new_tokens", "num_forward_passes",
                                   "num_calls", "model_calls": int, "tokens_per_forward": [int] | null}},
         "mean": {metric: float|null}, "se": {metric: float|null},   # across seeds; se null for 1 seed
         "totals": {"num_images", "num_new_tokens", "num_forward_passes", "model_calls": int},  # over seeds
         "tokens_per_forward": [int] | null}}}                       # histogram summed over seeds

  ``metric`` is each key of :data:`METRICS` (null where it does not apply, e.g. acceptance for ``ar``).
  ``tokens_per_forward[k]`` counts (row, forward) pairs that committed ``k`` tokens.
* ``results.csv``: columns ``method, seed`` + :data:`METRICS` + :data:`COUNTS`; one row per (method, seed),
  then one ``seed=mean`` and one ``seed=se`` row per method.
* ``results.md``: the Markdown table (mean ± SE across seeds) with the command and definitions.
* ``scatter.png`` (step compression vs FD-ref, SE bars), ``tokens_per_forward.png`` (histograms),
  ``samples.png`` (the first images of the first seed, a row per method).

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` during each batch (weights included). On CPU
there is no allocator counter for torch, so it is the rise of the process's resident set size over its
value at the batch start, sampled every 2 ms from ``/proc/self/statm`` after ``malloc_trim`` returned freed
memory to the OS (Linux only, else null): a lower bound on the batch's working memory, not comparable to the
CUDA number.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import shlex
import sys
import threading
import time
import zlib
from pathlib import Path

import torch

from .checks import check_float, check_int
from .files import atomic_folder, atomic_write_bytes

PROMPT_LOOKUP = "prompt-lookup"

#: per-(method, seed) metrics: key -> (table label, format, description)
METRICS: dict[str, tuple[str, str, str]] = {
    "nfe_per_call": ("NFE/call", "{:.1f}", "model forwards per generate call (a batch; prompt-lookup: one image), "
                     "prefill included; a batch runs until its slowest row is done"),
    "step_compression": ("step compression", "{:.2f}", "new tokens per row / forwards per call (vanilla = 1)"),
    "acceptance_rate": ("acceptance", "{:.2f}", "accepted drafts / verified drafts (Jacobi strategies only)"),
    "seconds_per_image": ("s/image", "{:.3f}", "wall seconds of generate per image"),
    "loop_overhead": ("loop overhead", "{:.1%}", "share of generate's wall time spent outside model forwards"),
    "peak_memory_mb": ("peak mem MB", "{:.1f}", "see environment.peak_memory; max over batches"),
    "fd_ref": ("FD-ref", "{:.2f}", "Frechet distance between reference-classifier features of the generated "
               "images and of held-out real images of the same classes"),
    "class_accuracy": ("class acc", "{:.2f}", "reference classifier agrees with the prompt's class"),
    "mean_token_loglik": ("loglik", "{:.3f}", "mean log-likelihood (nats/token) of the generated tokens under the "
                          "model's unprocessed distribution"),
    "tv_to_ar": ("TV to ar", "{:.3f}", "token-frequency total variation to the ar samples of the next seed "
                 "(cyclically; for ar itself that is the noise floor; 0 with one seed)"),
}
COUNTS = ("num_images", "num_new_tokens", "num_forward_passes", "num_calls", "model_calls")
HELDOUT_PER_CLASS, HELDOUT_SEED = 64, 1  # the held-out crops of scripts/train_reference_model.py (report.json)


# -- inputs -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench flags (shared by ``hf-sjd bench`` and ``python -m hf_sjd.bench``)."""
    parser.add_argument("--methods", default="ar,sjd",
                        help=f"comma-separated: 'ar', a registered strategy or '{PROMPT_LOOKUP}'")
    parser.add_argument("--prompts", default=None, help="'all' (default: the reference classes) or a comma list")
    parser.add_argument("--prompt-dataset", default=None,
                        help="datasets id, save_to_disk folder or csv/json/jsonl/parquet file with the prompts")
    parser.add_argument("--prompt-column", default="prompt", help="column of --prompt-dataset holding the prompts")
    parser.add_argument("--prompt-split", default="train", help="split of --prompt-dataset")
    parser.add_argument("--max-prompts", type=int, default=None, help="keep the first N prompts")
    parser.add_argument("--num-images", type=int, default=1, help="images per prompt and seed")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seeds", default="0", help="comma-separated; every method runs once per seed")
    parser.add_argument("--out", type=Path, required=True, help="output folder (must be empty, or --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a non-empty --out as a whole (its old contents are deleted)")
    parser.add_argument("--top-k", type=int, default=100, help="in [1, the model's drafted image tokens]")
    parser.add_argument("--guidance-scale", type=float, default=1.0)
    parser.add_argument("--window", type=int, default=16, help="Jacobi window (drafts per forward)")
    parser.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--phrase-library", default=None,
                        help="phrase library (folder or Hub id) for strategies with a phrase_library knob (SJD-PV)")
    parser.add_argument("--model", default=None, help="folder laid out like the shipped reference weights")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads per process (>= 1; default: torch's choice)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even where CUDA is available")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def known_methods() -> list[str]:
    from .sampling import registered_methods

    return [*registered_methods(), PROMPT_LOOKUP]


def load_prompt_dataset(name: str, column: str, split: str) -> list[str]:
    """Prompts from a ``datasets`` source; raises ``ValueError`` with a one-line reason."""
    import datasets

    from .files import looks_local

    path = Path(name).expanduser()
    if looks_local(name) or path.exists():
        if not path.exists():  # never fall through to a Hub lookup for what is clearly a local path
            raise ValueError(f"no such file or folder: {name}")
        if path.is_dir():
            data = datasets.load_from_disk(str(path))
        else:
            kind = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}.get(path.suffix)
            if kind is None:
                raise ValueError(f"unsupported file type {path.suffix!r} (csv, json, jsonl or parquet)")
            data = datasets.load_dataset(kind, data_files=str(path), split="train")
    else:
        data = datasets.load_dataset(name, split=split)
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ValueError(f"no split {split!r}; splits: {', '.join(data)}")
        data = data[split]
    if column not in data.column_names:
        raise ValueError(f"no column {column!r}; columns: {', '.join(data.column_names)}")
    return [str(p) for p in data[column]]


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], list[str], list[int]]:
    """Check every input before any work; exits 2 (``parser.error``) naming the argument. Returns
    (methods, prompts, seeds)."""
    from .reference import CLASS_NAMES

    def check(function, name: str, value, **bounds):
        try:
            return function(name, value, **bounds)
        except (TypeError, ValueError) as error:
            parser.error(str(error))

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    known = known_methods()
    unknown = [m for m in methods if m not in known]
    if not methods or unknown:
        parser.error(f"--methods: unknown method(s) {unknown or [args.methods]}; registered: {', '.join(known)}")
    if len(set(methods)) != len(methods):
        parser.error(f"--methods: duplicate method in {args.methods!r}")
    check(check_int, "--num-images", args.num_images, minimum=1)
    check(check_int, "--batch-size", args.batch_size, minimum=1)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds must be distinct integers, got {args.seeds!r}")
    for seed in seeds:
        check(check_int, "--seeds", seed, minimum=0, maximum=2**63 - 1)
    check(check_int, "--top-k", args.top_k, minimum=1)  # the upper bound needs the model: check_model_args
    check(check_int, "--window", args.window, minimum=1)  # a huge window is fine: generate clamps it
    check(check_float, "--guidance-scale", args.guidance_scale, minimum=0.0)
    if PROMPT_LOOKUP in methods and args.guidance_scale != 1.0:
        parser.error(f"--guidance-scale {args.guidance_scale:g}: {PROMPT_LOOKUP} supports only 1 (no CFG)")
    check(check_int, "--prompt-lookup-tokens", args.prompt_lookup_tokens, minimum=1)
    check(check_int, "--threads", args.threads, minimum=1, allow_none=True)
    check(check_int, "--max-prompts", args.max_prompts, minimum=1, allow_none=True)
    if args.phrase_library is not None:
        from .sampling import wants_knob

        if not any(wants_knob(m, "phrase_library") for m in methods):
            parser.error(f"--phrase-library is read only by phrase-verification strategies; none of --methods "
                         f"{','.join(methods)} uses it")

    if args.prompt_dataset is not None:
        if args.prompts is not None:
            parser.error("--prompts and --prompt-dataset are exclusive")
        try:
            prompts = load_prompt_dataset(args.prompt_dataset, args.prompt_column, args.prompt_split)
        except Exception as error:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ...)
            parser.error(f"--prompt-dataset: cannot load prompts from {args.prompt_dataset!r}: {error}")
        source = f"--prompt-dataset {args.prompt_dataset!r}"
    else:
        text = args.prompts or "all"
        prompts = list(CLASS_NAMES) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
        source = "--prompts"
        repeated = sorted({p for p in prompts if prompts.count(p) > 1})
        if repeated:
            parser.error(f"--prompts: {', '.join(map(repr, repeated))} named more than once; name each prompt once "
                         "(--num-images sets the images per prompt)")
    prompts = prompts[:args.max_prompts]
    if not prompts:
        parser.error(f"{source}: no prompts")
    unknown = sorted({p for p in prompts if p not in CLASS_NAMES})
    if unknown:
        shown = ", ".join(repr(p) for p in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        parser.error(f"{source}: unknown prompt(s) {shown}; the reference model knows only: {', '.join(CLASS_NAMES)}")

    check_out(parser, args.out, args.overwrite)
    return methods, prompts, seeds


def check_out(parser: argparse.ArgumentParser, out: Path, overwrite: bool) -> None:
    """``--out`` must be a missing or empty folder (or ``--overwrite``), in a folder we can write: the
    outputs are built in a sibling temporary folder and swapped in whole. Shared with ``hf-sjd generate``."""
    if out.exists() and not out.is_dir():
        parser.error(f"--out {str(out)!r} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        parser.error(f"--out {str(out)!r} exists and is not empty; pass --overwrite to replace it as a whole")
    target = Path(os.path.realpath(out))
    parent = next((p for p in target.parents if p.exists()), Path("/"))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        parser.error(f"--out {str(out)!r} is not writable (its folder {str(parent)!r} is not a writable folder)")


def check_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace, reference):
    """The checks that need the loaded model, before any generation: ``--top-k`` in [1, its drafted image
    tokens]; ``--phrase-library`` loads and matches its tokenizer fingerprint. Returns the library or None."""
    codes = reference.draft_token_ids.numel()
    if not 1 <= args.top_k <= codes:
        parser.error(f"--top-k must be in [1, {codes}] (the model's drafted image tokens), got {args.top_k}")
    if args.phrase_library is None:
        return None
    from .phrases import PhraseLibrary

    adapter = getattr(reference.model, "sjd_adapter", None)
    fingerprint = getattr(adapter, "tokenizer_fingerprint", None) or reference.vq.fingerprint()
    try:
        return PhraseLibrary.from_pretrained(args.phrase_library, fingerprint=fingerprint,
                                             codebook_size=reference.vq.codebook_size)
    except (OSError, ValueError) as error:
        parser.error(f"--phrase-library {args.phrase_library!r}: {error}")


# -- work ---------------------------------------------------------------------------------------------------
def make_batches(prompts: list[str], num_images: int, batch_size: int) -> list[list[tuple[str, int]]]:
    """``(prompt, image index)`` items, index-major, cut into batches; the unit that is seeded and sharded."""
    items = [(p, i) for i in range(num_images) for p in prompts]
    return [items[s:s + batch_size] for s in range(0, len(items), batch_size)]


def batch_seed(seed: int, batch: list[tuple[str, int]]) -> int:
    """A seed that depends only on the run seed and the batch's items (not on process or method)."""
    return zlib.crc32(f"{seed}|{batch}".encode()) & 0x7FFFFFFF


class PeakMemory:
    """Peak memory of a block in MB (see the module docstring for what is measured on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak_mb = device, None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._statm = Path("/proc/self/statm")
        if not self._statm.exists():
            return self
        try:  # hand freed heap back to the OS so the RSS rise reflects this block's allocations
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._start = self._peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _rss(self) -> int:
        return int(self._statm.read_text().split()[1]) * self._page

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self._peak = max(self._peak, self._rss())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif hasattr(self, "_thread"):
            self._stop.set()
            self._thread.join()
            self.peak_mb = (max(self._peak, self._rss()) - self._start) / 2**20


class _StepStreamer:
    """Records how many tokens each decoding step of transformers' assisted generate committed."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.sizes.append(int(value.numel()))
        self._prompt_seen = True  # generate() streams the prompt first

    def end(self) -> None:
        pass


def _prompt_lookup(reference, prompt_ids: torch.Tensor, args) -> tuple[torch.Tensor, dict]:
    """transformers' prompt-lookup decoding, one image at a time (it supports batch size 1 only)."""
    from .sampling import ForwardCounter

    model, rows, hist = reference.model, [], [0] * (args.prompt_lookup_tokens + 2)
    start = time.perf_counter()
    with ForwardCounter(model) as counter:
        for row in prompt_ids.split(1):
            streamer = _StepStreamer()
            rows.append(model.generate(row, do_sample=True, top_k=args.top_k, streamer=streamer,
                                       max_new_tokens=reference.num_image_tokens,
                                       prompt_lookup_num_tokens=args.prompt_lookup_tokens))
            for size in streamer.sizes:
                hist[size] += 1
    sequences = torch.cat(rows)
    new_tokens = (sequences.shape[1] - prompt_ids.shape[1]) * len(rows)
    return sequences, {"num_images": len(rows), "num_new_tokens": new_tokens, "num_calls": len(rows),
                       "num_forward_passes": counter.calls, "model_calls": counter.calls,
                       "seconds": time.perf_counter() - start, "model_seconds": counter.seconds,
                       "tokens_per_forward": hist}


@torch.no_grad()
def run_batch(reference, classifier, method: str, batch: list[tuple[str, int]], seed: int, args,
              device: torch.device) -> dict:
    """Generate one batch with ``method`` and score each image; returns a picklable record."""
    from .quality import token_logliks
    from .reference import CLASS_NAMES
    from .sampling import generate_images, wants_knob

    prompt_ids = reference.prompt_ids([p for p, _ in batch]).to(device)
    torch.manual_seed(batch_seed(seed, batch))
    with PeakMemory(device) as memory:
        if method == PROMPT_LOOKUP:
            sequences, stats = _prompt_lookup(reference, prompt_ids, args)
        else:
            extra = {}
            library = getattr(args, "library", None)  # loaded and checked once by check_model_args
            if library is not None and wants_knob(method, "phrase_library"):
                extra["phrase_library"] = library
            sequences, stats = generate_images(reference, prompt_ids, method, args.top_k, args.guidance_scale,
                                               args.window, **extra)
            if method == "ar":  # every row commits one token per forward
                stats["tokens_per_forward"] = [0, stats["num_new_tokens"]]
    prompt_len = prompt_ids.shape[1]
    images = reference.vq.decode_to_tensor(sequences[:, -reference.num_image_tokens:])
    features = classifier.features(images)
    predictions = classifier.head(features).argmax(-1)
    labels = torch.tensor([CLASS_NAMES.index(p) for p, _ in batch])  # the classifier's classes: data.CLASSES order
    return {"method": method, "seed": seed, "items": batch, "peak_memory_mb": memory.peak_mb,
            "stats": {k: v for k, v in stats.items() if k not in ("step_compression", "acceptance_rate")},
            "tokens": sequences[:, prompt_len:].cpu().tolist(),
            "loglik": token_logliks(reference.model, sequences, prompt_len).mean(1).tolist(),
            "features": features.cpu().double().tolist(),
            "correct": (predictions.cpu() == labels).tolist()}


# -- quality ------------------------------------------------------------------------------------------------
def frechet_distance(features_a, features_b) -> float:
    """Frechet distance between Gaussians fitted to two feature sets ``[N, D]``.

    ``|mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^1/2)``, with ``Tr (S_a S_b)^1/2`` computed as the sum of
    square roots of the eigenvalues of the symmetric PSD matrix ``S_a^1/2 S_b S_a^1/2`` (stable for the
    rank-deficient covariances of small samples, unlike a general ``sqrtm``). A single sample has zero
    covariance. Small samples bias it upwards: compare against a floor at the same sample size.
    """
    import numpy as np
    from scipy.linalg import eigh, eigvalsh

    a, b = np.asarray(features_a, dtype=np.float64), np.asarray(features_b, dtype=np.float64)

    def cov(x):
        return np.cov(x, rowvar=False) if len(x) > 1 else np.zeros((x.shape[1], x.shape[1]))

    cov_a, cov_b = cov(a), cov(b)
    values, vectors = eigh(cov_a)
    root_a = (vectors * np.sqrt(values.clip(min=0))) @ vectors.T
    cross = np.sqrt(eigvalsh(root_a @ cov_b @ root_a).clip(min=0)).sum()
    diff = a.mean(0) - b.mean(0)
    return float(max(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2 * cross, 0.0))


def real_images(class_counts: dict[str, int], seed: int) -> torch.Tensor:
    """Fresh random crops of the reference photos, ``class_counts[name]`` per class (not training data:
    the training and held-out sets use seeds 0-2 through ``make_dataset``)."""
    from .reference.data import CLASSES, load_source_photo, random_crops

    generator = torch.Generator().manual_seed(1_000_003 + seed)
    crops = [random_crops(load_source_photo(c.source), class_counts[c.name], generator)
             for c in CLASSES if class_counts.get(c.name)]
    return torch.cat(crops)


def _mean_se(values: list) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


@torch.no_grad()
def reference_features(reference, classifier, prompts: list[str], num_images: int, seeds: list[int]) -> dict:
    """Held-out real-image features of the prompts' classes and the FD floors at the generated sample size."""
    from collections import Counter

    from .reference.data import CLASS_NAMES, make_dataset

    images, labels = make_dataset(HELDOUT_PER_CLASS, seed=HELDOUT_SEED)
    wanted = torch.tensor([CLASS_NAMES[int(label)] in set(prompts) for label in labels])
    heldout = classifier.embed(images[wanted]).double().numpy()
    counts = {name: n * num_images for name, n in Counter(prompts).items()}
    floor_real, floor_vq = {}, {}
    for seed in seeds:
        fresh = real_images(counts, seed)
        floor_real[str(seed)] = frechet_distance(classifier.embed(fresh).double().numpy(), heldout)
        codes = reference.vq.encode(fresh.to(reference.vq.codebook.device))
        recon = reference.vq.decode_to_tensor(codes).cpu()
        floor_vq[str(seed)] = frechet_distance(classifier.embed(recon).double().numpy(), heldout)

    def summary(per_seed):
        mean, se = _mean_se(list(per_seed.values()))
        return {"per_seed": per_seed, "mean": mean, "se": se}

    return {"features": heldout, "feature_dim": int(heldout.shape[1]), "real_images": int(heldout.shape[0]),
            "generated_images_per_seed": len(prompts) * num_images,
            "floor_real": summary(floor_real), "floor_vq": summary(floor_vq)}


def torchmetrics_note() -> str:
    try:
        import torchmetrics  # noqa: F401
    except ImportError:
        return ("skipped: torchmetrics is not installed; FID/CLIPScore need it plus locally cached Inception/CLIP "
                "weights (FD-ref and class accuracy are this benchmark's proxies)")
    return ("skipped: torchmetrics is installed, but FID/CLIPScore are not wired for the reference model (64x64 "
            "class crops, no local Inception/CLIP weights); FD-ref and class accuracy are the proxies")


def summarize(records: list[dict], methods: list[str], seeds: list[int], reference_stats: dict,
              vocab: int) -> dict:
    """Per-(method, seed) metrics from the gathered batch records, then mean/SE across seeds."""
    from .quality import token_frequency_tv
    from .sampling import pooled_rates, sum_histograms

    by_key: dict[tuple[str, int], list[dict]] = {}
    for record in records:
        by_key.setdefault((record["method"], record["seed"]), []).append(record)
    tokens = {key: torch.tensor([t for r in parts for t in r["tokens"]]) for key, parts in by_key.items()}
    out = {}
    for method in methods:
        per_seed = {}
        for position, seed in enumerate(seeds):
            parts = by_key[(method, seed)]
            stats = [r["stats"] for r in parts]
            total = {k: sum(s[k] for s in stats) for k in (*COUNTS, "seconds", "model_seconds")}
            hists = [s.get("tokens_per_forward") for s in stats]
            hist = sum_histograms(hists) if all(h is not None for h in hists) else None
            drafted = "num_accepted" in stats[0]
            rates = pooled_rates(total["num_new_tokens"], total["num_images"], total["num_forward_passes"],
                                 total["num_calls"], sum(s["num_accepted"] for s in stats) if drafted else None,
                                 sum(s["num_recovered"] for s in stats) if drafted else None)
            features = [f for r in parts for f in r["features"]]
            correct = [c for r in parts for c in r["correct"]]
            logliks = [v for r in parts for v in r["loglik"]]
            next_ar = ("ar", seeds[(position + 1) % len(seeds)])
            memory = [r["peak_memory_mb"] for r in parts if r["peak_memory_mb"] is not None]
            row = {
                "nfe_per_call": total["num_forward_passes"] / total["num_calls"],
                "step_compression": rates["step_compression"],
                "acceptance_rate": rates["acceptance_rate"],
                "seconds_per_image": total["seconds"] / total["num_images"],
                "loop_overhead": (total["seconds"] - total["model_seconds"]) / total["seconds"],
                "peak_memory_mb": max(memory) if memory else None,
                "fd_ref": frechet_distance(features, reference_stats["features"]),
                "class_accuracy": sum(correct) / len(correct),
                "mean_token_loglik": sum(logliks) / len(logliks),
                "tv_to_ar": (token_frequency_tv(tokens[(method, seed)], tokens[next_ar], vocab)
                             if next_ar in tokens else None),
            }
            row.update({k: int(total[k]) for k in COUNTS}, tokens_per_forward=hist)
            per_seed[str(seed)] = row
        mean, se = {}, {}
        for key in METRICS:
            mean[key], se[key] = _mean_se([per_seed[str(s)][key] for s in seeds])
        hists = [per_seed[str(s)]["tokens_per_forward"] for s in seeds]
        summed = sum_histograms(hists) if all(h is not None for h in hists) else None
        out[method] = {"per_seed": per_seed, "mean": mean, "se": se,
                       "totals": {k: sum(per_seed[str(s)][k] for s in seeds)
                                  for k in ("num_images", "num_new_tokens", "num_forward_passes", "model_calls")},
                       "tokens_per_forward": summed}
    return out


# -- outputs ------------------------------------------------------------------------------------------------
def _fmt(value, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def _cell(key: str, mean, se) -> str:
    spec = METRICS[key][1]
    if mean is None:
        return "-"
    if se is None:
        return _fmt(mean, spec)
    return f"{_fmt(mean, spec)} ± {_fmt(se, spec)}".replace("% ± ", " ± ")


def _hist_text(hist: list[int] | None) -> str:
    if not hist or not sum(hist[1:]):
        return "-"
    total, last = sum(hist), max(k for k, c in enumerate(hist) if c)
    return " ".join(f"{100 * c / total:.0f}" for c in hist[1:last + 1])


def markdown(results: dict) -> str:
    config, ref = results["config"], results["reference"]
    fd = ref["fd_ref"]
    keys = list(METRICS)
    lines = [
        "# `hf-sjd bench`: speed and quality proxies of every method on the same prompts and seeds", "",
        f"Command: `{results['command']}`", "",
        f"{len(config['prompts'])} prompts ({config['prompt_source']}) x {config['num_images']} image(s) x "
        f"{len(config['seeds'])} seeds ({', '.join(map(str, config['seeds']))}), batch {config['batch_size']}, "
        f"top-k {config['top_k']}, CFG {config['guidance_scale']:g}, window {config['window']}, "
        f"{config['num_processes']} process(es) on {config['device']}, {config['threads'] or 'default'} thread(s). "
        "Cells: mean ± standard error across seeds.", "",
        "| method | " + " | ".join(METRICS[k][0] for k in keys) + " | tokens/forward % (1,2,3,...) |",
        "|---|" + "---:|" * len(keys) + "---|",
    ]
    for method, entry in results["methods"].items():
        cells = [_cell(k, entry["mean"][k], entry["se"][k]) for k in keys]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {_hist_text(entry['tokens_per_forward'])} |")
    floor_real, floor_vq = fd["floor_real"], fd["floor_vq"]
    lines += [
        "",
        f"* **FD-ref** uses the shipped reference classifier's {fd['feature_dim']}-d features (held-out accuracy "
        f"{100 * ref['classifier_heldout_accuracy']:.1f}%): {fd['generated_images_per_seed']} generated images "
        f"per seed vs {fd['real_images']} held-out real crops of the same classes. At this sample size two real "
        f"sets are {_cell('fd_ref', floor_real['mean'], floor_real['se'])} apart (floor) and VQ reconstructions "
        f"of real crops {_cell('fd_ref', floor_vq['mean'], floor_vq['se'])} (the best a model over this "
        "tokenizer can reach).",
        "* **NFE/call**: forwards per generate call (a batch; prompt-lookup runs one image per call, transformers "
        "supports batch 1 only), prefill included; **step compression**: new tokens per row / NFE (ar = 1).",
        "* **loop overhead**: share of wall time outside model forwards; **peak mem**: "
        f"{results['environment']['peak_memory']}.",
        "* **loglik**: nats/token under the model's unprocessed distribution; **TV to ar**: token-frequency total "
        "variation to the ar samples of another seed (the ar row is the noise floor).",
        f"* torchmetrics FID/CLIPScore: {ref['torchmetrics']}.",
    ]
    return "\n".join(lines) + "\n"


def write_csv(results: dict) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["method", "seed", *METRICS, *COUNTS])
    for method, entry in results["methods"].items():
        for seed, row in entry["per_seed"].items():
            writer.writerow([method, seed, *(row[k] for k in METRICS), *(row[k] for k in COUNTS)])
        for label in ("mean", "se"):
            writer.writerow([method, label, *(entry[label][k] for k in METRICS), *([""] * len(COUNTS))])
    return buffer.getvalue().encode()


def _png(figure, dpi: int = 110) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def plots(results: dict, samples: dict[str, list], sample_prompts: list[str]) -> dict[str, bytes]:
    """``scatter.png``, ``tokens_per_forward.png`` and ``samples.png`` (``samples[method]``: PIL images of
    ``sample_prompts``) as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    fd = results["reference"]["fd_ref"]
    figure, axis = plt.subplots(figsize=(6, 4.2))
    for method, entry in methods.items():
        mean, se = entry["mean"], entry["se"]
        axis.errorbar(mean["step_compression"], mean["fd_ref"], xerr=se["step_compression"] or 0,
                      yerr=se["fd_ref"] or 0, fmt="o", capsize=3, label=method)
        axis.annotate(method, (mean["step_compression"], mean["fd_ref"]), textcoords="offset points",
                      xytext=(5, 4), fontsize=8)
    for name, style in (("floor_real", ":"), ("floor_vq", "--")):
        if fd[name]["mean"] is not None:
            axis.axhline(fd[name]["mean"], color="grey", linestyle=style, linewidth=1,
                         label="real vs real" if name == "floor_real" else "VQ reconstructions")
    axis.set_xlabel("step compression (new tokens per forward, higher is faster)")
    axis.set_ylabel("FD-ref (lower is better)")
    axis.set_title(f"mean ± SE over {len(results['config']['seeds'])} seed(s)")
    axis.legend(fontsize=7)
    files = {"scatter.png": _png(figure)}

    with_hist = {m: e["tokens_per_forward"] for m, e in methods.items() if e["tokens_per_forward"]}
    columns = min(3, max(len(with_hist), 1))
    rows = max(1, math.ceil(len(with_hist) / columns))
    longest = max((len(h) for h in with_hist.values()), default=2)
    figure, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.5 * rows), squeeze=False)
    for axis, (method, hist) in zip(axes.flat, with_hist.items()):
        total = sum(hist)
        axis.bar(range(1, len(hist)), [100 * c / total for c in hist[1:]])
        axis.set_xlim(0.5, longest - 0.5)  # one scale for all methods
        axis.set_title(method, fontsize=9)
        axis.set_xlabel("tokens committed per forward", fontsize=8)
        axis.set_ylabel("% of (row, forward)", fontsize=8)
    for axis in list(axes.flat)[len(with_hist):]:
        axis.axis("off")
    figure.tight_layout()
    files["tokens_per_forward.png"] = _png(figure)

    width = max((len(images) for images in samples.values()), default=1)
    figure, axes = plt.subplots(len(samples), width, figsize=(1.2 * width + 0.8, 1.3 * len(samples)),
                                squeeze=False)
    for row, (method, images) in enumerate(samples.items()):
        for column in range(width):
            axis = axes[row, column]
            axis.set_xticks([])
            axis.set_yticks([])
            if column < len(images):
                axis.imshow(images[column], interpolation="nearest")  # the model's own pixels, small PNG
                if row == 0 and column < len(sample_prompts):
                    axis.set_title(sample_prompts[column], fontsize=7)
            else:
                axis.axis("off")
        axes[row, 0].set_ylabel(method, rotation=0, ha="right", va="center", fontsize=8)
    figure.subplots_adjust(wspace=0.05, hspace=0.05)
    files["samples.png"] = _png(figure, dpi=80)  # ~1 pixel per generated pixel
    return files


# -- driver -------------------------------------------------------------------------------------------------
def run(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str | None = None) -> int:
    """Validate, generate (sharded under ``accelerate launch``), score, and write the outputs on the main
    process."""
    methods, prompts, seeds = validate(parser, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from accelerate import PartialState
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    import hf_sjd

    from .reference import load, load_classifier, weights_dir

    from accelerate.utils import parse_flag_from_env

    # PartialState only picks gloo/MULTI_CPU when told cpu=True; without CUDA that is the only choice anyway.
    state = PartialState(cpu=args.cpu or parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.cuda.is_available())
    if state.num_processes == 1 and "MASTER_PORT" in os.environ and "WORLD_SIZE" not in os.environ:
        print("hf-sjd bench: running as ONE process: `accelerate launch --cpu --num_processes N` starts a single "
              "process unless given --mpirun_hostfile; for N CPU processes use `accelerate launch --multi_gpu "
              "--num_processes N -m hf_sjd.bench ... --cpu` (or `torchrun --nproc_per_node N -m hf_sjd.bench`)",
              file=sys.stderr)
    device = state.device
    try:
        reference = load(args.model)
    except (OSError, ValueError) as error:
        parser.error(f"--model: cannot load a reference-layout model from {args.model!r}: {error}")
    hf_sjd.enable(reference.model)
    args.library = check_model_args(parser, args, reference)
    if args.library is not None:
        args.library.to(device)
    reference.model.to(device)
    reference.vq.to(device)
    classifier = load_classifier(args.model).to(device)

    batches = make_batches(prompts, args.num_images, args.batch_size)
    records = []
    with state.split_between_processes(batches) as shard:
        progress = tqdm(total=len(seeds) * len(methods) * sum(len(b) for b in shard), unit="image",
                        desc=f"bench (process {state.process_index})", disable=args.quiet or not shard,
                        position=state.process_index)
        for seed in seeds:  # seeds outermost, so slow drifts (thermal, other load) hit every method alike
            for method in methods:
                progress.set_postfix_str(f"seed {seed} {method}")
                for batch in shard:
                    records.append(run_batch(reference, classifier, method, batch, seed, args, device))
                    progress.update(len(batch))
        progress.close()
    records = gather_object(records)
    # Every process tears the process group down before it exits; a worker that exits with gloo still up can
    # abort ("terminate called without an active exception") while the main process is still writing.
    state.destroy_process_group()
    if not state.is_main_process:
        return 0

    reference_stats = reference_features(reference, classifier, prompts, args.num_images, seeds)
    classifier_accuracy = None
    report = (Path(args.model) if args.model else weights_dir()) / "report.json"
    if report.exists():
        classifier_accuracy = json.loads(report.read_text())["classifier"]["heldout_accuracy"]
    import transformers

    results = {
        "schema_version": 1,
        "command": command or shlex.join(["hf-sjd", "bench", *sys.argv[1:]]),
        "config": {"methods": methods, "prompts": prompts,
                   "prompt_source": (f"dataset {args.prompt_dataset}:{args.prompt_column}" if args.prompt_dataset
                                     else "reference classes"),
                   "num_images": args.num_images, "batch_size": args.batch_size, "seeds": seeds,
                   "top_k": args.top_k, "guidance_scale": args.guidance_scale, "window": args.window,
                   "prompt_lookup_num_tokens": args.prompt_lookup_tokens, "phrase_library": args.phrase_library,
                   "threads": args.threads,
                   "num_processes": state.num_processes, "device": str(device)},
        "environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peak_memory": ("torch.cuda.max_memory_allocated per batch (weights included)"
                                        if device.type == "cuda" else
                                        "CPU: rise of the resident set size over the batch start, sampled every "
                                        "2 ms after malloc_trim (a lower bound; not comparable to CUDA)")},
        "metrics": {k: v[2] for k, v in METRICS.items()},
        "reference": {"classifier_heldout_accuracy": classifier_accuracy,
                      "fd_ref": {k: v for k, v in reference_stats.items() if k != "features"},
                      "torchmetrics": torchmetrics_note()},
        "methods": summarize(records, methods, seeds, reference_stats, reference.model.config.vocab_size),
    }
    samples, sample_prompts = {}, [p for batch in batches for p, _ in batch][:8]
    for method in methods:  # the first seed's first images, in item order
        parts = sorted((r for r in records if r["method"] == method and r["seed"] == seeds[0]),
                       key=lambda r: batches.index(r["items"]))
        tokens = torch.tensor([t for r in parts for t in r["tokens"]][:8], device=device)
        samples[method] = reference.vq.decode(tokens)
    text = markdown(results)
    with atomic_folder(args.out) as out:  # all outputs of this run appear together, or none
        atomic_write_bytes(out / "results.json", (json.dumps(results, indent=2) + "\n").encode())
        atomic_write_bytes(out / "results.csv", write_csv(results))
        atomic_write_bytes(out / "results.md", text.encode())
        for name, data in plots(results, samples, sample_prompts).items():
            atomic_write_bytes(out / name, data)
    if not args.quiet:
        print(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-sjd bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m hf_sjd.bench`` / ``accelerate launch -m hf_sjd.bench``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    return run(parser, args, command=shlex.join(["hf-sjd", "bench", *argv]))


if __name__ == "__main__":
    sys.exit(main())
