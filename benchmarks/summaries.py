"""Summaries of the study suites: per-(row, seed) metrics from batch records, mean ± SE across seeds, paired
differences, FD-ref against held-out real images.

    metric      one number per (row, seed), :data:`METRICS`
    mean, se    across seeds (:func:`mean_se`, the one standard-error helper; se is None for one value)
    vs_base     paired difference of per-batch step compression to the row's base row, over (seed, batch)
    d_loglik    paired difference of per-image log-likelihood to the ``ar`` row at the same CFG, over images

Rates come from pooled counts (:func:`hf_sjd.jacobi.stats.pooled_rates`), the definition ``hf-sjd generate``,
``hf-sjd bench`` and ``JacobiStats`` use too.
"""

from __future__ import annotations

import importlib.util
import math

import torch

from hf_sjd.jacobi.stats import pooled_rates
from hf_sjd.quality import ReferenceScorer, frechet_distance
from hf_sjd.sampling import sum_histograms

#: per-(row, seed) metrics: key -> (table label, format, description)
METRICS: dict[str, tuple[str, str, str]] = {
    "nfe_per_call": ("NFE/call", "{:.1f}", "model forwards per generate call (a batch; prompt-lookup: one image), "
                     "prefill included; a batch runs until its slowest row is done"),
    "step_compression": ("step compression", "{:.2f}", "new tokens per row / forwards per call (vanilla = 1)"),
    "acceptance_rate": ("acceptance", "{:.2f}", "accepted drafts / verified drafts (Jacobi strategies only)"),
    "seconds_per_image": ("s/image", "{:.3f}", "wall seconds of generate per image"),
    "loop_overhead": ("loop overhead", "{:.1%}", "share of generate's wall time spent outside model forwards"),
    "peak_memory_mb": ("peak mem MB", "{:.1f}", "see environment.peak_memory; max over batches"),
    "fd_ref": ("FD-ref", "{:.2f}", "Frechet distance between reference-classifier features of the generated "
               "images and of held-out real images of the same classes (reference layout only)"),
    "class_accuracy": ("class acc", "{:.2f}", "reference classifier agrees with the prompt's class (reference "
                       "layout only)"),
    "mean_token_loglik": ("loglik", "{:.3f}", "mean log-likelihood (nats/token) of the generated tokens under the "
                          "model's unprocessed distribution"),
    "tv_to_ar": ("TV to ar", "{:.3f}", "token-frequency total variation to the ar row (same CFG) of the next seed "
                 "(cyclically; for ar itself that is the noise floor; 0 for ar with one seed)"),
    "repeat_rate": ("equal adjacent", "{:.3f}", "share of generated codes equal to their left neighbour"),
    "growth_share": ("share grew", "{:.3f}", "growth probe: accepted drafts that grew / accepted drafts"),
    "growth_precision": ("precision", "{:.3f}", "growth probe: grew and accepted / grew (verified drafts)"),
    "growth_rate": ("grew", "{:.3f}", "growth probe: verified drafts that grew / verified drafts"),
    "prior_ms": ("prior ms/iter", "{:.2f}", "prior-cost probe: ms inside the VP prior per call"),
    "verifier_ms": ("verifier ms/iter", "{:.2f}", "pv-cost probe: ms inside the phrase verifier per call"),
    "siblings_accepted": ("siblings/forward", "{:.3f}", "accepted siblings of the first draft per (row, forward) "
                          "(jacobi_siblings)"),
    "ms_per_forward": ("ms/forward", "{:.1f}", "wall ms of generate per forward (decoding iteration)"),
    "drafts_per_forward": ("drafts/forward", "{:.1f}", "mean drafts per row per forward: the window width, which "
                           "`jacobi_window=\"auto\"` widens as rows finish (prefill forward included)"),
    "row_tokens_per_forward": ("row tokens/forward", "{:.2f}", "tokens committed per (row, forward) while the "
                               "row is active: each image's own compression (equals step compression at batch 1)"),
}
COUNTS = ("num_images", "num_new_tokens", "num_forward_passes", "num_calls", "model_calls")
PAIRED = {"vs_base": ("vs base", "{:+.2f}", "paired difference of per-batch step compression to the row named in "
                      "`base` (same batches and seeds), mean ± SE over (seed, batch) pairs"),
          "d_loglik": ("d loglik", "{:+.3f}", "paired difference of per-image loglik to the ar row at the same "
                       "CFG (same images), mean ± SE over (seed, image) pairs")}
