#!/usr/bin/env bash
# Every study suite, end to end: run the suites into docs/results/<suite>/, copy each results.md to
# docs/results/<suite>.md (what the docs link), the core scatter plot to docs/bench_scatter.png, and
# refresh the README's generated sections (benchmarks/update_readme.py).
#
#   bash benchmarks/run_bench.sh                          # all suites at their default sizes (CPU: hours)
#   SUITES="core pv" bash benchmarks/run_bench.sh         # some of them
#   bash benchmarks/run_bench.sh --images-per-prompt 1    # extra flags go to every suite (after its defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
SUITES=${SUITES:-core verifiers vp pv library frontier}
for suite in $SUITES; do
    python -m benchmarks "$suite" --threads 1 --out "docs/results/$suite" --overwrite --quiet "$@"
    cp "docs/results/$suite/results.md" "docs/results/$suite.md"
done
if [ -f docs/results/core/scatter.png ]; then cp docs/results/core/scatter.png docs/bench_scatter.png; fi
python benchmarks/update_readme.py
