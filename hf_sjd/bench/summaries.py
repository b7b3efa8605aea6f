"""Summaries of ``hf-sjd bench``: per-(row, seed) metrics from batch records, mean ± SE across seeds, paired
differences, FD-ref against held-out real images.

    metric      one number per (row, seed), :data:`METRICS`
    mean, se    across seeds (:func:`mean_se`, the one standard-error helper; se is None for one value)
    vs_base     paired difference of per-batch step compression to the row's base row, over (seed, batch)
    d_loglik    paired difference of per-image log-likelihood to the ``ar`` row at the same CFG, over images

Rates come from pooled counts (:func:`hf_sjd.jacobi.stats.pooled_rates`), the definition ``hf-sjd generate``
and ``JacobiStats`` use too.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from ..jacobi.state import Ending
from ..quality import frechet_distance

#: Ending -> (metric suffix, column label, what the forward before did)
AFTER_ENDINGS = {
    Ending.RECOVERED: ("recovered", "recovered", "ended with a recovered token (a rejected draft of the window)"),
    Ending.BONUS: ("bonus", "bonus", "accepted its whole window"),
    Ending.SIBLING: ("sibling", "sibling", "accepted a sibling of the first draft, then a token drawn after it"),
    Ending.BRANCH_RECOVERED: ("branch_rejection", "branch rejection", "accepted the first sibling, then rejected "
                             "one of its branch drafts (jacobi_sibling_drafts)"),
    Ending.BRANCH_BONUS: ("branch_whole", "whole branch", "accepted the first sibling and every branch draft")}

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
    **{f"siblings_{where}_{m}": (f"+{m} at {'slot 1' if where == 'first' else 'every slot'}", "{:+.2f}",
                                 f"siblings probe: expected extra tokens per (row, forward) had "
                                 f"{'the first window slot' if where == 'first' else 'every window slot'} carried "
                                 f"{m} more i.i.d. drafts from its q, verified by recursive rejection sampling "
                                 f"(first order: the rest of the run as it went)")
       for where, counts in (("first", (1, 3, 7)), ("all", (1, 3))) for m in counts},
    "first_slot_rejection": ("P(slot 1 rejected)", "{:.2f}", "siblings probe: mean probability that the first draft "
                             "of a forward is rejected (that forward then commits one token)"),
    "siblings_accepted": ("siblings/forward", "{:.3f}", "accepted siblings of the first draft per (row, forward) "
                          "(jacobi_siblings)"),
    "branch_accepted": ("branch/forward", "{:.3f}", "accepted drafts after an accepted first sibling per (row, "
                        "forward) (jacobi_sibling_drafts)"),
    **{f"after_{name}": (f"next after {label}", "{:.2f}", f"tokens a row commits in the forward right after one "
                         f"that {meaning}")
       for name, label, meaning in AFTER_ENDINGS.values()},
    "ms_per_forward": ("ms/forward", "{:.1f}", "wall ms of generate per forward (decoding iteration)"),
    "drafts_per_forward": ("drafts/forward", "{:.1f}", "mean drafts per row per forward: the window width, which "
                           "the adaptive window rule sets per iteration (prefill forward included)"),
    "row_tokens_per_forward": ("row tokens/forward", "{:.2f}", "tokens committed per (row, forward) while the "
                               "row is active: each image's own compression (equals step compression at batch 1)"),
}
COUNTS = ("num_images", "num_new_tokens", "num_forward_passes", "num_calls", "model_calls")
PAIRED = {"vs_base": ("vs base", "{:+.2f}", "paired difference of per-batch step compression to the row named in "
                      "`base` (same batches and seeds), mean ± SE over (seed, batch) pairs"),
          "d_loglik": ("d loglik", "{:+.3f}", "paired difference of per-image loglik to the ar row at the same "
                       "CFG (same images), mean ± SE over (seed, image) pairs")}
HELDOUT_PER_CLASS, HELDOUT_SEED = 64, 1  # the held-out crops of scripts/train_reference_model.py (report.json)


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


def sum_histograms(histograms: list[list[int]]) -> list[int]:
    from ..sampling import sum_histograms as total

    return total(histograms)


class Scorer:
    """Per-image quality features of the reference layout: decoded by its VQ, embedded and classified by the
    shipped reference classifier."""

    def __init__(self, subject, classifier) -> None:
        self.subject, self.classifier = subject, classifier

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, prompts: list[str]) -> dict:
        from ..reference import CLASS_NAMES

        images = self.subject.vq.decode_to_tensor(tokens[:, -self.subject.num_image_tokens:])
        features = self.classifier.features(images)
        predictions = self.classifier.head(features).argmax(-1).cpu()
        labels = torch.tensor([CLASS_NAMES.index(p) for p in prompts])
        return {"features": features.cpu().double().tolist(), "correct": (predictions == labels).tolist()}


def real_images(class_counts: dict[str, int], seed: int) -> torch.Tensor:
    """Fresh random crops of the reference photos, ``class_counts[name]`` per class (not training data:
    the training and held-out sets use seeds 0-2 through ``make_dataset``)."""
    from ..reference.data import CLASSES, load_source_photo, random_crops

    generator = torch.Generator().manual_seed(1_000_003 + seed)
    crops = [random_crops(load_source_photo(c.source), class_counts[c.name], generator)
             for c in CLASSES if class_counts.get(c.name)]
    return torch.cat(crops)


@torch.no_grad()
def reference_features(subject, classifier, prompts: list[str], num_images: int, seeds: list[int]) -> dict:
    """Held-out real-image features of the prompts' classes and the FD floors at the generated sample size."""
    from ..reference.data import CLASS_NAMES, make_dataset

    images, labels = make_dataset(HELDOUT_PER_CLASS, seed=HELDOUT_SEED)
    wanted = torch.tensor([CLASS_NAMES[int(label)] in set(prompts) for label in labels])
    heldout = classifier.embed(images[wanted]).double().numpy()
    counts = {name: n * num_images for name, n in Counter(prompts).items()}
    floor_real, floor_vq = {}, {}
    for seed in seeds:
        fresh = real_images(counts, seed)
        floor_real[str(seed)] = frechet_distance(classifier.embed(fresh).double().numpy(), heldout)
        codes = subject.vq.encode(fresh.to(subject.vq.codebook.device))
        recon = subject.vq.decode_to_tensor(codes).cpu()
        floor_vq[str(seed)] = frechet_distance(classifier.embed(recon).double().numpy(), heldout)

    def summary(per_seed):
        mean, se = mean_se(per_seed.values())
        return {"per_seed": per_seed, "mean": mean, "se": se}

    return {"features": heldout, "feature_dim": int(heldout.shape[1]), "real_images": int(heldout.shape[0]),
            "generated_images_per_seed": len(prompts) * num_images,
            "floor_real": summary(floor_real), "floor_vq": summary(floor_vq)}