def mean_se(values) -> tuple[float | None, float | None]:
    """Mean and standard error of the mean (sample SD / sqrt(n)); Nones and NaNs are dropped; se None for n < 2."""
    values = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def paired(values: dict, base: dict) -> dict | None:
    """``{"mean", "se", "n"}`` of ``values[k] - base[k]`` over the keys both have (None if none)."""
    diffs = [values[k] - base[k] for k in values if k in base]
    if not diffs:
        return None
    mean, se = mean_se(diffs)
    return {"mean": mean, "se": se, "n": len(diffs)}


def reference_features(scorer: ReferenceScorer, prompts: list[str], images_per_prompt: int, seeds: list[int]
                       ) -> dict:
    """Held-out real-image features of the prompts' classes and the FD floors at the generated sample size: fresh
    real crops, and their VQ reconstructions, against the held-out crops (per seed)."""
    heldout = scorer.heldout(prompts)
    sample = [p for p in prompts for _ in range(images_per_prompt)]
    floor_real = {str(s): frechet_distance(scorer.real_features(sample, s), heldout) for s in seeds}
    floor_vq = {str(s): frechet_distance(scorer.real_features(sample, s, through_vq=True), heldout) for s in seeds}

    def summary(per_seed):
        mean, se = mean_se(per_seed.values())
        return {"per_seed": per_seed, "mean": mean, "se": se}

    return {"features": heldout, "feature_dim": int(heldout.shape[1]), "real_images": int(heldout.shape[0]),
            "generated_images_per_seed": len(sample), "floor_real": summary(floor_real),
            "floor_vq": summary(floor_vq)}


def _seed_metrics(parts: list[dict], reference_stats: dict | None, probe_name: str | None = None) -> dict:
    """The :data:`METRICS` of one (row, seed) from its batch records (TV to ar is filled in by the caller)."""
    stats = [r["stats"] for r in parts]
    total = {k: sum(s[k] for s in stats) for k in (*COUNTS, "seconds", "model_seconds")}
    hists = [s.get("tokens_per_forward") for s in stats]
    widths = [s.get("forward_windows") for s in stats]
    drafted = "num_accepted" in stats[0]
    rates = pooled_rates(total["num_new_tokens"], total["num_images"], total["num_forward_passes"],
                         total["num_calls"], sum(s["num_accepted"] for s in stats) if drafted else None,
                         sum(s["num_recovered"] for s in stats) if drafted else None)
    memory = [r["peak_memory_mb"] for r in parts if r["peak_memory_mb"] is not None]
    logliks = [v for r in parts for v in r["loglik"]]
    repeats = [v for r in parts for v in r["repeat"]]
    probe = None
    for r in parts:
        if r.get("probe") is not None:
            probe = list(r["probe"]) if probe is None else [a + b for a, b in zip(probe, r["probe"])]
    row = {key: None for key in METRICS}
    row.update({
        "nfe_per_call": total["num_forward_passes"] / total["num_calls"],
        "step_compression": rates["step_compression"],
        "acceptance_rate": rates["acceptance_rate"],
        "seconds_per_image": total["seconds"] / total["num_images"],
        "loop_overhead": (total["seconds"] - total["model_seconds"]) / total["seconds"] if total["seconds"] else None,
        "peak_memory_mb": max(memory) if memory else None,
        "mean_token_loglik": sum(logliks) / len(logliks),
        "repeat_rate": sum(repeats) / len(repeats),
        "ms_per_forward": 1000 * total["seconds"] / total["num_forward_passes"],
    })
    if "features" in parts[0] and reference_stats is not None:
        correct = [c for r in parts for c in r["correct"]]
        row["fd_ref"] = frechet_distance([f for r in parts for f in r["features"]], reference_stats["features"])
        row["class_accuracy"] = sum(correct) / len(correct)
    if probe is not None and probe_name == "growth":  # [grew & accepted, grew & verified, accepted, verified]
        grew_acc, grew_ver, acc, ver = probe
        row.update(growth_share=grew_acc / max(acc, 1), growth_precision=grew_acc / max(grew_ver, 1),
                   growth_rate=grew_ver / max(ver, 1))
    elif probe is not None and probe_name in ("prior-cost", "pv-cost"):  # [seconds, calls]
        row["prior_ms" if probe_name == "prior-cost" else "verifier_ms"] = 1000 * probe[0] / max(probe[1], 1)
    row.update({k: int(total[k]) for k in COUNTS},
               tokens_per_forward=sum_histograms(hists) if all(h is not None for h in hists) else None)
    row["forward_windows"] = sum_histograms(widths) if all(w is not None for w in widths) else None
    if row["forward_windows"] and sum(row["forward_windows"]):  # histogram of forwards by window width
        row["drafts_per_forward"] = (sum(k * c for k, c in enumerate(row["forward_windows"]))
                                     / sum(row["forward_windows"]))
    hist = row["tokens_per_forward"]
    if hist and sum(hist):  # histogram of (row, forward) pairs by tokens committed
        row["row_tokens_per_forward"] = sum(k * c for k, c in enumerate(hist)) / sum(hist)
        if any(s.get("num_siblings_accepted") for s in stats):
            row["siblings_accepted"] = sum(s.get("num_siblings_accepted", 0) for s in stats) / sum(hist)
    return row


