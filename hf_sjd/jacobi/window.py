"""How many drafts each iteration verifies: the window rule (``jacobi_window_rule``).

    name        shape  meaning
    L_max       -      ``jacobi_window``: the most drafts a forward verifies (every rule's upper bound)
    L_min       -      ``jacobi_window_min``: the fewest the adaptive rule asks for
    count       [b]    tokens a row committed this iteration (accepted drafts + the recovered/bonus token)
    estimate    [b]    per row, an exponential moving average of ``count`` (rate ``jacobi_window_ema``)
    wanted      [b]    per row, ``clamp(ceil(scale * estimate) + margin, L_min, L_max)``
    window      -      the next iteration's width: max of ``wanted`` over the rows that go on (one forward width
                       for the batch), then shrunk near ``max_new_tokens`` by the loop

``"fixed"`` verifies ``L_max`` drafts every iteration (the loop's behaviour before this module, bit for bit).
``"adaptive"`` sizes the window from what each row committed in the past iterations: a row that keeps
accepting long runs asks for a wide window, one that commits a token or two per forward asks for a narrow one.

Invariant (exactness): the rule reads only the past, the counts of iterations already committed, so every window
is fixed before the draws it verifies; speculative verification is exact for ANY window so chosen (the same
argument as the shrink near ``max_new_tokens``), hence the output distribution is unchanged.

Cost: a few elementwise kernels per iteration on the device; ``wanted`` rides in the loop's one summary read
(:meth:`~hf_sjd.jacobi.loop.JacobiDecoder.commit_cache`), so the rule adds no device read.
"""

from __future__ import annotations

import torch

WINDOW_RULES = ("fixed", "adaptive")
DEFAULT_WINDOW_MIN = 4  # jacobi_window_min=None: this, or jacobi_window where that is smaller


class AdaptiveWindow:
    """Per-row running estimate of the tokens committed per iteration, and the window it asks for.

    The estimate starts at ``L_max`` (optimistic: the first windows are the widest, as with the fixed rule) and
    follows ``estimate <- (1 - rate) * estimate + rate * count`` after each commit.

    >>> rule = AdaptiveWindow(upper=16, lower=4, scale=2.0, margin=2, rate=0.5, batch=2, device=torch.device("cpu"))
    >>> rule.update(torch.tensor([16, 1]))  # estimates 16 and 8.5
    tensor([16, 16])
    >>> rule.update(torch.tensor([16, 1]))  # estimates 16 and 4.75
    tensor([16, 12])
    """

    def __init__(self, upper: int, lower: int, scale: float, margin: int, rate: float, batch: int,
                 device: torch.device) -> None:
        self.upper, self.lower, self.scale, self.margin, self.rate = upper, min(lower, upper), scale, margin, rate
        self.estimate = torch.full((batch,), float(upper), device=device)  # [b]

    def update(self, count: torch.Tensor) -> torch.Tensor:
        """Fold this iteration's ``count`` [b] into the estimates; returns ``wanted`` [b] long."""
        self.estimate.lerp_(count.to(self.estimate.dtype), self.rate)
        wanted = torch.ceil(self.estimate * self.scale).long() + self.margin  # [b]
        return wanted.clamp_(self.lower, self.upper)

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep the estimates of the rows at indices ``keep`` (finished rows leave the batch)."""
        self.estimate = self.estimate[keep]


def window_rule(config, batch: int, device: torch.device) -> AdaptiveWindow | None:
    """The rule ``config`` asks for: ``None`` for ``"fixed"`` (the loop then uses ``jacobi_window``)."""
    if config.jacobi_window_rule == "fixed":
        return None
    return AdaptiveWindow(config.jacobi_window, config.window_min(), config.jacobi_window_scale,
                          config.jacobi_window_margin, config.jacobi_window_ema, batch, device)