SIBLING_METRICS = ("siblings_first_1", "siblings_first_3", "siblings_first_7", "siblings_all_1", "siblings_all_3",
                   "first_slot_rejection")


def _seed_metrics(parts: list[dict], reference_stats: dict | None, probe_name: str | None = None) -> dict:
    """The :data:`METRICS` of one (row, seed) from its batch records (TV to ar is filled in by the caller)."""
    from ..sampling import pooled_rates

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
    elif probe is not None and probe_name == "prior-cost":  # [seconds, calls]
        row["prior_ms"] = 1000 * probe[0] / max(probe[1], 1)
    elif probe is not None and probe_name == "siblings":  # [gains at slot 0 (m = 1, 3, 7), everywhere (1, 3),
        # P(first slot rejected), n]
        *gains, pairs = probe
        row.update({key: gain / max(pairs, 1) for key, gain in zip(SIBLING_METRICS, gains)})
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
        if any(s.get("num_branch_accepted") for s in stats):
            row["branch_accepted"] = sum(s.get("num_branch_accepted", 0) for s in stats) / sum(hist)
    after = [s["commits_after"] for s in stats if s.get("commits_after") is not None]
    for ending, (name, _, _) in AFTER_ENDINGS.items():
        forwards = sum(a[ending][1] for a in after)
        if forwards:
            row[f"after_{name}"] = sum(a[ending][0] for a in after) / forwards
    return row


def summarize(records: list[dict], rows: list, seeds: list[int], reference_stats: dict | None, vocab: int,
              guidance_of) -> dict:
    """``results.json["rows"]``: per-seed metrics, mean/SE across seeds, totals, paired differences.

    ``guidance_of(row)`` is a row's effective CFG scale (TV and d loglik compare with the ar row of the same)."""
    from ..quality import token_frequency_tv

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
    try:
        import torchmetrics  # noqa: F401
    except ImportError:
        return ("skipped: torchmetrics is not installed; FID/CLIPScore need it plus locally cached Inception/CLIP "
                "weights (FD-ref and class accuracy are this benchmark's proxies)")
    return ("skipped: torchmetrics is installed, but FID/CLIPScore are not wired for the reference model (64x64 "
            "class crops, no local Inception/CLIP weights); FD-ref and class accuracy are the proxies")
