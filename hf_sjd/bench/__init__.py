"""``hf-sjd bench``: each method on your model, same prompts and seed, in one paired table.

    hf-sjd bench                                      # the reference model: ar and every strategy, 16 images each
    hf-sjd bench --methods ar,sjd --num-images 2      # exactly 2 images per method, 4 in all
    hf-sjd bench --model BAAI/Emu3-Gen-hf --methods ar,sjd,mc-sjd --prompts "a red apple,a cat" --device cuda

``--num-images`` counts each method's images; prompts are cycled over them and every method starts from
``--seed``, so image i of every method has the same prompt and seed. A Jacobi method runs the pinned cell
``jacobi_window=--window, jacobi_siblings=0``. Columns: step compression (new tokens per image / forwards per
generate call), wall seconds, speed-up over ``ar`` in the same run (its seconds / the method's), acceptance
(accepted / verified drafts), loop overhead (wall time outside forwards); on the reference layout with its
classifier also class accuracy and FD-ref (Frechet distance of classifier features to held-out real crops of the
same classes, with the real-vs-real floor at the same sample size).

``--out`` (checked first, replaced as a whole: an earlier run's needs ``--overwrite``) gets ``results.json``,
``results.csv``, ``results.md`` and ``<method>/<prompt>-<i>.png``. The study suites (frontier, vp, pv,
verifiers, library, loop cost, GPU latency) are not in the package: ``python -m benchmarks`` from a checkout.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import time
from pathlib import Path

import torch

from ..checks import check_float, check_int
from ..files import atomic_folder, atomic_write_bytes, check_output_folder
from ..sampling import COMPRESSION_VS_TIME, parse_methods, registered_methods, run_method, verifiers_of

#: flags of the study suites (``benchmarks/``): refused here with a message saying where they live
STUDY_FLAGS = ("--suite", "--sections", "--seeds", "--images-per-prompt", "--prompt-dataset", "--prompt-column",
               "--prompt-split", "--max-prompts", "--prompt-lookup-tokens", "--ablation-corpus-images",
               "--library-tokens", "--library-merges", "--cpu")
#: a method's results -> (table label, format); every key goes to results.csv, those set to results.md
COLUMNS = {"num_images": ("images", "{}"), "num_forward_passes": (None, "{}"),
           "step_compression": ("step compression", "{:.2f}"), "seconds": ("wall s", "{:.1f}"),
           "speedup_vs_ar": ("speed-up vs ar", "{:.2f}x"), "acceptance_rate": ("acceptance", "{:.2f}"),
           "loop_overhead": ("loop overhead", "{:.0%}"), "class_accuracy": ("class acc", "{:.2f}"),
           "fd_ref": ("FD-ref", "{:.1f}")}


class _StudyFlag(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} belongs to the study suites, which are not part of the package: from a "
                     f"checkout of the repository run `python -m benchmarks SUITE {option_string} ...` (see "
                     "benchmarks/README.md). hf-sjd bench takes --methods, --num-images (per method), --prompts, "
                     "--seed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="folder laid out like the shipped reference weights (default: them), or a folder / Hub "
                             "id of a supported checkpoint (Emu3, Janus, Chameleon / Lumina-mGPT, LlamaGen-style)")
    parser.add_argument("--methods", default=None, help="comma-separated: 'ar' and registered strategies (default: "
                                                        "all on the reference model; ar,sjd,mc-sjd on a checkpoint)")
    parser.add_argument("--num-images", type=int, default=16, help="images per method, in total")
    parser.add_argument("--batch-size", type=int, default=8, help="images per generate call")
    parser.add_argument("--guidance-scale", type=float, default=1.0, help="classifier-free guidance (1: none)")
    parser.add_argument("--top-k", type=int, default=100, help="in [1, the model's drafted image tokens]")
    parser.add_argument("--prompts", default="all", help="comma-separated, cycled over the images; 'all': the "
                        "reference classes ('a photo of a coffee', ... for a checkpoint)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed each method starts from")
    parser.add_argument("--window", type=int, default=16, help="jacobi_window of the Jacobi methods")
    parser.add_argument("--phrase-library", default=None, help="phrase library (folder or Hub id) of the phrase-"
                                                               "verification methods (default: the model's own)")
    parser.add_argument("--image-size", type=int, default=None, help="side in px of a checkpoint's images")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda where available)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="weights of a checkpoint")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier run's --out as a whole")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    for flag in STUDY_FLAGS:
        parser.add_argument(flag, nargs="?", action=_StudyFlag, help=argparse.SUPPRESS)


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str] | None, torch.device]:
    """Every check that needs no model, before any work (exit 2 naming the flag): ``(methods or None, device)``."""
    try:
        methods = None if args.methods is None else parse_methods("--methods", args.methods)
        for name in ("num_images", "batch_size", "top_k", "window", "image_size", "threads"):
            check_int(f"--{name.replace('_', '-')}", getattr(args, name), minimum=1,
                      allow_none=name in ("image_size", "threads"))
        check_int("--seed", args.seed, minimum=0, maximum=2**63 - 1)
        check_float("--guidance-scale", args.guidance_scale, minimum=0.0)
        check_output_folder(args.out, args.overwrite)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        device = torch.device("meta")  # refused just below
    if device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
        parser.error(f"--device {args.device!r}: allowed values: cpu, cuda, cuda:N (CUDA where it is available)")
    return methods, device


def _load(parser, args, methods, device):
    """``(subject, classifier or None, methods)``; a checkpoint is checked from its config before its weights."""
    from ..reference import CLASS_NAMES, load, load_classifier, weights_dir
    from .subjects import check_methods, is_reference_layout, load_checkpoint

    try:
        if not is_reference_layout(args.model):
            family, loader = load_checkpoint(args.model, args.image_size, getattr(torch, args.dtype))
            reason = check_methods(family, set(methods or ()))
            if reason:
                parser.error(f"--model {args.model}: {reason}; choose other --methods")
            default = [m for m in ("ar", "sjd", "mc-sjd") if not check_methods(family, {m})]
            return loader(), None, methods or default
    except ValueError as error:
        parser.error(str(error))
    if args.image_size is not None:
        parser.error("--image-size applies to a --model checkpoint; the reference layout generates 64 px only")
    named = [p.strip() for p in args.prompts.split(",") if p.strip()] if args.prompts != "all" else CLASS_NAMES
    unknown = [p for p in named if p not in CLASS_NAMES]
    if unknown or not named:
        parser.error(f"--prompts: unknown prompt(s) {unknown}; the reference model knows only: "
                     f"{', '.join(CLASS_NAMES)}")
    try:
        subject = load(args.model)
    except (OSError, ValueError) as error:
        parser.error(f"--model: cannot load a reference-layout model from {args.model!r}: {error}")
    root = Path(args.model) if args.model else weights_dir()
    classifier = load_classifier(args.model).to(device) if (root / "classifier" / "config.json").exists() else None
    subject.vq.to(device)
    return subject, classifier, methods or registered_methods()


def _check_loaded(parser, args, subject, methods) -> tuple[list[str], dict]:
    """The checks that need the model, before any generation: ``(each image's prompt, phrase-library knobs)``."""
    import hf_sjd
    from ..reference import CLASS_NAMES

    prompts = [p.strip() for p in args.prompts.split(",") if p.strip()] if args.prompts != "all" else (
        subject.default_prompts() if hasattr(subject, "default_prompts") else list(CLASS_NAMES))
    try:
        if hasattr(subject, "prompt_inputs"):
            subject.prompt_inputs(prompts)  # a LlamaGen-style checkpoint knows only its condition names
    except ValueError as error:
        parser.error(f"--prompts: {error}")
    codes = subject.draft_token_ids.numel()
    if not 1 <= args.top_k <= codes:
        parser.error(f"--top-k must be in [1, {codes}] (the model's drafted image tokens), got {args.top_k}")
    phrase = [m for m in methods if "phrase" in verifiers_of(m, {})]
    if args.phrase_library is not None and not phrase:
        parser.error("--phrase-library is read only by phrase-verification methods; none of --methods is one")
    if args.phrase_library is not None:
        vq = getattr(subject, "vq", None)
        fingerprint = getattr(subject.model.sjd_adapter, "tokenizer_fingerprint", None) or (vq and vq.fingerprint())
        try:
            return [prompts[i % len(prompts)] for i in range(args.num_images)], {
                "phrase_library": hf_sjd.PhraseLibrary.from_pretrained(
                    args.phrase_library, fingerprint=fingerprint, codebook_size=vq.codebook_size if vq else codes)}
        except (OSError, ValueError) as error:
            parser.error(f"--phrase-library {args.phrase_library!r}: {error}")
    if phrase and subject.model.sjd_adapter.default_phrase_library is None:
        parser.error(f"--phrase-library: {', '.join(phrase)} verify phrases and --model {args.model} has no default "
                     "phrase library; pass one (hf-sjd build-phrases --model ... builds it) or other --methods")
    return [prompts[i % len(prompts)] for i in range(args.num_images)], {}


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    import transformers

    import hf_sjd
    from ..quality import ReferenceScorer, frechet_distance
    from ..sampling import decode_images, save_png

    methods, device = _validate(parser, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    subject, classifier, methods = _load(parser, args, methods, device)
    hf_sjd.enable(subject.model).to(device)
    prompts, knobs = _check_loaded(parser, args, subject, methods)
    scorer = ReferenceScorer(subject, classifier) if classifier is not None else None
    rows, features, started = {}, {}, time.perf_counter()
    with atomic_folder(args.out, mark=True) as out:  # the whole run appears at once, replacing any earlier one
        for method in methods:
            scores = features[method] = {"features": [], "correct": []}

            def on_batch(first, sequences, prompt_length, method=method, scores=scores):
                names = prompts[first:first + len(sequences)]
                for i, image in enumerate(decode_images(subject, sequences, prompt_length) or ()):
                    save_png(image, out / method / f"{names[i].replace('/', '_')}-{first + i}.png")
                for key, values in (scorer.score(sequences[:, prompt_length:], names) if scorer else {}).items():
                    scores[key] += values

            rows[method] = run_method(subject, prompts, method, args.batch_size, args.seed, on_batch, args.quiet,
                                      top_k=args.top_k, guidance_scale=args.guidance_scale, window=args.window,
                                      **(knobs if "phrase" in verifiers_of(method, {}) else {}))
        heldout = floor = None
        try:  # the reference photos behind the real crops come with scikit-image (pip install hf_sjd[bench])
            heldout = scorer.heldout(prompts) if scorer else None
            floor = frechet_distance(scorer.real_features(prompts, args.seed), heldout) if scorer else None
        except ImportError:
            pass
        for method, row in rows.items():
            row["speedup_vs_ar"] = rows["ar"]["seconds"] / row["seconds"] if "ar" in rows else None
            correct = features[method]["correct"]
            row["class_accuracy"] = sum(correct) / len(correct) if correct else None
            row["fd_ref"] = frechet_distance(features[method]["features"], heldout) if heldout is not None else None
        results = {"schema_version": 1, "command": command, "note": COMPRESSION_VS_TIME,
                   "config": {"model": args.model, "model_family": getattr(subject, "family", "reference"),
                              "methods": methods, "num_images": args.num_images, "prompts": sorted(set(prompts)),
                              "batch_size": args.batch_size, "guidance_scale": args.guidance_scale,
                              "top_k": args.top_k, "seed": args.seed, "window": args.window, "device": str(device),
                              "threads": torch.get_num_threads()},
                   "environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                                   "hf_sjd": hf_sjd.__version__},
                   "fd_ref_floor": floor, "seconds": time.perf_counter() - started, "methods": rows}
        text = markdown(results)
        atomic_write_bytes(out / "results.json", (json.dumps(results, indent=2) + "\n").encode())
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, ["method", *COLUMNS], extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows({"method": method, **row} for method, row in rows.items())
        atomic_write_bytes(out / "results.csv", buffer.getvalue().encode())
        atomic_write_bytes(out / "results.md", text.encode())
    print(text)
    return 0


def markdown(results: dict) -> str:
    """The paired table: a column per :data:`COLUMNS` entry with a label that some method fills."""
    config, rows = results["config"], results["methods"]
    columns = [c for c, (label, _) in COLUMNS.items() if label and any(r.get(c) is not None for r in rows.values())]
    lines = [f"# `{results['command']}`", "",
             f"{config['num_images']} images per method ({len(config['prompts'])} prompts cycled), batch "
             f"{config['batch_size']}, top-k {config['top_k']}, CFG {config['guidance_scale']:g}, window "
             f"{config['window']}, seed {config['seed']}, {config['device']}, {config['threads']} thread(s); "
             f"model: {config['model'] or 'the shipped reference model'}.", "",
             "| method | " + " | ".join(COLUMNS[c][0] for c in columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {method} | " + " | ".join("-" if row.get(c) is None else COLUMNS[c][1].format(row[c])
                                            for c in columns) + " |" for method, row in rows.items()]
    lines += ["", results["note"]] + (["Add `ar` to --methods for the speed-up column."] if "ar" not in rows else [])
    if results["fd_ref_floor"] is not None:
        lines.append(f"FD-ref of {config['num_images']} real crops against the held-out ones (the floor at this "
                     f"sample size): {results['fd_ref_floor']:.1f}.")
    return "\n".join(lines) + "\n"
