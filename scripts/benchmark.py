#!/usr/bin/env python
"""Benchmark Jacobi strategies against vanilla sampling on the shipped reference model (CPU metrics).

For each (batch size, guidance scale) setting, every method samples the same prompts with the same
seeds. Reported per method: forwards (NFE), step compression (new tokens per row / forwards), the
tokens-per-forward histogram, seconds per image, and loop overhead (time outside model forwards).
Paired differences of per-image step compression against ``--baseline`` come with their standard error.

    python scripts/benchmark.py --methods ar,sjd,mc-sjd --batch-sizes 1,8 --guidance-scales 1,3 \
        --num-images 16 --out docs/results/core.md

On CPU a 17-token forward costs about twice a 1-token forward, so wall-clock speedups need a GPU; the
CPU metrics are step compression and loop overhead.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

import hf_sjd
from hf_sjd.files import atomic_write_bytes
from hf_sjd.reference import CLASS_NAMES, load
from hf_sjd.sampling import generate_images, merge_stats, registered_methods


def run_setting(reference, method: str, batch_size: int, guidance_scale: float, num_images: int, top_k: int,
                window: int, seed: int, progress) -> tuple[dict, list[float]]:
    """All images of one setting; returns (merged stats, per-batch step compression)."""
    parts = []
    for start in range(0, num_images, batch_size):
        names = [CLASS_NAMES[(start + i) % len(CLASS_NAMES)] for i in range(min(batch_size, num_images - start))]
        torch.manual_seed(seed + start)  # paired across methods: same prompts, same seed per batch
        _, stats = generate_images(reference, reference.prompt_ids(names), method, top_k, guidance_scale, window)
        parts.append(stats)
        progress.update(len(names))
    return merge_stats(parts), [p["step_compression"] for p in parts]


def paired(values: list[float], base: list[float]) -> str:
    diffs = [a - b for a, b in zip(values, base)]
    if len(diffs) < 2:
        return "n/a"
    mean = sum(diffs) / len(diffs)
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    return f"{mean:+.2f} ± {se:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="ar,sjd,mc-sjd")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--guidance-scales", default="1,3")
    parser.add_argument("--num-images", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", default="sjd", help="method the paired differences are taken against")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown table (+ .json) here")
    args = parser.parse_args()
    methods = args.methods.split(",")
    unknown = set(methods) - set(registered_methods())
    if unknown:
        parser.error(f"--methods: unknown {sorted(unknown)}; registered: {', '.join(registered_methods())}")
    torch.set_num_threads(args.threads)
    reference = load()
    hf_sjd.enable(reference.model)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    scales = [float(g) for g in args.guidance_scales.split(",")]

    rows, results = [], {}
    progress = tqdm(total=len(methods) * len(batch_sizes) * len(scales) * args.num_images, unit="image")
    for batch_size in batch_sizes:
        for scale in scales:
            per_batch = {}
            for method in methods:
                stats, per_batch[method] = run_setting(reference, method, batch_size, scale, args.num_images,
                                                       args.top_k, args.window, args.seed, progress)
                results[f"{method}/b{batch_size}/g{scale:g}"] = stats
            for method in methods:
                stats = results[f"{method}/b{batch_size}/g{scale:g}"]
                base = per_batch.get(args.baseline)
                diff = paired(per_batch[method], base) if base and method != args.baseline and method != "ar" else ""
                hist = stats.get("tokens_per_forward")
                rows.append(f"| {method} | {batch_size} | {scale:g} | {stats['num_forward_passes']} | "
                            f"{stats['step_compression']:.2f} | {diff} | "
                            f"{stats.get('acceptance_rate', float('nan')):.2f} | {stats['seconds_per_image']:.3f} | "
                            f"{100 * stats['loop_overhead']:.1f}% | {hist_summary(hist)} |")
    progress.close()
    command = "python " + " ".join(sys.argv)
    table = "\n".join([
        f"Command: `{command}` (top-k {args.top_k}, window {args.window}, {args.num_images} images per setting, "
        f"torch threads {args.threads})", "",
        f"| method | batch | CFG | forwards | step compression | paired diff vs {args.baseline} (± SE) | "
        "acceptance | s/image | loop overhead | tokens/forward histogram (1,2,3,...) |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, ""])
    print(table)
    if args.out:
        atomic_write_bytes(args.out, table.encode())
        atomic_write_bytes(args.out.with_suffix(".json"), (json.dumps(results, indent=2) + "\n").encode())


def hist_summary(hist: list[int] | None) -> str:
    if not hist:
        return ""
    total = sum(hist)
    last = max(i for i, c in enumerate(hist) if c) if total else 0
    return " ".join(f"{100 * c / total:.0f}" for c in hist[1:last + 1]) + " %"


if __name__ == "__main__":
    main()
