"""What SJD's step compression buys in latency on a GPU: time a 1-token vs a (window+1)-token forward.

Acceleration cannot be measured with random weights (near-uniform distributions make drafts accept at
random), and the reference model is too small for forward cost to matter. So this splits the question:

* the *step compression* c (new tokens per forward) comes from the trained reference model
  (``hf-sjd bench --suite core``'s ``docs/results/core/results.json``, or ``--compression``);
* the *cost of a window forward* comes from a >= 1B-parameter model with random weights in bf16 on CUDA
  (``--shape``): ``1.3b``, LlamaGen-style Llama shapes (Sun et al. 2024, arXiv 2406.06525; Chameleon/Lumina-mGPT
  7B scaled down: hidden 2048, 24 layers, 16 heads, MLP 5632, 16384-code vocabulary), or ``7b``, the
  Chameleon / Lumina-mGPT 7B decoder (Chameleon Team 2024, arXiv 2405.09818: hidden 4096, 32 layers, 32 heads,
  MLP 11008, 65536-token vocabulary), the size the issue's targets and the cost model's ``SEVEN_B`` speak of;
  KV cache of ``--context`` tokens (~1k: a text prompt plus part of a 576-1024-token image).

speedup = c x t(1) / t(window+1), then corrected for the time spent outside the forward: x (1 - o_sjd) /
(1 - o_ar), with o the loop-overhead fractions measured on the reference model (``--loop-overhead``,
``--ar-loop-overhead``; defaults from the core results; a tiny CPU model overstates them, so this is pessimistic).
``--loop-tokens N`` also times both real loops (transformers' sampling and SJD, no CFG) on the random model
on the device, giving the overhead-inclusive estimate c x t_AR(token) / t_SJD(iteration) (an SJD iteration
costs the same whatever it accepts, as long as the window is full).
``--loop-cost ar,sjd,mc-sjd,sjd-pv`` also measures, on the device, the loop's cost per iteration outside the
forward (:mod:`benchmarks.loop_cost`: host-device syncs, kernel-launching ops, CUDA-event ms), with and without
``--guidance-scale``, with the model made LlamaGen-style (all ids but the last three are image tokens).

    python -m benchmarks.gpu_latency                              # CUDA, bf16, 1.3B
    python -m benchmarks.gpu_latency --loop-cost ar,sjd,mc-sjd,sjd-pv --guidance-scale 3 --batch 8 --loop-cost-compiled
    python -m benchmarks.gpu_latency --shape 7b --auto-check      # the "auto" pick: roofline vs measured cost
    python -m benchmarks.gpu_latency --shape 7b --auto-check --batch 8   # and the plan for the rows left
    python -m benchmarks.gpu_latency --summarize gpu_check/       # a table of the --out JSONs in a folder
    python -m benchmarks.gpu_latency --device cpu --shape tiny    # smoke test (seconds)

``benchmarks/gpu_check.sh`` runs the checks issue 16 leaves to a GPU as one prepared command (run from the
repository root; ``python benchmarks/gpu_latency.py`` works too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/gpu_latency.py`: the repository root holds the benchmarks package
    sys.path.insert(0, str(ROOT))
SHAPES = {  # LlamaGen-style decoder over VQ codes
    "1.3b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=16, vocab_size=16384),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=65536),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=512),
    "reference": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
                      num_key_value_heads=6, vocab_size=530),  # hf_sjd.reference.ar_config()'s shape
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--shape", default="1.3b", choices=sorted(SHAPES),
                        help="the random-weight decoder timed (tiny: a smoke test, CPU is fine)")
    parser.add_argument("--context", type=int, default=1024, help="tokens in the KV cache")
    parser.add_argument("--window", type=int, default=16, help="jacobi_window L (forward of L+1 tokens)")
    parser.add_argument("--batch", type=int, default=1, help="images per batch")
    parser.add_argument("--guidance-scale", type=float, default=1.0, help="> 1 doubles the forward batch (CFG)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--core-json", default=str(ROOT / "docs/results/core/results.json"),
                        help="a `python -m benchmarks core` results.json")
    parser.add_argument("--method", default="sjd", help="the core results' row to read compression/overhead from")
    parser.add_argument("--compression", type=float, default=None, help="step compression (default: core results)")
    parser.add_argument("--loop-overhead", type=float, default=None,
                        help="fraction of SJD wall time outside forwards (default: core results)")
    parser.add_argument("--ar-loop-overhead", type=float, default=None,
                        help="fraction of vanilla-sampling wall time outside forwards (default: core results)")
    parser.add_argument("--loop-tokens", type=int, default=0,
                        help="also time transformers' sampling loop and the SJD loop for this many tokens")
    parser.add_argument("--loop-cost", default="",
                        help="also measure the loop cost per iteration of these methods (comma-separated, of "
                             "ar, sjd, mc-sjd, sjd-pv; see benchmarks/loop_cost.py)")
    parser.add_argument("--loop-cost-iterations", type=int, default=8, help="steady iterations per loop-cost run")
    parser.add_argument("--loop-cost-compiled", action="store_true",
                        help="also measure the Jacobi methods with jacobi_compile=True (torch.compile of the loop's "
                             "tensor steps; compiles on the device first)")
    parser.add_argument("--loop-cost-repeats", type=int, default=3, help="timed loop-cost runs per case")
    parser.add_argument("--auto-check", action="store_true",
                        help="also time t(n)/t(1) at every token count of the cells jacobi_window='auto' picks "
                             "from, against the roofline it uses (hf_sjd/jacobi/cost_model.py), and report the "
                             "pick under each")
    parser.add_argument("--generate-tokens", type=int, default=160,
                        help="with --auto-check: new tokens of the generate(custom_generate='mc-sjd') call whose "
                             "own pick is reported (more than the widest window, which runs clamped to the tokens "
                             "left)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU runs)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--summarize", default=None, metavar="FOLDER",
                        help="only print a markdown table of the --out JSONs in FOLDER (what gpu_check.sh wrote)")
    args = parser.parse_args(argv)
    from hf_sjd.checks import check_choice, check_int

    from benchmarks.loop_cost import METHODS

    try:
        args.loop_cost = [check_choice("--loop-cost", m.strip(), METHODS) for m in args.loop_cost.split(",")
                          if m.strip()]
        check_int("--loop-cost-iterations", args.loop_cost_iterations, minimum=2)
        check_int("--loop-cost-repeats", args.loop_cost_repeats, minimum=1)
        check_int("--generate-tokens", args.generate_tokens, minimum=1)
    except ValueError as error:
        parser.error(str(error))
    return args


def bench_rows(path: Path) -> list[dict]:
    """(method, guidance, batch, mean metrics) of the plain rows (no knobs) of a study suite's results.json."""
    if not path.exists():
        return []
    results = json.loads(path.read_text())
    batch = results["config"]["batch_size"]
    return [{"method": row["method"], "guidance": row["guidance_scale"], "batch": row["batch_size"] or batch,
             **row["mean"]} for row in results["rows"].values() if not row["knobs"]]


