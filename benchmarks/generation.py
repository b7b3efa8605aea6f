"""The one generation path of the study suites: batches, seeds, peak memory, prompt lookup, per-image scores.

    item     (prompt, image index); items are index-major, so a batch mixes prompts
    batch    consecutive items, ``--batch-size`` (or the row's batch size) of them: the unit that is seeded,
             generated, scored and sharded over processes
    record   what one (row, seed, batch) produced: counts, timings, per-image tokens / scores (picklable)

Seeding (the only scheme): a batch is seeded from ``(run seed, its items)`` (:func:`batch_seed`), never from
the process, the method or the order of work, so every row of a suite sees the same seed for the same images
(paired comparison) and sharding over processes changes no sample.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from pathlib import Path

import torch

PROMPT_LOOKUP = "prompt-lookup"
#: families where transformers' prompt-lookup decoding cannot run -> why
NO_PROMPT_LOOKUP = {"janus": "Janus's image generate runs its own loop (no assisted decoding)",
                    "emu3": "the suites run transformers' prompt lookup without Emu3's image-layout constraint, "
                            "so it would not write an image",
                    "lumina-mgpt": "transformers' ChameleonForConditionalGeneration.forward sets every image "
                                   "token's logit to the minimum, so its own generate cannot sample an image"}


def make_batches(prompts: list[str], images_per_prompt: int, batch_size: int) -> list[list[tuple[str, int]]]:
    """``(prompt, image index)`` items, index-major, cut into batches of ``batch_size``."""
    items = [(p, i) for i in range(images_per_prompt) for p in prompts]
    return [items[s:s + batch_size] for s in range(0, len(items), batch_size)]


def batch_seed(seed: int, batch: list[tuple[str, int]]) -> int:
    """A seed that depends only on the run seed and the batch's items (not on process, row or order)."""
    return zlib.crc32(f"{seed}|{batch}".encode()) & 0x7FFFFFFF


class PeakMemory:
    """Peak memory of a block in MB. CUDA: ``torch.cuda.max_memory_allocated`` (weights included). CPU: the
    rise of the resident set size over its value at the start, sampled every 2 ms from ``/proc/self/statm``
    after ``malloc_trim`` (Linux only, else None): a lower bound, not comparable to the CUDA number."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak_mb = device, None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._statm = Path("/proc/self/statm")
        if not self._statm.exists():
            return self
        try:  # hand freed heap back to the OS so the RSS rise reflects this block's allocations
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._start = self._peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _rss(self) -> int:
        return int(self._statm.read_text().split()[1]) * self._page

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self._peak = max(self._peak, self._rss())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif hasattr(self, "_thread"):
            self._stop.set()
            self._thread.join()
            self.peak_mb = (max(self._peak, self._rss()) - self._start) / 2**20


class _StepStreamer:
    """Records how many tokens each decoding step of transformers' assisted generate committed."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.sizes.append(int(value.numel()))
        self._prompt_seen = True  # generate() streams the prompt first

    def end(self) -> None:
        pass


def _prompt_lookup(subject, prompt_ids: torch.Tensor, top_k: int, num_tokens: int) -> tuple[torch.Tensor, dict]:
    """transformers' prompt-lookup decoding, one image at a time (it supports batch size 1 only)."""
    from hf_sjd.timing import ForwardTimer

    model, rows, hist, timer = subject.model, [], [0] * (num_tokens + 2), ForwardTimer()
    start = time.perf_counter()
    with timer.hooked(model):
        for one in prompt_ids.split(1):
            streamer = _StepStreamer()
            rows.append(model.generate(one, do_sample=True, top_k=top_k, streamer=streamer,
                                       max_new_tokens=subject.num_image_tokens, prompt_lookup_num_tokens=num_tokens))
            for size in streamer.sizes:
                hist[size] += 1
    sequences = torch.cat(rows)
    new_tokens = (sequences.shape[1] - prompt_ids.shape[1]) * len(rows)
    return sequences, {"num_images": len(rows), "num_new_tokens": new_tokens, "num_calls": len(rows),
                       "num_forward_passes": timer.count, "model_calls": timer.count,
                       "seconds": time.perf_counter() - start, "model_seconds": timer.total(),
                       "tokens_per_forward": hist}


