"""The lossless frontier on the shipped reference model: fresh drafts, Gumbel coupling, window economics.

Every cell samples the same images with the same seeds (generate call ``i`` starts from ``seed + i``; batch 1:
one image per call), so settings compare image by image: each row gives its tokens per forward (new tokens /
forwards, mean over calls) and the mean paired difference to its base setting with its standard error.
Top-k 100, no CFG, 256 tokens per image, one thread. Sections:

1. fresh drafts (``draft_init``) with maximal coupling at window 16 (sweep seeds);
2. Gumbel coupling (``draft_coupling="gumbel"``) against maximal, with the same inits;
3. compression against the window (8 .. 64) for sjd, mc-sjd (random init) and the winner;
4. the forward cost model (roofline t(L+1)/t(1) per model size and batch) and the window it picks;
5. confirmation on fresh seeds: winner vs the old default at window 16 and at the picked window, batch 8
   against batch 1, and the quality proxies (token log-likelihood, FD-ref) against vanilla sampling.

Raw per-call numbers are cached in ``--cache`` (JSON, keyed by setting), so a rerun only samples what is new
and the Markdown can be regenerated from the cache::

    python scripts/frontier.py                          # -> docs/results/frontier.md (+ frontier.json)
    python scripts/frontier.py --sections 1 --per-prompt 1 --out /tmp/f.md --cache /tmp/f.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch



def open_reference(script: str, argv: list[str] | None):
    """``(start time, the command line to print, the reference model with Jacobi strategies enabled)``
    (the old verifier benchmark script's helper; that script became `hf-sjd bench --suite verifiers`)."""
    import shlex

    import hf_sjd
    from hf_sjd.reference import load

    start = time.perf_counter()
    command = shlex.join(["python", f"scripts/{script}", *(sys.argv[1:] if argv is None else argv)])
    ref = load()
    hf_sjd.enable(ref.model)
    return start, command, ref


REPO_ROOT = Path(__file__).resolve().parents[1]
INITS = ("random", "repeat-horizon", "last-target", "row-above", "row-above-dist", "row-above-mix")
WINDOWS = (8, 16, 32, 64)  # 24 and 48 cut for CPU time (the cache keeps sjd at 24 / 48)
OLD_DEFAULT = {"draft_init": "random"}  # mc-sjd before this study


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-prompt", type=int, default=2, help="images per reference prompt (16 prompts)")
    parser.add_argument("--window-per-prompt", type=int, default=1, help="images per prompt in section 3")
    parser.add_argument("--seed", type=int, default=0, help="sweep seeds (sections 1-3)")
    parser.add_argument("--confirm-seed", type=int, default=1000, help="fresh seeds of section 5")
    parser.add_argument("--winner", default="row-above-dist", help="draft_init of the candidate default")
    parser.add_argument("--winner-coupling", default="maximal")
    parser.add_argument("--sections", default="1,2,3,4,5")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default=str(REPO_ROOT / "docs" / "results" / "frontier.json"))
    parser.add_argument("--out", default=str(REPO_ROOT / "docs" / "results" / "frontier.md"))
    parser.add_argument("--render-only", action="store_true", help="sample nothing: render from the cache")
    return parser.parse_args(argv)


