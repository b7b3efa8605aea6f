"""Benchmark the verifiers (SJD vs LANTERN vs GSD) on the shipped reference model: speed and quality proxies.

Every method samples the same prompts with the same seeds (batch ``i`` starts from seed ``seed + i``) under
top-k sampling. Reported per method: forwards per batch (NFE), step compression (new tokens / forwards,
vanilla = 1), acceptance rate, and three quality proxies from :mod:`hf_sjd.quality`: mean token
log-likelihood under the model's unprocessed distribution, token-frequency TV to vanilla sampling (next to
the TV between two independent vanilla sets of the same size: the noise floor), and classifier accuracy.
Then a small sweep of LANTERN's ``(k, delta)``.

Writes a Markdown table (temp file + rename) and prints it::

    python scripts/benchmark_verifiers.py                  # -> docs/results/verifiers.md
    python scripts/benchmark_verifiers.py --per-prompt 2 --sweep "" --out /tmp/quick.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROMPTS = "all"
DEFAULT_SWEEP = "1:0.02,1:0.05,2:0.1,5:0.1,10:0.1,10:1.5,10:2.0,10:3.0,10:5.0,50:10.0"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default=DEFAULT_PROMPTS,
                        help="comma-separated reference prompts, or 'all' (the 16 classes)")
    parser.add_argument("--per-prompt", type=int, default=4, help="images per prompt")
    parser.add_argument("--batch", type=int, default=8, help="rows per generate call")
    parser.add_argument("--window", type=int, default=16, help="jacobi_window")
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sweep", default=DEFAULT_SWEEP,
                        help="LANTERN settings 'k:delta,...' (delta > 1 is LANTERN++'s lambda); '' for none")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", default=str(REPO_ROOT / "docs" / "results" / "verifiers.md"))
    return parser.parse_args(argv)


def generate(ref, prompts: list[str], args, method: str | None, **knobs) -> dict:
    """Sample every prompt ``args.per_prompt`` times with ``method`` (``None``: transformers' vanilla sampling)."""
    ids = ref.prompt_ids([p for p in prompts for _ in range(args.per_prompt)])
    sequences, forwards, compression, accepted, verified = [], [], [], 0, 0
    start = time.perf_counter()
    for index, chunk in enumerate(ids.split(args.batch)):
        torch.manual_seed(args.seed + index)
        if method is None:
            sequences.append(ref.model.generate(chunk, do_sample=True, top_k=args.top_k, max_new_tokens=256))
            continue
        out = ref.model.generate(chunk, custom_generate=method, do_sample=True, top_k=args.top_k, max_new_tokens=256,
                                 jacobi_window=args.window, return_dict_in_generate=True, **knobs)
        sequences.append(out.sequences)
        forwards.append(out.stats.num_forward_passes)
        compression.append(out.stats.step_compression)
        accepted += out.stats.num_accepted
        verified += out.stats.num_accepted + out.stats.num_recovered
    seconds = time.perf_counter() - start
    result = {"sequences": torch.cat(sequences), "seconds_per_image": seconds / len(ids), "prompt_ids": ids}
    if method is None:
        result.update(nfe=256.0, compression=1.0, acceptance=None)
    else:
        result.update(nfe=sum(forwards) / len(forwards), compression=sum(compression) / len(compression),
                      acceptance=accepted / max(verified, 1), per_batch_compression=torch.tensor(compression))
    return result


def evaluate(ref, classifier, result: dict, vanilla: torch.Tensor) -> dict:
    from hf_sjd.quality import class_accuracy, mean_token_loglik, token_frequency_tv
    from hf_sjd.reference import NUM_CODES

    sequences = result["sequences"]
    images = ref.vq.decode_to_tensor(sequences[:, 1:])
    labels = result["prompt_ids"][:, 0] - NUM_CODES
    result.update(loglik=mean_token_loglik(ref.model, sequences, prompt_len=1),
                  tv=token_frequency_tv(sequences[:, 1:], vanilla[:, 1:], NUM_CODES),
                  accuracy=class_accuracy(classifier, images, labels))
    return result


def markdown(rows: list[tuple[str, str, dict]], vanilla_loglik: float, args, command: str, total_seconds: float,
             num_images: int) -> str:
    lines = [
        "# Verifier benchmark: SJD vs LANTERN vs GSD on the reference model",
        "",
        f"Command: `{command}`",
        "",
        f"Reference model (512-code VQ, 2M-parameter Llama), prompts: {args.prompts.replace(',', ', ')}, "
        f"{args.per_prompt} images each ({num_images} images), batch {args.batch}, top-k {args.top_k}, "
        f"`jacobi_window={args.window}`, seeds {args.seed}.. (one per batch, shared by all methods), "
        f"{args.threads} CPU thread(s); total {total_seconds / 60:.1f} min.",
        "",
        "* **NFE**: model forwards per batch (prefill included); a batch runs until its slowest row is done.",
        "* **compression**: new tokens per row / NFE (vanilla = 1).",
        "* **loglik**: mean log-likelihood (nats/token) of the generated tokens under the model's *unprocessed* "
        "distribution; **d loglik**: minus vanilla's.",
        "* **TV**: total variation between token histograms and the vanilla set; the *vanilla (2nd set)* row is the "
        "noise floor at this sample size (two independent vanilla sets).",
        "* **accuracy**: the shipped classifier agrees with the prompt's class.",
        "",
        "| method | knobs | NFE | compression | acceptance | loglik | d loglik | TV to vanilla | accuracy | s/image |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, knobs, r in rows:
        acceptance = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        tv = "0 (reference)" if r.get("is_reference") else f"{r['tv']:.3f}"
        lines.append(f"| {name} | {knobs} | {r['nfe']:.1f} | {r['compression']:.2f}x | {acceptance} | "
                     f"{r['loglik']:.3f} | {r['loglik'] - vanilla_loglik:+.3f} | {tv} | {r['accuracy']:.2f} | "
                     f"{r['seconds_per_image']:.3f} |")
    return "\n".join(lines) + "\n"


def lantern_label(k: int, delta: float) -> str:
    return f"k={k}, " + (f"lambda={delta:g} (LANTERN++)" if delta > 1 else f"delta={delta:g}")


def open_reference(script: str, argv: list[str] | None):
    """Start of every benchmark script: ``(start time, the command line to print, the reference model with
    Jacobi strategies enabled)``."""
    import hf_sjd
    from hf_sjd.reference import load

    start = time.perf_counter()
    command = shlex.join(["python", f"scripts/{script}", *(sys.argv[1:] if argv is None else argv)])
    ref = load()
    hf_sjd.enable(ref.model)
    return start, command, ref


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from hf_sjd.files import atomic_write_text
    from hf_sjd.jacobi.verify.lantern import lantern_defaults
    from hf_sjd.reference import load_classifier

    start, command, ref = open_reference("benchmark_verifiers.py", argv)
    classifier = load_classifier()
    prompts = (list(ref.conditions) if args.prompts == "all"
               else [p.strip() for p in args.prompts.split(",") if p.strip()])
    latent = {"latent_embeddings": ref.latent_embeddings}

    with torch.no_grad():
        vanilla = generate(ref, prompts, args, None)
        second = generate(ref, prompts, argparse.Namespace(**{**vars(args), "seed": args.seed + 10_000}), None)
        reference = vanilla["sequences"]
        evaluate(ref, classifier, vanilla, reference)["is_reference"] = True
        evaluate(ref, classifier, second, reference)
        k, delta = lantern_defaults(512)
        rows = [("vanilla (transformers)", "-", vanilla), ("vanilla (2nd set)", "other seeds", second)]
        runs = [("sjd", "sjd", "-", {}),
                ("lantern (default)", "lantern", lantern_label(k, delta), latent),
                ("gsd (default)", "gsd", "W=7, prob 0.15, dist 0.5, VQ latents", latent),
                ("gsd (input embeddings)", "gsd", "W=7, prob 0.15, dist 0.5, model embeddings", {})]
        for setting in filter(None, args.sweep.split(",")):
            k_text, delta_text = setting.split(":")
            if (int(k_text), float(delta_text)) == (k, delta):
                continue  # the default row above
            runs.append(("lantern (sweep)", "lantern", lantern_label(int(k_text), float(delta_text)),
                         {**latent, "lantern_k": int(k_text), "lantern_delta": float(delta_text)}))
        for name, method, knobs_label, knobs in runs:
            result = evaluate(ref, classifier, generate(ref, prompts, args, method, **knobs), reference)
            rows.append((name, knobs_label, result))
            print(f"{name:24s} {knobs_label:44s} compression {result['compression']:.2f}x  "
                  f"loglik {result['loglik']:.3f}  TV {result['tv']:.3f}  acc {result['accuracy']:.2f}",
                  file=sys.stderr, flush=True)

    text = markdown(rows, vanilla["loglik"], args, command, time.perf_counter() - start,
                    len(prompts) * args.per_prompt)
    atomic_write_text(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
