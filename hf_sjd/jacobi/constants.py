"""Tensors the loop reads every iteration but that depend only on shapes: built once, then only read.

Each fresh tensor is a kernel launch, so a range ``0 .. n - 1`` (:func:`offsets`, one per device for the process) or a
window's layout (:func:`cached`, one per key in its owner's table) is built once and shared: read it, never write
into it. Under ``torch.compile`` both are built in the graph instead (fused there, and no stored tensor for the
graph to guard on).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

T = TypeVar("T")

_RANGES: dict[torch.device, torch.Tensor] = {}  # device -> [capacity] 0 .. capacity - 1, grown by doubling


def offsets(n: int, device: torch.device | str) -> torch.Tensor:
    """[n] ``0 .. n - 1`` (int64) on ``device``: a read-only view of one shared tensor."""
    if torch.compiler.is_compiling():
        return torch.arange(n, device=device)
    device = torch.device(device)
    shared = _RANGES.get(device)
    if shared is None or shared.numel() < n:
        shared = _RANGES[device] = torch.arange(max(2 * n, 64), device=device)
    return shared[:n]


def cached(table: dict, key: Hashable, build: Callable[[], T]) -> T:
    """``table[key]``, from ``build()`` the first time (read-only from then on); a fresh ``build()`` while
    ``torch.compile`` traces."""
    if torch.compiler.is_compiling():
        return build()
    if key not in table:
        table[key] = build()
    return table[key]