class Cells:
    """Samples the prompt set with one setting per cell; per-call results cached on disk by setting."""

    def __init__(self, ref, args) -> None:
        self.ref, self.args = ref, args
        self.path = Path(args.cache)
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self) -> None:
        from hf_sjd.files import atomic_write_text

        atomic_write_text(self.path, json.dumps(self.data, indent=0, sort_keys=True))

    def run(self, method: str, window: int = 16, batch: int = 1, seed: int | None = None, per_prompt: int | None = None,
            keep_tokens: bool = False, **knobs) -> dict:
        seed = self.args.seed if seed is None else seed
        per_prompt = per_prompt or self.args.per_prompt
        key = json.dumps([method, window, batch, seed, per_prompt, sorted(knobs.items())])
        cached = self.data.get(key)
        if cached is not None and (cached.get("tokens") is not None or not keep_tokens):
            return cached
        if self.args.render_only:
            raise SystemExit(f"--render-only: no cached cell {key}")
        ref = self.ref
        ids = ref.prompt_ids([p for _ in range(per_prompt) for p in ref.conditions])
        compression, forwards, tokens, start = [], [], [], time.perf_counter()
        for index, chunk in enumerate(ids.split(batch)):
            torch.manual_seed(seed + index)
            common = dict(do_sample=True, top_k=100, max_new_tokens=ref.num_image_tokens)
            if method == "ar":
                out = ref.model.generate(chunk, **common)
                sequences, steps = out, ref.num_image_tokens
            else:
                out = ref.model.generate(chunk, custom_generate=method, jacobi_window=window,
                                         return_dict_in_generate=True, **common, **knobs)
                sequences, steps = out.sequences, out.stats.num_forward_passes
            compression.append(ref.num_image_tokens / steps)
            forwards.append(steps)
            if keep_tokens:
                tokens.append(sequences[:, 1:].tolist())
        cell = {"compression": compression, "forwards": forwards, "seconds": time.perf_counter() - start,
                "tokens": [row for chunk in tokens for row in chunk] if keep_tokens else None}
        self.data[key] = cell
        self.save()
        print(f"{key:90.90s} {mean(compression):.3f}  {cell['seconds']:.0f}s", file=sys.stderr, flush=True)
        return cell


def mean(values) -> float:
    return sum(values) / len(values)


def paired(cell: dict, base: dict) -> str:
    diff = [a - b for a, b in zip(cell["compression"], base["compression"])]
    if len(diff) < 2:
        return f"{mean(diff):+.3f}"
    m = mean(diff)
    se = math.sqrt(sum((d - m) ** 2 for d in diff) / (len(diff) - 1) / len(diff))
    return f"{m:+.3f} ± {se:.3f}"


def section_fresh(cells: Cells, coupling: str) -> list[str]:
    base = cells.run("mc-sjd", draft_coupling="maximal", **OLD_DEFAULT)
    title = ("## 1. Fresh drafts (maximal coupling, window 16)" if coupling == "maximal"
             else "## 2. Gumbel coupling (window 16), against maximal coupling with random init")
    lines = [title, "", f"{len(base['compression'])} images, batch 1, sweep seeds {cells.args.seed}+.", "",
             "| draft_init | coupling | tokens / forward | vs mc-sjd random init (paired) |", "|---|---|---:|---:|"]
    for init in INITS:
        cell = cells.run("mc-sjd", draft_coupling=coupling, draft_init=init)
        lines.append(f"| `{init}` | {coupling} | {mean(cell['compression']):.3f} | {paired(cell, base)} |")
    if coupling == "maximal":
        for weight in (0.25, 0.75):
            cell = cells.run("mc-sjd", draft_coupling=coupling, draft_init="row-above-mix", draft_init_weight=weight)
            lines.append(f"| `row-above-mix`, w = {weight} | {coupling} | {mean(cell['compression']):.3f} | "
                         f"{paired(cell, base)} |")
    else:
        lines += ["", "Gumbel against maximal, init by init (paired):", "", "| draft_init | gumbel - maximal |",
                  "|---|---:|"]
        for init in INITS:
            lines.append(f"| `{init}` | {paired(cells.run('mc-sjd', draft_coupling='gumbel', draft_init=init), cells.run('mc-sjd', draft_coupling='maximal', draft_init=init))} |")
    return lines + [""]


def window_settings(args) -> list[tuple[str, str, dict]]:
    return [("sjd", "sjd", {}), ("mc-sjd (random init)", "mc-sjd", dict(OLD_DEFAULT)),
            (f"mc-sjd + {args.winner}", "mc-sjd", {"draft_init": args.winner, "draft_coupling": args.winner_coupling})]


def window_table(cells: Cells) -> dict:
    args = cells.args
    return {label: {w: mean(cells.run(method, window=w, per_prompt=args.window_per_prompt, **knobs)["compression"])
                    for w in WINDOWS} for label, method, knobs in window_settings(args)}


def section_windows(cells: Cells) -> list[str]:
    table = window_table(cells)
    lines = ["## 3. Compression against the window (tokens / forward)", "",
             f"{16 * cells.args.window_per_prompt} images, batch 1, sweep seeds.", "",
             "| strategy | " + " | ".join(f"L = {w}" for w in WINDOWS) + " |", "|---|" + "---:|" * len(WINDOWS)]
    for label, row in table.items():
        lines.append(f"| {label} | " + " | ".join(f"{row[w]:.2f}" for w in WINDOWS) + " |")
    return lines + [""]


