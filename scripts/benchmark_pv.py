"""SJD-PV on the shipped reference model: step compression next to quality proxies, ablations, matching cost.

All settings sample the same prompts with the same seeds (batch ``i`` from seed ``seed + i``): compression
is compared batch by batch with plain SJD (mean paired difference ± standard error over batches).
Quality proxies for every row: mean token log-likelihood under the model (difference to vanilla over images
matched by prompt, ± its standard error), rate of equal
adjacent codes, token-frequency TV to vanilla (next to the TV between two vanilla sets: the noise floor),
and the shipped classifier's accuracy. Then ablations (tau, merges, matching mode) and the cost of one
matching call.

    python scripts/benchmark_pv.py                      # -> docs/results/pv.md (about 15 min on 1 thread)
    python scripts/benchmark_pv.py --per-prompt 1 --ablations "" --out /tmp/pv.md
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_verifiers import evaluate, generate, open_reference  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-prompt", type=int, default=4, help="images per reference prompt (16 prompts)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ablations", default="tau,merges,match", help="comma list of tau, merges, match ('' none)")
    parser.add_argument("--ablation-corpus-images", type=int, default=4000,
                        help="reference training crops tokenized for the 16k-merge ablation library")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(REPO_ROOT / "docs" / "results" / "pv.md"))
    return parser.parse_args(argv)


def paired_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Mean and standard error of ``a - b`` over images matched by prompt (the two sets are independent
    samples; matching by prompt removes the between-class variance)."""
    diff = a - b
    return float(diff.mean()), float(diff.std()) / math.sqrt(len(diff))


def add_proxies(ref, classifier, result: dict, vanilla: dict) -> dict:
    from hf_sjd.quality import adjacent_repeat_rate, token_logliks

    evaluate(ref, classifier, result, vanilla["sequences"])
    result["per_image_loglik"] = token_logliks(ref.model, result["sequences"], prompt_len=1).mean(1)
    result["per_image_repeat"] = adjacent_repeat_rate(result["sequences"][:, 1:])
    return result


def row(name: str, knobs: str, result: dict, vanilla: dict, sjd: dict | None) -> str:
    d_loglik, se = paired_difference(result["per_image_loglik"], vanilla["per_image_loglik"])
    paired = "-"
    if sjd is not None and "per_batch_compression" in result:
        diff = result["per_batch_compression"] - sjd["per_batch_compression"]
        paired = f"{float(diff.mean()):+.2f} ± {float(diff.std()) / math.sqrt(len(diff)):.2f}"
    return (f"| {name} | {knobs} | {result['compression']:.2f}x | {paired} | {d_loglik:+.3f} ± {se:.3f} | "
            f"{float(result['per_image_repeat'].mean()):.3f} | {result['tv']:.3f} | {result['accuracy']:.2f} |")


