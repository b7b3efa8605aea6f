"""Measurements of a suite that are not image generation: the phrase-library build speed, the merges-ablation
library (a resource of the ``pv`` suite), and the frontier suite's forward cost model (a roofline model, not a
measurement) with what it makes of the measured rows.

Each measurement is ``fn(subject, args) -> {"title", "text" (markdown), "data" (JSON)}``; ``args`` are the
resolved bench flags (``library_tokens``, ``library_merges``, ``ablation_corpus_images``) plus ``summary``, the
summarised rows of this run (``results.json["rows"]``) for measurements that combine a model with them.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import torch

from hf_sjd.jacobi import cost_model

from .suites import COST_CONTEXT, COST_ROWS, MODEL_SIZES, SEVEN_B_SIZE
from hf_sjd.jacobi.cost_model import cost_ratio as roofline_ratio


def ablation_library(subject, num_images: int):
    """A 16k-merge library from ``num_images`` tokenized reference training crops (the shipped library's recipe
    minus the PNG round trip), so ``first(M)`` gives the 1k/4k/8k/16k libraries of one corpus."""
    from hf_sjd.phrases import PhraseLibrary
    from hf_sjd.reference.data import CLASSES, make_dataset

    images, _ = make_dataset(max(1, num_images // len(CLASSES)), seed=2)
    with torch.no_grad():
        codes = torch.cat([subject.vq.encode(images[i:i + 256]).reshape(-1, subject.num_image_tokens)
                           for i in range(0, len(images), 256)])
    start = time.perf_counter()
    library = PhraseLibrary.from_token_sequences(codes, num_merges=16000, codebook_size=subject.vq.codebook_size,
                                                 fingerprint=subject.vq.fingerprint())
    return library, time.perf_counter() - start, codes.numel()


# -- library build speed ------------------------------------------------------------------------------------
def fit_markov_chain(codes: torch.Tensor, num_codes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``codes`` [N, L] -> (first-token CDF [C], transition CDFs [C, C]); unseen rows fall back to uniform."""
    first = torch.bincount(codes[:, 0], minlength=num_codes).double()
    pairs = codes[:, :-1] * num_codes + codes[:, 1:]  # [N, L-1] packed (previous, next)
    transitions = torch.bincount(pairs.flatten(), minlength=num_codes * num_codes).double().view(num_codes, num_codes)
    transitions[transitions.sum(1) == 0] = 1.0
    return (first / first.sum()).cumsum(0), (transitions / transitions.sum(1, keepdim=True)).cumsum(1)


def sample_markov_chain(first_cdf: torch.Tensor, cdf: torch.Tensor, num_sequences: int, length: int,
                        generator: torch.Generator) -> torch.Tensor:
    """Inverse-CDF sampling, one raster position at a time for all sequences: ``[num_sequences, length]``."""
    out = torch.empty(num_sequences, length, dtype=torch.long)
    last = len(first_cdf) - 1
    u = torch.rand(num_sequences, generator=generator, dtype=torch.double)
    out[:, 0] = torch.searchsorted(first_cdf, u).clamp_(max=last)
    for t in range(1, length):
        u = torch.rand(num_sequences, 1, generator=generator, dtype=torch.double)
        out[:, t] = torch.searchsorted(cdf[out[:, t - 1]], u).squeeze(1).clamp_(max=last)
    return out


