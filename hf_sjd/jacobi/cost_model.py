"""The window L and siblings m worth verifying per forward (``"auto"``): the cell of highest modelled speed-up
c(L, m) / (t(L + 1 + m) / t(1)), c the measured step compression (:data:`STEP_COMPRESSION`), t(n) / t(1) a forward
of n new tokens per row in vanilla steps: measured (:mod:`hf_sjd.calibration`), else a roofline on CUDA (few rows
are memory-bound, so a wider window is free), else the field defaults. :func:`plan` picks again as rows finish;
every cell is fixed before the draws it verifies, so exactness is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

AUTO = "auto"
DEFAULT_WINDOW, DEFAULT_SIBLINGS = 16, 0  # "auto" where no cost model applies

#: c(L, m) of the mc-sjd preset on the reference model (top-k 100, batch 1; docs/results/frontier_auto_token)
STEP_COMPRESSION: dict[tuple[int, int], float] = {
    (8, 0): 3.07, (16, 0): 4.13, (16, 3): 4.57, (16, 7): 4.66, (16, 15): 4.72,
    (32, 0): 4.84, (32, 3): 5.28, (32, 7): 5.29, (32, 15): 5.48, (64, 0): 4.81, (64, 7): 5.35, (64, 15): 5.41,
}

# The roofline's device: an H200 running transformers' eager forward: bytes/s, FLOP/s, and the host's seconds per
# decoder layer (an eager forward launches each layer's kernels one by one, and on a GPU that is most of a small
# batch's time). Fitted to the forwards an H200 timed (docs/results/gpu/README.md).
BANDWIDTH, PEAK_FLOPS, LAYER_HOST_S = 0.9 * 4.8e12, 0.5 * 989e12, 0.8e-3


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a decoder."""

    params: float  # parameters read per forward
    layers: int
    kv_width: int  # key/value heads x head size
    bytes_per_value: int = 2  # bf16

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        """The shape of ``model`` (every parameter counted, a vision tower too)."""
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
    math = max((weight_bytes + kv_bytes) / BANDWIDTH, 2 * shape.params * rows * n / PEAK_FLOPS)
    return shape.layers * LAYER_HOST_S + math


def cost_ratio(shape: ModelShape, rows: int, n: int, context: int) -> float:
    """t(n) / t(1): one forward of ``n`` new tokens per row, in vanilla decoding steps.

    >>> seven_b = ModelShape(params=7e9, layers=32, kv_width=4096)
    >>> round(cost_ratio(seven_b, rows=1, n=40, context=1024), 2)  # memory-bound: 39 more tokens are free
    1.0
    >>> round(cost_ratio(seven_b, rows=16, n=24, context=1024), 2)  # compute-bound: they are not
    1.18
    """
    return forward_seconds(shape, rows, n, context) / forward_seconds(shape, rows, 1, context)


def speedup(shape: ModelShape | None, rows: int, context: int, cell: tuple[int, int],
            table: Mapping[tuple[int, int], float] = STEP_COMPRESSION,
            cost: Callable[[tuple[int, int]], float] | None = None) -> float:
    """Modelled speed-up of ``cell`` = (L, m): c(L, m) / ``cost(cell)`` (default: the roofline of ``shape``)."""
    window, siblings = cell
    return table[cell] / (cost(cell) if cost is not None else cost_ratio(shape, rows, window + 1 + siblings, context))


def pick(shape: ModelShape | None, rows: int, context: int, window: int | None = None, siblings: int | None = None,
         siblings_allowed: bool = True, table: Mapping[tuple[int, int], float] = STEP_COMPRESSION,
         cost: Callable[[tuple[int, int]], float] | None = None) -> tuple[int, int]:
    """The cell (L, m) of ``table`` of highest :func:`speedup` among those agreeing with an explicit ``window`` or
    ``siblings`` (``None``: free; ``siblings_allowed=False``: m = 0); if none agrees, the free knob's default.

    >>> seven_b = ModelShape(params=7e9, layers=32, kv_width=4096)
    >>> pick(seven_b, rows=1, context=1024), pick(seven_b, rows=16, context=1024)
    ((32, 15), (16, 3))
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
    """``plan[a - 1]`` = (L, m) of a forward with ``a`` of the ``batch`` images still decoding (``rows_per_image``: 2
    with guidance). Explicit values: one cell throughout. ``"auto"``: :func:`pick` for the full batch, then again,
    for fewer rows, among the agreeing cells at least as wide; priced by ``cost(rows, cell)`` if given (module
    docstring).

    >>> seven_b = ModelShape(params=7e9, layers=32, kv_width=4096)
    >>> with priced_as(seven_b):
    ...     plan("auto", "auto", torch.nn.Linear(1, 1), batch=8, rows_per_image=1, context=1024,
    ...          siblings_allowed=True)
    ((32, 15), (32, 15), (32, 15), (32, 3), (32, 3), (32, 3), (32, 3), (32, 3))
    """
    if window != AUTO and siblings != AUTO:
        return ((window, siblings),) * batch

    def cost_at(images: int) -> Callable[[tuple[int, int]], float] | None:  # an iteration of that many images
        return None if cost is None else (lambda cell: cost(images * rows_per_image, cell))

    shape = None if cost is not None else _priced_shape(model, device_type)
    explicit_window, explicit_siblings = (None if window == AUTO else window), (None if siblings == AUTO else siblings)
    if cost is None and shape is None:  # nothing to price a cell with: the fields' defaults
        return ((DEFAULT_WINDOW if explicit_window is None else explicit_window,
                 DEFAULT_SIBLINGS if explicit_siblings is None else explicit_siblings),) * batch
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
    """Within the block, price every model as ``shape`` on ``device_type`` (benchmarks and tests on a CPU)."""
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
