"""``python -m benchmarks loop-cost``: what one iteration of the decoding loop costs outside the model forward.

On a GPU the loop around the forward costs in two ways a CPU run hides: every host-device *sync point*
stalls the host until the device has caught up, and every torch op is a kernel launch. This measures
both, hardware-free, and the CPU time, per iteration of transformers' own sampling loop (``ar``: one
iteration = one step) and of the Jacobi strategies (one iteration = one window forward)::

    quantity              what is counted / timed
    iteration             the loop's work between the end of one model forward and the start of the
                          next (forward pre/post hooks on the model, so what ``adapter.window_logits``
                          does around the model call is outside); ``ar`` with CFG: one step = its two
                          forwards (transformers' CFG processor runs the unconditional one)
    steady iterations     ``--iterations`` per run: ``ar`` steps, or Jacobi window forwards, after the
                          prefill (the gap after the prefill forward counts, the setup before it does
                          not); the run is stopped when the next forward starts, so windows stay full
                          and a 256-token image costs only what is measured
    syncs/iter            host-device sync points outside the forward (loop) and inside it (forward)
    ops/iter              aten ops outside the forward that launch a kernel on a GPU
    no-kernel ops/iter    views / metadata / allocation (``aten.view``, ``expand``, ``slice``, ``select``,
                          ``unsqueeze``, ``as_strided``, ``detach``, ``_unsafe_view``, ``empty``, ...): excluded
                          from ops/iter, reported separately
    outside ms/iter       wall time between a forward's end and the next forward's start (CUDA events on a
                          GPU, no ``synchronize`` per forward), measured with no counting active; best and
                          median over ``--repeats`` runs after ``--warmup`` runs
    .../token             per iteration / tokens per iteration (new tokens per row over the measured
                          iterations; ``ar``: 1)

Counting rule (each host read counted once):

* a Python-level read (``Tensor.item``, ``.tolist``, ``.cpu``, ``.numpy``, ``.to("cpu")``, ``int(t)``,
  ``float(t)``, ``bool(t)`` / ``if t:``, ``operator.index(t)``) of a device tensor is one sync; the aten ops it
  dispatches (``_local_scalar_dense``, the device-to-host copy) are part of it and not counted again;
* otherwise an aten op that must read device memory is one sync: ``_local_scalar_dense`` (a scalar read
  from C++, e.g. a tensor slice bound), ``nonzero``, ``masked_select``, ``index``/``index_put_`` with a bool
  index, ``_unique2`` and kin, ``multinomial`` (validates on the host), ``bincount``, ``equal``,
  ``repeat_interleave`` with a tensor count and no ``output_size``, device-to-host copies; such ops also
  launch kernels, so they count in ops/iter too (``_local_scalar_dense`` does not: it is a copy);
* on CPU every tensor stands for a device tensor, except what a counted read returned (``.cpu()`` returns a
  fresh host copy here, as on a GPU) and what is computed from host tensors only (host ops: not counted);
  ``.to(device)`` counts only with a literal ``"cpu"`` (``.to(x.device)`` names the CPU here, not on a GPU);
* inside the forward only Python-level reads are counted unless ``dispatch_in_forward`` (aten-level
  counting costs ~0.1 ms per op, and a forward has hundreds);
* ``--modes compiled`` (``jacobi_compile=True``): while counting, ``torch.compile`` is wrapped so that each function
  it compiles runs with the dispatch mode paused (under one, torch.compile would run the eager code) and its
  launches are read from a profile: each fused inductor kernel, and each kernel-launching aten op its graph calls
  (fallbacks: ``topk``, ``sort``, the random draws). Each case compiles in an untimed, uncounted run first.

Everything is observed from outside ``model.generate`` (hf_sjd's public API only): forward hooks on the model
split the run into forwards and the gaps between them, ``hf_sjd.timing.ForwardTimer`` times the forwards (and,
by hand, the span from the first forward's end to the stopped forward's start, so outside = span - forwards),
a ``TorchDispatchMode`` counts the aten ops, and wrapped ``torch.Tensor`` read methods count the host reads.

Random weights (every model but the shipped reference model) measure cost, never acceleration.

    python -m benchmarks loop-cost --methods ar,sjd,mc-sjd,sjd-pv --batch-sizes 1,8 --guidance-scales 1,3 \\
        --vocab-sizes 530,65536,184622 --json loop_cost.json --markdown loop_cost.md
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import statistics
import sys
import time
import traceback
from collections import Counter
import dataclasses
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode_temporarily
from torch.utils.weak import WeakIdKeyDictionary

from hf_sjd.checks import check_choice, check_float, check_int
from hf_sjd.files import atomic_write_text
from hf_sjd.timing import ForwardTimer

METHODS = ("ar", "sjd", "mc-sjd", "sjd-pv")
REFERENCE_VOCAB = 530  # the shipped reference model's vocabulary
LARGE_VOCAB = 65536  # from this V on: fewer iterations and repeats (a batch-8 CFG window's logits: 70-200 MB)

# Python-level host reads: ``torch.Tensor`` attribute -> how the report names it.
PYTHON_SYNCS = {"item": "Tensor.item", "tolist": "Tensor.tolist", "cpu": "Tensor.cpu", "numpy": "Tensor.numpy",
                "to": "Tensor.to(cpu)", "__int__": "int(tensor)", "__float__": "float(tensor)",
                "__bool__": "bool(tensor)", "__index__": "index(tensor)"}
# aten ops whose output size or value needs device memory on the host (bool-mask ``index`` is decided per call).
ALWAYS_SYNC = {"_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
               "unique_consecutive", "unique_dim_consecutive", "multinomial", "bincount", "equal"}
BOOL_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}
# Ops that launch no kernel besides the views (``OpOverload.is_view``).
NO_KERNEL = {"_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
             "resize_", "set_", "alias", "detach", "t", "view", "expand", "slice", "select", "unsqueeze", "squeeze",
             "as_strided", "_reshape_alias", "split", "split_with_sizes", "unbind", "permute", "transpose",
             "_local_scalar_dense"}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS_FILE = os.path.abspath(__file__)


# -- counting ---------------------------------------------------------------------------------------------
@dataclass
class Tally:
    """Counts of one scope (a gap between forwards, or one forward)."""

    syncs: Counter = field(default_factory=Counter)  # (kind, call site) -> n
    ops: Counter = field(default_factory=Counter)  # aten op name -> n (kernel launches)
    op_sites: Counter = field(default_factory=Counter)  # call site -> n (kernel launches)
    op_ms: Counter = field(default_factory=Counter)  # call site -> ms inside the op (CPU: its kernel time)
    no_kernel: Counter = field(default_factory=Counter)  # op name -> n (views, metadata, allocation)
    host_ops: Counter = field(default_factory=Counter)  # op name -> n (inputs on the host only)

    def __iadd__(self, other: "Tally") -> "Tally":
        for name in ("syncs", "ops", "op_sites", "op_ms", "no_kernel", "host_ops"):
            getattr(self, name).update(getattr(other, name))
        return self


def call_site() -> str:
    """``path:line (function)`` of the innermost frame outside torch and this module."""
    for frame, line in traceback.walk_stack(sys._getframe(1)):
        path = frame.f_code.co_filename
        if path.startswith(_TORCH_DIR) or os.path.abspath(path) == _THIS_FILE:
            continue
        for anchor in ("/hf_sjd/", "/transformers/", "/tests/", "/benchmarks/"):
            if anchor in path:
                path = anchor[1:] + path.rsplit(anchor, 1)[1]
                break
        else:
            path = os.path.basename(path)
        return f"{path}:{line} ({frame.f_code.co_name})"
    return "?"


def _targets_cpu(args: tuple, kwargs: dict, literal_only: bool) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` moves to the CPU. ``literal_only`` (a CPU run standing for a GPU
    one): only a literal ``"cpu"`` string counts, since ``.to(x.device)`` names the CPU here but not on a GPU."""
    target = kwargs.get("device")
    if target is None and args and isinstance(args[0], (str, torch.device)):
        target = args[0]
    if target is None or (literal_only and not isinstance(target, str)):
        return False
    return torch.device(target).type == "cpu"