# -- forward cost model ---------------------------------------------------------------------------------------
# Roofline of one decoder forward appending n tokens per row (no measurement: no GPU was lent to this study).
# bf16 weights read once per forward, the KV cache read per row, 2 * params FLOPs per token; an H100-class
# device at 80% of its memory bandwidth and 50% of its dense bf16 peak; a fixed 0.3 ms of launch latency.
BANDWIDTH, PEAK_FLOPS, LAUNCH_S = 0.8 * 3.35e12, 0.5 * 989e12, 0.3e-3
MODEL_SIZES = {"1.3B (LlamaGen-XL-like)": (1.3e9, 24, 2048), "7B (Lumina-mGPT / Janus-Pro-7B / Emu3-like)": (7e9, 32, 4096)}
CONTEXT = 1024  # tokens in the KV cache


def forward_seconds(params: float, layers: int, hidden: int, rows: int, n: int) -> float:
    weight_bytes = 2 * params
    kv_bytes = rows * 2 * layers * 2 * hidden * CONTEXT  # K and V, bf16, per row
    flops = 2 * params * rows * n
    return LAUNCH_S + max((weight_bytes + kv_bytes) / BANDWIDTH, flops / PEAK_FLOPS)


def cost_ratio(size: str, rows: int, window: int) -> float:
    """t(L+1) / t(1) of the roofline model: what one Jacobi forward costs in vanilla decoding steps."""
    params, layers, hidden = MODEL_SIZES[size]
    return forward_seconds(params, layers, hidden, rows, window + 1) / forward_seconds(params, layers, hidden, rows, 1)


def pick_windows(table: dict, label: str) -> dict:
    """(size, batch rows) -> (window maximising compression / cost ratio, that speed-up)."""
    picks = {}
    for size in MODEL_SIZES:
        for rows in (1, 8, 16):
            speed = {w: table[label][w] / cost_ratio(size, rows, w) for w in WINDOWS}
            best = max(speed, key=speed.get)
            picks[(size, rows)] = (best, speed[best])
    return picks


def section_cost(cells: Cells) -> list[str]:
    table = window_table(cells)
    label = window_settings(cells.args)[-1][0]
    lines = ["## 4. Forward cost model and the window it picks", "",
             "Roofline model, not a measurement (no GPU was lent): bf16 weights read once per forward, KV cache of "
             f"{CONTEXT} tokens per row, 2 x params FLOPs per token, 80% of 3.35 TB/s, 50% of 989 TFLOP/s, "
             "0.3 ms launch latency per forward. Rows = images x 2 with CFG. `scripts/gpu_latency.py` measures "
             "t(L+1)/t(1) on a real device.", "",
             "| model | rows | " + " | ".join(f"t({w + 1})/t(1)" for w in WINDOWS) + " |",
             "|---|---:|" + "---:|" * len(WINDOWS)]
    for size in MODEL_SIZES:
        for rows in (1, 8, 16):
            lines.append(f"| {size} | {rows} | " + " | ".join(f"{cost_ratio(size, rows, w):.2f}" for w in WINDOWS)
                         + " |")
    lines += ["", f"Window maximising (tokens / forward) / (t(L+1)/t(1)) for {label}:", "",
              "| model | rows | window | modelled speed-up over vanilla |", "|---|---:|---:|---:|"]
    for (size, rows), (window, speed) in pick_windows(table, label).items():
        lines.append(f"| {size} | {rows} | {window} | {speed:.2f}x |")
    return lines + [""]


def fd_ref(cells: Cells, tokens: list) -> float:
    from hf_sjd.bench import frechet_distance, reference_features
    from hf_sjd.reference import load_classifier

    if not hasattr(cells, "heldout"):
        cells.classifier = load_classifier()
        prompts = list(cells.ref.conditions)
        cells.heldout = reference_features(cells.ref, cells.classifier, prompts, 1, [0])["features"]
    with torch.no_grad():
        images = cells.ref.vq.decode_to_tensor(torch.tensor(tokens))
        features = cells.classifier.embed(images).double().numpy()
    return frechet_distance(features, cells.heldout)


