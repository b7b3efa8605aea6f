"""One method, one batch, with its counts: what ``hf-sjd generate``, ``hf-sjd bench`` and ``benchmarks/`` share.

A *subject* is what ``--model`` loads: the reference model (:func:`hf_sjd.reference.load`) or a checkpoint
(:class:`hf_sjd.bench.subjects.CheckpointSubject`). Rates come from pooled counts
(:func:`hf_sjd.jacobi.stats.pooled_rates`), so one run reports one number everywhere.
"""

from __future__ import annotations

import time

import torch

from .jacobi.stats import pooled_rates
from .timing import ForwardTimer

#: printed next to every speed table: what step compression is and is not
COMPRESSION_VS_TIME = ("Step compression counts forwards, not seconds: fewer forwards are less time only where a "
                       "forward of L+1 tokens costs about what one of 1 token does (large models on a GPU); on a "
                       "CPU, and with the 2M-parameter reference model, each forward's cost grows with its tokens.")


def registered_methods() -> list[str]:
    """``"ar"`` (transformers' own sampling) plus every registered Jacobi strategy."""
    import hf_sjd

    return ["ar", *sorted(hf_sjd.STRATEGIES)]


def parse_methods(flag: str, text: str) -> list[str]:
    """A comma list of methods (``ar`` and registered strategies), each once; else ``ValueError`` naming ``flag``."""
    methods, known = [m.strip() for m in text.split(",") if m.strip()], registered_methods()
    unknown = [m for m in methods if m not in known]
    if not methods or unknown:
        raise ValueError(f"{flag}: unknown method(s) {unknown or [text]}; registered: {', '.join(known)}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"{flag}: duplicate method in {text!r}; name each method once")
    return methods


def check_window_of(flag: str, methods: list[str], window: int | str) -> None:
    """``ValueError`` naming ``flag`` where a method's own knobs refuse an explicit ``window`` (``sjd-vp``'s growth
    steps need a wider one), before any model loads."""
    import hf_sjd
    from transformers import GenerationConfig

    for method in methods if window != "auto" else ():
        if method in hf_sjd.STRATEGIES:
            try:
                hf_sjd.SJDConfig.resolve(hf_sjd.STRATEGIES[method].preset, GenerationConfig(),
                                         {"jacobi_window": window})
            except ValueError as error:
                raise ValueError(f"{flag} {window} with {method}: {error}") from None


def verifiers_of(method: str, knobs: dict) -> set[str]:
    """The verifiers ``method``'s preset overridden by ``knobs`` runs (``verifier``, and ``pv_base_verifier``
    under phrase verification); none for ``ar``."""
    import hf_sjd

    if method not in hf_sjd.STRATEGIES:
        return set()
    preset = {**hf_sjd.STRATEGIES[method].preset, **knobs}
    names = {preset.get("verifier", "speculative")}
    if "phrase" in names:
        names.add(preset.get("pv_base_verifier") or "speculative")
    return names


def prompt_batch(subject, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(ids [batch, P], attention mask or None)``: a checkpoint's text prompts come left padded."""
    if hasattr(subject, "prompt_inputs"):
        return subject.prompt_inputs(texts)
    return subject.prompt_ids(texts), None


def decode_images(subject, sequences: torch.Tensor, prompt_length: int) -> list | None:
    """Sequences -> PIL images (None where the family ships no image decoder)."""
    if hasattr(subject, "prompt_inputs"):
        return subject.decode(sequences[:, prompt_length:])
    return subject.decode(sequences)


def save_png(image, path, text: dict[str, str] | None = None) -> None:
    """One PIL image, written atomically; ``text``: PNG text chunks (prompt, seed, ...)."""
    import io

    from PIL.PngImagePlugin import PngInfo

    from .files import atomic_write_bytes

    info = PngInfo()
    for key, value in (text or {}).items():
        info.add_itxt(key, value)  # iTXt: UTF-8, any prompt
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info)
    atomic_write_bytes(path, buffer.getvalue())


def generate_images(subject, prompt_ids: torch.Tensor, method: str, top_k: int, guidance_scale: float,
                    window: int | str | None, attention_mask: torch.Tensor | None = None, **strategy_kwargs
                    ) -> tuple[torch.Tensor, dict]:
    """``(sequences, stats)`` of one batch sampled with ``method``.

    ``num_forward_passes`` counts decoding steps (transformers' unbatched CFG adds a call per step: counted in
    ``model_calls``, not as a step). A Jacobi method runs ``jacobi_window=window, jacobi_siblings=0`` unless the
    knobs say otherwise: an int pins the cell, so its numbers do not depend on the device's cost model; ``"auto"``
    picks the window for this machine. ``window=None``: the strategy as ``generate`` runs it by default (its own
    window and siblings)."""
    model = subject.model
    batch = prompt_ids.shape[0]
    common = {"do_sample": True, "top_k": top_k, "max_new_tokens": subject.num_image_tokens}
    timer = ForwardTimer()
    start = time.perf_counter()
    with timer.hooked(getattr(subject, "forward_module", model)):
        if method == "ar" and hasattr(subject, "sample_ar"):
            sequences = subject.sample_ar(prompt_ids, attention_mask, guidance_scale, **common)
        elif method == "ar":
            extra = {}
            if guidance_scale != 1.0:  # transformers' own (unbatched) CFG processor
                extra = {"guidance_scale": guidance_scale,
                         "negative_prompt_ids": subject.unconditional_ids(batch).to(prompt_ids.device)}
            sequences = model.generate(prompt_ids, **common, **extra)
        else:
            if verifiers_of(method, strategy_kwargs) & {"lantern", "gsd"}:  # they read the VQ codebook vectors
                strategy_kwargs.setdefault("latent_embeddings", subject.latent_embeddings)
            if window is not None:
                strategy_kwargs = {"jacobi_window": window, "jacobi_siblings": 0, **strategy_kwargs}
            inputs = {} if attention_mask is None else {"attention_mask": attention_mask}
            out = model.generate(prompt_ids, **common, **inputs, custom_generate=method, guidance_scale=guidance_scale,
                                 return_dict_in_generate=True, **strategy_kwargs)
            sequences = out.sequences
    seconds = time.perf_counter() - start
    steps = subject.num_image_tokens if method == "ar" else out.stats.num_forward_passes
    new_tokens = (sequences.shape[1] - prompt_ids.shape[1]) * batch
    stats = {"num_images": batch, "num_new_tokens": new_tokens, "num_forward_passes": steps, "num_calls": 1,
             "seconds": seconds, "model_seconds": timer.total(), "model_calls": timer.count}
    if method == "ar":
        stats["tokens_per_forward"] = [0, new_tokens]  # every row commits one token per forward
    else:
        stats.update(tokens_per_forward=out.stats.tokens_per_forward.tolist(),
                     forward_windows=out.stats.forward_windows.tolist(),  # forwards by drafts per row
                     windows=[out.stats.jacobi_window],  # the full batch's (the plan's; "auto" resolved)
                     num_accepted=out.stats.num_accepted, num_recovered=out.stats.num_recovered,
                     num_siblings_accepted=out.stats.num_siblings_accepted,
                     row_forward_passes=out.stats.row_forward_passes.tolist())  # each row's until it finished
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
    total["tokens_per_forward"] = sum_histograms([p["tokens_per_forward"] for p in parts])
    drafted = "num_accepted" in parts[0]
    if all("forward_windows" in p for p in parts):  # (a Jacobi method's: forwards by drafts per row)
        total["forward_windows"] = sum_histograms([p["forward_windows"] for p in parts])
    if all("windows" in p for p in parts):
        total["windows"] = sorted({window for p in parts for window in p["windows"]})
    if drafted:
        total["num_accepted"] = sum(p["num_accepted"] for p in parts)
        total["num_recovered"] = sum(p["num_recovered"] for p in parts)
    rates = pooled_rates(total["num_new_tokens"], total["num_images"], total["num_forward_passes"], total["num_calls"],
                         total.get("num_accepted"), total.get("num_recovered"))
    total["step_compression"] = rates["step_compression"]
    total["acceptance_rate"] = rates["acceptance_rate"] if drafted else None
    total["seconds_per_image"] = total["seconds"] / total["num_images"]
    total["loop_overhead"] = (total["seconds"] - total["model_seconds"]) / total["seconds"] if total["seconds"] else 0.0
    return total