class CostCounter(TorchDispatchMode):
    """Counts sync points and ops (rules: module docstring) into ``tallies[scope]`` while ``scope`` is set.

    Entering it also wraps the Python-level read methods of ``torch.Tensor``; leaving it (even by an
    exception) restores them. ``simulate_device``: treat CPU tensors as device tensors (a CPU run standing
    for a GPU one); else only non-CPU tensors are device tensors.

        >>> with CostCounter(simulate_device=True) as counter:
        ...     counter.enter_scope("demo")
        ...     _ = torch.ones(3).sum().item()
        >>> counter.tallies["demo"].ops["sum"], sum(counter.tallies["demo"].syncs.values())
        (1, 1)
    """

    def __init__(self, simulate_device: bool, attribute: bool = True, dispatch_in_forward: bool = True) -> None:
        super().__init__()
        self.simulate_device, self.attribute, self.dispatch_in_forward = simulate_device, attribute, dispatch_in_forward
        self.scope = None  # counting is off while None
        self._paused = None  # the popped mode while a forward runs without dispatch counting
        self.tallies: dict = {}
        self._depth = 0  # > 0 inside a wrapped read: its own aten ops belong to it
        self._host = WeakIdKeyDictionary()  # tensors a read returned, and what was computed from them only
        self._saved: dict[str, object] = {}

    # -- Python-level reads -------------------------------------------------------------------------
    def __enter__(self) -> "CostCounter":
        for name in PYTHON_SYNCS:
            self._saved[name] = torch.Tensor.__dict__.get(name, _ABSENT)
            setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        counter, compile_ = self, torch.compile
        self._saved_compile = compile_

        def counted_compile(*args, **kwargs):  # what the loop compiles while counting runs through _count_compiled
            compiled = compile_(*args, **kwargs)
            return functools.wraps(compiled)(lambda *a, **k: counter._count_compiled(compiled, a, k)) \
                if callable(compiled) and not isinstance(compiled, torch.nn.Module) else compiled

        torch.compile = counted_compile
        try:
            return super().__enter__()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self._resume()
            super().__exit__(*exc)
        finally:
            self._restore()

    def enter_scope(self, scope) -> None:
        """Count into ``scope`` from now on (:class:`ForwardScopes`' callback). A ``("forward", i)`` scope
        pauses the dispatch mode unless ``dispatch_in_forward`` (aten-level counting inside a forward costs
        ~0.1 ms per op); Python-level reads are counted there either way."""
        self.scope = scope
        if isinstance(scope, tuple) and scope[0] == "forward" and not self.dispatch_in_forward:
            if self._paused is None and _get_current_dispatch_mode() is self:
                self._paused = _pop_mode_temporarily()
                self._paused.__enter__()
        else:
            self._resume()

    def _resume(self) -> None:
        if self._paused is not None:
            paused, self._paused = self._paused, None
            paused.__exit__(None, None, None)

    def _restore(self) -> None:
        if "_saved_compile" in vars(self):
            torch.compile = self._saved_compile
            del self._saved_compile
        for name, original in self._saved.items():
            if original is _ABSENT:
                delattr(torch.Tensor, name)  # falls back to torch._C.TensorBase's method again
            else:
                setattr(torch.Tensor, name, original)
        self._saved.clear()

    def _wrap(self, name: str, original):
        counter, moves_to_host = self, name in ("cpu", "to")

        @functools.wraps(original)
        def read(tensor, *args, **kwargs):
            if name == "to" and not _targets_cpu(args, kwargs, literal_only=counter.simulate_device):
                return original(tensor, *args, **kwargs)  # dtype / device casts are ordinary ops
            if counter._depth == 0 and counter.scope is not None and counter._is_device(tensor):
                counter._tally().syncs[(PYTHON_SYNCS[name], counter._site())] += 1
            counter._depth += 1
            try:
                result = original(tensor, *args, **kwargs)
                if moves_to_host and result is tensor and counter.simulate_device:
                    result = tensor.clone()  # a GPU's .cpu() returns a new host tensor, never the device one
            finally:
                counter._depth -= 1
            if moves_to_host and isinstance(result, torch.Tensor):
                counter._host[result] = True
            return result

        return read

    # -- compiled steps (jacobi_compile) -------------------------------------------------------------------
    def _count_compiled(self, compiled, args: tuple, kwargs: dict):
        """Run a compiled step with the dispatch mode paused (under a non-infra dispatch mode torch.compile runs
        the eager code instead) and count its launches from a profile: each fused kernel (``cpp_fused_*`` on
        CPU, traced by ``enable_kernel_profile``; ``triton_*`` on a GPU) and each kernel-launching aten op it
        calls (fallbacks such as ``topk`` or the random draws) that launches no kernel-launching op below it."""
        from torch.profiler import ProfilerActivity, profile

        if self.scope is None or not self._outside_forward or self._depth:
            return compiled(*args, **kwargs)
        paused = _pop_mode_temporarily()
        paused.__enter__()
        try:
            with profile(activities=[ProfilerActivity.CPU]) as recorded:
                result = compiled(*args, **kwargs)
        finally:
            paused.__exit__(None, None, None)
        tally, site = self._tally(), self._site()
        for event in _compiled_launches(recorded.events()):
            tally.ops[event] += 1
            if site is not None:
                tally.op_sites[f"{site} [compiled]"] += 1
        return result

    # -- aten-level ops -----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        start = time.perf_counter()
        result = func(*args, **kwargs)
        elapsed = time.perf_counter() - start
        if self._depth or self.scope is None:
            return result
        name = func.overloadpacket.__name__
        tensors = _tensors(args, kwargs.values())
        tally = self._tally()
        if tensors and not any(self._is_device(t) for t in tensors):
            tally.host_ops[name] += 1
            for out in _tensors((result,)):
                self._host[out] = True
            return result
        if not tensors and not self.simulate_device and torch.device(kwargs.get("device") or "cpu").type == "cpu":
            tally.host_ops[name] += 1  # a factory without a device on a GPU run makes a host tensor
            return result
        kind = self._sync_kind(func, name, args, kwargs)
        site = self._site() if (kind or self._outside_forward) else None
        if kind:
            tally.syncs[(kind, site)] += 1
        if func.is_view or name in NO_KERNEL:
            tally.no_kernel[name] += 1
        else:
            tally.ops[name] += 1
            if site is not None:
                tally.op_sites[site] += 1
                tally.op_ms[site] += 1000 * elapsed
        return result

    def _sync_kind(self, func, name: str, args: tuple, kwargs: dict) -> str | None:
        if name in ALWAYS_SYNC:
            return "scalar read (C++)" if name == "_local_scalar_dense" else f"aten.{name}"
        if name in BOOL_INDEX_OPS:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
                return f"aten.{name} (bool mask)"
        if name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3 \
                and any(isinstance(a, torch.Tensor) for a in args):
            return "aten.repeat_interleave (tensor repeats)"
        if name in ("_to_copy", "copy_", "copy"):  # device -> host copies (real devices only)
            if name == "_to_copy":
                source, target = args[0], kwargs.get("device")
                to_host = target is not None and torch.device(target).type == "cpu"
            else:
                target, source = args[0], args[1]
                to_host = isinstance(source, torch.Tensor) and target.device.type == "cpu"
            if to_host and isinstance(source, torch.Tensor) and source.device.type != "cpu":
                return f"aten.{name} (device to host)"
        return None

    # -- helpers ------------------------------------------------------------------------------------
    @property
    def _outside_forward(self) -> bool:
        return not (isinstance(self.scope, tuple) and self.scope[0] == "forward")

    def _site(self) -> str | None:
        return call_site() if self.attribute else None

    def _tally(self) -> Tally:
        tally = self.tallies.get(self.scope)
        if tally is None:
            tally = self.tallies[self.scope] = Tally()
        return tally

    def _is_device(self, tensor: torch.Tensor) -> bool:
        if tensor.device.type != "cpu":
            return True
        return self.simulate_device and tensor not in self._host


