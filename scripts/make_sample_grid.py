#!/usr/bin/env python
"""Sample grid of the reference model: one row per class, ``--per-class`` samples per row (PNG).

    python scripts/make_sample_grid.py --method sjd --guidance-scale 3 --out docs/samples.png
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import torch
from PIL import Image

import hf_sjd
from hf_sjd.files import atomic_write_bytes
from hf_sjd.reference import CLASS_NAMES, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="sjd")
    parser.add_argument("--per-class", type=int, default=6)
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/samples.png"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    reference = load()
    hf_sjd.enable(reference.model)
    torch.manual_seed(args.seed)
    names = [name for name in CLASS_NAMES for _ in range(args.per_class)]
    kwargs = {"do_sample": True, "top_k": args.top_k, "max_new_tokens": 256}
    if args.method != "ar":
        kwargs.update(custom_generate=args.method, guidance_scale=args.guidance_scale)
    elif args.guidance_scale != 1:
        kwargs.update(guidance_scale=args.guidance_scale, negative_prompt_ids=reference.unconditional_ids(len(names)))
    sequences = reference.model.generate(reference.prompt_ids(names), **kwargs)
    tiles = reference.decode(sequences)
    size = tiles[0].size[0]
    grid = Image.new("RGB", (size * args.per_class, size * len(CLASS_NAMES)), "white")
    for i, tile in enumerate(tiles):
        grid.paste(tile, ((i % args.per_class) * size, (i // args.per_class) * size))
    buffer = io.BytesIO()
    grid.save(buffer, format="PNG")
    atomic_write_bytes(args.out, buffer.getvalue())
    print(f"wrote {args.out}: rows = {', '.join(CLASS_NAMES)}")


if __name__ == "__main__":
    main()
