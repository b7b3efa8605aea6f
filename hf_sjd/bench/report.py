"""``hf-sjd bench``'s paired table from its per-batch records (markdown, CSV, and the plot of speed-up vs FID).

Every number has its standard error, every quality number also its difference to the baseline (``ar``, else the
first method) with a 95% interval (+- 1.96 SE), so "within noise" is a number. SE over batches: step compression,
seconds per image (a batch's images share their forwards); over images, paired by image: CLIP score; by
bootstrap over images, the same resamples for every method (:func:`hf_sjd.quality.bootstrap`): FID, FD-ref.
"""

from __future__ import annotations

import csv
import io

import torch

from ..sampling import merge_stats

#: a row's key -> (table label, format); a key's ``_se`` / ``_ci`` companions print next to it. Every key of a
#: row (companions included) goes to results.csv; those with a label and a value to results.md.
COLUMNS = {"num_images": ("images", "{}"), "num_forward_passes": (None, "{}"),
           "step_compression": ("step compression", "{:.2f}"), "seconds": ("wall s", "{:.1f}"),
           "seconds_per_image": ("s/image (batch {batch})", "{:.3g}"), "latency_b1": ("s/image (batch 1)", "{:.3g}"),
           "speedup": ("speed-up vs {baseline}", "{:.2f}x"), "acceptance_rate": ("acceptance", "{:.2f}"),
           "loop_overhead": ("loop overhead", "{:.0%}"), "fid": ("FID", "{:.2f}"),
           "fid_delta": ("FID - {baseline}", "{:+.2f}"), "clip_score": ("CLIP score", "{:.2f}"),
           "clip_score_delta": ("CLIP - {baseline}", "{:+.2f}"), "class_accuracy": ("class acc", "{:.2f}"),
           "fd_ref": ("FD-ref", "{:.1f}"), "fd_ref_delta": ("FD-ref - {baseline}", "{:+.1f}")}
GRID = 8  # the first images of every method, always saved (images/)


def _mean_se(values) -> tuple[float | None, float | None]:
    values = torch.as_tensor(values, dtype=torch.float64)
    if not len(values):
        return None, None
    return float(values.mean()), float(values.std() / len(values) ** 0.5) if len(values) > 1 else None


def _delta(row: dict, key: str, delta: float, se: float | None) -> None:
    row[f"{key}_delta"], row[f"{key}_delta_se"] = delta, se
    row[f"{key}_delta_ci"] = None if se is None else [delta - 1.96 * se, delta + 1.96 * se]


def _put(row: dict, key: str, values, base_values=None) -> None:
    """``row[key]`` mean +- SE of ``values``; with the baseline's ``base_values`` also the paired difference."""
    row[key], row[f"{key}_se"] = _mean_se(values)
    if base_values is not None and len(values) == len(base_values) and len(values):
        _delta(row, key, *_mean_se(torch.as_tensor(values, dtype=torch.float64) - torch.as_tensor(base_values)))


def summarise(batches: dict, latency: dict, baseline: str, distances: dict, resamples: int = 0,
              batch_size: int = 1) -> dict:
    """``{method: row}`` from ``batches[method]`` (batch records in image order), ``latency[method]`` (batch-1
    records) and ``distances``: column -> (record key of per-image features, features [N, D] -> distance)."""
    from ..quality import bootstrap

    rows, clip = {}, {}
    for method, records in batches.items():
        stats = [r["stats"] for r in records]
        row = rows[method] = merge_stats(stats)
        row["step_compression_se"] = _mean_se([s["step_compression"] for s in stats])[1]  # over batches
        full = [s for s in stats if s["num_images"] == batch_size] or stats  # a smaller last batch is not batch B
        _put(row, "seconds_per_image", [s["seconds"] / s["num_images"] for s in full])
        if batch_size > 1:  # (at batch 1 it is the column above)
            _put(row, "latency_b1", [r["stats"]["seconds"] for r in latency.get(method, ())])
        if "correct" in records[0]:  # the reference scorer's
            correct = [c for r in records for c in r["correct"]]
            row["class_accuracy"] = sum(correct) / len(correct)
        if "clip_score" in records[0]:
            clip[method] = [s for r in records for s in r["clip_score"]]
    for method, row in rows.items():
        row["speedup"] = rows[baseline]["seconds"] / row["seconds"] if row["seconds"] else None
        if method in clip:
            _put(row, "clip_score", clip[method], clip[baseline] if method != baseline else None)
    for column, (key, distance) in distances.items():
        names = list(batches)
        features = {m: torch.cat([torch.as_tensor(r[key], dtype=torch.float64) for r in batches[m]]) for m in names}
        size = len(features[baseline])  # [N, D] each; the bootstrap: [resamples, methods], the same indices for all
        values = bootstrap(lambda index: [distance(features[m][index]) for m in names], size, resamples) if (
            resamples > 1 and size > 1) else None
        found = {m: distance(features[m]) for m in names}
        for k, method in enumerate(names):
            row = rows[method]
            row[column], row[f"{column}_se"] = found[method], None if values is None else float(values[:, k].std())
            if method != baseline:
                _delta(row, column, found[method] - found[baseline],
                       None if values is None else float((values[:, k] - values[:, names.index(baseline)]).std()))
    return rows