_ABSENT = object()


def _compiled_launches(events) -> list[str]:
    """The launches of a profiled compiled call: fused inductor kernels, and the kernel-launching aten events
    under a compiled graph with no kernel-launching event below them (``aten::exponential`` = ``copy_`` +
    ``exponential_``)."""
    found = []
    for event in events:
        if _launches(event) and _in_compiled_graph(event) and not any(map(_launches, _descendants(event))):
            found.append("inductor kernel" if _is_fused_kernel(event.name)
                         else event.name.removeprefix("aten::") + " (compiled graph)")
    return found


def _is_fused_kernel(name: str) -> bool:
    return "cpp_fused" in name or name.startswith("triton_")


def _launches(event) -> bool:
    """A profiler event that launches a kernel: a fused kernel, or an aten op that is neither a view nor in
    :data:`NO_KERNEL`."""
    if _is_fused_kernel(event.name):
        return True
    if not event.name.startswith("aten::"):
        return False
    name = event.name.removeprefix("aten::")
    packet = getattr(torch.ops.aten, name, None)
    overload = getattr(packet, "default", None)
    return overload is not None and name not in NO_KERNEL and not overload.is_view


def _in_compiled_graph(event) -> bool:
    while event is not None:
        if event.name.startswith("## Call CompiledFxGraph"):
            return True
        event = event.cpu_parent
    return False


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def _tensors(*groups) -> list[torch.Tensor]:
    """The tensors among the values of ``groups``, looking one level into lists and tuples (aten arguments
    nest no deeper: ``cat``'s tensor list, ``index``'s index list); cheaper than ``pytree`` per op."""
    found = []
    for group in groups:
        for value in group:
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


# -- forwards and timing ----------------------------------------------------------------------------------
class StopRun(Exception):
    """Raised by :class:`ForwardScopes`' pre-hook to end a run once it holds the iterations it measures (the rest
    of a 256-token image, and the shrinking windows at its end, would cost time and say nothing)."""