def ablation_library(ref, num_images: int):
    """A 16k-merge library from ``num_images`` tokenized reference training crops (same recipe as the shipped
    one, minus the PNG round trip), so ``first(M)`` gives the 1k/4k/8k/16k libraries of one corpus."""
    from hf_sjd import PhraseLibrary
    from hf_sjd.reference.data import CLASSES, make_dataset

    images, _ = make_dataset(max(1, num_images // len(CLASSES)), seed=2)
    with torch.no_grad():
        codes = torch.cat([ref.vq.encode(images[i:i + 256]).reshape(-1, ref.num_image_tokens)
                           for i in range(0, len(images), 256)])
    start = time.perf_counter()
    library = PhraseLibrary.from_token_sequences(codes, num_merges=16000, codebook_size=512,
                                                 fingerprint=ref.vq.fingerprint())
    return library, time.perf_counter() - start, codes.numel()


def matching_cost(library, batch: int, window: int = 16, repeats: int = 50) -> float:
    """Milliseconds per PhraseVerifier call (matching + joint test + walk) on reference-like windows."""
    from hf_sjd import SpeculativeVerifier
    from hf_sjd.jacobi.verify.phrase import PhraseIndex, PhraseVerifier

    generator = torch.Generator().manual_seed(0)
    vocab = 530
    p = torch.rand(batch, window, vocab, generator=generator).pow(8)
    p[..., 512:] = 0
    p = p / p.sum(-1, keepdim=True)
    drafts = torch.multinomial(p.view(-1, vocab), 1, generator=generator).view(batch, window)
    verifier = PhraseVerifier(PhraseIndex.from_library(library, torch.arange(512), vocab), SpeculativeVerifier())
    uniforms = torch.rand(batch, window, generator=generator)
    verifier(drafts, p, p, uniforms)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        verifier(drafts, p, p, uniforms)
    return 1000 * (time.perf_counter() - start) / repeats


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import hf_sjd
    from hf_sjd.files import atomic_write_text
    from hf_sjd.reference import load_classifier

    start, command, ref = open_reference("benchmark_pv.py", argv)
    classifier = load_classifier()
    prompts = list(ref.conditions)
    latent = {"latent_embeddings": ref.latent_embeddings}
    ablations = {a.strip() for a in args.ablations.split(",") if a.strip()}
    header = ["| method | knobs | compression | vs sjd (paired) | d loglik vs vanilla ± SE | equal adjacent codes | "
              "TV to vanilla | accuracy |", "|---|---|---:|---:|---:|---:|---:|---:|"]

    def run(method, **knobs):
        result = generate(ref, prompts, args, method, **knobs)
        add_proxies(ref, classifier, result, vanilla)
        print(f"{method} {sorted(k for k in knobs if k != 'latent_embeddings')} {result['compression']:.2f}x "
              f"loglik {result['loglik']:.3f}", file=sys.stderr, flush=True)
        return result

    with torch.no_grad():
        vanilla = generate(ref, prompts, args, None)
        vanilla["tv"] = 0.0
        add_proxies(ref, classifier, vanilla, vanilla)
        second = generate(ref, prompts, argparse.Namespace(**{**vars(args), "seed": args.seed + 10_000}), None)
        add_proxies(ref, classifier, second, vanilla)
        sjd = run("sjd")
        lines = ["# SJD-PV on the reference model", "", f"Command: `{command}`", "",
                 f"Reference model, 16 prompts x {args.per_prompt} images, batch {args.batch}, top-k {args.top_k}, "
                 f"window {args.window}, seeds {args.seed}.. (one per batch, shared by all rows), {args.threads} CPU "
                 f"thread(s). Default library: the shipped one (8000 merges over 1.02M tokens of reference training "
                 f"crops), `pv_tau=0.01`, `pv_match='exact'`.", "",
                 "## Strategies", "", *header,
                 row("vanilla (transformers)", "-", vanilla, vanilla, None),
                 row("vanilla (2nd set)", "other seeds: the noise floor", second, vanilla, None),
                 row("sjd", "-", sjd, vanilla, sjd)]
        for method, knobs, label in [("sjd-pv", {}, "defaults"), ("mc-sjd", {}, "-"), ("mc-sjd-pv", {}, "defaults"),
                                     ("lantern", latent, "k=10, lambda=2"), ("lantern-pv", latent, "defaults"),
                                     ("gsd-pv", latent, "defaults"), ("sjd-vp-pv", {}, "VP defaults")]:
            lines.append(row(method, label, run(method, **knobs), vanilla, sjd))

        if "tau" in ablations:
            lines += ["", "## Ablation: tau (sjd-pv, exact matching)", "", *header]
            for tau in (0.001, 0.01, 0.1):
                lines.append(row("sjd-pv", f"pv_tau={tau:g}", run("sjd-pv", pv_tau=tau), vanilla, sjd))
        if "match" in ablations:
            lines += ["", "## Ablation: matching and what is committed (sjd-pv)", "",
                      "`neighbourhood` + `phrase`: phrase tokens replace drafts (committed up to the first "
                      "substituted token); `neighbourhood` + `draft`: a neighbourhood match only makes the drafts "
                      "verified jointly.", "", *header]
            for match, commit in (("exact", "phrase"), ("neighbourhood", "draft"), ("neighbourhood", "phrase")):
                for tau in (0.01, 0.1):
                    result = run("sjd-pv", pv_match=match, pv_commit=commit, pv_tau=tau)
                    lines.append(row("sjd-pv", f"{match}, commit {commit}, tau={tau:g}", result, vanilla, sjd))
        if "merges" in ablations:
            library, build_seconds, corpus_tokens = ablation_library(ref, args.ablation_corpus_images)
            lines += ["", f"## Ablation: number of merges (sjd-pv; one 16k-merge library over {corpus_tokens:,} "
                      f"tokens, built in {build_seconds:.1f} s, truncated with `first(M)`)", "", *header]
            for merges in (1000, 4000, 8000, 16000):
                sub = library.first(min(merges, library.num_merges))
                lines.append(row("sjd-pv", f"{merges} merges ({len(sub)} phrases, mean length "
                                           f"{float(sub.lengths.float().mean()):.2f})",
                                 run("sjd-pv", phrase_library=sub), vanilla, sjd))

        shipped = hf_sjd.PhraseLibrary.from_pretrained(ref.model.sjd_adapter.default_phrase_library)
        lines += ["", "## Cost of phrase verification", "",
                  "Milliseconds per verifier call (matching + joint test + walk), shipped library "
                  f"({len(shipped)} phrases), window 16: "
                  + ", ".join(f"batch {b}: {matching_cost(shipped, b):.2f} ms" for b in (1, 8))
                  + ". Library build time: see the phrase-library table.", ""]
    lines.append(f"Total {(time.perf_counter() - start) / 60:.1f} min.")
    text = "\n".join(lines) + "\n"
    atomic_write_text(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