def library_build(subject, args) -> dict:
    """Build ``--library-merges`` merges over a ``--library-tokens`` Markov-chain corpus, with and without the
    row boundary; plus the shipped library's recorded build."""
    from hf_sjd.phrases import PhraseLibrary
    from hf_sjd.reference import GRID_SIZE, weights_dir
    from hf_sjd.reference.data import make_dataset

    per_class = min(64, max(4, args.library_tokens // 4096))  # 64 crops per class; fewer for a tiny corpus
    images, _ = make_dataset(per_class, seed=2)  # crops like the AR training set's
    with torch.no_grad():
        real = torch.cat([subject.vq.encode(chunk).flatten(1) for chunk in images.split(256)])  # [N, 256]
    num_codes, length = subject.vq.codebook_size, real.shape[1]
    first_cdf, cdf = fit_markov_chain(real, num_codes)
    corpus = sample_markov_chain(first_cdf, cdf, -(-args.library_tokens // length), length,
                                 torch.Generator().manual_seed(0))
    rows = []
    for row_length in (None, GRID_SIZE):
        start = time.perf_counter()
        library = PhraseLibrary.from_token_sequences(corpus, num_merges=args.library_merges, row_length=row_length,
                                                     codebook_size=num_codes)
        rows.append({"corpus": "Markov chain fitted to reference crops", "tokens": int(corpus.numel()),
                     "row_length": row_length, "merges": args.library_merges,
                     "seconds": time.perf_counter() - start, "phrases": len(library),
                     "mean_length": float(library.lengths.float().mean()), "max_length": int(library.max_length)})
    shipped = PhraseLibrary.from_pretrained(weights_dir() / "ar" / "phrases")
    meta = shipped.metadata
    rows.append({"corpus": "shipped reference library (real tokens, from its metadata)",
                 "tokens": meta["corpus"]["tokens"], "row_length": meta["row_length"], "merges": meta["num_merges"],
                 "seconds": meta["build_seconds"], "phrases": len(shipped),
                 "mean_length": float(shipped.lengths.float().mean()), "max_length": int(shipped.max_length)})
    lines = [f"{os.cpu_count()} CPU cores ({platform.machine()}).", "",
             "| corpus | tokens | row length | merges | seconds | phrases | mean length | max length |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['corpus']} | {r['tokens']:,} | {r['row_length'] or 'none'} | {r['merges']} | {r['seconds']:.1f} "
              f"| {r['phrases']} | {r['mean_length']:.2f} | {r['max_length']} |" for r in rows]
    return {"title": "Build speed", "text": "\n".join(lines), "data": {"builds": rows}}


# -- frontier: the forward cost model (a model, not a measurement) -----------------------------------------------
# The roofline of hf_sjd.jacobi.cost_model (the one the mc-sjd preset's "auto" window and siblings are picked by).
#: label -> the decoder's shape (hidden size = key/value width: no grouped-query attention)


def cost_ratio(size: str, rows: int, window: int) -> float:
    """t(L+1) / t(1): what one Jacobi forward of window L costs in vanilla decoding steps."""
    return roofline_ratio(MODEL_SIZES[size], rows, window + 1, COST_CONTEXT)


def pick_window(compression: dict[int, float], size: str, rows: int) -> tuple[int, float]:
    """The window maximising modelled speed-up = compression(L) / (t(L+1)/t(1)), and that speed-up."""
    speed = {w: c / cost_ratio(size, rows, w) for w, c in compression.items()}
    best = max(speed, key=speed.get)
    return best, speed[best]


def frontier_cost_model(subject, args) -> dict:
    """The roofline t(L+1)/t(1) table, and per (model size, rows) the window it picks for each strategy of the
    ``window`` section, from that section's measured step compression (``args.summary``: the summarised rows)."""
    from .suites import FRONTIER_WINDOWS

    windows = FRONTIER_WINDOWS
    lines = ["**Model, not a measurement**: a roofline of one forward (bf16 weights read once per forward, KV cache "
             f"of {COST_CONTEXT} tokens per row, 2 x params FLOPs per token, "
             f"{cost_model.BANDWIDTH / 1e12:g} TB/s, {cost_model.PEAK_FLOPS / 1e12:g} TFLOP/s, "
             f"{cost_model.LAYER_HOST_S * 1e3:g} ms of host time per layer; `hf_sjd.jacobi.cost_model`). Rows = "
             "images x 2 "
             "with CFG. `benchmarks/gpu_latency.py` measures "
             "t(L+1)/t(1) on a real device.", "",
             "| model | rows | " + " | ".join(f"t({w + 1})/t(1)" for w in windows) + " |",
             "|---|---:|" + "---:|" * len(windows)]
    ratios = {}
    for size in MODEL_SIZES:
        for rows in COST_ROWS:
            ratios[f"{size}|{rows}"] = {str(w): cost_ratio(size, rows, w) for w in windows}
            lines.append(f"| {size} | {rows} | " + " | ".join(f"{cost_ratio(size, rows, w):.2f}" for w in windows)
                         + " |")
    # measured compression of the window section: (method, label) -> {window: step compression}
    curves: dict[str, dict[int, float]] = {}
    for entry in (getattr(args, "summary", None) or {}).values():
        if entry["window"] in windows and entry["batch_size"] == 1 and entry["mean"]["step_compression"]:
            name = entry["method"] + ("" if entry["label"] == "-" else f", {entry['label']}")
            curves.setdefault(name, {})[entry["window"]] = entry["mean"]["step_compression"]
    curves = {name: curve for name, curve in curves.items() if len(curve) == len(windows)}
    cases = [(size, rows) for size in MODEL_SIZES for rows in COST_ROWS]
    picks = {}
    if curves:
        lines += ["", "Window maximising the modelled speed-up over vanilla, measured step compression(L) / "
                  "(t(L+1)/t(1)), from the `window` section (model x measurement); cell: window (speed-up):", "",
                  "| strategy | " + " | ".join(f"{size.split()[0]}, {rows} rows" for size, rows in cases) + " |",
                  "|---|" + "---:|" * len(cases)]
        for name, curve in curves.items():
            cells = []
            for size, rows in cases:
                window, speed = pick_window(curve, size, rows)
                picks[f"{name}|{size}|{rows}"] = {"window": window, "speedup": speed}
                cells.append(f"{window} ({speed:.2f}x)")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    else:
        lines += ["", "(No window pick: the `window` section did not run at every window.)"]
    return {"title": "Forward cost model (model, not a measurement) and the window it picks",
            "text": "\n".join(lines), "data": {"kind": "model, not a measurement", "cost_ratio": ratios,
                                               "picks": picks}}


# -- frontier: siblings under the same cost model ---------------------------------------------------------------
def mean_cost_ratio(size: str, rows: int, forward_windows: list[int], extra: int = 0) -> float:
    """Mean t(L+1)/t(1) over a run's forwards (``forward_windows[L]``: forwards of width L), each at its own width
    (the roofline is convex in L, so the cost at the mean width would understate a varying window's cost);
    ``extra`` more input tokens in every forward with drafts (siblings; the prefill is charged them too)."""
    total = sum(forward_windows)
    return sum(n * cost_ratio(size, rows, width + (extra if width else 0))
               for width, n in enumerate(forward_windows) if n) / total


def siblings_cost_model(subject, args) -> dict:
    """Modelled speed-up over vanilla of the ``siblings`` rows for a 7B model: step compression / mean over
    forwards of t(L+1+m)/t(1) (m siblings ride in every forward), at the row counts each batch size stands in for."""
    from .suites import FRONTIER

    summary = getattr(args, "summary", None) or {}
    keys = [r.key for s in FRONTIER.sections if s.name == "siblings" for r in s.rows if r.key in summary]
    if not keys:
        return {"title": "Siblings under the cost model", "text": "(The siblings section did not run.)",
                "data": {"kind": "model, not a measurement", "rows": {}}}
    lines = [f"**Model, not a measurement** (the roofline above, {SEVEN_B_SIZE.split()[0]} model): speed-up = step "
             "compression / mean over forwards of t(L+1+m)/t(1). The batch-1 rows stand in for 1 forward row, the "
             "batch-8 rows for 8 and 16.", "", "| knobs | batch | window | input tokens/row | step compression | "
             "modelled speed-up |", "|---|---:|---:|---:|---:|---|"]
    entries = {}
    for key in keys:
        entry = summary[key]
        siblings = dict(entry.get("knobs") or {}).get("jacobi_siblings", 0)
        compression, widths = entry["mean"]["step_compression"], entry["forward_windows"]
        counts = (1,) if entry["batch_size"] == 1 else (8, 16)
        speedup = {str(r): compression / mean_cost_ratio(SEVEN_B_SIZE, r, widths, extra=siblings) for r in counts}
        entries[key] = {"label": entry["label"], "batch_size": entry["batch_size"], "window": entry["window"],
                        "siblings": siblings, "step_compression": compression, "speedup": speedup}
        tokens = entry["window"] + 1 + siblings
        lines.append(f"| {entry['label']} | {entry['batch_size']} | {entry['window']} | {tokens} | {compression:.2f} | "
                     + ", ".join(f"{r} rows: {v:.2f}x" for r, v in speedup.items()) + " |")
    best = {}  # per row count: the row of highest modelled speed-up (its window and siblings: the model's pick)
    for key, entry in entries.items():
        for count, value in entry["speedup"].items():
            if count not in best or value > best[count]["speedup"]:
                best[count] = {"row": key, "window": entry["window"], "siblings": entry["siblings"], "speedup": value}
    lines += ["", "Pick (highest modelled speed-up per forward row count): " + "; ".join(
        f"{count} rows: window {b['window']} + {b['siblings']} siblings ({b['speedup']:.2f}x)"
        for count, b in sorted(best.items(), key=lambda item: int(item[0])))]
    return {"title": "Siblings under the cost model (model, not a measurement)", "text": "\n".join(lines),
            "data": {"kind": "model, not a measurement", "size": SEVEN_B_SIZE, "rows": entries, "best": best}}


def auto_cost_model(subject, args) -> dict:
    """The (window, siblings) ``"auto"`` picks on a CUDA device per model size and forward row count: from the
    shipped table (:data:`~hf_sjd.jacobi.cost_model.STEP_COMPRESSION`, what ``generate`` uses) and, where the
    ``auto`` section ran, from this run's measured cells."""
    from .suites import AUTO_GRID, FRONTIER

    summary = getattr(args, "summary", None) or {}
    keys = [r.key for s in FRONTIER.sections if s.name == "auto" for r in s.rows]
    measured = {cell: summary[key]["mean"]["step_compression"] for cell, key in zip(AUTO_GRID, keys) if key in summary}
    rows = (1, 2, 8, 16, 32)
    tables = {"shipped": cost_model.STEP_COMPRESSION, **({"this run": measured} if len(measured) == len(AUTO_GRID)
                                                         else {})}
    lines = ["**Model, not a measurement** (the roofline of `hf_sjd.jacobi.cost_model`, KV cache of "
             f"{COST_CONTEXT} tokens per row): the cell (window L, siblings m) of highest step compression / "
             "(t(L+1+m)/t(1)). Rows = images x 2 with CFG. On CPU `auto` is window 16 without siblings.", "",
             "| model | table | " + " | ".join(f"{r} rows" for r in rows) + " |", "|---|---|" + "---:|" * len(rows)]
    picks = {}
    for size, shape in MODEL_SIZES.items():
        for name, table in tables.items():
            cells = []
            for r in rows:
                best = cost_model.pick(shape, r, COST_CONTEXT, table=table)
                speed = cost_model.speedup(shape, r, COST_CONTEXT, best, table)
                picks[f"{size}|{name}|{r}"] = {"window": best[0], "siblings": best[1], "speedup": speed}
                cells.append(f"{best[0]} + {best[1]} ({speed:.2f}x)")
            lines.append(f"| {size.split()[0]} | {name} | " + " | ".join(cells) + " |")
    if measured:
        shipped = cost_model.STEP_COMPRESSION
        lines += ["", "This run's cells against the shipped table: " + "; ".join(
            f"({L}, {m}): {measured[L, m]:.2f} vs " + (f"{shipped[L, m]:.2f}" if (L, m) in shipped else "not shipped")
            for L, m in measured)]
    return {"title": "The auto window and siblings under the cost model (model, not a measurement)",
            "text": "\n".join(lines), "data": {"kind": "model, not a measurement", "picks": picks,
                                               "measured": {f"{L},{m}": c for (L, m), c in measured.items()}}}


def expected_max(values: list[float], n: int) -> float:
    """E[max of ``n`` independent draws from the empirical distribution of ``values``], exactly: P(max <= v) =
    F(v)^n, so E[max] = sum over the distinct values v of v (F(v)^n - F(v-)^n).

    >>> expected_max([1, 3], 2)  # (1, 1): 1; (1, 3), (3, 1), (3, 3): 3
    2.5
    """
    ordered, total, below, mean = sorted(values), len(values), 0.0, 0.0
    for i, value in enumerate(ordered):
        if i + 1 < total and ordered[i + 1] == value:
            continue
        cdf = (i + 1) / total
        mean += value * (cdf ** n - below ** n)
        below = cdf
    return mean


def batch_straggler(subject, args) -> dict:
    """Why batch 8 keeps less step compression than batch 1: a batch's forwards are the most any of its images
    needs. For each pair of the ``straggler`` section, the batch-8 forwards per call are predicted from the
    batch-1 forwards of the same images, (a) batch by batch as the most of its eight images' (each image's
    batch-1 run is one draw from the forwards that image needs, so the max over a batch's images has the batch's
    expectation if rows decode in a batch as they do alone), and (b) from the spread of the batch-1 forwards
    alone, as E[max of 8 independent draws]. The measured ratio factors exactly into (batch-1 forwards / a row's
    own forwards in the batch) x (a row's own forwards / the batch's, which is its slowest row's): how decoding
    inside a batch changes a row, and what waiting for the slowest row costs."""
    from .suites import _straggler_pairs

    summary = getattr(args, "summary", None) or {}
    pairs = [(one.key, many.key) for one, many in _straggler_pairs() if one.key in summary and many.key in summary]
    if not pairs:
        return {"title": "Batch 8 against batch 1: the slowest row", "text": "(The straggler section did not run.)",
                "data": {"pairs": {}}}
    lines = ["Forwards per generate call, pooled over seeds (the same images at both batch sizes; each call "
             "decodes every image to its full grid, so step compression = tokens per image / forwards per call and "
             "the ratio of compressions is the inverse ratio of forwards). Predicted batch-8 forwards: (a) per "
             "batch, the most of its images' batch-1 forwards; (b) E[max of 8 independent draws] of the batch-1 "
             "forwards. The target (batch 8 >= 85% of batch 1) needs batch-8 forwards <= 1.18 x the batch-1 mean.",
             "", "| batch 1 | batch 8 | batch-1 forwards: mean, CV | batch-8 forwards: row's own, batch's | measured "
             "ratio | = row in a batch | x slowest row | predicted: (a) same images | (b) spread alone |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    data = {}
    for one_key, many_key in pairs:
        single = {(call["seed"], str(call["items"][0])): call["forwards"]  # (seed, image) -> its forwards
                  for call in summary[one_key]["forwards_per_call"]}
        calls = summary[many_key]["forwards_per_call"]
        mean_one = statistics.mean(single.values())
        spread = statistics.stdev(single.values()) / mean_one if len(single) > 1 else 0.0
        batch = max(len(call["items"]) for call in calls)
        mean_many = statistics.mean(call["forwards"] for call in calls)
        row_forwards = [f for call in calls for f in call["row_forwards"] or ()]
        own = statistics.mean(row_forwards) if row_forwards else float("nan")
        same_images = sum(max(single[(call["seed"], str(item))] for item in call["items"])
                          for call in calls) / len(calls)
        iid = expected_max(list(single.values()), batch)
        entry = {"batch_1_forwards": mean_one, "batch_1_cv": spread, "batch_forwards": mean_many, "batch": batch,
                 "measured_ratio": mean_one / mean_many, "predicted_ratio_same_images": mean_one / same_images,
                 "predicted_ratio_spread": mean_one / iid, "row_in_batch": mean_one / own,
                 "slowest_row": own / mean_many, "row_forwards": own, "images": len(single), "calls": len(calls)}
        data[f"{one_key} | {many_key}"] = entry
        lines.append(f"| {summary[one_key]['label']}, window {summary[one_key]['window']} | "
                     f"{summary[many_key]['label']} | {mean_one:.1f}, {100 * spread:.0f}% | {own:.1f}, "
                     f"{mean_many:.1f} | {100 * entry['measured_ratio']:.1f}% | {100 * entry['row_in_batch']:.1f}% | "
                     f"{100 * entry['slowest_row']:.1f}% | {100 * entry['predicted_ratio_same_images']:.1f}% | "
                     f"{100 * entry['predicted_ratio_spread']:.1f}% |")
    return {"title": "Batch 8 against batch 1: the slowest row", "text": "\n".join(lines), "data": {"pairs": data}}


# -- speed: wall time of the lossless defaults against ar, and how much of compression / cost they keep ----------
SPEED_METHODS = ("sjd", "mc-sjd", "sjd-vp")  # the lossless defaults
INFERENCE_AR = "ar, inference mode"  # ar inside torch.inference_mode(), as hf_sjd decodes


def speed(subject, args) -> dict:
    """Per batch size (1, 8) and CFG (1, 3): wall time of ``ar`` and of every lossless default as it is (the preset's
    ``"auto"`` windows, picked from this machine's measured costs; the calibration and a first call per method run
    before the timed calls), on the same prompts and seeds (the median of the seeds' paired ratios). For each: the
    speed-up over ``ar``, the step compression, the cells that ran, their cost (seconds per forward of the timed calls
    over ``ar``'s forward seconds per token, both measured in the timed calls; the calibrated profile's estimate beside
    it), the bound compression / cost and the fraction of that bound the speed-up reaches: what the loop's own work
    costs beyond ``ar``'s, and the batch's stragglers. And the first call on a model not calibrated yet, in ``ar``
    calls: what timing the forwards costs once; and ``ar`` in inference mode, as hf_sjd decodes: what of a speed-up
    that mode alone gives."""
    from hf_sjd import calibration
    from hf_sjd.sampling import prompt_batch
    from hf_sjd.timing import ForwardTimer

    model, seeds, prompts = subject.model, args.seed_list, list(args.prompt_list)[:8]
    device = next(model.parameters()).device
    rows, data = [], {}

    def clock() -> float:  # after the device's queued work (generate ends on a host read on the GPU too)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    for batch, guidance in ((1, 1.0), (1, 3.0), (8, 1.0), (8, 3.0)):
        ids = prompt_batch(subject, (prompts * batch)[:batch])[0].to(device)
        per_image = 2 if guidance != 1 else 1
        first = {}  # a method's first call on the model with no cost profile: the calibration included
        for method in SPEED_METHODS:
            calibration.forget(model)
            start = clock()
            model.generate(ids, do_sample=True, top_k=args.top_k, custom_generate=method,
                           max_new_tokens=subject.num_image_tokens, guidance_scale=guidance)
            first[method] = clock() - start
        profile = calibration.profile_for(model, model.sjd_adapter, batch * per_image,
                                          context=ids.shape[1] + subject.num_image_tokens // 2, fewest=per_image,
                                          widest=None)  # every count before the timed calls: none times one
        ar_kwargs = {"do_sample": True, "top_k": args.top_k, "max_new_tokens": subject.num_image_tokens}
        if guidance != 1:
            ar_kwargs.update(guidance_scale=guidance, negative_prompt_ids=subject.unconditional_ids(batch).to(device))
        for method in SPEED_METHODS:  # untimed: the loop's overheads are timed at a method's first call
            model.generate(ids, do_sample=True, top_k=args.top_k, custom_generate=method,
                           max_new_tokens=subject.num_image_tokens, guidance_scale=guidance)
        times: dict[str, list[float]] = {}
        calls: dict[str, list[tuple]] = {}  # method -> (cell, step compression, seconds in forwards, forwards) per seed
        ar_forwards = ForwardTimer()  # ar's forwards (with CFG, both of a token's), timed by hooks as the loop's are
        for seed in seeds:  # each seed's calls back to back, so a change of the machine's load hits them alike
            for method in ("ar", INFERENCE_AR, *SPEED_METHODS):
                torch.manual_seed(seed)
                start = clock()
                if method == "ar":
                    with ar_forwards.hooked(model):
                        model.generate(ids, **ar_kwargs)
                elif method == INFERENCE_AR:  # what of a speed-up inference mode alone gives (hf_sjd decodes in it)
                    with torch.inference_mode():
                        model.generate(ids, **ar_kwargs)
                else:
                    stats = model.generate(ids, do_sample=True, top_k=args.top_k, custom_generate=method,
                                           max_new_tokens=subject.num_image_tokens, guidance_scale=guidance,
                                           return_dict_in_generate=True).stats
                times.setdefault(method, []).append(clock() - start)
                if method in SPEED_METHODS:
                    calls.setdefault(method, []).append(((stats.jacobi_window, stats.jacobi_siblings),
                                                         stats.step_compression, stats.model_seconds,
                                                         stats.num_forward_passes))
        ar_token_seconds = ar_forwards.total() / (len(seeds) * subject.num_image_tokens)
        speedup = statistics.median(a / m for a, m in zip(times["ar"], times[INFERENCE_AR]))
        data[f"{INFERENCE_AR}|b{batch}|g{guidance:g}"] = {"speedup": speedup,
                                                           "seconds": statistics.median(times[INFERENCE_AR])}
        rows.append(f"| {INFERENCE_AR} | {batch} | {guidance:g} | {speedup:.2f}x | 1.00 | | | | | | |")
        for method in SPEED_METHODS:
            # every quantity over the same timed calls (a call's cell may differ from the last one's: the estimate
            # of compression moves with each finished call), weighted by their forwards
            cells = list(dict.fromkeys(cell for cell, *_ in calls[method]))
            forwards = sum(count for *_, count in calls[method])
            compression = sum(c * count for _, c, _, count in calls[method]) / forwards
            cost = sum(seconds for *_, seconds, _ in calls[method]) / forwards / ar_token_seconds
            estimate = None if profile is None else sum(profile.cost(batch * per_image, sum(cell) + 1) * count
                                                        for cell, _, _, count in calls[method]) / forwards
            speedup = statistics.median(a / m for a, m in zip(times["ar"], times[method]))
            bound = compression / cost
            first_call = first[method] / statistics.median(times["ar"])
            data[f"{method}|b{batch}|g{guidance:g}"] = {
                "cells": [list(cell) for cell in cells], "compression": compression, "speedup": speedup,
                "seconds": statistics.median(times[method]), "ar_seconds": statistics.median(times["ar"]),
                "cost": cost, "profile_cost": estimate, "bound": bound, "achieved": speedup / bound,
                "first_call_seconds": first[method], "first_call": first_call}
            rows.append(f"| {method} | {batch} | {guidance:g} | {speedup:.2f}x | {compression:.2f} | "
                        f"{', '.join(f'{w} + {m}' for w, m in cells)} | {cost:.2f} | {estimate or float('nan'):.2f} | "
                        f"{bound:.2f} | {speedup / bound:.0%} | {first_call:.1f} |")
    text = "\n".join([
        f"Wall time of `generate` against `ar` (transformers' own sampling; its CFG is unbatched) in the same run, "
        f"median over seeds {', '.join(map(str, seeds))}, {subject.num_image_tokens} new tokens, top-k {args.top_k}, "
        f"{torch.get_num_threads()} thread(s). cell: window + siblings the calls ran (`\"auto\"`, picked from this "
        "machine's measured forward costs; several where the pick moved between seeds); compression, cost and "
        "profile: over the same calls, per forward; cost: seconds per forward of the timed calls over `ar`'s forward "
        "seconds per token (with CFG, both its forwards), both measured in the timed calls; profile: the calibrated "
        "t(L+1+m)/t(1) the pick read; bound: compression / cost; achieved: speed-up / bound (what the loop's own work "
        "beyond `ar`'s, and the batch's stragglers, leave of the bound); first call: the wall time of the method's "
        "first call on the model with no cost profile (`calibration.forget`; timing its forwards included), in `ar` "
        f"calls. `{INFERENCE_AR}`: `ar` inside `torch.inference_mode()`, as hf_sjd decodes: the part of a speed-up "
        "that skipping autograd's bookkeeping gives alone.", "",
        "| method | batch | CFG | speed-up | compression | cell | cost | profile | bound | achieved | first call |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|", *rows])
    return {"title": "Never slower than vanilla generate", "text": text, "data": data}


MEASUREMENTS = {"speed": speed, "library-build": library_build, "frontier-cost-model": frontier_cost_model,
                "siblings-cost-model": siblings_cost_model,
                "auto-cost-model": auto_cost_model, "batch-straggler": batch_straggler}
