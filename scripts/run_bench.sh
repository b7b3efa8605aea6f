#!/usr/bin/env bash
# Every README benchmark, end to end: run the suites into docs/results/<suite>/, copy each results.md to
# docs/results/<suite>.md (what the README links), the core scatter plot to docs/bench_scatter.png, and
# refresh the README's generated sections (scripts/update_readme.py).
#
#   scripts/run_bench.sh                       # all suites at their default sizes (CPU: about an hour)
#   SUITES="core pv" scripts/run_bench.sh      # some of them
#   scripts/run_bench.sh --num-images 1        # extra flags go to every suite (after its defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
SUITES=${SUITES:-core verifiers vp pv library frontier}
for suite in $SUITES; do
    python -m hf_sjd.bench --suite "$suite" --threads 1 --out "docs/results/$suite" --overwrite --quiet "$@"
    cp "docs/results/$suite/results.md" "docs/results/$suite.md"
done
if [ -f docs/results/core/scatter.png ]; then cp docs/results/core/scatter.png docs/bench_scatter.png; fi
python scripts/update_readme.py
