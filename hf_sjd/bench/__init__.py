"""``hf-sjd bench``: each method on your model, same prompts and seeds, in one paired table.

    hf-sjd bench                                      # the reference model: ar and every strategy, 16 images each
    hf-sjd bench --methods ar,sjd --num-images 2      # exactly 2 images per method, 4 in all
    hf-sjd bench --model BAAI/Emu3-Gen-hf --methods ar,sjd,mc-sjd --prompts "coco2017-val[:1000]" \\
        --fid-reference coco2017-val --clip-model openai/clip-vit-base-patch16 --device cuda --out emu3-coco

``--prompts``: a prompt set (one image per prompt by default) or comma-separated prompts cycled over
``--num-images``. Image ``i`` of every method has the same prompt and the seed of its batch (``--seed`` + its first
image's index), so no batch depends on the ones before it (resume, sharding over ``accelerate launch``). A Jacobi
method runs as ``generate`` runs it (``--window auto``: its window and siblings picked from this machine's measured
costs, calibrated before the timed batches), or the pinned cell ``jacobi_window=--window, jacobi_siblings=0`` (the
papers' setting, the same on every machine). The table: :mod:`hf_sjd.bench.report`.

``--out``: ``manifest.json``, ``records/<method>/*.pt`` (one per batch, written when done: ``--resume`` continues
from them), ``images/<method>/<index>.png`` (the first 8, all with ``--save-images``; prompt and seed in its text
chunks), ``results.json`` / ``.csv`` / ``.md``, ``plot.png`` (speed-up vs FID). The study suites: ``python -m
benchmarks`` from a checkout.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from ..checks import check_device, check_float, check_int, check_window
from ..files import atomic_write_bytes, check_output_folder, mark_folder
from ..sampling import (COMPRESSION_VS_TIME, check_window_of, decode_images, generate_images, parse_methods,
                        prompt_batch, registered_methods, save_png, verifiers_of)
from .report import GRID

#: flags of the study suites (``benchmarks/``): refused here with a message saying where they live
STUDY_FLAGS = ("--suite", "--sections", "--seeds", "--images-per-prompt", "--prompt-dataset", "--prompt-column",
               "--prompt-split", "--max-prompts", "--prompt-lookup-tokens", "--ablation-corpus-images",
               "--library-tokens", "--library-merges", "--cpu")
#: what a run writes into --out (the marker lists them, so --overwrite / --resume recognise the folder)
OUTPUTS = ("manifest.json", "records", "images", "plot.png", "results.json", "results.csv", "results.md")
#: arguments that do not change a run's numbers: a resumed run may differ in them
UNRECORDED = ("out", "overwrite", "resume", "threads", "quiet", "bootstrap", "fid_cache", "argv", "handler",
              "command")
#: arguments that name a folder or file (or a Hub id): recorded resolved, however the path was spelled
PATH_FLAGS = ("model", "phrase_library", "processor", "vq_decoder", "fid_reference", "fid_features", "clip_model")


class _StudyFlag(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} belongs to the study suites, which are not part of the package: from a "
                     f"checkout of the repository run `python -m benchmarks SUITE {option_string} ...` (see "
                     "benchmarks/README.md). hf-sjd bench takes --methods, --num-images (per method), --prompts, "
                     "--seed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..prompts import PROMPT_SET_HELP

    parser.add_argument("--model", default=None,
                        help="folder laid out like the shipped reference weights (default: them), or a folder / Hub "
                             "id of a supported checkpoint (Emu3, Janus, Chameleon / Lumina-mGPT, LlamaGen-style)")
    parser.add_argument("--methods", default=None, help="comma-separated: 'ar' and registered strategies (default: "
                                                        "all on the reference model; ar,sjd,mc-sjd on a checkpoint)")
    parser.add_argument("--num-images", type=int, default=None,
                        help="images per method (default: one per prompt of a prompt set, else 16)")
    parser.add_argument("--batch-size", type=int, default=8, help="images per generate call")
    parser.add_argument("--latency-images", type=int, default=0,
                        help="also time the first N images at batch 1 (the papers' latency), not scored")
    parser.add_argument("--guidance-scale", type=float, default=1.0, help="classifier-free guidance (1: none)")
    parser.add_argument("--top-k", type=int, default=100, help="in [1, the model's drafted image tokens]")
    parser.add_argument("--prompts", default="all", help=f"{PROMPT_SET_HELP}; or comma-separated prompts; 'all': "
                        "the reference classes ('a photo of a coffee', ... for a checkpoint)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first batch (batch seeds: + first index)")
    parser.add_argument("--window", default="auto", help="the Jacobi methods' drafts per forward: 'auto' (default: "
                        "each as generate runs it, picked from this machine's measured costs) or an integer >= 1 "
                        "(that window, no siblings: the papers' setting)")
    parser.add_argument("--phrase-library", default=None, help="phrase library (folder or Hub id) of the phrase-"
                                                               "verification methods (default: the model's own)")
    parser.add_argument("--image-size", type=int, default=None, help="side in px of a checkpoint's images (default: "
                                                                      "the family's own; Emu3: 720 px, 8193 tokens)")
    parser.add_argument("--processor", default=None, help="a checkpoint's processor / tokenizer where it ships none "
                                                          "(Lumina-mGPT: facebook/chameleon-7b's)")
    parser.add_argument("--vq-decoder", default=None, help="Lumina-mGPT: its VQGAN decoder checkpoint (vqgan.ckpt "
                                                           "or .safetensors), for images and their metrics")
    parser.add_argument("--trust-vq-decoder", action="store_true", help="unpickle --vq-decoder (a Lightning .ckpt)")
    parser.add_argument("--fid-reference", default=None, help="FID against: coco2017-val, a folder of images, or a "
                        "Hub dataset owner/name:split, [:N] for the first N (default: no FID)")
    parser.add_argument("--fid-features", default=None, help="with --fid-reference: inception (the default; "
                        "pytorch-fid's, torchmetrics') or a saved network: torch.export .pt2 (or TorchScript), uint8 "
                        "[N, 3, 299, 299] -> [N, D]")
    parser.add_argument("--fid-cache", default="~/.cache/hf_sjd", help="where reference features are cached")
    parser.add_argument("--clip-model", default=None, help="CLIP score with this CLIPModel (folder or Hub id; the "
                                                           "papers': openai/clip-vit-base-patch16; default: none)")
    parser.add_argument("--bootstrap", type=int, default=25,
                        help="bootstrap resamples for the SE of FID / FD-ref (0: none)")
    parser.add_argument("--save-images", action="store_true", help=f"save every image (default: the first {GRID})")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda where available)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="weights of a --model checkpoint (default: float32)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run's --out (deleted when this run starts)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from the batches it saved")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    for flag in STUDY_FLAGS:
        parser.add_argument(flag, nargs="?", action=_StudyFlag, help=argparse.SUPPRESS)


def _validate(parser, args) -> tuple[list[str] | None, torch.device, list[str] | None]:
    """Every check that needs no model, before any work (exit 2 naming the flag): ``(methods or None, device,
    prompts or None: the model's default)``."""
    from ..prompts import load_prompt_set
    from ..quality import reference_images

    try:
        methods = None if args.methods is None else parse_methods("--methods", args.methods)
        args.window = check_window("--window", args.window, minimum=1)
        check_window_of("--window", methods or [], args.window)
        for name in ("batch_size", "top_k", "image_size", "threads"):
            check_int(f"--{name.replace('_', '-')}", getattr(args, name), minimum=1,
                      allow_none=name in ("image_size", "threads"))
        check_int("--latency-images", args.latency_images, minimum=0)
        check_int("--bootstrap", args.bootstrap, minimum=0)
        check_int("--seed", args.seed, minimum=0, maximum=2**62)
        check_float("--guidance-scale", args.guidance_scale, minimum=0.0)
        if args.resume and args.overwrite:
            raise ValueError("--resume continues the run in --out and --overwrite replaces it: pass one of them")
        if not (args.resume and (args.out / "manifest.json").is_file()):
            check_output_folder(args.out, args.overwrite)
        prompts = None if args.prompts == "all" else load_prompt_set(args.prompts)  # a prompt set: one image each
        if args.num_images is None:
            args.num_images = 16 if prompts is None else len(prompts)
        check_int("--num-images", args.num_images, minimum=1)
        if prompts is None and args.prompts != "all":
            prompts = [p.strip() for p in args.prompts.split(",") if p.strip()]
        if args.fid_features is not None and args.fid_reference is None:
            raise ValueError("--fid-features is read only with --fid-reference (the images FID compares against)")
        if args.fid_reference is not None:
            reference_images(args.fid_reference, check_only=True)
            if args.num_images < 2:
                raise ValueError("--num-images: FID needs at least 2 images per method")
        if args.vq_decoder is not None and not Path(args.vq_decoder).expanduser().is_file():
            raise ValueError(f"--vq-decoder {args.vq_decoder!r}: no such file")
        if prompts is not None and not prompts:
            raise ValueError("--prompts: no prompt given")
        device = check_device("--device", args.device)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    return methods, device, prompts


def _note(text: str) -> None:
    """What a run leaves out, and why, on stderr (the table is written without it)."""
    print(f"hf-sjd bench: {text}", file=sys.stderr)


def _load(parser, args, methods, prompts, device):
    """``(subject, classifier or None, methods)``; a checkpoint is checked from its config before its weights."""
    from ..reference import CLASS_NAMES
    from .subjects import check_methods, is_reference_layout, load_checkpoint, load_reference

    try:
        if not is_reference_layout(args.model):
            family, loader = load_checkpoint(args.model, args.image_size, getattr(torch, args.dtype or "float32"),
                                             args.processor)
            reason = check_methods(family, set(methods or ()))
            if reason:
                parser.error(f"--model {args.model}: {reason}; choose other --methods")
            if family == "lumina-mgpt" and (args.fid_reference or args.clip_model) and not args.vq_decoder:
                parser.error("--vq-decoder: FID and CLIP score need images, and transformers ships no Lumina-mGPT "
                             "image decoder; pass its VQGAN checkpoint (ckpts/chameleon/tokenizer/vqgan.ckpt)")
            default = [m for m in ("ar", "sjd", "mc-sjd") if not check_methods(family, {m})]
            return loader(), None, methods or default
    except ValueError as error:
        parser.error(str(error))
    for flag in ("image_size", "vq_decoder", "processor", "dtype"):
        if getattr(args, flag) is not None:
            parser.error(f"--{flag.replace('_', '-')} applies to a --model checkpoint, not the reference layout")
    unknown = [p for p in prompts or () if p not in CLASS_NAMES]
    if unknown:
        parser.error(f"--prompts: unknown prompt(s) {unknown[:5]}; the reference model knows only: "
                     f"{', '.join(CLASS_NAMES)}")
    subject, classifier = load_reference(parser, args.model, device)
    subject.vq.to(device)
    return subject, classifier, methods or registered_methods()


def _check_loaded(parser, args, subject, methods, prompts) -> tuple[list[str], dict]:
    """The checks that need the model, before any generation: ``(each image's prompt, phrase-library knobs)``."""
    import hf_sjd
    from ..reference import CLASS_NAMES
    from .subjects import default_phrase_library

    prompts = prompts or (subject.default_prompts() if hasattr(subject, "default_prompts") else list(CLASS_NAMES))
    try:
        if hasattr(subject, "prompt_inputs"):
            subject.prompt_inputs(sorted(set(prompts)))  # a LlamaGen-style checkpoint knows only its conditions
    except ValueError as error:
        parser.error(f"--prompts: {error}")
    try:  # Lumina-mGPT's decoder, loaded where the model is (decode_images then uses it)
        if args.vq_decoder is not None:
            subject.layout.load_vq_decoder(args.vq_decoder, allow_pickle=args.trust_vq_decoder).to(subject.model.device)
            subject.layout.vq_decoder_path = args.vq_decoder
    except (OSError, ValueError, RuntimeError) as error:
        parser.error(f"--vq-decoder {args.vq_decoder!r}: {error}")
    try:  # the model's default methods too (--methods were checked before it loaded)
        check_window_of("--window", methods, args.window)
    except ValueError as error:
        parser.error(f"{error} (or pass --methods without it)")
    codes = subject.draft_token_ids.numel()
    if not 1 <= args.top_k <= codes:
        parser.error(f"--top-k must be in [1, {codes}] (the model's drafted image tokens), got {args.top_k}")
    phrase = [m for m in methods if "phrase" in verifiers_of(m, {})]
    each = [prompts[i % len(prompts)] for i in range(args.num_images)]
    if args.phrase_library is not None:
        if not phrase:
            parser.error("--phrase-library is read only by phrase-verification methods; none of --methods is one")
        vq = getattr(subject, "vq", None)
        fingerprint = getattr(subject.model.sjd_adapter, "tokenizer_fingerprint", None) or (vq and vq.fingerprint())
        try:
            return each, {"phrase_library": hf_sjd.PhraseLibrary.from_pretrained(
                args.phrase_library, fingerprint=fingerprint, codebook_size=vq.codebook_size if vq else codes)}
        except (OSError, ValueError) as error:
            parser.error(f"--phrase-library {args.phrase_library!r}: {error}")
    if phrase and default_phrase_library(parser, subject, args.model, "--phrase-library") is None:
        parser.error(f"--phrase-library: {', '.join(phrase)} verify phrases and --model {args.model} has no default "
                     "phrase library; pass one (hf-sjd build-phrases --model ... builds it) or other --methods")
    return each, {}


def _canonical(value):
    """A :data:`PATH_FLAGS` value as the manifest records it: a local path resolved (``./m``, ``m`` and ``/abs/m``
    are one run for ``--resume``), a Hub id as given."""
    if isinstance(value, str) and value and Path(value).expanduser().exists():
        return str(Path(value).expanduser().resolve())
    return value


def _prepare(parser, args, config: dict) -> None:
    """Make ``--out`` for a new run (marker + manifest), or check that the one to resume is this run."""
    manifest = args.out / "manifest.json"
    if args.resume and manifest.is_file():
        earlier = json.loads(manifest.read_text())
        # (a manifest may hold a path as it was given: older runs recorded it so)
        earlier.update({k: _canonical(earlier[k]) for k in PATH_FLAGS if k in earlier})
        differ = sorted(k for k in {*config, *earlier} if config.get(k) != earlier.get(k))
        if differ:
            parser.error(f"--resume: --out {str(args.out)!r} holds a run with other settings ({', '.join(differ)}); "
                         "rerun it with the same ones, or pass a new --out")
        return
    if args.out.exists():
        shutil.rmtree(args.out)  # check_output_folder allowed it: an earlier run's outputs, --overwrite
    args.out.mkdir(parents=True)
    mark_folder(args.out, OUTPUTS)  # what a run may write: an unfinished run is recognised too
    atomic_write_bytes(manifest, (json.dumps(config, indent=2) + "\n").encode())


def _generate(run, method: str, names: list[str], seed: int):
    """``(prompt length, sequences, stats)`` of one batch of ``method``, torch seeded with ``seed`` first."""
    torch.manual_seed(seed)
    ids, mask = prompt_batch(run.subject, names)
    device = run.subject.model.device
    return ids.shape[1], *generate_images(run.subject, ids.to(device), method, **run.settings,
                                          attention_mask=None if mask is None else mask.to(device),
                                          **(run.knobs if "phrase" in verifiers_of(method, {}) else {}))


def _record(out: Path, method: str, first: int, latency: bool) -> Path:
    return out / "records" / method / f"{'latency' if latency else 'batch'}-{first:06d}.pt"


def _run_item(run, method: str, first: int, size: int, latency: bool) -> None:
    """Generate (and score) the images ``first .. first + size - 1`` of ``method``; write their record last."""
    names, seed = run.prompts[first:first + size], run.args.seed + first
    length, sequences, stats = _generate(run, method, names, seed)  # every method's batch `first`: one seed
    record = {"stats": stats, "seed": seed, "first": first}
    if not latency:
        images = decode_images(run.subject, sequences, length)
        if run.scorer is not None:
            record.update(run.scorer.score(sequences[:, length:], names))
        if run.fid is not None:
            record["fid_features"] = run.fid(images)  # [size, D]
        if run.clip is not None:
            record["clip_score"] = run.clip(images, names)
        for i, image in enumerate(images or ()):
            if run.args.save_images or first + i < GRID:
                save_png(image, run.args.out / "images" / method / f"{first + i:05d}.png",
                         {"prompt": names[i], "seed": str(seed), "method": method, "index": str(first + i)})
    buffer = io.BytesIO()
    torch.save(record, buffer)
    atomic_write_bytes(_record(run.args.out, method, first, latency), buffer.getvalue())


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    import transformers
    from tqdm.auto import tqdm

    import hf_sjd
    from ..quality import ClipScorer, FidFeatures, Frechet, ReferenceScorer, frechet_distance, reference_features
    from . import report

    methods, device, prompts = _validate(parser, args)
    state = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under `accelerate launch`: one process per GPU
        from accelerate import PartialState

        state = PartialState(cpu=device.type == "cpu")
        device = state.device
        state.wait_for_everyone()  # every process has checked --out before the main one writes it
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:  # before the model: a missing weight or a network of the wrong kind stops the run before any image
        clip = ClipScorer(args.clip_model, device) if args.clip_model else None
        fid = FidFeatures(args.fid_features or "inception", device) if args.fid_reference else None
    except ValueError as error:
        parser.error(str(error))
    subject, classifier, methods = _load(parser, args, methods, prompts, device)
    hf_sjd.enable(subject.model).to(device)
    prompts, knobs = _check_loaded(parser, args, subject, methods, prompts)
    config = {k: _canonical(v) if k in PATH_FLAGS else v for k, v in vars(args).items() if k not in UNRECORDED}
    config.update(methods=methods, prompts=prompts, device=device.type, model_family=getattr(subject, "family",
                                                                                              "reference"))
    main = state is None or state.is_main_process
    reference = None
    if main:
        try:  # computed once per (reference images, feature network), then read from --fid-cache
            reference = reference_features(args.fid_reference, fid, args.fid_cache, args.quiet) if fid else None
        except ValueError as error:
            parser.error(str(error))
        _prepare(parser, args, config)
    if state is not None:
        state.wait_for_everyone()
    scorer = ReferenceScorer(subject, classifier) if classifier is not None else None
    run = SimpleNamespace(args=args, subject=subject, prompts=prompts, knobs=knobs, scorer=scorer, fid=fid, clip=clip,
                          settings={"top_k": args.top_k, "guidance_scale": args.guidance_scale,
                                    "window": None if args.window == "auto" else args.window})
    batches = range(0, args.num_images, args.batch_size)
    one = range(min(args.latency_images, args.num_images)) if args.batch_size > 1 else ()
    work = [(m, first, min(args.batch_size, args.num_images - first), False) for first in batches for m in methods]
    work += [(m, i, 1, True) for i in one for m in methods]  # batch-major: slow drifts hit every method alike
    rank, count = (state.process_index, state.num_processes) if state is not None else (0, 1)
    todo = [w for w in work[rank::count] if not _record(args.out, w[0], w[1], w[3]).exists()]
    for method in methods:  # untimed: a method's first forwards pay for allocations and kernels,
        for size in sorted({size for timed, _, size, _ in todo if timed == method}):
            # and "auto" calibrates at its first call per batch size (each this process times, no other)
            _generate(run, method, prompts[:size], args.seed)
    started = time.perf_counter()
    for item in tqdm(todo, desc=f"bench (process {rank})" if count > 1 else "bench", unit="batch",
                     disable=args.quiet, position=rank):
        _run_item(run, *item)
    if state is not None:
        state.wait_for_everyone()
        state.destroy_process_group()  # before exiting: a worker leaving gloo up can abort the main process
    if not main:
        return 0

    def records(method, firsts, latency=False):
        return [torch.load(_record(args.out, method, i, latency), weights_only=True) for i in firsts]

    baseline = "ar" if "ar" in methods else methods[0]
    distances, floor = {"fid": ("fid_features", Frechet(reference, device))} if reference is not None else {}, None
    if scorer is not None:
        try:  # the reference photos behind the real crops come with scikit-image (pip install hf_sjd[bench])
            heldout = scorer.heldout(prompts)
            floor = frechet_distance(scorer.real_features(prompts, args.seed), heldout)
            distances["fd_ref"] = ("features", lambda features: frechet_distance(features, heldout))
        except ImportError:
            _note("no FD-ref column: the reference model's held-out photos come with scikit-image, which is not "
                  "installed (pip install 'hf_sjd[bench]')")
    rows = report.summarise({m: records(m, batches) for m in methods}, {m: records(m, one, True) for m in methods},
                            baseline, distances, args.bootstrap, min(args.batch_size, args.num_images))
    environment = {"torch": torch.__version__, "transformers": transformers.__version__, "hf_sjd": hf_sjd.__version__,
                   "processes": count}
    results = {"schema_version": 2, "command": command, "note": COMPRESSION_VS_TIME, "config": config,
               "baseline": baseline, "environment": environment,
               "fd_ref_floor": floor, "seconds": time.perf_counter() - started, "methods": rows}
    text = report.markdown(results)
    atomic_write_bytes(args.out / "results.json", (json.dumps(results, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "results.csv", report.table_csv(rows))
    atomic_write_bytes(args.out / "results.md", text.encode())
    try:
        figure = report.plot(results)
    except ImportError:
        figure = _note("no plot.png: matplotlib is not installed (pip install 'hf_sjd[bench]')")
    if figure is not None:
        atomic_write_bytes(args.out / "plot.png", figure)
    mark_folder(args.out)  # the finished run's files, each of them
    print(text)
    return 0