def _cell(row: dict, key: str) -> str:
    """``value ± SE``, or for a difference ``value [95% interval]``."""
    text, interval, se = COLUMNS[key][1].format(row[key]), row.get(f"{key}_ci"), row.get(f"{key}_se")
    if interval is not None:
        return f"{text} [{interval[0]:+.2f}, {interval[1]:+.2f}]"
    return text if se is None or key.endswith("_delta") else f"{text} ± {COLUMNS[key][1].format(se).lstrip('+')}"


def markdown(results: dict) -> str:
    """The paired table: a column per :data:`COLUMNS` entry with a label that some method fills."""
    config, rows, baseline = results["config"], results["methods"], results["baseline"]
    columns = [c for c, (label, _) in COLUMNS.items() if label and any(r.get(c) is not None for r in rows.values())]
    batch = min(config["batch_size"], config["num_images"])  # the batch that ran: fewer images make a smaller one
    labels = [COLUMNS[c][0].format(batch=batch, baseline=baseline) for c in columns]
    lines = [f"# `{results['command']}`", "",
             f"{config['num_images']} images per method ({len(set(config['prompts']))} prompts), batch "
             f"{batch}, top-k {config['top_k']}, CFG {config['guidance_scale']:g}, window "
             f"{config['window']}, seed {config['seed']} (+ the batch's first image), {config['device']}; model: "
             f"{config['model'] or 'the shipped reference model'}.", "",
             "| method | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(columns)]
    for method, row in rows.items():
        cells = ["-" if row.get(c) is None else _cell(row, c) for c in columns]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "x ± y: a value and its standard error; [a, b]: a 95% interval of the difference to "
              f"{baseline} (same prompts and seeds). {results['note']}"]
    if results["fd_ref_floor"] is not None:
        lines.append(f"FD-ref of {config['num_images']} real crops against the held-out ones (the floor at this "
                     f"sample size): {results['fd_ref_floor']:.1f}.")
    return "\n".join(lines) + "\n"


def table_csv(rows: dict) -> bytes:
    """One line per method: every key of its row (lists such as histograms and intervals as JSON-ish text)."""
    keys = list(dict.fromkeys(k for row in rows.values() for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, ["method", *keys], lineterminator="\n")
    writer.writeheader()
    writer.writerows({"method": method, **row} for method, row in rows.items())
    return buffer.getvalue().encode()


def plot(results: dict) -> bytes | None:
    """PNG: FID (+- SE) against the speed-up over the baseline, one point per method; None without FID; an
    ``ImportError`` without matplotlib."""
    rows = {m: r for m, r in results["methods"].items() if r.get("fid") is not None and r.get("speedup")}
    if not rows:
        return None
    import matplotlib  # the bench extra's: ImportError without it (the caller says so; the table needs none)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 4))
    for method, row in rows.items():
        axes.errorbar(row["speedup"], row["fid"], yerr=row.get("fid_se"), fmt="o", capsize=3)
        axes.annotate(method, (row["speedup"], row["fid"]), textcoords="offset points", xytext=(5, 5))
    axes.set(xlabel=f"speed-up over {results['baseline']} (wall time)", ylabel="FID (lower is better)",
             title=f"{results['config']['model_family']}: {results['config']['num_images']} images per method")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()