def summarize(records: list[dict], rows: list, seeds: list[int], reference_stats: dict | None, vocab: int,
              guidance_of) -> dict:
    """``results.json["rows"]``: per-seed metrics, mean/SE across seeds, totals, paired differences.

    ``guidance_of(row)`` is a row's effective CFG scale (TV and d loglik compare with the ar row of the same)."""
    from benchmarks.metrics import token_frequency_tv

    by_key: dict[tuple[str, int], list[dict]] = {}
    for record in records:
        by_key.setdefault((record["row"], record["seed"]), []).append(record)
    for parts in by_key.values():
        parts.sort(key=lambda r: str(r["items"]))
    ar_of = {}
    for r in rows:
        if r.method == "ar":
            ar_of.setdefault(guidance_of(r), r.key)

    def tokens(key, seed):
        return torch.tensor([t for r in by_key[(key, seed)] for t in r["tokens"]])

    def per_batch(key):  # (seed, batch items) -> that batch's step compression
        out = {}
        for seed in seeds:
            for r in by_key[(key, seed)]:
                s = r["stats"]
                value = s["num_new_tokens"] / s["num_images"] / (s["num_forward_passes"] / s["num_calls"])
                out[(seed, str(r["items"]))] = value
        return out

    def forwards_per_call(key):  # each call's forwards (its slowest row's) and each row's until it finished
        return [{"seed": seed, "items": r["items"], "forwards": s["num_forward_passes"] / s["num_calls"],
                 "row_forwards": s.get("row_forward_passes")}
                for seed in seeds for r in by_key[(key, seed)] for s in (r["stats"],)]

    def per_image(key):
        return {(seed, str(item)): value for seed in seeds for r in by_key[(key, seed)]
                for item, value in zip(r["items"], r["loglik"])}

    out = {}
    for r in rows:
        per_seed = {}
        ar_key = ar_of.get(guidance_of(r))
        for position, seed in enumerate(seeds):
            metrics = _seed_metrics(by_key[(r.key, seed)], reference_stats, r.probe)
            next_seed = seeds[(position + 1) % len(seeds)]
            if ar_key is not None:
                metrics["tv_to_ar"] = token_frequency_tv(tokens(r.key, seed), tokens(ar_key, next_seed), vocab)
            per_seed[str(seed)] = metrics
        mean, se = {}, {}
        for key in METRICS:
            mean[key], se[key] = mean_se(per_seed[str(s)][key] for s in seeds)
        hists = [per_seed[str(s)]["tokens_per_forward"] for s in seeds]
        widths = [per_seed[str(s)]["forward_windows"] for s in seeds]
        out[r.key] = {
            "method": r.method, "knobs": {k: v for k, v in r.knobs}, "label": r.knobs_label,
            "guidance_scale": guidance_of(r), "window": r.window, "batch_size": r.batch_size,
            "base": r.base.key if r.base is not None else None, "probe": r.probe,
            "per_seed": per_seed, "mean": mean, "se": se,
            "totals": {k: sum(per_seed[str(s)][k] for s in seeds)
                       for k in ("num_images", "num_new_tokens", "num_forward_passes", "model_calls")},
            "tokens_per_forward": sum_histograms(hists) if all(h is not None for h in hists) else None,
            "forward_windows": sum_histograms(widths) if all(w is not None for w in widths) else None,
            "forwards_per_call": forwards_per_call(r.key),
            "vs_base": paired(per_batch(r.key), per_batch(r.base.key)) if r.base is not None else None,
            "d_loglik": (paired(per_image(r.key), per_image(ar_key)) if ar_key is not None and ar_key != r.key
                         else None),
        }
    return out


def torchmetrics_note() -> str:
    if importlib.util.find_spec("torchmetrics") is None:
        return ("skipped: torchmetrics is not installed; FID/CLIPScore need it plus locally cached Inception/CLIP "
                "weights (FD-ref and class accuracy are this benchmark's proxies)")
    return ("skipped: torchmetrics is installed, but FID/CLIPScore are not wired for the reference model (64x64 "
            "class crops, no local Inception/CLIP weights); FD-ref and class accuracy are the proxies")
