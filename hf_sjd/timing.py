"""The one forward timer: how many model forwards ran and how long each took, by hand around a forward
(:meth:`ForwardTimer.start` / :meth:`ForwardTimer.stop`) or by hooks on a module (:meth:`ForwardTimer.hooked`).
On a GPU, CUDA events read once in :meth:`ForwardTimer.durations`, so the host never waits mid-run.

    >>> import torch
    >>> timer = ForwardTimer()
    >>> layer = torch.nn.Linear(2, 2)
    >>> with timer.hooked(layer):
    ...     _ = layer(torch.ones(1, 2)); _ = layer(torch.ones(1, 2))
    >>> timer.count, len(timer.durations()), timer.total() >= 0, len(timer.gaps())
    (2, 2, True, 1)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch


class ForwardTimer:
    def __init__(self) -> None:
        self._spans: list[tuple] = []  # (start, end): floats, or CUDA events read in durations()
        self._seconds: list[float] = []  # the spans read so far
        self._gaps: list[float] = []  # seconds from the end of each forward read so far to the start of the next
        self._last_end = None  # the end stamp of the last forward read

    @property
    def count(self) -> int:
        """Forwards timed so far."""
        return len(self._seconds) + len(self._spans)

    @staticmethod
    def start(device: torch.device):
        """A stamp before a forward on ``device``; hand it to :meth:`stop` after the forward."""
        if device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started) -> None:
        end = time.perf_counter() if isinstance(started, float) else self.start(torch.device("cuda"))
        self._spans.append((started, end))

    def durations(self) -> list[float]:
        """Seconds of every forward timed so far, in order (synchronises a GPU once, here)."""
        if self._spans:
            if not isinstance(self._spans[0][0], float):
                torch.cuda.synchronize()
            for start, end in self._spans:
                self._seconds.append(_elapsed(start, end))
                if self._last_end is not None:
                    self._gaps.append(_elapsed(self._last_end, start))
                self._last_end = end
            self._spans = []
        return list(self._seconds)

    def gaps(self) -> list[float]:
        """Seconds between consecutive forwards (the end of one to the start of the next): the work of the loop
        around them, without what ran before the first forward or after the last."""
        self.durations()
        return list(self._gaps)

    def total(self) -> float:
        """Seconds inside forwards so far."""
        return sum(self.durations())

    @contextlib.contextmanager
    def hooked(self, module: torch.nn.Module) -> Iterator["ForwardTimer"]:
        """Time every call of ``module`` inside the block made by this thread (forward pre/post hooks, removed on
        exit): a call from another thread on the same model is that thread's."""
        stack: list = []
        owner = threading.get_ident()

        def before(mod, args):
            if threading.get_ident() == owner:
                parameter = next(mod.parameters(), None)
                stack.append(self.start(parameter.device if parameter is not None else torch.device("cpu")))

        def after(mod, args, output):
            if threading.get_ident() == owner:
                self.stop(stack.pop())

        handles = [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


def _elapsed(start, end) -> float:
    """Seconds from ``start`` to ``end``: two ``perf_counter`` floats, or two recorded CUDA events."""
    return end - start if isinstance(start, float) else start.elapsed_time(end) / 1000
