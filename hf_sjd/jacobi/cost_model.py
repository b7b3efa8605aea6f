"""What a forward costs, and the window and siblings worth verifying in it (``jacobi_window="auto"``,
``jacobi_siblings="auto"``: the ``mc-sjd`` preset).

    name       shape  meaning
    rows       -      rows of one forward: images, x 2 with classifier-free guidance
    n          -      new tokens per row in one forward: L + 1 + m (L drafts, the uncached token, m siblings)
    context    -      tokens in the KV cache per row (mean over the call: prompt + max_new_tokens / 2)
    t(n)/t(1)  -      one forward of n tokens per row, in vanilla decoding steps (:func:`cost_ratio`)
    c(L, m)    -      measured step compression of the mc-sjd preset at window L with m siblings
                      (:data:`STEP_COMPRESSION`: the reference model, batch 1, no CFG)
    speed-up   -      c(L, m) / (t(L + 1 + m) / t(1)): what :func:`pick` maximises over the measured cells

The forward cost is a roofline (a model, not a measurement): the weights are read once per forward, each row's
KV cache once, and every new token costs 2 x params FLOPs, on an H100-class device at 80% of its memory bandwidth
and 50% of its dense peak, plus a fixed launch latency. A large model's forward of a few rows is memory-bound,
so t(33)/t(1) is about 1 there and a wider window is free; with many rows the FLOPs take over and each drafted
token costs. ``benchmarks/`` measures t(L+1)/t(1) on a real device.

Only CUDA devices get the roofline; elsewhere ``"auto"`` is the field defaults, window 16 without siblings (a CPU
forward's cost grows with its tokens, and no roofline is calibrated for CPUs).

As a batch's rows finish, :func:`plan` keeps picking: the cell for every number of rows still decoding, so the
stragglers' forwards, which have fewer rows and so cheaper tokens, take the wider window and the siblings the
roofline makes free for them.

Exactness: the plan reads only the model's shape, the batch and the prompt, before the first forward, and the loop
reads only how many rows are left, so every window and sibling count is fixed before the draws it verifies, like
any other (verification, token by token or by blocks, is exact for every one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

AUTO = "auto"
DEFAULT_WINDOW, DEFAULT_SIBLINGS = 16, 0  # the fields' defaults: what "auto" is where no cost model applies

#: measured step compression c(L, m) of the mc-sjd preset (block verification, draft_init="auto", maximal coupling,
#: siblings from the mixture law, top-k 100, no CFG, batch 1) on the reference model: mean over seeds 0 / 1000 /
#: 3000, 64 images each, of ``python -m benchmarks frontier --sections auto --images-per-prompt 4 --seeds S``
#: (docs/results/frontier_auto_block; ``tests/jacobi/test_cost_model.py`` checks it). Keys: (window L, siblings m).
STEP_COMPRESSION: dict[tuple[int, int], float] = {
    (8, 0): 3.13, (16, 0): 4.27, (16, 3): 4.73, (16, 7): 4.80, (16, 15): 4.89,
    (32, 0): 4.94, (32, 3): 5.38, (32, 7): 5.53, (32, 15): 5.64, (64, 0): 5.05, (64, 7): 5.60, (64, 15): 5.65,
}

# The roofline's device: an H100-class GPU (bytes/s, FLOP/s, seconds per forward outside the math).
BANDWIDTH, PEAK_FLOPS, LAUNCH_S = 0.8 * 3.35e12, 0.5 * 989e12, 0.3e-3


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a decoder: its weights and the KV cache one row adds per token."""

    params: float  # parameters read per forward
    layers: int
    kv_width: int  # key/value heads x head size (the hidden size without grouped-query attention)
    bytes_per_value: int = 2  # bf16

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        """The shape of ``model``. Every parameter is counted (a Janus or Emu3 checkpoint's vision tower too,
        a few percent of a 7B model, which leans the pick slightly towards the memory-bound side)."""
        text = model.config.get_text_config()
        heads = getattr(text, "num_attention_heads", 1)
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        return cls(params=float(sum(p.numel() for p in model.parameters())), layers=text.num_hidden_layers,
                   kv_width=kv_heads * head_dim, bytes_per_value=next(model.parameters()).element_size())


def forward_seconds(shape: ModelShape, rows: int, n: int, context: int) -> float:
    """Modelled seconds of one forward of ``rows`` x ``n`` new tokens over ``context`` cached tokens per row."""
    weight_bytes = shape.bytes_per_value * shape.params
    kv_bytes = rows * shape.bytes_per_value * shape.layers * 2 * shape.kv_width * context  # K and V
    return LAUNCH_S + max((weight_bytes + kv_bytes) / BANDWIDTH, 2 * shape.params * rows * n / PEAK_FLOPS)


def cost_ratio(shape: ModelShape, rows: int, n: int, context: int) -> float:
    """t(n) / t(1): one forward of ``n`` new tokens per row, in vanilla decoding steps.

    >>> seven_b = ModelShape(params=7e9, layers=32, kv_width=4096)
    >>> round(cost_ratio(seven_b, rows=1, n=40, context=1024), 2)  # memory-bound: 39 more tokens are free
    1.0
    >>> round(cost_ratio(seven_b, rows=16, n=24, context=1024), 2)  # compute-bound: they are not
    1.28
    """
    return forward_seconds(shape, rows, n, context) / forward_seconds(shape, rows, 1, context)


