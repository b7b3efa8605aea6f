"""Why hf_sjd's calibration and a synchronised harness read different t(n)/t(1) on a GPU: every forward's time,
per token count, three ways on one model and cache.

    way         what runs                                   clock
    library     ``adapter.window_logits`` (zeros, as         CUDA events read once per count, no sync between
                :meth:`hf_sjd.CostProfile.measure` feeds it)  forwards (the calibration's clock)
    synced      the same forward                            the device synchronised after each forward
    harness     the bare model call of ``gpu_latency``       synchronised after each (``gpu_latency.forward_times``)

Then :meth:`~hf_sjd.CostProfile.measure` itself, ``--calibrations`` times. Every count is timed in two passes
(ascending, then descending), so a drift over the run and a count's first-use cost show apart. ``settle``: the
one-token forwards right after one of the widest count, each over the steady one-token forward (why ``measure``
reads the last of :data:`~hf_sjd.calibration.ONE_TOKEN_RUN`).

    python -m benchmarks.calibration_trace --shape 7b --out trace.json          # on the GPU
    python -m benchmarks.calibration_trace --device cpu --shape tiny             # smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu_latency import SHAPES, Timer, build_model, filled_cache, forward_times, image_model  # noqa: E402

SETTLE = 6  # one-token forwards timed after each of the widest count


def library_times(model, cache, rows: int, context: int, n: int, count: int, synced: bool) -> list[float]:
    """``count`` forwards of ``n`` zero tokens through the adapter after ``context`` cached ones (rolled back)."""
    from hf_sjd.timing import ForwardTimer

    device = model.device
    ids = torch.zeros(rows, n, dtype=torch.long, device=device)
    positions = torch.arange(context, context + n, device=device).expand(rows, -1)
    timer, times = ForwardTimer(), []
    for _ in range(count):
        mask = torch.ones(rows, context + n, dtype=torch.long, device=device)
        if synced:
            times.append(Timer(device)(lambda: model.sjd_adapter.window_logits(model, ids, mask, positions, cache, n)))
        else:
            started = timer.start(device)
            model.sjd_adapter.window_logits(model, ids, mask, positions, cache, num_logits=n)
            timer.stop(started)
        cache.crop(-n)
    return times if synced else timer.durations()


@torch.no_grad()
def trace(args: argparse.Namespace) -> dict:
    from hf_sjd import CostProfile
    from hf_sjd.calibration import TOKENS

    model = image_model(build_model(args))
    cache = filled_cache(model, args.rows, args.context)
    counts = list(TOKENS)
    result = {"shape": args.shape, "device": str(model.device), "dtype": args.dtype, "rows": args.rows,
              "context": args.context, "repeats": args.repeats, "passes": {}}
    harness_args = argparse.Namespace(warmup=1, repeats=args.repeats)
    library_times(model, cache, args.rows, args.context, 1, 10, synced=False)  # as measure(): settle first
    for name, order in (("ascending", counts), ("descending", counts[::-1])):
        result["passes"][name] = {
            way: {n: times(n) for n in order}
            for way, times in (
                ("library", lambda n: library_times(model, cache, args.rows, args.context, n, args.repeats, False)),
                ("synced", lambda n: library_times(model, cache, args.rows, args.context, n, args.repeats, True)),
                ("harness", lambda n: forward_times(model, cache, args.rows, args.context, n, harness_args)))}
    steady = statistics.median(library_times(model, cache, args.rows, args.context, 1, 2 * SETTLE, False))
    after_widest = []
    for _ in range(args.repeats):
        library_times(model, cache, args.rows, args.context, max(counts), 1, False)
        after_widest.append(library_times(model, cache, args.rows, args.context, 1, SETTLE, False))
    result["settle"] = [statistics.median(run[k] for run in after_widest) / steady for k in range(SETTLE)]
    result["calibrations"] = []
    for _ in range(args.calibrations):
        profile = CostProfile.empty_for(model)
        profile.measure(model, model.sjd_adapter, args.rows, args.context)
        result["calibrations"].append(profile.ratios[args.rows])
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=6, help="forwards per count, way and pass")
    parser.add_argument("--calibrations", type=int, default=3, help="CostProfile.measure runs after the trace")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = trace(args)
    for name, ways in result["passes"].items():
        for way, times in ways.items():
            one = min(times[1])
            print(f"{name:10s} {way:8s} " + " ".join(f"{n}:{min(t) / one:.2f}" for n, t in sorted(times.items())))
    print("settle after " + str(max(result["passes"]["ascending"]["library"])) + ": "
          + " ".join(f"{ratio:.2f}" for ratio in result["settle"]))
    for ratios in result["calibrations"]:
        print("measure()           " + " ".join(f"{n}:{c:.2f}" for n, c in sorted(ratios.items())))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
