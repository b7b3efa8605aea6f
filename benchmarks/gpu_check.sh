#!/usr/bin/env bash
# The checks a GPU is needed for, as one prepared script: at most 14 minutes, the sum of its steps' time limits
# (each step has its own, so a slow one costs only itself). Writes into $OUT (default gpu_check/):
#
#   auto-7b-rows1.json   a 7B decoder (random bf16 weights: cost only) at one forward row: t(n)/t(1) at every token
#                        count of the cost model's cells, timed by this harness and by hf_sjd's own calibration,
#                        against the roofline prior; the cell each picks, and what generate(custom_generate="mc-sjd")
#                        picked and ran itself
#   auto-7b-batch8.json  the same at 8 rows, and the auto window rule's plan as rows finish
#   auto-7b-cfg.json     batch 8 with CFG 3 (16 forward rows)
#   speed/               python -m benchmarks speed on the reference model on the device: wall time of ar and each
#                        lossless default ("auto": calibrated on the device) at batch 1 / 8, CFG 1 / 3
#   loop-cost.json/.md   the loop's cost per iteration outside the forward on the device (syncs, ops, CUDA ms),
#                        reference model and vocabularies of 16k-184k (python -m benchmarks loop-cost --device cuda)
#   loop-cost-compiled.json/.md   the same with jacobi_compile=True at V = 65536, batch 1 (sjd, mc-sjd)
#   exactness.xml        the tests marked `device` (chi-square exactness and greedy equality through generate) run
#                        on the GPU: HF_SJD_TEST_DEVICE=cuda pytest -m device (tests/conftest.py)
#   summary.md           benchmarks/gpu_latency.py --summarize: the picks per file, each preset's modelled speed-up
#   log.txt              everything printed
#
# The device returns at most 8 files: the run of docs/results/gpu/ packed $OUT, e.g. `OUT=/tmp/gc bash
# benchmarks/gpu_check.sh; tar czf "$DEVICE_OUT/gpu_check.tgz" -C /tmp/gc .`. The limits are what an H200 took
# there with room (a 7B forward with transformers' eager code takes about 30 ms there): t(n)/t(1) is timed in pairs
# with a one-token forward (gpu_latency.paired_ratios), two forwards per count and round, so the steps that time
# every row count a batch passes through run fewer rounds (docs/results/gpu/calibration: about 113 s at one row
# with 3 + 10 rounds, 105 s at 8 rows with 1 + 5).
#
#   bash benchmarks/gpu_check.sh                  # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh --device cpu --shape tiny --dtype float32 ...   # extra flags go to every
#                                                 # gpu_latency.py call (the test runs it so, on a CPU)
# GPU_CHECK_7B=0 skips the three 7B steps, GPU_CHECK_LOOP_COST=0 the loop-cost steps, GPU_CHECK_SPEED=0 the speed
# suite, GPU_CHECK_TESTS=0 the tests. The device tool runs a command for at most 10 minutes: run the 7B steps (7.5
# minutes) with the other three off, then the rest (6.3 minutes) with GPU_CHECK_7B=0. GPU_CHECK_LIMIT scales every
# step's time limit (seconds x it); GPU_CHECK_WHEELS names the wheel folder (default .whl, below).
#
# The device image's transformers (5.17 when last read, /work/.library/device/KINDS.md) is older than hf_sjd needs
# (hf_sjd/compat.py), and transformers 5.25 needs a newer huggingface_hub. Carry them as wheels: here, `echo /.whl/
# >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl
# transformers==5.25.0 huggingface_hub==2.4.0 ...` (each wheel's Requires-Dist names what else the image lacks or
# has too old), then run this with `.whl` carried; wheels in .whl/ are installed into a folder ahead of the image's
# packages first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-.whl}
SITE=""
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    SITE=${TMPDIR:-/tmp}/gpu_check_site
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$WHEELS"/*.whl || exit 1
fi
export PYTHONPATH="$PWD${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1  # the checkout, installed or not
SCALE=${GPU_CHECK_LIMIT:-1}
status=0

step() {  # step NAME SECONDS COMMAND...: run it under its limit, log it, remember a failure
    local name=$1 seconds=$(( $2 * SCALE )); shift 2
    echo "== $name (limit ${seconds}s): $*"
    timeout "$seconds" "$@" || { echo "== $name failed (exit $?)"; status=1; }
}

{
    "$PYTHON" -c "import torch, transformers, hf_sjd; print('torch', torch.__version__, '| transformers',
transformers.__version__, '| cuda', torch.cuda.is_available() and torch.cuda.get_device_name())" || status=1
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    fi
    if [ "${GPU_CHECK_7B:-1}" != 0 ]; then
        step auto-7b-rows1 150 "$PYTHON" -m benchmarks.gpu_latency --shape 7b --auto-check --batch 1 --warmup 3 \
            --repeats 10 --out "$OUT/auto-7b-rows1.json" "$@"
        step auto-7b-batch8 150 "$PYTHON" -m benchmarks.gpu_latency --shape 7b --auto-check --batch 8 --warmup 1 \
            --repeats 5 --out "$OUT/auto-7b-batch8.json" "$@"
        step auto-7b-cfg 150 "$PYTHON" -m benchmarks.gpu_latency --shape 7b --auto-check --batch 8 \
            --guidance-scale 3 --warmup 1 --repeats 4 --out "$OUT/auto-7b-cfg.json" "$@"
    fi
    if [ "${GPU_CHECK_SPEED:-1}" != 0 ]; then
        step speed 100 "$PYTHON" -m benchmarks speed --seeds 0,1,2 --quiet --out "$OUT/speed"
    fi
    if [ "${GPU_CHECK_LOOP_COST:-1}" != 0 ]; then
        step loop-cost 100 "$PYTHON" -m benchmarks loop-cost --device cuda --methods ar,sjd,mc-sjd,sjd-pv \
            --vocab-sizes 16384,65536,184622 --json "$OUT/loop-cost.json" --markdown "$OUT/loop-cost.md"
        step loop-cost-compiled 60 "$PYTHON" -m benchmarks loop-cost --device cuda --methods sjd,mc-sjd \
            --vocab-sizes 65536 --batch-sizes 1 --guidance-scales 1 --modes compiled \
            --json "$OUT/loop-cost-compiled.json" --markdown "$OUT/loop-cost-compiled.md"
    fi
    if [ "${GPU_CHECK_TESTS:-1}" != 0 ]; then
        # (the image has no nbformat, a test extra: the notebook's test module is not collected)
        step exactness 120 env HF_SJD_TEST_DEVICE=cuda "$PYTHON" -m pytest -q -p no:cacheprovider -n 4 -m device \
            -rfE tests --ignore tests/test_notebook.py --junitxml "$OUT/exactness.xml"
    fi
    "$PYTHON" -m benchmarks.gpu_latency --summarize "$OUT" | tee "$OUT/summary.md" || status=1
    exit $status  # the block runs in a subshell (it is piped): its exit status is the script's
} 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