def speedup(shape: ModelShape | None, rows: int, context: int, cell: tuple[int, int],
            table: Mapping[tuple[int, int], float] = STEP_COMPRESSION,
            cost: Callable[[tuple[int, int]], float] | None = None) -> float:
    """Modelled speed-up over vanilla decoding of ``cell`` = (L, m): c(L, m) / (t(L + 1 + m) / t(1)), with
    ``cost(cell)`` an iteration's cost in vanilla steps (default: the roofline of ``shape``; measured costs:
    :mod:`hf_sjd.calibration`, ``benchmarks/gpu_latency.py --auto-check``)."""
    window, siblings = cell
    return table[cell] / (cost(cell) if cost is not None else cost_ratio(shape, rows, window + 1 + siblings, context))


def pick(shape: ModelShape | None, rows: int, context: int, window: int | None = None, siblings: int | None = None,
         siblings_allowed: bool = True, table: Mapping[tuple[int, int], float] = STEP_COMPRESSION,
         cost: Callable[[tuple[int, int]], float] | None = None) -> tuple[int, int]:
    """The cell (L, m) of ``table`` (the measured cells) of highest :func:`speedup`, among those agreeing with
    an explicit ``window`` or ``siblings`` (``None``: free); ``siblings_allowed=False`` keeps m = 0. Where no
    cell agrees, the free knob takes its field default.

    >>> seven_b = ModelShape(params=7e9, layers=32, kv_width=4096)
    >>> pick(seven_b, rows=1, context=1024), pick(seven_b, rows=16, context=1024)
    ((64, 15), (16, 3))
    >>> pick(seven_b, rows=1, context=1024, window=16), pick(seven_b, rows=1, context=1024, window=24)
    ((16, 15), (24, 0))
    """
    cells = [(L, m) for L, m in table if (window is None or L == window)
             and (siblings is None or m == siblings) and (siblings_allowed or m == 0)]
    if not cells:
        return (DEFAULT_WINDOW if window is None else window), (DEFAULT_SIBLINGS if siblings is None else siblings)
    return max(cells, key=lambda cell: speedup(shape, rows, context, cell, table, cost))


def plan(window: int | str, siblings: int | str, model: torch.nn.Module, batch: int, rows_per_image: int,
         context: int, siblings_allowed: bool, device_type: str | None = None,
         cost: Callable[[int, tuple[int, int]], float] | None = None,
         table: Mapping[tuple[int, int], float] = STEP_COMPRESSION) -> tuple[tuple[int, int], ...]:
    """``plan[a - 1]`` = (L, m), the window and siblings of a forward with ``a`` of the ``batch`` images still decoding
    (``rows_per_image``: 2 with classifier-free guidance), among the cells of ``table`` (c(L, m)).

    Explicit values give the same cell for every ``a``. With ``"auto"``, the full batch's cell is :func:`pick`'s
    for all its rows, and with fewer rows left the pick is made again among the cells that agree with the explicit
    knob and are at least as wide as the full batch's. An iteration of ``rows`` forward rows at ``cell`` costs
    ``cost(rows, cell)`` vanilla steps where it is given (measured: :mod:`hf_sjd.calibration`), else the roofline's
    t(L+1+m)/t(1) on a CUDA device; with neither, every entry is the field defaults' cell.

    >>> seven_b = ModelShape(params=7e9, layers=32, kv_width=4096)
    >>> with priced_as(seven_b):
    ...     plan("auto", "auto", torch.nn.Linear(1, 1), batch=8, rows_per_image=1, context=1024,
    ...          siblings_allowed=True)
    ((64, 15), (64, 15), (32, 15), (32, 15), (32, 7), (32, 3), (32, 3), (16, 7))
    """
    if window != AUTO and siblings != AUTO:
        return ((window, siblings),) * batch

    def cost_at(images: int) -> Callable[[tuple[int, int]], float] | None:  # an iteration of that many images
        return None if cost is None else (lambda cell: cost(images * rows_per_image, cell))

    shape = None if cost is not None else _priced_shape(model, device_type)
    explicit_window, explicit_siblings = (None if window == AUTO else window), (None if siblings == AUTO else siblings)
    if cost is None and shape is None:  # nothing to price a cell with: the fields' defaults
        return ((explicit_window or DEFAULT_WINDOW, DEFAULT_SIBLINGS if explicit_siblings is None
                 else explicit_siblings),) * batch
    first = pick(shape, batch * rows_per_image, context, explicit_window, explicit_siblings, siblings_allowed,
                 table, cost_at(batch))
    cells = {(L, m): c for (L, m), c in table.items()
             if (L >= first[0] if window == AUTO else L == window)
             and (m == siblings if siblings != AUTO else siblings_allowed or m == 0)}
    if not cells:  # an explicit value no measured cell has: nothing to pick again from
        return (first,) * batch
    return (*(pick(shape, rows * rows_per_image, context, table=cells, cost=cost_at(rows))
              for rows in range(1, batch)), first)


def roofline_forced() -> bool:
    """Whether :func:`priced_as` is pricing every model (then measured costs are not asked for)."""
    return bool(_PRICED_AS)


_PRICED_AS: list[tuple[ModelShape, str]] = []  # priced_as's stack: (shape, device type), innermost last


@contextlib.contextmanager
def priced_as(shape: ModelShape, device_type: str = "cuda") -> Iterator[None]:
    """Within the block, price every model as ``shape`` on ``device_type`` (:func:`plan`): what the preset would run
    for that model there. For benchmarks and tests, which run the reference model on a CPU; restored on exit, also
    when the block raises."""
    _PRICED_AS.append((shape, device_type))
    try:
        yield
    finally:
        _PRICED_AS.pop()


def _priced_shape(model: torch.nn.Module, device_type: str | None) -> ModelShape | None:
    """The shape the roofline prices ``model`` as, or None where it does not apply (not a CUDA device)."""
    if _PRICED_AS:
        shape, device_type = _PRICED_AS[-1]
    else:
        shape, device_type = None, device_type or next(model.parameters()).device.type
    if device_type != "cuda":
        return None
    return shape or ModelShape.of(model)
