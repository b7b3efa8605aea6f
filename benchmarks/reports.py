"""Reports of the study suites: ``results.md`` (one table per section), ``results.csv``, the plots.

A table cell is ``mean ± SE`` across seeds (just the mean for one seed); paired columns are ``mean ± SE``
over their pairs; ``-`` where a metric does not apply (acceptance of ``ar``, FD-ref off the reference layout).
"""

from __future__ import annotations

import csv
import io
import math

from .summaries import COUNTS, METRICS, PAIRED

SETTING_COLUMNS = {"batch_size": "batch", "guidance_scale": "CFG", "window": "window"}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def cell(spec: str, mean, se) -> str:
    if mean is None:
        return "-"
    if se is None:
        return _fmt(mean, spec)
    return f"{_fmt(mean, spec)} ± {_fmt(se, spec.replace('+', ''))}".replace("% ± ", " ± ")


def hist_text(hist: list[int] | None) -> str:
    """Percent of (row, forward) pairs that committed 1, 2, 3, ... tokens (the one histogram formatter)."""
    if not hist or not sum(hist[1:]):
        return "-"
    total, last = sum(hist), max(k for k, c in enumerate(hist) if c)
    return " ".join(f"{100 * c / total:.0f}" for c in hist[1:last + 1])


def column_label(key: str) -> str:
    if key in SETTING_COLUMNS:
        return SETTING_COLUMNS[key]
    if key == "tokens_per_forward":
        return "tokens/forward % (1,2,3,...)"
    return (METRICS.get(key) or PAIRED[key])[0]


def row_cell(key: str, entry: dict, results: dict) -> str:
    if key in SETTING_COLUMNS:
        value = entry[key] if entry[key] is not None else results["config"][key]
        return f"{value:g}"
    if key == "tokens_per_forward":
        return hist_text(entry["tokens_per_forward"])
    if key in PAIRED:
        pair = entry[key]
        if pair is None:
            return "-"
        text = cell(PAIRED[key][1], pair["mean"], pair["se"])
        if key == "vs_base":
            text += f" (vs {results['rows'][entry['base']]['method']})"
        return text
    return cell(METRICS[key][1], entry["mean"][key], entry["se"][key])


def section_table(section: dict, results: dict) -> list[str]:
    columns = [c for c in section["columns"] if results["reference"] is not None or c not in ("fd_ref",
                                                                                             "class_accuracy")]
    lines = ["| method | knobs | " + " | ".join(column_label(c) for c in columns) + " |",
             "|---|---|" + "---:|" * len(columns)]
    for key in section["rows"]:
        entry = results["rows"][key]
        lines.append(f"| {entry['method']} | {entry['label']} | "
                     + " | ".join(row_cell(c, entry, results) for c in columns) + " |")
    return lines


def markdown(results: dict) -> str:
    config, ref = results["config"], results["reference"]
    lines = [f"# `python -m benchmarks {results['suite']}`: {results['title']}", "",
             f"Command: `{results['command']}`", "", results["description"], ""]
    if results["sections"]:
        lines += [f"{len(config['prompts'])} prompts ({config['prompt_source']}) x {config['images_per_prompt']} "
                  f"image(s) x "
                  f"{len(config['seeds'])} seed(s) ({', '.join(map(str, config['seeds']))}), batch "
                  f"{config['batch_size']}, top-k {config['top_k']}, CFG {config['guidance_scale']:g}, window "
                  f"{config['window']} (unless a row says otherwise), {config['num_processes']} process(es) on "
                  f"{config['device']}, {config['threads'] or 'default'} thread(s), {results['seconds'] / 60:.1f} min. "
                  "Cells: mean ± standard error across seeds; paired columns: ± SE over their pairs.", ""]
        if config.get("model_family", "reference") != "reference":
            lines += [f"Model: `{config['model']}` (family {config['model_family']}), not the reference layout: "
                      "FD-ref and class accuracy need the reference classifier and VQ, so those columns are left out; "
                      "the speed columns, loglik (image-code positions, under the adapter's unguided logits), TV to "
                      "ar and repeats are this model's.", ""]
    for section in results["sections"]:
        lines += [f"## {section['title']}", ""]
        if section["note"]:
            lines += [section["note"], ""]
        lines += [*section_table(section, results), ""]
    for measurement in results["measurements"].values():
        lines += [f"## {measurement['title']}", "", measurement["text"], ""]
    if results["sections"]:
        used = {c for s in results["sections"] for c in s["columns"]}
        lines += ["Definitions:", ""]
        lines += [f"* **{column_label(k)}**: "
                  + (results["environment"]["peak_memory"] if k == "peak_memory_mb" else d[2]) + "."
                  for k, d in {**METRICS, **PAIRED}.items()
                  if k in used and (ref is not None or k not in ("fd_ref", "class_accuracy"))]
        if ref is not None and "fd_ref" in used:
            fd = ref["fd_ref"]
            real, vq = (cell("{:.2f}", fd[k]["mean"], fd[k]["se"]) for k in ("floor_real", "floor_vq"))
            lines.append(
                f"* **FD-ref floors**: the shipped reference classifier's {fd['feature_dim']}-d features (held-out "
                f"accuracy {100 * (ref['classifier_heldout_accuracy'] or 0):.1f}%), "
                f"{fd['generated_images_per_seed']} generated images per seed vs {fd['real_images']} held-out real "
                f"crops. At this sample size two real sets are {real} apart and VQ reconstructions of real crops {vq} "
                f"(the best a model over this tokenizer can reach). torchmetrics FID/CLIPScore: {ref['torchmetrics']}.")
        elif ref is None:
            lines.append("* FD-ref and class accuracy need the reference layout (its classifier and VQ); this "
                         "model has none, so those columns are left out.")
    return "\n".join(line for line in lines if line is not None).rstrip() + "\n"