def bench_entry(rows: list[dict], method: str, guidance: float, batch: int) -> dict:
    """The row of ``method`` closest to (guidance, batch): both equal, else the guidance, else any."""
    candidates = [r for r in rows if r["method"] == method]
    for matches in (lambda r: r["guidance"] == guidance and r["batch"] == batch, lambda r: r["guidance"] == guidance,
                    lambda r: True):
        found = [r for r in candidates if matches(r)]
        if found:
            return found[0]
    return {}


def reference_numbers(args: argparse.Namespace) -> dict:
    """Compression and loop overheads: flags first, else the reference model's ``python -m benchmarks core``
    results (the row of ``--method`` closest to this guidance and batch)."""
    guidance = 3.0 if args.guidance_scale > 1 else 1.0
    path = Path(args.core_json)
    rows = bench_rows(path)
    sjd, ar = bench_entry(rows, args.method, guidance, args.batch), bench_entry(rows, "ar", guidance, args.batch)
    values = {"compression": args.compression if args.compression is not None else sjd.get("step_compression"),
              "loop_overhead": args.loop_overhead if args.loop_overhead is not None else sjd.get("loop_overhead"),
              "ar_loop_overhead": (args.ar_loop_overhead if args.ar_loop_overhead is not None
                                   else ar.get("loop_overhead") or 0.0),
              "source": (f"{path} ({args.method}, CFG {sjd['guidance']:g}, batch {sjd['batch']})" if sjd
                         else "flags")}
    if values["compression"] is None:
        raise SystemExit(f"no step compression: {path} has no '{args.method}' entry; pass --compression")
    values["loop_overhead"] = values["loop_overhead"] or 0.0
    return values


