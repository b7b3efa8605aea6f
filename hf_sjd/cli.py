"""``hf-sjd`` command line (also ``python -m hf_sjd``).

    hf-sjd generate "coffee" --num-images 4 --method ar,sjd --out out/ [--seed 0] [--top-k 100]
                   [--guidance-scale 3.0] [--window 16] [--model DIR]
    hf-sjd bench --methods ar,sjd,mc-sjd --prompts all --seeds 0,1 --out results/   (see hf_sjd/bench.py)

Writes ``OUT/<method>/<prompt>-<i>.png`` and ``OUT/stats.json`` and prints one summary line per method.
Every input is validated before any model work or any write; files are written to a temporary name and
renamed, so an interrupted run never leaves a half-written file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from .files import atomic_write_bytes
from .sampling import generate_images, merge_stats, registered_methods


def save_png(image, path: Path) -> None:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())


def _fail(parser: argparse.ArgumentParser, message: str) -> None:
    parser.error(message)  # prints usage + message, exits with status 2


def validate_generate_args(parser, args, reference) -> tuple[list[str], torch.Tensor]:
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    known = registered_methods()
    unknown = [m for m in methods if m not in known]
    if not methods or unknown:
        _fail(parser, f"--method: unknown method(s) {unknown or [args.method]}; registered: {', '.join(known)}")
    if args.prompt not in reference.conditions:
        _fail(parser, f"unknown prompt {args.prompt!r}; known prompts: {', '.join(sorted(reference.conditions))}")
    if args.num_images <= 0:
        _fail(parser, f"--num-images must be >= 1, got {args.num_images}")
    if args.batch_size <= 0:
        _fail(parser, f"--batch-size must be >= 1, got {args.batch_size}")
    codebook = reference.draft_token_ids.numel()
    if not 1 <= args.top_k <= codebook:
        _fail(parser, f"--top-k must be in [1, {codebook}] (the codebook size), got {args.top_k}")
    if args.window < 1:
        _fail(parser, f"--window must be >= 1, got {args.window}")
    if args.guidance_scale < 0:
        _fail(parser, f"--guidance-scale must be >= 0, got {args.guidance_scale}")
    try:  # the output folder must be writable before any work starts
        args.out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=args.out):
            pass
    except OSError as error:
        _fail(parser, f"--out {str(args.out)!r} is not writable: {error.strerror or error}")
    return methods, reference.prompt_ids([args.prompt])


def cmd_generate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    import hf_sjd
    from hf_sjd.reference import load

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        reference = load(args.model)
    except (OSError, ValueError) as error:
        _fail(parser, f"--model: cannot load a reference-layout model from {args.model!r}: {error}")
    hf_sjd.enable(reference.model)
    methods, prompt_ids = validate_generate_args(parser, args, reference)
    all_stats = {}
    for method in methods:
        torch.manual_seed(args.seed)  # every method sees the same seed
        parts, index = [], 0
        progress = tqdm(total=args.num_images, desc=method, unit="image", disable=args.quiet)
        while index < args.num_images:
            batch = min(args.batch_size, args.num_images - index)
            sequences, stats = generate_images(reference, prompt_ids.expand(batch, -1), method, args.top_k,
                                               args.guidance_scale, args.window)
            for image in reference.decode(sequences):
                save_png(image, args.out / method / f"{args.prompt}-{index}.png")
                index += 1
            parts.append(stats)
            progress.update(batch)
        progress.close()
        stats = merge_stats(parts)
        all_stats[method] = stats
        print(f"{method}: {stats['num_images']} images, {stats['num_new_tokens']} tokens, "
              f"{stats['num_forward_passes']} forwards, step compression {stats['step_compression']:.2f}x, "
              f"{stats['seconds']:.1f} s ({stats['seconds_per_image']:.2f} s/image), "
              f"loop overhead {100 * stats['loop_overhead']:.0f}%")
    report = {"prompt": args.prompt, "seed": args.seed, "top_k": args.top_k, "guidance_scale": args.guidance_scale,
              "window": args.window, "batch_size": args.batch_size, "methods": all_stats}
    atomic_write_bytes(args.out / "stats.json", (json.dumps(report, indent=2) + "\n").encode())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-sjd", description="Speculative Jacobi decoding for AR image models")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="sample images from the reference model with one or more methods",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompt", help="a reference class name, e.g. coffee")
    gen.add_argument("--num-images", type=int, default=4)
    gen.add_argument("--method", default="ar",
                     help="comma-separated; 'ar' (transformers' generate) or a registered strategy")
    gen.add_argument("--out", type=Path, default=Path("out"))
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--top-k", type=int, default=100)
    gen.add_argument("--guidance-scale", type=float, default=1.0)
    gen.add_argument("--window", type=int, default=16, help="Jacobi window (drafts per forward)")
    gen.add_argument("--batch-size", type=int, default=8)
    gen.add_argument("--model", default=None, help="folder laid out like the shipped reference weights")
    gen.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    gen.add_argument("--quiet", action="store_true", help="no progress bars")
    gen.set_defaults(handler=cmd_generate)
    from . import bench

    bench_parser = sub.add_parser("bench", help="benchmark methods on the same prompts and seeds (speed + quality)",
                                  description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(handler=cmd_bench)
    return parser


def cmd_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import shlex

    from . import bench

    return bench.run(parser, args, command=shlex.join(["hf-sjd", *args.argv]))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # recorded by `bench` as the command line
    sub = parser._subparsers._group_actions[0].choices[args.command]
    return args.handler(sub, args)


if __name__ == "__main__":
    sys.exit(main())
