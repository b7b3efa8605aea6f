"""Argument checks shared by the API, ``hf-sjd generate``, ``hf-sjd bench`` and the phrase-library tools.

Every check names the argument and the allowed values and returns the value in its canonical Python type: an
integer or a float however passed (``numpy.int64``, a 0-d tensor, ...) is accepted; ``bool``, ``"3"``, ``nan``,
``inf`` or a float where an integer is meant are refused before any work starts.

    >>> check_int("jacobi_window", 16, minimum=1)
    16
    >>> check_float("guidance_scale", float("nan"), minimum=0.0)
    Traceback (most recent call last):
    ...
    ValueError: guidance_scale must be a finite number >= 0.0, got nan
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any


def _bounds(minimum, maximum, low_open: bool = False, high_open: bool = False) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if low_open else '>='} {minimum}")
    if maximum is not None:
        parts.append(f"{'<' if high_open else '<='} {maximum}")
    return " and ".join(parts)


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *,
              allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` in ``[minimum, maximum]``; bools, floats and strings raise ``TypeError``
    (``operator.index`` is the test: ``3.0`` where an integer is meant is a bug to report, not to round)."""
    if value is None and allow_none:
        return None
    bounds = _bounds(minimum, maximum)
    allowed = f"{'None or ' if allow_none else ''}an integer{' ' + bounds if bounds else ''}"
    if isinstance(value, bool):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_window(name: str, value: Any, minimum: int) -> int | str:
    """A command line's window: ``"auto"``, or an integer ``>= minimum`` (as text or an int).

    >>> check_window("--window", "16", minimum=1), check_window("--window", "auto", minimum=1)
    (16, 'auto')
    """
    if value == "auto":
        return value
    try:
        return check_int(name, int(value) if isinstance(value, str) else value, minimum=minimum)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be 'auto' or an integer >= {minimum}, got {value}") from None


def check_float(name: str, value: Any, minimum: float | None = None, maximum: float | None = None, *,
                low_open: bool = False, high_open: bool = False, allow_none: bool = False) -> float | None:
    """``value`` as a finite ``float`` within the bounds (``low_open``/``high_open``: exclusive bound); integers
    are accepted (``guidance_scale=3``), bools, strings and non-finite values are not."""
    if value is None and allow_none:
        return None
    bounds = _bounds(minimum, maximum, low_open, high_open)
    allowed = f"{'None or ' if allow_none else ''}a finite number{' ' + bounds if bounds else ''}"
    is_tensor_scalar = hasattr(value, "ndim") and getattr(value, "ndim", 1) == 0 and hasattr(value, "item")
    if is_tensor_scalar and not isinstance(value, numbers.Real):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {allowed}, got {value}")
    too_low = minimum is not None and (value <= minimum if low_open else value < minimum)
    too_high = maximum is not None and (value >= maximum if high_open else value > maximum)
    if too_low or too_high:
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_choice(name: str, value: Any, allowed: tuple, *, allow_none: bool = False) -> Any:
    """``value`` if it is one of ``allowed`` (or ``None`` with ``allow_none``); else ``ValueError`` listing them."""
    if value is None and allow_none:
        return None
    if isinstance(value, (str, int, float, type(None))) and value in allowed:  # no array comparisons
        return value
    listed = ", ".join(map(repr, allowed)) + (", None" if allow_none else "")
    raise ValueError(f"{name}={value!r} is not supported; allowed values: {listed}")


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a ``bool`` (numpy bools included); ``1``/``"yes"`` are refused, not guessed."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):  # numpy 2 names it bool
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def check_device(name: str, value: str | None):
    """The ``torch.device`` a command line's ``value`` names: ``cpu``, ``cuda`` or ``cuda:N`` (CUDA only where it is
    available); ``None``: CUDA where available, else the CPU.

    >>> check_device("--device", "cpu")
    device(type='cpu')
    >>> check_device("--device", "tpu")
    Traceback (most recent call last):
    ...
    ValueError: --device 'tpu': allowed values: cpu, cuda, cuda:N (CUDA where it is available)
    """
    import torch

    try:
        device = torch.device(value or ("cuda" if torch.cuda.is_available() else "cpu"))
    except (RuntimeError, TypeError):
        device = None
    cuda_ok = device is not None and device.type == "cuda" and torch.cuda.is_available() and (
        device.index is None or device.index < torch.cuda.device_count())
    if device is None or not (device.type == "cpu" or cuda_ok):
        raise ValueError(f"{name} {value!r}: allowed values: cpu, cuda, cuda:N (CUDA where it is available)")
    return device


class UnsupportedModelError(ValueError):
    """A model Jacobi decoding cannot run token-identically to transformers' own decoding, refused before any
    decoding forward. ``reason``: the short kind (``"recurrent state"``, ``"no KV cache"``, ...); the message
    says why it cannot be exact and, where there is one, what to do instead."""

    def __init__(self, model, reason: str, why: str) -> None:
        self.reason = reason
        super().__init__(f"{type(model).__name__} cannot be used for Jacobi decoding ({reason}): {why}")
