#!/usr/bin/env python
"""Refresh the generated sections of README.md from the files the benchmark/training commands write.

A section is delimited by ``<!-- BEGIN name -->`` and ``<!-- END name -->``; its body is replaced by
``docs/results/name.md`` (``reference`` is rendered from ``hf_sjd/reference/weights/report.json``;
``headline`` is the first table of ``docs/results/core.md`` with its command line, written by
``python -m benchmarks core``). Sections the README does not have are left alone.

    python benchmarks/update_readme.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hf_sjd.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def reference_facts() -> str:
    report = json.loads((ROOT / "hf_sjd/reference/weights/report.json").read_text())
    vq, ar, clf, data = report["vq"], report["ar"], report["classifier"], report["data"]
    return "\n".join([
        "| fact | value |", "|---|---|",
        f"| training images (VQ) / sequences (AR) / held-out crops | {data['vq_train_images']} / "
        f"{data['ar_train_sequences']} / {data['heldout_images']} |",
        f"| VQ parameters / held-out PSNR / codebook usage | {vq['parameters']:,} / {vq['heldout_psnr_db']} dB / "
        f"{100 * vq['codebook_usage']:.1f}% of {vq['codebook_size']} |",
        f"| AR parameters / tokens seen | {ar['parameters']:,} / {ar['tokens_seen']:,} |",
        f"| AR validation loss (conditional / unconditional prompt) | {ar['val_loss']} / {ar['val_loss_unconditional']} nats |",
        f"| next-token entropy mean / median | {ar['mean_entropy_nats']} / {ar['median_entropy_nats']} nats |",
        f"| mean top-1 probability / top-1 accuracy | {ar['mean_top1_prob']} / {ar['top1_accuracy']} |",
        f"| reference classifier parameters / held-out accuracy | {clf['parameters']:,} / {100 * clf['heldout_accuracy']:.1f}% |",
        f"| training time (2 CPU cores) | {report['train_seconds'] / 60:.1f} min |",
    ])


def headline() -> str:
    """The command line and the first section's table of the core suite (the README's one results table)."""
    text = (ROOT / "docs/results/core.md").read_text()
    command = next(line for line in text.splitlines() if line.startswith("Command: "))
    table = text.split("\n## ", 2)[1].split("\n", 1)[1].strip()  # the first section, without its heading
    return f"{command}\n\n{table}"


def main() -> None:
    readme = (ROOT / "README.md").read_text()

    def body(match: re.Match) -> str:
        name = match.group(1)
        if name in ("reference", "headline"):
            text = reference_facts() if name == "reference" else headline()
            return f"<!-- BEGIN {name} -->\n{text}\n<!-- END {name} -->"
        text = (ROOT / f"docs/results/{name}.md").read_text().strip()
        if text.startswith("# "):  # the result file's own title; the README section has a heading already
            text = text.split("\n", 1)[1].strip()
        # the file's own sections sit below the README section's ### heading
        text = re.sub(r"^(#{2,3}) ", lambda m: "#" * (len(m.group(1)) + 2) + " ", text, flags=re.M)
        return f"<!-- BEGIN {name} -->\n{text}\n<!-- END {name} -->"

    updated = re.sub(r"<!-- BEGIN (\S+) -->.*?<!-- END \1 -->", body, readme, flags=re.S)
    atomic_write_text(ROOT / "README.md", updated)


if __name__ == "__main__":
    main()
