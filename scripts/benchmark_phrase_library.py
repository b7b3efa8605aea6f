#!/usr/bin/env python
"""Phrase-library build speed (SJD-PV, arXiv:2603.06666): 8000 BPE merges over a 10M-token corpus.

Tokenizing 40k images with the reference VQ tokenizer takes minutes on 2 CPU cores, so the 10M-token corpus is
sampled from a first-order Markov chain fitted to tokenized reference training images (raster order,
transition counts over 512 codes, first-token distribution from the same images). It keeps the pair
statistics BPE works on, not the 2-D structure, and every sequence is distinct (repeating a real corpus would
flatter the trainer, which deduplicates identical words). The shipped reference library (real tokens) is
timed too. Writes ``docs/results/phrase_library.md``.

    python scripts/benchmark_phrase_library.py [--tokens 10000000] [--merges 8000] [--out docs/results/phrase_library.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

from hf_sjd import PhraseLibrary, reference
from hf_sjd.reference.data import make_dataset

SEQ_LEN = reference.NUM_IMAGE_TOKENS  # 256


def fit_markov_chain(codes: torch.Tensor, num_codes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``codes`` [N, 256] -> (first-token CDF [C], transition CDFs [C, C]); unseen rows fall back to uniform."""
    first = torch.bincount(codes[:, 0], minlength=num_codes).double()
    pairs = codes[:, :-1] * num_codes + codes[:, 1:]  # [N, 255] packed (previous, next)
    transitions = torch.bincount(pairs.flatten(), minlength=num_codes * num_codes).double().view(num_codes, num_codes)
    transitions[transitions.sum(1) == 0] = 1.0
    return (first / first.sum()).cumsum(0), (transitions / transitions.sum(1, keepdim=True)).cumsum(1)


def sample_markov_chain(first_cdf: torch.Tensor, cdf: torch.Tensor, num_sequences: int, generator) -> torch.Tensor:
    """Inverse-CDF sampling, one raster position at a time for all sequences: ``[num_sequences, 256]``."""
    out = torch.empty(num_sequences, SEQ_LEN, dtype=torch.long)
    last = len(first_cdf) - 1
    out[:, 0] = torch.searchsorted(first_cdf, torch.rand(num_sequences, generator=generator, dtype=torch.double)).clamp_(max=last)
    for t in range(1, SEQ_LEN):
        u = torch.rand(num_sequences, 1, generator=generator, dtype=torch.double)
        out[:, t] = torch.searchsorted(cdf[out[:, t - 1]], u).squeeze(1).clamp_(max=last)
    return out


def timed_build(corpus: torch.Tensor, merges: int, row_length: int | None) -> tuple[float, PhraseLibrary]:
    start = time.perf_counter()
    library = PhraseLibrary.from_token_sequences(corpus, num_merges=merges, row_length=row_length,
                                                 codebook_size=reference.NUM_CODES)
    return time.perf_counter() - start, library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--merges", type=int, default=8000)
    parser.add_argument("--fit-images-per-class", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("docs/results/phrase_library.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # torch only samples; the BPE trainer uses tokenizers' own (Rayon) threads

    ref = reference.load()
    images, _ = make_dataset(args.fit_images_per_class, seed=2)  # crops like the AR training set's
    with torch.no_grad():
        real = torch.cat([ref.vq.encode(chunk).flatten(1) for chunk in images.split(256)])  # [N, 256]
    first_cdf, cdf = fit_markov_chain(real, reference.NUM_CODES)
    num_sequences = -(-args.tokens // SEQ_LEN)
    start = time.perf_counter()
    corpus = sample_markov_chain(first_cdf, cdf, num_sequences, torch.Generator().manual_seed(0))
    sample_seconds = time.perf_counter() - start
    print(f"sampled {corpus.numel():,} tokens in {sample_seconds:.1f} s")

    rows = []
    for row_length in (None, reference.GRID_SIZE):
        seconds, library = timed_build(corpus, args.merges, row_length)
        rows.append(("Markov chain fitted to reference crops", corpus.numel(), row_length, args.merges, seconds, library))
        print(rows[-1][:-1], library)
    shipped = PhraseLibrary.from_pretrained(reference.weights_dir() / "ar" / "phrases")
    meta = shipped.metadata
    rows.append(("shipped reference library (real tokens, from its metadata)", meta["corpus"]["tokens"],
                 meta["row_length"], meta["num_merges"], meta["build_seconds"], shipped))

    lines = [
        "# Phrase library build speed",
        "",
        f"`python scripts/benchmark_phrase_library.py` on {os.cpu_count()} CPU cores ({platform.machine()}), "
        f"tokenizers' Rust BPE trainer + vectorised phrase counting. Seconds = `PhraseLibrary.from_token_sequences` "
        "wall time (BPE, expansion, counts). Target: 8k merges over 10M tokens in < 2 min.",
        "",
        "| corpus | tokens | row length | merges | seconds | phrases | mean length | max length |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, tokens, row_length, merges, seconds, library in rows:
        lines.append(f"| {name} | {tokens:,} | {row_length or 'none'} | {merges} | {seconds:.1f} | {len(library)} | "
                     f"{float(library.lengths.float().mean()):.2f} | {library.max_length} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
