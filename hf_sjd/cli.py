"""``hf-sjd`` command line (also ``python -m hf_sjd``).

    hf-sjd generate "coffee" --num-images 4 --method ar,sjd --out out/ [--overwrite] [--seed 0] [--top-k 100]
                   [--guidance-scale 3.0] [--window auto|16] [--model DIR] [--device cpu|cuda] [--threads N]
    hf-sjd bench [--model DIR_OR_HUB_ID] [--methods ar,sjd] [--num-images 16] --out DIR  (see hf_sjd/bench/)
    hf-sjd build-phrases --model DIR_OR_HUB_ID --dataset ... --out LIBRARY/      (see hf_sjd/phrase_builder.py)

``generate``: :data:`GENERATE_HELP`, each summary line with its speed-up over ``ar`` when ``ar`` ran too; ``--out`` is
checked by :func:`hf_sjd.files.check_output_folder` and replaced by :func:`hf_sjd.files.atomic_folder`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import shlex
import signal
import sys
import threading
from pathlib import Path

import torch

from .checks import check_device, check_float, check_int, check_window
from .files import atomic_folder, atomic_write_bytes, check_output_folder
from .sampling import (COMPRESSION_VS_TIME, check_window_of, generate_images, merge_stats, parse_methods,
                       save_png, verifiers_of)


def validate_plain_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Every check that needs no model (run before it is loaded); returns the methods."""
    try:
        check_output_folder(args.out, args.overwrite)
        methods = parse_methods("--method", args.method)
        for flag in ("num_images", "batch_size", "top_k"):  # --top-k's upper bound: the model's codes, later
            check_int(f"--{flag.replace('_', '-')}", getattr(args, flag), minimum=1)
        check_int("--seed", args.seed, minimum=0, maximum=2**63 - 1)
        args.window = check_window("--window", args.window, minimum=0)  # a huge window is fine: generate clamps it
        check_window_of("--window", methods, args.window)
        check_float("--guidance-scale", args.guidance_scale, minimum=0.0)
        check_int("--threads", args.threads, minimum=1, allow_none=True)
        args.device = check_device("--device", args.device)
    except (TypeError, ValueError) as error:
        parser.error(str(error))  # usage + message, exit status 2
    return methods