def write_csv(results: dict) -> bytes:
    """One line per (row, seed), then ``seed=mean`` and ``seed=se`` lines per row."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["row", "method", "knobs", "seed", *METRICS, *COUNTS, "vs_base", "vs_base_se", "d_loglik",
                     "d_loglik_se"])
    for key, entry in results["rows"].items():
        pairs = [v for k in PAIRED for v in ((entry[k] or {}).get("mean"), (entry[k] or {}).get("se"))]
        for seed, row in entry["per_seed"].items():
            writer.writerow([key, entry["method"], entry["label"], seed, *(row[k] for k in METRICS),
                             *(row[k] for k in COUNTS), "", "", "", ""])
        for label in ("mean", "se"):
            writer.writerow([key, entry["method"], entry["label"], label, *(entry[label][k] for k in METRICS),
                             *([""] * len(COUNTS)), *(pairs if label == "mean" else [""] * 4)])
    return buffer.getvalue().encode()


def _png(figure, dpi: int = 110) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def plots(results: dict, samples: dict[str, list], sample_prompts: list[str]) -> dict[str, bytes]:
    """``scatter.png`` (step compression vs FD-ref, or vs d loglik off the reference layout),
    ``tokens_per_forward.png`` and ``samples.png`` for the first section; ``measurements.png`` for a suite
    without sections. PNG bytes by file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results["sections"]:
        figure, axis = plt.subplots(figsize=(6, 3))
        builds = next(iter(results["measurements"].values()))["data"].get("builds", [])
        axis.barh([f"{b['tokens']:,} tok, row {b['row_length'] or 'none'}" for b in builds],
                  [b["seconds"] for b in builds])
        axis.set_xlabel("build seconds")
        return {"measurements.png": _png(figure)}

    first = results["sections"][0]
    entries = {key: results["rows"][key] for key in first["rows"]}
    quality = "fd_ref" if results["reference"] is not None else "mean_token_loglik"
    figure, axis = plt.subplots(figsize=(6, 4.2))
    for key, entry in entries.items():
        mean, se = entry["mean"], entry["se"]
        if mean[quality] is None:
            continue
        name = entry["method"] + ("" if entry["label"] == "-" else f" ({entry['label']})")
        axis.errorbar(mean["step_compression"], mean[quality], xerr=se["step_compression"] or 0,
                      yerr=se[quality] or 0, fmt="o", capsize=3, label=name)
        axis.annotate(entry["method"], (mean["step_compression"], mean[quality]), textcoords="offset points",
                      xytext=(5, 4), fontsize=8)
    if quality == "fd_ref":
        fd = results["reference"]["fd_ref"]
        for name, style in (("floor_real", ":"), ("floor_vq", "--")):
            if fd[name]["mean"] is not None:
                axis.axhline(fd[name]["mean"], color="grey", linestyle=style, linewidth=1,
                             label="real vs real" if name == "floor_real" else "VQ reconstructions")
    axis.set_xlabel("step compression (new tokens per forward, higher is faster)")
    axis.set_ylabel("FD-ref (lower is better)" if quality == "fd_ref" else "loglik (nats/token)")
    axis.set_title(f"{first['title']}: mean ± SE over {len(results['config']['seeds'])} seed(s)", fontsize=9)
    axis.legend(fontsize=6)
    files = {"scatter.png": _png(figure)}

    with_hist = {k: e["tokens_per_forward"] for k, e in entries.items() if e["tokens_per_forward"]}
    columns = min(3, max(len(with_hist), 1))
    rows = max(1, math.ceil(len(with_hist) / columns))
    longest = max((len(h) for h in with_hist.values()), default=2)
    figure, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.5 * rows), squeeze=False)
    for axis, (key, hist) in zip(axes.flat, with_hist.items()):
        total = sum(hist)
        axis.bar(range(1, len(hist)), [100 * c / total for c in hist[1:]])
        axis.set_xlim(0.5, longest - 0.5)  # one scale for all rows
        axis.set_title(key, fontsize=8)
        axis.set_xlabel("tokens committed per forward", fontsize=8)
        axis.set_ylabel("% of (row, forward)", fontsize=8)
    for axis in list(axes.flat)[len(with_hist):]:
        axis.axis("off")
    figure.tight_layout()
    files["tokens_per_forward.png"] = _png(figure)

    if samples:
        width = max(len(images) for images in samples.values())
        figure, axes = plt.subplots(len(samples), width, figsize=(1.2 * width + 0.8, 1.3 * len(samples)),
                                    squeeze=False)
        for index, (name, images) in enumerate(samples.items()):
            for column in range(width):
                axis = axes[index, column]
                axis.set_xticks([])
                axis.set_yticks([])
                if column < len(images):
                    axis.imshow(images[column], interpolation="nearest")  # the model's own pixels, small PNG
                    if index == 0 and column < len(sample_prompts):
                        axis.set_title(sample_prompts[column], fontsize=7)
                else:
                    axis.axis("off")
            axes[index, 0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=7)
        figure.subplots_adjust(wspace=0.05, hspace=0.05)
        files["samples.png"] = _png(figure, dpi=80)  # ~1 pixel per generated pixel
    return files
