"""Sampling helpers shared by ``hf-sjd generate`` and the benchmarks: one method, one batch, with counters."""

from __future__ import annotations

import time

import torch


def registered_methods() -> list[str]:
    """``"ar"`` (transformers' own sampling) plus every registered Jacobi strategy."""
    import hf_sjd

    return ["ar", *sorted(hf_sjd.STRATEGIES)]


def wants_knob(method: str, knob: str) -> bool:
    """Whether a registered strategy, or a component it selects (verifier, draft prior), reads ``knob``."""
    import hf_sjd

    strategy = hf_sjd.STRATEGIES.get(method)
    if strategy is None:
        return False
    fields = {k: v for k, v in strategy.preset.items() if k in hf_sjd.SJDConfig.field_names()}
    return knob in strategy.knobs or knob in hf_sjd.SJDConfig(**fields).component_knobs()


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
                    window: int, **strategy_kwargs) -> tuple[torch.Tensor, dict]:
    """Sample one batch of images' tokens with ``method``; returns (sequences, stats dict).

    ``num_forward_passes`` counts decoding steps (each one batched forward; transformers' unbatched CFG
    adds its own unconditional call per step, counted in ``model_calls`` but not as a step)."""
    model = reference.model
    batch = prompt_ids.shape[0]
    common = {"do_sample": True, "top_k": top_k, "max_new_tokens": reference.num_image_tokens}
    start = time.perf_counter()
    with ForwardCounter(model) as counter:
        if method == "ar":
            extra = {}
            if guidance_scale != 1.0:  # transformers' own (unbatched) CFG processor
                extra = {"guidance_scale": guidance_scale,
                         "negative_prompt_ids": reference.unconditional_ids(batch).to(prompt_ids.device)}
            sequences = model.generate(prompt_ids, **common, **extra)
            steps = reference.num_image_tokens
        else:
            if wants_knob(method, "latent_embeddings"):  # LANTERN/GSD (also under phrase verification) use VQ latents
                strategy_kwargs.setdefault("latent_embeddings", reference.latent_embeddings)
            out = model.generate(prompt_ids, **common, custom_generate=method, jacobi_window=window,
                                 guidance_scale=guidance_scale, return_dict_in_generate=True, **strategy_kwargs)
            sequences, steps = out.sequences, out.stats.num_forward_passes
    seconds = time.perf_counter() - start
    new_tokens = (sequences.shape[1] - prompt_ids.shape[1]) * batch
    stats = {"num_images": batch, "num_new_tokens": new_tokens, "num_forward_passes": steps,
             "step_compression": new_tokens / batch / steps, "seconds": seconds,
             "model_seconds": counter.seconds, "model_calls": counter.calls}
    if method != "ar":
        stats["acceptance_rate"] = out.stats.acceptance_rate
        stats["tokens_per_forward"] = out.stats.tokens_per_forward.tolist()
        stats["num_accepted"], stats["num_recovered"] = out.stats.num_accepted, out.stats.num_recovered
    return sequences, stats


def merge_stats(parts: list[dict]) -> dict:
    total = {k: sum(p[k] for p in parts) for k in ("num_images", "num_new_tokens", "num_forward_passes", "seconds",
                                                   "model_seconds", "model_calls")}
    total["step_compression"] = total["num_new_tokens"] / total["num_images"] / (
        total["num_forward_passes"] / len(parts))
    total["seconds_per_image"] = total["seconds"] / total["num_images"]
    total["loop_overhead"] = (total["seconds"] - total["model_seconds"]) / total["seconds"]
    if "acceptance_rate" in parts[0]:
        total["acceptance_rate"] = sum(p["acceptance_rate"] for p in parts) / len(parts)
        total["tokens_per_forward"] = [sum(col) for col in zip(*(p["tokens_per_forward"] for p in parts))]
    return total