@torch.no_grad()
def checkpoint_logliks(subject, sequences: torch.Tensor, prompt_len: int, attention_mask: torch.Tensor
                       ) -> torch.Tensor:
    """``[batch, new]`` log-probability of each generated token of a checkpoint subject under its adapter's unguided
    logits (the distribution the Jacobi loop samples); NaN at positions the layout fixes (forced, never sampled)."""
    from transformers import DynamicCache

    layout = subject.adapter.prepare_generation(sequences[:, :prompt_len], {})
    new = sequences.shape[1] - prompt_len
    mask = torch.cat([attention_mask, attention_mask.new_ones(sequences.shape[0], new)], 1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = layout.window_logits(subject.model, sequences, mask, positions, DynamicCache(), new + 1)[:, :-1]
    logprobs = logits.float().log_softmax(-1).gather(-1, sequences[:, prompt_len:, None]).squeeze(-1)
    forced = layout.structural_tokens(torch.arange(new, device=sequences.device)[None].expand(len(sequences), -1))
    return (logprobs if forced is None else logprobs.masked_fill(forced >= 0, float("nan"))).cpu()


def resolve_knobs(knobs, resources) -> dict:
    """Row knobs with ``"@name"`` values replaced by ``resources(name)``."""
    return {k: resources(v[1:]) if isinstance(v, str) and v.startswith("@") else v for k, v in knobs}


@torch.no_grad()
def run_batch(subject, scorer, row, batch: list[tuple[str, int]], seed: int, settings, device: torch.device,
              resources) -> dict:
    """Generate one batch for ``row`` and score each image; returns a picklable record.

    ``subject``: the model side (``model``, ``num_image_tokens``, ...): a ``ReferenceModel`` (``prompt_ids``)
    or a :class:`hf_sjd.bench.subjects.CheckpointSubject` (``prompt_inputs``: left-padded ids and mask; its
    loglik through :func:`checkpoint_logliks`);
    ``scorer``: per-image quality features or None (:class:`~.summaries.Scorer`); ``settings``: the resolved
    run flags (``top_k``, ``guidance_scale``, ``window``, ``prompt_lookup_tokens``, ``library``)."""
    from benchmarks.metrics import adjacent_repeat_rate, token_logliks
    from hf_sjd.sampling import generate_images, prompt_batch, verifiers_of

    from . import probes

    prompt_ids, mask = prompt_batch(subject, [p for p, _ in batch])  # a checkpoint's: left padded, with a mask
    prompt_ids, mask = prompt_ids.to(device), None if mask is None else mask.to(device)
    guidance = settings.guidance_scale if row.guidance_scale is None else row.guidance_scale
    window = settings.window if row.window is None else row.window
    torch.manual_seed(batch_seed(seed, batch))
    with probes.probe(row.probe) as probe, PeakMemory(device) as memory:
        if row.method == PROMPT_LOOKUP:
            sequences, stats = _prompt_lookup(subject, prompt_ids, settings.top_k, settings.prompt_lookup_tokens)
        else:
            knobs = resolve_knobs(row.knobs, resources)
            if settings.library is not None and "phrase" in verifiers_of(row.method, knobs):
                knobs.setdefault("phrase_library", settings.library)  # --phrase-library, checked once up front
            sequences, stats = generate_images(subject, prompt_ids, row.method, settings.top_k, guidance, window,
                                               attention_mask=mask, **knobs)
    prompt_len = prompt_ids.shape[1]
    new = sequences[:, prompt_len:]
    record = {"row": row.key, "seed": seed, "items": batch, "peak_memory_mb": memory.peak_mb,
              "stats": {k: v for k, v in stats.items() if k not in ("step_compression", "acceptance_rate")},
              "tokens": new.cpu().tolist(),
              "loglik": (checkpoint_logliks(subject, sequences, prompt_len, mask) if mask is not None
                         else token_logliks(subject.model, sequences, prompt_len)).nanmean(1).tolist(),
              "repeat": adjacent_repeat_rate(new.cpu()).tolist(), "probe": probe.counts}
    if scorer is not None:
        record.update(scorer.score(new, [p for p, _ in batch]))
    return record
