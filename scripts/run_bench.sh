#!/usr/bin/env bash
# The README's `hf-sjd bench` section, end to end: run the benchmark into docs/results/bench/, copy its table
# and scatter plot to where the README takes them from, and refresh the README's generated sections.
#
#   scripts/run_bench.sh                                   # the committed table
#   METHODS=ar,sjd,sjd-pv scripts/run_bench.sh --phrase-library DIR
#
# Extra arguments go to the bench (they come after the defaults, so they override them).
set -euo pipefail
cd "$(dirname "$0")/.."
METHODS=${METHODS:-ar,sjd,mc-sjd,sjd-vp,mc-sjd-vp,sjd-pv,mc-sjd-pv,lantern,mc-lantern,lantern-pv,gsd,mc-gsd,sjd-vp-pv,prompt-lookup}
python -m hf_sjd.bench --methods "$METHODS" --prompts all --num-images 1 --batch-size 8 --seeds 0,1 \
    --threads 1 --out docs/results/bench --overwrite --quiet "$@"
cp docs/results/bench/results.md docs/results/bench.md
cp docs/results/bench/scatter.png docs/bench_scatter.png
python scripts/update_readme.py
