"""Sampling helpers shared by ``hf-sjd generate`` and the benchmarks: one method, one batch, with counters.

Rates are defined once, in :func:`hf_sjd.jacobi.stats.pooled_rates`, from pooled counts; ``hf-sjd generate`` (``merge_stats``),
``hf-sjd bench`` and ``JacobiStats`` all report through it, so one run gets one number everywhere.
"""

from __future__ import annotations

import time

import torch

from .jacobi.stats import pooled_rates


def registered_methods() -> list[str]:
    """``"ar"`` (transformers' own sampling) plus every registered Jacobi strategy."""
    import hf_sjd

    return ["ar", *sorted(hf_sjd.STRATEGIES)]


def wants_knob(method: str, knob: str) -> bool:
    """Whether a registered strategy, or a component it selects (verifier, draft prior, nested verifier),
    reads ``knob``."""
    import hf_sjd

    strategy = hf_sjd.STRATEGIES.get(method)
    return strategy is not None and knob in hf_sjd.SJDConfig.resolve(strategy.preset, None, {}).knob_names()


class ForwardCounter:
    """Counts and times model forwards through hooks (works for transformers' own generate too)."""

    def __init__(self, model) -> None:
        self.model, self.calls, self.seconds, self._start = model, 0, 0.0, 0.0

    def __enter__(self) -> "ForwardCounter":
        def before(*_):
            self._start = time.perf_counter()

        def after(*_):
            self.calls += 1
            self.seconds += time.perf_counter() - self._start

        self._handles = [self.model.register_forward_pre_hook(before), self.model.register_forward_hook(after)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()


def generate_images(reference, prompt_ids: torch.Tensor, method: str, top_k: int, guidance_scale: float,
                    window: int, attention_mask: torch.Tensor | None = None, **strategy_kwargs
                    ) -> tuple[torch.Tensor, dict]:
    """Sample one batch of images' tokens with ``method``; returns (sequences, stats dict).

    ``num_forward_passes`` counts decoding steps (each one batched forward; transformers' unbatched CFG
    adds its own unconditional call per step, counted in ``model_calls`` but not as a step).
    ``attention_mask``: of left-padded prompts. Other subjects than the reference model
    (``hf_sjd.bench.subjects``) may add ``forward_module`` (what the forward counter hooks instead of
    ``model``) and ``sample_ar`` (their family's own sampling loop for ``ar``)."""
    model = reference.model
    batch = prompt_ids.shape[0]
    common = {"do_sample": True, "top_k": top_k, "max_new_tokens": reference.num_image_tokens}
    inputs = {} if attention_mask is None else {"attention_mask": attention_mask}
    start = time.perf_counter()
    with ForwardCounter(getattr(reference, "forward_module", model)) as counter:
        if method == "ar" and hasattr(reference, "sample_ar"):
            sequences = reference.sample_ar(prompt_ids, attention_mask, guidance_scale, **common)
            steps = reference.num_image_tokens
        elif method == "ar":
            extra = {}
            if guidance_scale != 1.0:  # transformers' own (unbatched) CFG processor
                extra = {"guidance_scale": guidance_scale,
                         "negative_prompt_ids": reference.unconditional_ids(batch).to(prompt_ids.device)}
            sequences = model.generate(prompt_ids, **common, **extra)
            steps = reference.num_image_tokens
        else:
            if wants_knob(method, "latent_embeddings"):  # LANTERN/GSD (also under phrase verification) use VQ latents
                strategy_kwargs.setdefault("latent_embeddings", reference.latent_embeddings)
            strategy_kwargs.setdefault("jacobi_siblings", 0)  # pinned like the window (no "auto" pick on CUDA)
            strategy_kwargs.setdefault("jacobi_window_rule", "fixed")  # and no re-pick as rows finish
            out = model.generate(prompt_ids, **common, **inputs, custom_generate=method, jacobi_window=window,
                                 guidance_scale=guidance_scale, return_dict_in_generate=True, **strategy_kwargs)
            sequences, steps = out.sequences, out.stats.num_forward_passes
    seconds = time.perf_counter() - start
    new_tokens = (sequences.shape[1] - prompt_ids.shape[1]) * batch
    stats = {"num_images": batch, "num_new_tokens": new_tokens, "num_forward_passes": steps, "num_calls": 1,
             "seconds": seconds, "model_seconds": counter.seconds, "model_calls": counter.calls}
    if method != "ar":
        stats["tokens_per_forward"] = out.stats.tokens_per_forward.tolist()
        stats["forward_windows"] = out.stats.forward_windows.tolist()  # forwards by drafts per row
        stats["num_accepted"], stats["num_recovered"] = out.stats.num_accepted, out.stats.num_recovered
        stats["num_siblings_accepted"] = out.stats.num_siblings_accepted
        stats["num_branch_accepted"] = out.stats.num_branch_accepted
        stats["commits_after"] = out.stats.commits_after.tolist()  # [5, 2] per ending: next commits, forwards
        stats["row_forward_passes"] = out.stats.row_forward_passes.tolist()  # each row's until it finished
    stats.update(pooled_rates(new_tokens, batch, steps, 1, stats.get("num_accepted"), stats.get("num_recovered")))
    if method == "ar":
        del stats["acceptance_rate"]  # nothing is drafted
    return sequences, stats


def sum_histograms(histograms: list[list[int]]) -> list[int]:
    """Element-wise sum of count histograms of different lengths (``zip`` would cut them to the shortest)."""
    total = [0] * max((len(h) for h in histograms), default=0)
    for histogram in histograms:
        for k, count in enumerate(histogram):
            total[k] += count
    return total


def merge_stats(parts: list[dict]) -> dict:
    """Totals of several batches of one method, with rates from the pooled counts (:func:`pooled_rates`)."""
    keys = ("num_images", "num_new_tokens", "num_forward_passes", "seconds", "model_seconds", "model_calls")
    total = {k: sum(p[k] for p in parts) for k in keys}
    total["num_calls"] = sum(p.get("num_calls", 1) for p in parts)
    drafted = "num_accepted" in parts[0]
    if drafted:
        total["num_accepted"] = sum(p["num_accepted"] for p in parts)
        total["num_recovered"] = sum(p["num_recovered"] for p in parts)
        total["tokens_per_forward"] = sum_histograms([p["tokens_per_forward"] for p in parts])
        if all("forward_windows" in p for p in parts):
            total["forward_windows"] = sum_histograms([p["forward_windows"] for p in parts])
    rates = pooled_rates(total["num_new_tokens"], total["num_images"], total["num_forward_passes"], total["num_calls"],
                         total.get("num_accepted"), total.get("num_recovered"))
    total["step_compression"] = rates["step_compression"]
    if drafted:
        total["acceptance_rate"] = rates["acceptance_rate"]
    total["seconds_per_image"] = total["seconds"] / total["num_images"]
    total["loop_overhead"] = (total["seconds"] - total["model_seconds"]) / total["seconds"] if total["seconds"] else 0.0
    return total