def section_confirm(cells: Cells) -> list[str]:
    from hf_sjd.quality import mean_token_loglik

    args = cells.args
    seed = args.confirm_seed
    winner = {"draft_init": args.winner, "draft_coupling": args.winner_coupling}
    picked = pick_windows(window_table(cells), window_settings(args)[-1][0])
    window_7b = picked[(list(MODEL_SIZES)[1], 1)][0]
    lines = ["## 5. Confirmation on fresh seeds", "",
             f"Seeds {seed}+, {16 * args.per_prompt} images; winner = `draft_init={args.winner!r}`, "
             f"`draft_coupling={args.winner_coupling!r}`.", "",
             "| setting | window | batch | tokens / forward | vs old mc-sjd default (paired) |",
             "|---|---:|---:|---:|---:|"]
    for window in sorted({16, window_7b}):
        old = cells.run("mc-sjd", window=window, seed=seed, keep_tokens=True, **OLD_DEFAULT)
        new = cells.run("mc-sjd", window=window, seed=seed, keep_tokens=True, **winner)
        lines.append(f"| mc-sjd, random init (old default) | {window} | 1 | {mean(old['compression']):.3f} | |")
        lines.append(f"| mc-sjd + winner | {window} | 1 | {mean(new['compression']):.3f} | {paired(new, old)} |")
        for batch in (8,) if window == 16 else ():
            old_b = cells.run("mc-sjd", window=window, batch=batch, seed=seed, **OLD_DEFAULT)
            new_b = cells.run("mc-sjd", window=window, batch=batch, seed=seed, **winner)
            lines.append(f"| mc-sjd, random init | {window} | {batch} | {mean(old_b['compression']):.3f} | |")
            lines.append(f"| mc-sjd + winner | {window} | {batch} | {mean(new_b['compression']):.3f} | "
                         f"({mean(new_b['compression']) / mean(new['compression']):.0%} of batch 1) |")
    vanilla = cells.run("ar", seed=seed, keep_tokens=True)
    lines += ["", "Quality proxies of the window-16, batch-1 samples (same seeds): mean token log-likelihood under "
              "the model, FD-ref (classifier features against held-out real crops, "
              f"{16 * args.per_prompt} images; compare with the gap between two vanilla seed sets).", "",
              "| samples | mean token log-lik | FD-ref |", "|---|---:|---:|"]
    vanilla_2 = cells.run("ar", seed=seed + 5000, keep_tokens=True)
    for label, cell in [("vanilla", vanilla), ("vanilla, other seeds", vanilla_2),
                        ("mc-sjd random init", cells.run("mc-sjd", seed=seed, keep_tokens=True, **OLD_DEFAULT)),
                        ("mc-sjd + winner", cells.run("mc-sjd", seed=seed, keep_tokens=True, **winner))]:
        sequences = torch.cat([torch.full((len(cell["tokens"]), 1), 0), torch.tensor(cell["tokens"])], dim=1)
        sequences[:, 0] = cells.ref.prompt_ids([p for _ in range(args.per_prompt) for p in cells.ref.conditions])[:, 0]
        loglik = mean_token_loglik(cells.ref.model, sequences, prompt_len=1)
        lines.append(f"| {label} | {loglik:.4f} | {fd_ref(cells, cell['tokens']):.2f} |")
    return lines + [""]


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start, command, ref = open_reference("frontier.py", argv)
    cells = Cells(ref, args)
    sections = {"1": lambda: section_fresh(cells, "maximal"), "2": lambda: section_fresh(cells, "gumbel"),
                "3": lambda: section_windows(cells), "4": lambda: section_cost(cells),
                "5": lambda: section_confirm(cells)}
    lines = ["# The lossless frontier: fresh drafts, Gumbel coupling, window economics", "",
             f"`{command}` (reference model, top-k 100, no CFG, batch 1 unless said; paired seeds)", ""]
    for name in args.sections.split(","):
        lines += sections[name.strip()]()
    from hf_sjd.files import atomic_write_text

    atomic_write_text(args.out, "\n".join(lines))
    print("\n".join(lines))
    print(f"done in {time.perf_counter() - start:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