class ForwardScopes:
    """Forward pre/post hooks on ``model`` that split a run: ``on_scope(("forward", i))`` when forward ``i`` starts
    and ``on_scope(("gap", i))`` when it ends; :class:`StopRun` when forward ``stop_at`` starts. Each forward's
    ``logits_to_keep`` and ``position_ids`` (Jacobi forwards: window + 1, and [rows, width] with column 0 the
    uncached token's position) are kept; ``forwards`` (a :class:`hf_sjd.timing.ForwardTimer` hooked alongside)
    times every forward, ``span`` (one driven by hand) the stretch from forward 0's end to forward ``stop_at``'s
    start, so the time outside the forwards in between is ``span - forwards``."""

    def __init__(self, model, on_scope=None, stop_at: int | None = None) -> None:
        self.model, self.on_scope, self.stop_at = model, on_scope, stop_at
        self.calls: list[dict] = []  # per forward started: its logits_to_keep and position_ids
        self.forwards, self.span = ForwardTimer(), ForwardTimer()
        self._span_start = None

    def __enter__(self) -> "ForwardScopes":
        parameter = next(self.model.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")

        def before(module, args, kwargs):
            if self.on_scope is not None:
                self.on_scope(("forward", len(self.calls)))
            self.calls.append({"logits_to_keep": kwargs.get("logits_to_keep"),
                               "position_ids": kwargs.get("position_ids")})
            if len(self.calls) - 1 == self.stop_at:
                if self._span_start is not None:
                    self.span.stop(self._span_start)
                raise StopRun

        def after(module, args, kwargs, output):
            if len(self.calls) == 1:
                self._span_start = self.span.start(device)
            if self.on_scope is not None:
                self.on_scope(("gap", len(self.calls) - 1))

        self._timed = self.forwards.hooked(self.model)
        self._handles = [self.model.register_forward_pre_hook(before, with_kwargs=True)]
        self._timed.__enter__()  # the timer's hooks sit inside the scope hooks: they time the forward alone
        self._handles.append(self.model.register_forward_hook(after, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        self._timed.__exit__(*exc)
        for handle in self._handles:
            handle.remove()


# -- models and prompts -----------------------------------------------------------------------------------
@dataclass
class Subject:
    """A model to measure, with what a run needs besides the method."""

    name: str  # "reference" | "dummy-V<vocab>"
    model: torch.nn.Module  # hf_sjd-enabled
    prompt: object  # batch -> [batch, P] prompt ids (no padding)
    negative: object  # batch -> [batch, P'] unconditional prompt ids (CFG)
    max_new_tokens: int  # what generate is asked for (runs stop after the measured iterations)
    strategy_kwargs: dict = field(default_factory=dict)  # method -> extra generate kwargs
    random_weights: bool = True

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)


def reference_subject(device: str = "cpu") -> Subject:
    """The shipped reference model (V = 530, trained; 256-token images; its own phrase library for ``sjd-pv``)."""
    import hf_sjd
    from hf_sjd.reference import load

    reference = load()
    model = hf_sjd.enable(reference.model.to(device))
    names = sorted(reference.conditions)
    return Subject("reference", model, lambda b: reference.prompt_ids([names[i % len(names)] for i in range(b)]),
                   reference.unconditional_ids, max_new_tokens=reference.num_image_tokens, random_weights=False)


def dummy_model(vocab_size: int, device: str = "cpu", seed: int = 0) -> torch.nn.Module:
    """A 1-layer LlamaGen-style ``LlamaForCausalLM`` (random weights: cost only) over ``vocab_size`` tokens:
    the first ``min(V - 3, 16384)`` ids are image tokens, then a prompt token, the null condition, padding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_sjd

    vocab_size = check_int("vocab_size", vocab_size, minimum=2)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                         pad_token_id=vocab_size - 1, bos_token_id=None, eos_token_id=None,
                         tie_word_embeddings=False, image_token_range=[0, max(1, min(vocab_size - 3, 16384))],
                         null_condition_token_id=max(vocab_size - 2, 0))
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    return hf_sjd.enable(model)


def motif_phrase_library(num_codes: int, seed: int = 0):
    """A small :class:`~hf_sjd.PhraseLibrary` over ``num_codes`` codes, learnt by BPE from random sequences
    built of 48 random motifs (2-5 codes), so there are phrases to find."""
    from hf_sjd import PhraseLibrary

    generator = torch.Generator().manual_seed(seed)
    motifs = [torch.randint(0, num_codes, (int(n),), generator=generator).tolist()
              for n in torch.randint(2, 6, (48,), generator=generator)]
    sequences = []
    for _ in range(96):
        picks = torch.randint(0, len(motifs), (20,), generator=generator).tolist()
        sequences.append([code for pick in picks for code in motifs[pick]])
    return PhraseLibrary.from_token_sequences(sequences, num_merges=64, codebook_size=num_codes)


def dummy_subject(vocab_size: int, device: str = "cpu", max_new_tokens: int = 64) -> Subject:
    model = dummy_model(vocab_size, device)
    first, last = model.config.image_token_range
    prompt_id, null_id = max(vocab_size - 3, 0), model.config.null_condition_token_id
    library = motif_phrase_library(last - first)
    return Subject(f"dummy-V{vocab_size}", model, lambda b: torch.full((b, 1), prompt_id, dtype=torch.long),
                   lambda b: torch.full((b, 1), null_id, dtype=torch.long), max_new_tokens=max_new_tokens,
                   strategy_kwargs={"sjd-pv": {"phrase_library": library, "pv_ignore_fingerprint": True}})


# -- one measurement --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    iterations: int = 12  # steady iterations measured per run (the run stops after them)
    window: int = 16
    top_k: int = 100
    repeats: int = 3  # timed runs (best and median)
    warmup: int = 1  # untimed runs before them
    count: bool = True  # also one counted run (syncs, ops, call sites)
    seed: int = 0
    top: int = 24  # call sites / op names kept per case
    dispatch_in_forward: bool = False  # also count aten-level syncs/ops inside forwards (slow)
    compile: bool = False  # Jacobi methods with jacobi_compile=True (compiled by an untimed run before counting)
    siblings: int = 0  # Jacobi methods' jacobi_siblings (the first draft's siblings, every forward after the prefill)
    verifier: str | None = None  # Jacobi methods' verifier (None: each strategy's own)
    sparse: str = "auto"  # Jacobi methods' jacobi_sparse: "auto", or "sparse" / "dense" (True / False)


def _generate(subject: Subject, method: str, batch: int, guidance_scale: float, settings: Settings) -> torch.Tensor:
    """One seeded ``generate`` call (``ar``: transformers' own loop, CFG through its unbatched CFG processor);
    returns the sequences."""
    model = subject.model
    device = model.device
    prompt = subject.prompt(batch).to(device)
    common = {"do_sample": True, "top_k": settings.top_k, "max_new_tokens": subject.max_new_tokens,
              "attention_mask": torch.ones_like(prompt)}
    torch.manual_seed(settings.seed)
    with torch.no_grad():
        if method == "ar":
            extra = {"guidance_scale": guidance_scale, "negative_prompt_ids": subject.negative(batch).to(device)} \
                if guidance_scale != 1 else {}
            return model.generate(prompt, **common, **extra)
        return model.generate(prompt, **common, custom_generate=method, jacobi_window=settings.window,
                              guidance_scale=guidance_scale, jacobi_compile=settings.compile,
                              jacobi_siblings=settings.siblings,
                              **({} if settings.verifier is None else {"verifier": settings.verifier}),
                              jacobi_sparse=SPARSE_KNOB[settings.sparse],
                              **subject.strategy_kwargs.get(method, {}))


def run_once(subject: Subject, method: str, batch: int, guidance_scale: float, settings: Settings,
             counter: CostCounter | None = None) -> ForwardScopes:
    """One run, stopped when the forward after the measured iterations starts; checks it got that far with
    full windows. Gap ``i`` (between forwards ``i`` and ``i + 1``) for ``i < forwards_per_step * iterations``
    is then the measured part."""
    per_step = forwards_per_step(method, guidance_scale)
    needed = per_step * settings.iterations
    scopes = ForwardScopes(subject.model, on_scope=None if counter is None else counter.enter_scope, stop_at=needed)
    with scopes:
        if counter is not None:
            counter.enter_scope(("setup",))
        try:
            _generate(subject, method, batch, guidance_scale, settings)
        except StopRun:
            pass
        finally:
            if counter is not None:
                counter.enter_scope(None)
    widths = {call["logits_to_keep"] for call in scopes.calls[1:]}  # after the prefill (it carries no siblings)
    if len(scopes.calls) <= needed or (method != "ar" and len(widths) > 1):
        raise ValueError(f"{subject.name} {method}: max_new_tokens={subject.max_new_tokens} ended the run or shrank "
                         f"the window within {settings.iterations} iterations; measure fewer iterations")
    return scopes


def forwards_per_step(method: str, guidance_scale: float) -> int:
    return 2 if method == "ar" and guidance_scale != 1 else 1  # transformers' CFG runs a second forward


def _step_compression(scopes: ForwardScopes, method: str, batch: int, prompt_length: int, iterations: int) -> float:
    """New tokens per row per iteration over the measured iterations (``ar``: 1). The forward after them
    starts at position ``prompt_length + committed - 1`` (its first token is the last committed one)."""
    if method == "ar":
        return 1.0
    positions = scopes.calls[-1]["position_ids"][:batch, 0].float()  # [batch] conditional rows
    return float((positions - prompt_length + 1).mean()) / iterations


def _per(counter: Counter, n: int, top: int) -> list:
    return [[key, value / n] for key, value in counter.most_common(top)]


def _by_site(syncs: Counter) -> Counter:
    joined = Counter()
    for (kind, site), n in syncs.items():
        joined[f"{kind} @ {site}"] += n
    return joined


def count_case(subject: Subject, method: str, batch: int, guidance_scale: float, settings: Settings) -> dict:
    """Sync points and ops per iteration, from one counted run (module docstring: the rules)."""
    cuda = subject.model.device.type == "cuda"
    counter = CostCounter(simulate_device=not cuda, dispatch_in_forward=settings.dispatch_in_forward)
    if settings.compile and method != "ar":
        torch._inductor.config.cpp.enable_kernel_profile = True  # fused CPU kernels show in the profile
        run_once(subject, method, batch, guidance_scale, settings)  # compiles (inductor), uncounted
    with counter:
        scopes = run_once(subject, method, batch, guidance_scale, settings, counter)
    per_step, n = forwards_per_step(method, guidance_scale), settings.iterations
    loop, forward = Tally(), Tally()
    for gap in range(per_step * n):
        loop += counter.tallies.get(("gap", gap), Tally())
    for index in range(per_step, per_step * n):  # the measured iterations' forwards, but the stopped last one
        forward += counter.tallies.get(("forward", index), Tally())
    compression = _step_compression(scopes, method, batch, subject.prompt(1).shape[1], n)
    kinds = Counter()
    for (kind, _), count in loop.syncs.items():
        kinds[kind] += count
    syncs, ops = sum(loop.syncs.values()), sum(loop.ops.values())
    return {"syncs_per_iter": syncs / n, "forward_syncs_per_iter": sum(forward.syncs.values()) / (n - 1),
            "ops_per_iter": ops / n, "no_kernel_ops_per_iter": sum(loop.no_kernel.values()) / n,
            "host_ops_per_iter": sum(loop.host_ops.values()) / n,
            "syncs_per_token": syncs / n / compression, "ops_per_token": ops / n / compression,
            "step_compression": compression, "sync_kinds": _per(kinds, n, 99),
            "top_syncs": _per(_by_site(loop.syncs), n, settings.top),
            "top_forward_syncs": _per(_by_site(forward.syncs), n - 1, settings.top),
            "top_ops": _per(loop.ops, n, settings.top), "top_op_sites": _per(loop.op_sites, n, settings.top),
            # counted run: each op timed alone (CPU: the kernel's time; CUDA: the launch only)
            "op_ms_per_iter": sum(loop.op_ms.values()) / n, "top_op_ms_sites": _per(loop.op_ms, n, settings.top)}


def time_case(subject: Subject, method: str, batch: int, guidance_scale: float, settings: Settings) -> dict:
    """Outside-forward (and forward) ms per iteration over timed runs with nothing counted."""
    per_step, n = forwards_per_step(method, guidance_scale), settings.iterations
    outside, inside = [], []
    for run in range(settings.warmup + settings.repeats):
        scopes = run_once(subject, method, batch, guidance_scale, settings)
        if run < settings.warmup:
            continue
        forwards = scopes.forwards.durations()  # every forward that ran: 0 .. per_step * n - 1
        (span,) = scopes.span.durations()  # from forward 0's end to the stopped forward's start
        outside.append(1000 * (span - sum(forwards[1:per_step * n])) / n)
        # forwards of the measured iterations but the stopped last one (it never ran): n - 1 iterations' worth
        inside.append(1000 * sum(forwards[per_step:per_step * n]) / max(n - 1, 1))
    compression = _step_compression(scopes, method, batch, subject.prompt(1).shape[1], n)
    return {"step_compression": compression,
            "outside_ms_per_iter": {"best": min(outside), "median": statistics.median(outside), "runs": outside},
            "forward_ms_per_iter": {"best": min(inside), "median": statistics.median(inside)},
            "outside_ms_per_token": min(outside) / compression}


def measure(subject: Subject, method: str, batch: int, guidance_scale: float, settings: Settings) -> dict:
    """One case: counts (if ``settings.count``) and times, per iteration."""
    check_choice("method", method, METHODS)
    check_int("batch", batch, minimum=1)
    check_float("guidance_scale", guidance_scale, minimum=0.0)
    check_int("iterations", settings.iterations, minimum=2)
    result = {"model": subject.name, "vocab_size": subject.vocab_size, "random_weights": subject.random_weights,
              "method": method, "batch": batch, "guidance_scale": guidance_scale,
              "max_new_tokens": subject.max_new_tokens, "window": None if method == "ar" else settings.window,
              "top_k": settings.top_k, "forwards_per_step": forwards_per_step(method, guidance_scale),
              "iterations": settings.iterations, "compiled": settings.compile, "siblings": settings.siblings,
              "verifier": None if method == "ar" else settings.verifier,
              "sparse": None if method == "ar" else settings.sparse}
    if settings.count:
        result.update(count_case(subject, method, batch, guidance_scale, settings))
    result.update(time_case(subject, method, batch, guidance_scale, settings))
    return result


# -- report -----------------------------------------------------------------------------------------------
def _label(case: dict) -> str:
    siblings = case.get("siblings") if case["method"] != "ar" else 0
    verifier = case.get("verifier")
    return (case["method"] + (" compiled" if case.get("compiled") else "")
            + (f" + {siblings} siblings" if siblings else "") + (f", verifier={verifier}" if verifier else "")
            + (f", {case['sparse']}" if case.get("sparse") not in (None, "auto") else ""))


def _cfg(scale: float) -> str:
    return "no" if scale == 1 else f"{scale:g}"


def _main_table(cases: list[dict]) -> list[str]:
    lines = ["| method | batch | CFG | syncs/iter loop | syncs/iter in forward | ops/iter | no-kernel ops/iter | "
             "outside ms/iter best | median | forward ms/iter | tokens/iter | syncs/token | ops/token | "
             "outside ms/token |", "|---|---:|---|" + "---:|" * 11]
    for c in cases:
        counts = (f"{c['syncs_per_iter']:.1f} | {c['forward_syncs_per_iter']:.1f} | {c['ops_per_iter']:.0f} | "
                  f"{c['no_kernel_ops_per_iter']:.0f}") if "syncs_per_iter" in c else " | | | "
        per_token = f"{c['syncs_per_token']:.1f} | {c['ops_per_token']:.0f}" if "syncs_per_iter" in c else " | "
        lines.append(f"| {_label(c)} | {c['batch']} | {_cfg(c['guidance_scale'])} | {counts} | "
                     f"{c['outside_ms_per_iter']['best']:.2f} | {c['outside_ms_per_iter']['median']:.2f} | "
                     f"{c['forward_ms_per_iter']['best']:.2f} | {c['step_compression']:.2f} | {per_token} | "
                     f"{c['outside_ms_per_token']:.2f} |")
    return lines


def _scaling_table(cases: list[dict]) -> list[str]:
    vocabs = sorted({c["vocab_size"] for c in cases})
    keyed = {(_label(c), c["batch"], c["guidance_scale"], c["vocab_size"]): c for c in cases}
    method_of = {_label(c): c["method"] for c in cases}
    rows = sorted({(_label(c), c["batch"], c["guidance_scale"]) for c in cases},
                  key=lambda r: (METHODS.index(method_of[r[0]]), r[0], r[1], r[2]))
    growth = [f"growth {vocabs[0]}->{v}" for v in vocabs[1:]]
    lines = ["| method | batch | CFG | " + " | ".join([*(f"ms/iter V={v}" for v in vocabs), *growth])
             + " | syncs/iter | ops/iter |", "|---|---:|---|" + "---:|" * (2 * len(vocabs) - 1 + 2)]

    def spread(values: list[float], digits: int) -> str:
        low, high = min(values), max(values)
        return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else \
            f"{low:.{digits}f}-{high:.{digits}f}"

    for method, batch, scale in rows:
        cells = [keyed.get((method, batch, scale, v)) for v in vocabs]
        ms = [c["outside_ms_per_iter"]["best"] if c else None for c in cells]
        shown = [f"{m:.2f}" if m is not None else "" for m in ms]
        shown += [f"{m / ms[0]:.1f}x" if m is not None and ms[0] else "" for m in ms[1:]]
        counted = [c for c in cells if c and "syncs_per_iter" in c]
        shown += [spread([c["syncs_per_iter"] for c in counted], 1), spread([c["ops_per_iter"] for c in counted], 0)] \
            if counted else ["", ""]
        lines.append(f"| {method} | {batch} | {_cfg(scale)} | " + " | ".join(shown) + " |")
    return lines


def _representative(cases: list[dict]) -> list[dict]:
    """Per method, the counted case with the largest batch and guidance scale."""
    best = {}
    for case in (c for c in cases if "top_syncs" in c):
        kept = best.get(_label(case))
        if kept is None or (case["batch"], case["guidance_scale"]) > (kept["batch"], kept["guidance_scale"]):
            best[_label(case)] = case
    return sorted(best.values(), key=lambda c: (METHODS.index(c["method"]), _label(c)))


def _sources(case: dict, top: int = 12) -> list[str]:
    lines = [f"### {_label(case)}, batch {case['batch']}, CFG {_cfg(case['guidance_scale'])}", "",
             f"{case['syncs_per_iter']:.1f} syncs/iter by kind: "
             + "; ".join(f"{kind} {n:.2f}" for kind, n in case["sync_kinds"]), "", "by call site:"]
    lines += [f"- {n:.2f} x {site}" for site, n in case["top_syncs"]]
    if case["top_forward_syncs"]:
        lines += ["", "inside the forward:"] + [f"- {n:.2f} x {site}" for site, n in case["top_forward_syncs"]]
    lines += ["", f"{case['ops_per_iter']:.0f} ops/iter, top by name: "
              + ", ".join(f"{name} {n:.1f}" for name, n in case["top_ops"][:top]), "", "top call sites:"]
    lines += [f"- {n:.1f} x {site}" for site, n in case["top_op_sites"][:top]] + [""]
    return lines


def _time_sources(case: dict, top: int = 8) -> list[str]:
    lines = [f"### {_label(case)}, batch {case['batch']}, CFG {_cfg(case['guidance_scale'])}: "
             f"{case['outside_ms_per_iter']['best']:.0f} ms/iter outside the forward; ops timed one by one "
             f"{case['op_ms_per_iter']:.0f} ms/iter", ""]
    return lines + [f"- {ms:.1f} ms x {site}" for site, ms in case["top_op_ms_sites"][:top]] + [""]


def markdown(report: dict) -> str:
    config, environment = report["config"], report["environment"]
    lines = [f"# {config['title']}", "", f"Command: `{report['command']}`", "",
             f"{environment['device']}, torch {environment['torch']}, transformers {environment['transformers']}, "
             f"{config['threads']} thread(s); do_sample, top-k {config['top_k']}, jacobi_window {config['window']}; "
             f"{config['iterations']} steady iterations per run ({config['iterations_large']} at V >= {LARGE_VOCAB}), "
             f"best of {config['repeats']} timed runs ({config['repeats_large']} at V >= {LARGE_VOCAB}). Definitions "
             "and counting rules: the docstring of `benchmarks/loop_cost.py`. CPU ms are this machine's (noisy when it "
             "is shared); syncs and ops are what a GPU would see.", "",
             "Models other than the shipped reference model have random weights: cost measurements, NOT "
             "acceleration claims (their acceptance is near random, so tokens/iter is near 1).", ""]
    main = [c for c in report["cases"] if c["model"] == "reference"]
    if main:
        lines += [f"## Reference model (V = {REFERENCE_VOCAB}, trained, {main[0]['max_new_tokens']}-token images)",
                  "", *_main_table(main), ""]
    scaling = [c for c in report["cases"] if c["model"] != "reference"]
    if scaling:
        lines += ["## Vocabulary scaling: outside-forward ms/iter (best), 1-layer dummy Llama, random weights", "",
                  "Image tokens: the first min(V - 3, 16384) ids; syncs/ops: over all V (a range where they differ).",
                  "", *_scaling_table(scaling), ""]
    sources = _representative(main or scaling)
    if sources:
        lines += [f"## Where the syncs and ops come from (per iteration, outside the forward; "
                  f"{sources[0]['model']})", ""]
        for case in sources:
            lines += _sources(case)
    if scaling:
        largest = max(c["vocab_size"] for c in scaling)
        timed = _representative([c for c in scaling if c["vocab_size"] == largest])
        if timed:
            lines += [f"## Where the time goes at V = {largest} (per iteration, outside the forward)", "",
                      "From the counted run, each op timed alone (on CPU its kernel time), by call site.", ""]
            for case in timed:
                lines += _time_sources(case)
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def _float_list(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from None


SPARSE_KNOB = {"auto": "auto", "sparse": True, "dense": False}  # --sparse -> jacobi_sparse
INT_FLAGS = (("--iterations", 2), ("--iterations-large", 2), ("--max-new-tokens", 2), ("--window", 1),
             ("--top-k", 1), ("--repeats", 1), ("--repeats-large", 1), ("--warmup", 0), ("--warmup-large", 0),
             ("--threads", 1), ("--siblings", 0))  # flag, minimum


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--guidance-scales", default="1,3", help="reference-model table; 1 = no CFG")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference-model table")
    parser.add_argument("--vocab-sizes", default="530,65536,184622",
                        help="dummy-model vocabularies of the scaling table ('' = none)")
    parser.add_argument("--scaling-guidance-scales", default="3", help="CFG of the scaling table")
    parser.add_argument("--iterations", type=int, default=12, help="steady iterations measured per run")
    parser.add_argument("--iterations-large", type=int, default=4, help=f"the same at V >= {LARGE_VOCAB}")
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="dummy models (the reference model: its 256); runs stop after the measured iterations")
    parser.add_argument("--window", type=int, default=16, help="jacobi_window")
    parser.add_argument("--siblings", type=int, default=0, help="jacobi_siblings of the Jacobi methods")
    parser.add_argument("--verifier", default=None,
                        help="verifier of the Jacobi methods (a key of hf_sjd.VERIFIERS; default: each strategy's own)")
    parser.add_argument("--sparse", default="auto", choices=tuple(SPARSE_KNOB),
                        help="jacobi_sparse of the Jacobi methods: auto (the default rule), sparse or dense (forced)")
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case (best and median)")
    parser.add_argument("--repeats-large", type=int, default=2, help=f"the same at V >= {LARGE_VOCAB}")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before them")
    parser.add_argument("--warmup-large", type=int, default=0, help=f"the same at V >= {LARGE_VOCAB}")
    parser.add_argument("--title", default="Loop cost per iteration", help="the markdown's heading")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (CUDA-event timing, real device syncs)")
    parser.add_argument("--modes", default="eager",
                        help="eager and/or compiled (the Jacobi methods with jacobi_compile=True), comma-separated")
    parser.add_argument("--json", default=None, help="write the full report (every count and call site) here")
    parser.add_argument("--markdown", default=None, help="write the tables here")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks loop-cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """Every argument checked before any model is built; a bad one exits 2 naming the flag."""
    def check(flag: str, fn):
        try:
            return fn()
        except (TypeError, ValueError, RuntimeError) as error:  # RuntimeError: torch.device("tpu")
            parser.error(f"{flag}: {error}")

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        parser.error(f"--methods: empty; allowed values: {', '.join(map(repr, METHODS))}")
    for method in methods:
        check("--methods", lambda: check_choice("method", method, METHODS))
    batches = check("--batch-sizes", lambda: [check_int("batch size", b, minimum=1)
                                              for b in _int_list(args.batch_sizes)])
    scales = check("--guidance-scales", lambda: [check_float("guidance scale", g, minimum=0.0)
                                                 for g in _float_list(args.guidance_scales)])
    scaling_scales = check("--scaling-guidance-scales", lambda: [check_float("guidance scale", g, minimum=0.0)
                                                                 for g in _float_list(args.scaling_guidance_scales)])
    vocabs = check("--vocab-sizes", lambda: [check_int("vocabulary size", v, minimum=2)
                                             for v in _int_list(args.vocab_sizes)])
    if not batches:
        parser.error("--batch-sizes: empty; give integers >= 1")
    if not args.no_reference and not scales:
        parser.error("--guidance-scales: empty; give numbers >= 0")
    if vocabs and not scaling_scales:
        parser.error("--scaling-guidance-scales: empty; give numbers >= 0")
    if args.no_reference and not vocabs:
        parser.error("--vocab-sizes: empty with --no-reference, so there is nothing to measure")
    for flag, minimum in INT_FLAGS:
        name = flag[2:].replace("-", "_")
        check(flag, lambda: check_int(flag, getattr(args, name), minimum=minimum))
    if args.verifier is not None:
        from hf_sjd import VERIFIERS

        check("--verifier", lambda: check_choice("verifier", args.verifier, tuple(VERIFIERS)))
    device = check("--device", lambda: torch.device(args.device))
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device: {args.device!r} is not supported; allowed: cpu, cuda, cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device: {args.device!r} needs CUDA, which is not available here")
    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path is not None and os.path.isdir(path):
            parser.error(f"{flag}: {path!r} is a folder; give a file path")
    modes = check("--modes", lambda: [check_choice("--modes", m, ("eager", "compiled"))
                                      for m in dict.fromkeys(args.modes.split(","))])
    return {"methods": methods, "batches": batches, "scales": scales, "scaling_scales": scaling_scales,
            "vocabs": vocabs, "compiled": [m == "compiled" for m in modes]}


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str | None = None) -> int:
    import transformers

    plan = validate(parser, args)
    torch.set_num_threads(args.threads)
    base = dict(window=args.window, top_k=args.top_k, seed=args.seed, siblings=args.siblings,
                verifier=args.verifier, sparse=args.sparse)
    normal = Settings(iterations=args.iterations, repeats=args.repeats, warmup=args.warmup, **base)
    large = Settings(iterations=args.iterations_large, repeats=args.repeats_large, warmup=args.warmup_large,
                     **base)
    cases = []

    def measure_all(subject: Subject, scales: list[float], settings: Settings) -> None:
        for method in plan["methods"]:
            for batch in plan["batches"]:
                for scale in scales:
                    for compiled in ((False,) if method == "ar" else plan["compiled"]):
                        case = measure(subject, method, batch, scale, dataclasses.replace(settings, compile=compiled))
                        cases.append(case)
                        counts = f"{case['syncs_per_iter']:.1f} syncs, {case['ops_per_iter']:.0f} ops, " \
                            if "syncs_per_iter" in case else ""
                        print(f"{subject.name} {_label(case)} batch {batch} CFG {_cfg(scale)}: {counts}"
                              f"{case['outside_ms_per_iter']['best']:.2f} ms outside the forward per iteration",
                              file=sys.stderr, flush=True)

    if not args.no_reference:
        measure_all(reference_subject(args.device), plan["scales"], normal)
    for vocab in plan["vocabs"]:
        measure_all(dummy_subject(vocab, args.device, args.max_new_tokens), plan["scaling_scales"],
                    large if vocab >= LARGE_VOCAB else normal)
    device = torch.device(args.device)
    report = {
        "schema_version": 1,
        "command": command or shlex.join(["python", "-m", "benchmarks", "loop-cost", *getattr(args, "argv", [])]),
        "note": "random-weight models (all but the reference model) measure loop cost only, never acceleration",
        "config": {"methods": plan["methods"], "batch_sizes": plan["batches"], "guidance_scales": plan["scales"],
                   "vocab_sizes": plan["vocabs"], "scaling_guidance_scales": plan["scaling_scales"],
                   **{flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_")) for flag, _ in INT_FLAGS},
                   "seed": args.seed, "device": args.device, "title": args.title},
        "environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"},
        "cases": cases,
    }
    text = markdown(report)
    print(text)
    if args.json is not None:  # each file is a whole artifact of its own (the markdown names its command)
        atomic_write_text(args.json, json.dumps(report, indent=2) + "\n")
    if args.markdown is not None:
        atomic_write_text(args.markdown, text + "\n")
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks loop-cost") -> int:
    """``prog``: how the report names the command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return run(parser, args, command=shlex.join([*prog.split(), *args.argv]))


if __name__ == "__main__":
    sys.exit(main(prog="python -m benchmarks.loop_cost"))
