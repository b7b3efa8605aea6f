"""``0 .. n - 1`` on a device without a kernel launch per call: one ``arange`` per device for the process, sliced.

The loop reads such ranges many times per iteration (window slots, phrase steps); each fresh ``torch.arange`` is
a launch. The slices are shared: read them, never write into them. Under ``torch.compile`` a plain ``arange``
(fused there, and no global tensor for the graph to guard on).
"""

from __future__ import annotations

import torch

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