def build_model(args: argparse.Namespace) -> LlamaForCausalLM:
    torch.manual_seed(0)
    with torch.device(args.device):
        return decoder(SHAPES[args.shape], args.dtype).eval()  # random weights: timing only


def decoder(shapes: dict, dtype: str) -> LlamaForCausalLM:
    """The ``--shape`` decoder of ``shapes`` (a :data:`SHAPES` entry) in ``dtype``, on torch's current device."""
    config = LlamaConfig(**shapes, max_position_embeddings=4096, pad_token_id=0, bos_token_id=None,
                         eos_token_id=None)
    return LlamaForCausalLM(config).to(getattr(torch, dtype))


class Timer:
    """Wall time of ``fn()``: CUDA events on a GPU (no host sync inside the timed region), else perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1000
        begin = time.perf_counter()
        fn()
        return time.perf_counter() - begin


def tree_positions(window_positions: torch.Tensor, num_siblings: int) -> torch.Tensor:
    """``[rows, L + 1 + m]`` positions of a tree forward's ``[uncached, drafts, siblings]`` from those of
    ``[uncached, drafts]`` (``[rows, L + 1]``): every sibling of the first draft sits at the first draft's position
    (what the Jacobi loop feeds the model; ``tests/benchmarks/test_gpu_latency.py`` checks it against a real
    ``generate(..., jacobi_siblings=m)``)."""
    return torch.cat([window_positions, window_positions[:, 1:2].expand(-1, num_siblings)], dim=1)


def tree_visibility(slots: torch.Tensor, num_cached: int, num_siblings: int) -> torch.Tensor:
    """``[W, K]`` bool (True: query ``w`` may attend to key ``k``) of a tree forward over ``num_cached`` cached
    slots, ``slots = 0 .. K - 1`` (K = cached + W appended: ``[uncached, drafts, siblings]``): the window is causal,
    a sibling sees the cached slots, the uncached token and itself."""
    key, query = slots[None], slots[num_cached:, None]  # [1, K], [W, 1]: each appended token's own slot
    sibling = query >= slots.shape[0] - num_siblings
    return (key <= query) & (~sibling | (key <= num_cached) | (key == query))


def forward_seconds(model, cache: DynamicCache, rows: int, context: int, num_tokens: int, args,
                    siblings: int = 0) -> float:
    """The median of :func:`forward_times`."""
    return statistics.median(forward_times(model, cache, rows, context, num_tokens, args, siblings))


@torch.no_grad()
def forward_times(model, cache: DynamicCache, rows: int, context: int, num_tokens: int, args,
                  siblings: int = 0) -> list[float]:
    """``--repeats`` times of one forward appending ``num_tokens`` to a ``context``-token cache (rolled back after;
    the device synchronised after each). With ``siblings`` the last of them are siblings of the first draft, under
    the loop's tree mask and positions (a 4D mask: another attention kernel than the causal one)."""
    device = model.device
    ids = torch.randint(0, model.config.vocab_size, (rows, num_tokens), device=device)
    window = context + torch.arange(num_tokens - siblings, device=device)  # the uncached token and the drafts
    positions = tree_positions(window.expand(rows, -1), siblings)
    if siblings:
        slots = torch.arange(context + num_tokens, device=device)
        mask = tree_visibility(slots, context, siblings)[None, None].expand(rows, -1, -1, -1)
    else:
        mask = torch.ones(rows, context + num_tokens, dtype=torch.long, device=device)
    timer, times = Timer(device), []

    def step():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
              logits_to_keep=num_tokens)  # like a Jacobi window forward: logits of every appended position

    for i in range(args.warmup + args.repeats):
        seconds = timer(step)
        cache.crop(-num_tokens)  # roll back, as the Jacobi loop does
        if i >= args.warmup:
            times.append(seconds)
    return times