def cmd_generate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import hf_sjd
    from hf_sjd.bench.subjects import default_phrase_library, load_reference_model
    from hf_sjd.reference import CONDITIONS

    methods = validate_plain_args(parser, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.prompt not in CONDITIONS:  # every reference-layout model has the reference classes
        parser.error(f"unknown prompt {args.prompt!r}; known prompts: {', '.join(sorted(CONDITIONS))}")
    reference = load_reference_model(parser, args.model)
    hf_sjd.enable(reference.model).to(args.device)
    reference.vq.to(args.device)
    phrase = [method for method in methods if "phrase" in verifiers_of(method, {})]
    if phrase and default_phrase_library(parser, reference, args.model) is None:
        parser.error(f"--method: {', '.join(phrase)} verify phrases and --model {args.model} has no phrase library "
                     "(hf-sjd build-phrases --model ... builds one)")
    codes = reference.draft_token_ids.numel()
    if not 1 <= args.top_k <= codes:
        parser.error(f"--top-k must be in [1, {codes}] (the model's drafted image tokens), got {args.top_k}")
    with atomic_folder(args.out, mark=True) as out:  # the whole run appears at once, replacing any earlier one
        report = _generate(args, reference, methods, out)
        atomic_write_bytes(out / "stats.json", (json.dumps(report, indent=2) + "\n").encode())
    return 0


def _generate(args: argparse.Namespace, reference, methods: list[str], out: Path) -> dict:
    from tqdm.auto import tqdm

    def generate(method: str, batch: int):
        return generate_images(reference, reference.prompt_ids([args.prompt] * batch).to(args.device), method,
                               args.top_k, args.guidance_scale, None if args.window == "auto" else args.window)

    # untimed, once per method and batch size: "auto" calibrates at its first call (hf_sjd.calibration), and a first
    # call on a GPU starts its context and kernels, which would be timed against whichever method ran first
    for method in methods:
        for batch in sorted({min(args.batch_size, args.num_images), args.num_images % args.batch_size
                             or args.batch_size}):
            generate(method, batch)
    all_stats = {}
    for method in methods:
        torch.manual_seed(args.seed)  # every method sees the same seed for the same images
        parts = []
        with tqdm(total=args.num_images, desc=method, unit="image", disable=args.quiet) as progress:
            for first in range(0, args.num_images, args.batch_size):
                sequences, stats = generate(method, min(args.batch_size, args.num_images - first))
                for i, image in enumerate(reference.decode(sequences)):
                    save_png(image, out / method / f"{args.prompt}-{first + i}.png")
                parts.append(stats)
                progress.update(len(sequences))
        all_stats[method] = merge_stats(parts)
    for method, stats in all_stats.items():
        speedup = ""
        if "ar" in all_stats and method != "ar":
            stats["speedup_vs_ar"] = all_stats["ar"]["seconds"] / stats["seconds"]
            speedup = f", {stats['speedup_vs_ar']:.2f}x the speed of ar"
        print(f"{method}: {stats['num_images']} images, {stats['num_new_tokens']} tokens, "
              f"{stats['num_forward_passes']} forwards{_what_ran(stats, args.window)}, step compression "
              f"{stats['step_compression']:.2f}x, {stats['seconds']:.1f} s ({stats['seconds_per_image']:.2f} "
              f"s/image{speedup}), loop overhead {100 * stats['loop_overhead']:.0f}%")
    if any(method != "ar" for method in methods):
        print(COMPRESSION_VS_TIME)
    return {"prompt": args.prompt, "device": str(args.device), "seed": args.seed, "top_k": args.top_k,
            "guidance_scale": args.guidance_scale, "window": args.window, "batch_size": args.batch_size,
            "methods": all_stats}


def _what_ran(stats: dict, window: int | str) -> str:
    """The full batch's window the calls ran (the cell ``"auto"`` picked; capped by the image's tokens), or plain
    decoding; nothing for ``ar``."""
    windows = stats.get("windows")
    if not windows:
        return ""
    if any(windows):
        return f" (window{'s' if len(windows) > 1 else ''} {', '.join(map(str, windows))})"
    return " (plain decoding" + (": no window was cheaper per token on this machine)" if window == "auto" else ")")


GENERATE_HELP = ("Sample images of a reference class with each --method from the reference model (or --model, a folder "
                 "laid out like it); writes OUT/<method>/<prompt>-<i>.png and OUT/stats.json and prints one summary "
                 "line per method. Bad input exits with status 2 naming the flag, before any work; --out is replaced "
                 "as a whole at the end, so an interrupted run leaves the previous one as it was.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-sjd", description="Speculative Jacobi decoding for AR image models")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="sample images from the reference model with one or more methods",
                         description=GENERATE_HELP)
    gen.add_argument("prompt", help="a reference class name, e.g. coffee")
    gen.add_argument("--num-images", type=int, default=4, help="images per method (default: %(default)s)")
    gen.add_argument("--method", default="ar",
                     help="comma-separated; 'ar' (transformers' generate) or a registered strategy (default: "
                          "%(default)s)")
    gen.add_argument("--out", type=Path, default=Path("out"),
                     help="output folder (must be empty, or --overwrite; default: %(default)s)")
    gen.add_argument("--overwrite", action="store_true",
                     help="replace a non-empty --out as a whole (its old contents are deleted)")
    gen.add_argument("--seed", type=int, default=0, help="torch seed, set before each method (default: %(default)s)")
    gen.add_argument("--top-k", type=int, default=100, help="top-k sampling (default: %(default)s)")
    gen.add_argument("--guidance-scale", type=float, default=1.0,
                     help="classifier-free guidance; 1: none (default: %(default)s)")
    gen.add_argument("--window", default="auto", help="drafts per forward (an integer >= 0: that window, no "
                     "siblings), or 'auto': each strategy as generate runs it, its cell picked from this machine's "
                     "measured forward costs (default)")
    gen.add_argument("--batch-size", type=int, default=8, help="images per generate call (default: %(default)s)")
    gen.add_argument("--model", default=None, help="folder laid out like the shipped reference weights")
    gen.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda where available)")
    gen.add_argument("--threads", type=int, default=None, help="torch CPU threads (>= 1; default: torch's choice)")
    gen.add_argument("--quiet", action="store_true", help="no progress bars")
    gen.set_defaults(handler=cmd_generate)
    # tools: a module with add_arguments(parser) and run(parser, args, command=...)
    tools = (("bench", "bench", "each method on your model, same prompts and seed: step compression, wall time, "
                                "speed-up over ar, acceptance (+ FD-ref / class accuracy on the reference model)"),
             ("build-phrases", "phrase_builder", "build an SJD-PV phrase library with a model's own VQ tokenizer "
                                                 "(Emu3, Janus, Lumina-mGPT/Chameleon, the reference model)"))
    for name, module_name, summary in tools:
        module = importlib.import_module(f"{__package__}.{module_name}")
        tool = sub.add_parser(name, help=summary, description=module.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(tool)
        tool.set_defaults(handler=functools.partial(_run_tool, module))
    return parser


def _run_tool(module, parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    return module.run(parser, args, command=shlex.join(["hf-sjd", *args.argv]))  # written into their results


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # recorded by `bench` as the command line
    sub = parser._subparsers._group_actions[0].choices[args.command]
    with _terminate_as_exit():
        return args.handler(sub, args)


@contextlib.contextmanager
def _terminate_as_exit():
    """SIGTERM (``kill``, ``timeout``, a job scheduler) raised as ``SystemExit(143)`` while a command runs, so its
    cleanup runs as on Ctrl-C: nothing partial is left on disk. The main thread only (where signals are handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