@torch.no_grad()
def loop_seconds(model, args) -> dict:
    """Time transformers' sampling loop and the SJD loop for ``--loop-tokens`` tokens on the device (no CFG)."""
    import hf_sjd

    model = hf_sjd.enable(model)
    prompt = torch.randint(0, model.config.vocab_size, (args.batch, args.context), device=model.device)
    common = dict(do_sample=True, top_k=100, max_new_tokens=args.loop_tokens)  # no EOS: always the full length
    synchronize = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    model.generate(prompt, **common)  # warm-up
    synchronize()
    start = time.perf_counter()
    model.generate(prompt, **common)
    synchronize()
    ar = time.perf_counter() - start
    for _ in range(2):  # the first call warms up
        stats = model.generate(prompt, **common, custom_generate="sjd", jacobi_window=args.window,
                               return_dict_in_generate=True).stats
    return {"ar_seconds_per_token": ar / args.loop_tokens,
            "sjd_seconds_per_iteration": stats.seconds / stats.num_forward_passes,
            "sjd_loop_overhead_measured": stats.loop_overhead, "sjd_iterations": stats.num_forward_passes}


def image_model(model):
    """``model`` made LlamaGen-style (every id but the last three an image token, ``vocab - 2`` the null condition
    of CFG) and enabled, so ``generate(custom_generate=...)`` runs on it as on an image model."""
    import hf_sjd

    vocab = model.config.vocab_size
    model.config.image_token_range = [0, vocab - 3]
    model.config.null_condition_token_id = vocab - 2
    return hf_sjd.enable(model)  # the adapter is detected again: LlamaGen-style now


def loop_cost_figures(model, args: argparse.Namespace) -> list[dict]:
    """:func:`benchmarks.loop_cost.measure` of ``--loop-cost`` methods on this model and device, without CFG and
    (if ``--guidance-scale`` > 1) with it: syncs, ops and outside-forward ms per iteration. Random weights:
    cost only."""
    from benchmarks import loop_cost

    model = image_model(model)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab - 3, (args.batch, args.context), generator=generator)  # as the KV context
    subject = loop_cost.Subject(
        "gpu-latency", model, prompt=lambda b: prompt[:b], negative=lambda b: torch.full((b, 1), vocab - 2),
        max_new_tokens=(args.window + 1) * (args.loop_cost_iterations + 1),  # full windows whatever is accepted
        strategy_kwargs={"sjd-pv": {"phrase_library": loop_cost.motif_phrase_library(vocab - 3),
                                    "pv_ignore_fingerprint": True}})
    settings = loop_cost.Settings(iterations=args.loop_cost_iterations, window=args.window, top_k=100,
                                  repeats=args.loop_cost_repeats, warmup=1)
    scales = sorted({1.0, args.guidance_scale})
    modes = (False, True) if args.loop_cost_compiled else (False,)
    return [loop_cost.measure(subject, method, args.batch, scale, dataclasses.replace(settings, compile=compiled))
            for method in args.loop_cost for scale in scales for compiled in modes
            if not (compiled and method == "ar")]


def paired_ratios(model, cache: DynamicCache, rows: int, context: int, tokens: list[int], args,
                  siblings_at: dict[int, int]) -> dict[int, float]:
    """t(n)/t(1) for each of ``tokens``: the median over ``--repeats`` rounds (after ``--warmup`` untimed ones) of a
    one-token forward's time against the n-token forward's right after it. Pairs, because a forward bound by its
    host switches between two speeds on a shared machine (the H200's did, about 1.6x apart: docs/results/gpu); a
    run of forwards per count reads the speed of its moment too (as hf_sjd's calibration times them)."""
    once = argparse.Namespace(warmup=0, repeats=1)
    pairs = {n: [] for n in tokens}
    for round_ in range(args.warmup + args.repeats):
        for n in tokens:
            one = forward_times(model, cache, rows, context, 1, once)[0]
            many = forward_times(model, cache, rows, context, n, once, siblings_at.get(n, 0))[0]
            if round_ >= args.warmup:
                pairs[n].append(many / one)
    return {n: statistics.median(ratios) for n, ratios in pairs.items()}


def auto_check(model, cache: DynamicCache, rows: int, args: argparse.Namespace) -> dict:
    """t(n)/t(1) measured for every cell (L, m) of the ``"auto"`` table (n = L + 1 + m tokens per row, with the
    siblings' tree mask; the cells' token counts are distinct; :func:`paired_ratios`),
    against the roofline (the prior where timing is refused) and hf_sjd's own calibration of the same model, and
    the (window, siblings) each cost gives for this model, forward rows and context; then what ``generate`` itself
    picked (:func:`generate_pick`). With ``--batch`` > 1 also the auto window rule's plan (the cell for each number
    of rows left) under the measured and the roofline cost, from t(n)/t(1) measured at every row count the batch
    passes through."""
    from hf_sjd import CostProfile
    from hf_sjd.jacobi import cost_model

    shape = cost_model.ModelShape.of(model)
    siblings_at = {window + 1 + siblings: siblings for window, siblings in cost_model.STEP_COMPRESSION}
    tokens = sorted(siblings_at)
    measured = paired_ratios(model, cache, rows, args.context, tokens, args, siblings_at)
    roofline = {n: cost_model.cost_ratio(shape, rows, n, args.context) for n in tokens}
    model = image_model(model)
    profile = CostProfile.empty_for(model)  # the library's own calibration, as generate() runs it
    profile.measure(model, model.sjd_adapter, rows, args.context)
    calibrated = {n: profile.cost(rows, n) for n in tokens}
    check = {"forward_rows": rows, "measured_cost_ratio": measured, "roofline_cost_ratio": roofline,
             "calibration_cost_ratio": calibrated,
             "pick_measured": cost_model.pick(shape, rows, args.context, cost=lambda cell: measured[sum(cell) + 1]),
             "pick_calibration": cost_model.pick(shape, rows, args.context,
                                                 cost=lambda cell: calibrated[sum(cell) + 1]),
             "pick_roofline": cost_model.pick(shape, rows, args.context)}
    if args.batch > 1:
        per_image = rows // args.batch
        by_rows = {rows: measured}
        for left in range(1, args.batch):  # a cache of the rows left, as the loop keeps once rows finish
            fewer = left * per_image
            small = filled_cache(model, fewer, args.context)
            by_rows[fewer] = paired_ratios(model, small, fewer, args.context, tokens, args, siblings_at)
        plans = {name: cost_model.plan("auto", "auto", model, args.batch, per_image, args.context, True,
                                       device_type="cuda", cost=cost)
                 for name, cost in (("measured", lambda r, cell: by_rows[r][sum(cell) + 1]), ("roofline", None))}
        check.update(plan_measured=plans["measured"], plan_roofline=plans["roofline"],
                     measured_cost_ratio_by_rows=by_rows)
    check["generate"] = generate_pick(model, args)
    return check


def generate_pick(model, args: argparse.Namespace) -> dict:
    """What ``generate(custom_generate="mc-sjd")`` picks itself on this device (``"auto"``: its calibration and
    timed probe loops, then the plan fixed before the first forward) for ``--batch`` images (with CFG: a null
    condition), and the cells its ``--generate-tokens`` new tokens ran. Random weights: the cells, not the
    tokens, are the result."""
    vocab, device = model.config.vocab_size, model.device
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab - 3, (args.batch, args.context), generator=generator).to(device)
    kwargs = dict(do_sample=True, top_k=100, max_new_tokens=args.generate_tokens, custom_generate="mc-sjd",
                  return_dict_in_generate=True)
    if args.guidance_scale > 1:
        kwargs.update(guidance_scale=args.guidance_scale,
                      negative_prompt_ids=torch.full((args.batch, 1), vocab - 2, device=device))
    stats = model.generate(prompt, **kwargs).stats
    return {"window_plan": None if stats.window_plan is None else [list(cell) for cell in stats.window_plan],
            "cells": {f"{window}+{siblings}": list(totals) for (window, siblings), totals in stats.cells.items()},
            "cost_source": stats.cost_source, "seconds": stats.seconds}


def filled_cache(model, rows: int, context: int) -> DynamicCache:
    """A KV cache of ``rows`` x ``context`` random tokens (the prompt and image so far)."""
    prompt = torch.randint(0, model.config.vocab_size, (rows, context), device=model.device)
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def summarize(folder: Path) -> str:
    """Markdown of the ``--auto-check`` JSONs in ``folder``: for each, the cell the roofline picked when the file was
    written and picks now (the prior where timing is refused), the cells picked from t(n)/t(1) measured by this
    harness and by the library's own calibration, with c(L, m) and the speed-up each has under the harness's
    measured cost; the widest cell ``generate(custom_generate="mc-sjd")`` ran (its own pick, timed probe loops
    included; a window wider than the tokens left runs clamped to them); with ``--batch`` > 1 the auto window rule's
    plan under the roofline (as written) and the measured cost. Then the costs themselves, per file."""
    from hf_sjd.jacobi import cost_model

    lines = ["| file | device, shape | forward rows | roofline pick as run: c, speed-up at measured cost | roofline "
             "pick now | measured pick | calibration pick | generate's pick (widest cell run) | auto rule plan (1, 2, "
             "... rows left): roofline / measured |", "|---|---|---:|---|---|---|---|---|---|"]
    costs = ["| file | forward rows | t(1) ms | t(n)/t(1) at n = " + " / ".join(map(str, COST_TOKENS)) + ": measured |"
             " calibration | roofline now |", "|---|---:|---:|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        check = result.get("auto_check")
        if check is None:
            continue
        measured = {int(n): ratio for n, ratio in check["measured_cost_ratio"].items()}

        def cell(pick: list[int] | None) -> str:
            if pick is None:
                return "-"
            window, siblings = pick
            c = cost_model.STEP_COMPRESSION[(window, siblings)]
            return f"{window} + {siblings}: {c:.2f}, {c / measured[window + 1 + siblings]:.2f}x"

        shape, rows = _shape(result), check["forward_rows"]
        now = None if shape is None else cost_model.pick(shape, rows, result["context"])
        plans = ""  # the auto window rule's plan: only with --batch > 1
        if "plan_roofline" in check:
            plans = ("same" if check["plan_roofline"] == check["plan_measured"]
                     else f"{_cells(check['plan_roofline'])} / {_cells(check['plan_measured'])}")
        ran = check.get("generate", {}).get("cells", {})  # its widest cell is its pick (narrower: the last tokens)
        ran = max(ran, key=lambda name: [int(part) for part in name.split("+")], default="-")
        lines.append(f"| {path.name} | {result['device']}, {result.get('shape', '?')} | {rows} | "
                     f"{cell(check['pick_roofline'])} | {cell(now)} | {cell(check['pick_measured'])} | "
                     f"{cell(check.get('pick_calibration'))} | {ran} | {plans} |")
        if "t_forward_1_s" in result:
            calibrated = {int(n): ratio for n, ratio in check.get("calibration_cost_ratio", {}).items()}
            roofline = {n: cost_model.cost_ratio(shape, rows, n, result["context"]) for n in COST_TOKENS} \
                if shape is not None else {}
            costs.append(f"| {path.name} | {rows} | {result['t_forward_1_s'] * 1e3:.1f} | "
                         + " | ".join(" / ".join(f"{table[n]:.2f}" if n in table else "-" for n in COST_TOKENS)
                                      for table in (measured, calibrated, roofline)) + " |")
    return "\n".join(lines + ([""] + costs if len(costs) > 2 else []))


COST_TOKENS = (9, 17, 33, 65, 80)  # token counts of the cost table: the cells' L + 1 + m at 8, 16, 32, 64 drafts


def _shape(result: dict):
    """The roofline's :class:`~hf_sjd.jacobi.cost_model.ModelShape` of the ``--shape`` decoder a JSON describes
    (built on the meta device: no memory), or None where it names none."""
    from hf_sjd.jacobi.cost_model import ModelShape

    if "shapes" not in result:
        return None
    with torch.device("meta"):
        return ModelShape.of(decoder(result["shapes"], result["dtype"]))


def preset_speedups(folder: Path) -> str:
    """Markdown: the modelled speed-up of each lossless preset on the 7B shape at batch 1 and 8 (CFG 1), where
    ``folder`` holds what ``gpu_check.sh`` writes: the compression and cells each preset ran on the reference model
    on the device (``speed/results.json``), the 7B's measured t(n)/t(1) at that many rows (``auto-7b-rows1.json``,
    ``auto-7b-batch8.json``; never below 1: more tokens never cost less) and the loop's own work per iteration
    outside the forward on the device at V = 65536 (``loop-cost.json``; its CFG 3 cases, the ones it times at that
    vocabulary). Forward only: c / (t(n)/t(1)); with the loop's work: c (t(1) + o_ar) / (t(n) + o). Empty where a
    file is missing."""
    paths = [folder / name for name in ("speed/results.json", "auto-7b-rows1.json", "auto-7b-batch8.json",
                                        "loop-cost.json")]
    if not all(path.exists() for path in paths):
        return ""
    from hf_sjd import CostProfile

    speed, *sevens, loops = (json.loads(path.read_text()) for path in paths)
    sevens = {result["forward_rows"]: result for result in sevens}
    outside = {(case["method"], case["batch"]): case["outside_ms_per_iter"]["median"] / 1e3
               for case in loops["cases"] if case["vocab_size"] == 65536}
    lines = ["| preset | batch | cell (reference model, device) | compression | 7B t(n)/t(1) | forward only | with "
             "the loop's work |", "|---|---:|---|---:|---:|---:|---:|"]
    for key, entry in speed["measurements"]["speed"]["data"].items():
        method, batch, guidance = key.split("|")
        batch = int(batch[1:])
        if guidance != "g1" or batch not in sevens or "cells" not in entry:  # (ar in inference mode: no cell)
            continue
        seven = sevens[batch]
        measured = {int(n): r for n, r in seven["auto_check"]["measured_cost_ratio"].items()}
        profile = CostProfile(seven["shape"], seven["device"], seven["dtype"], {batch: {1: 1.0, **measured}})
        window, siblings = max(entry["cells"])  # the widest cell the timed calls ran
        ratio = max(1.0, profile.cost(batch, window + 1 + siblings))
        c, t1 = entry["compression"], seven["t_forward_1_s"]
        work = ""
        if (method, batch) in outside and ("ar", batch) in outside:
            work = f"{c * (t1 + outside['ar', batch]) / (t1 * ratio + outside[method, batch]):.2f}x"
        lines.append(f"| {method} | {batch} | {window} + {siblings} | {c:.2f} | {ratio:.2f} | {c / ratio:.2f}x | "
                     f"{work or '-'} |")
    return "\n".join(lines)


def _cells(plan: list[list[int]]) -> str:
    return ", ".join(f"{window}+{siblings}" for window, siblings in plan)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.summarize is not None:
        text = summarize(Path(args.summarize))
        presets = preset_speedups(Path(args.summarize))
        text += f"\n\n{presets}" if presets else ""
        print(text)
        return {"summary": text}
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU, or pass --device cpu --shape tiny for a smoke test")
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    reference = reference_numbers(args)
    model = build_model(args)
    rows = args.batch * (2 if args.guidance_scale > 1 else 1)  # CFG runs conditional + unconditional rows
    with torch.no_grad():
        cache = filled_cache(model, rows, args.context)
    t1 = forward_seconds(model, cache, rows, args.context, 1, args)
    tw = t1 * paired_ratios(model, cache, rows, args.context, [args.window + 1], args, {})[args.window + 1]
    c, o_sjd, o_ar = reference["compression"], reference["loop_overhead"], reference["ar_loop_overhead"]
    result = {
        "device": torch.cuda.get_device_name() if model.device.type == "cuda" else args.device,
        "dtype": args.dtype, "parameters": sum(p.numel() for p in model.parameters()),
        "shape": args.shape, "shapes": SHAPES[args.shape], "context": args.context, "window": args.window,
        "batch": args.batch, "forward_rows": rows, "warmup": args.warmup, "repeats": args.repeats,
        "t_forward_1_s": t1, f"t_forward_{args.window + 1}_s": tw, "window_cost_ratio": tw / t1,
        "reference": reference,
        "speedup_forward_only": c * t1 / tw,  # every second spent in forwards
        "speedup_with_loop_overhead": c * t1 / tw * (1 - o_sjd) / (1 - o_ar),
        "note": "random weights time the forward only; compression is the trained reference model's",
    }
    if args.loop_tokens:
        loops = loop_seconds(model, args)
        loops["speedup_measured_loops"] = c * loops["ar_seconds_per_token"] / loops["sjd_seconds_per_iteration"]
        result["loops"] = loops
    if args.auto_check:
        with torch.no_grad():
            result["auto_check"] = auto_check(model, cache, rows, args)
    if args.loop_cost:
        result["loop_cost"] = loop_cost_figures(model, args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        from hf_sjd.files import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
