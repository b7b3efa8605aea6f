"""How many drafts each iteration verifies: the window rule (``jacobi_window_rule``).

    name        shape  meaning
    L           -      ``jacobi_window``: the drafts the first forward verifies (every forward's with ``"fixed"``)
    L_max       -      the most drafts a forward verifies: ``L``; the budget rule's ``jacobi_window_max``
    L_min       -      the fewest: ``L``; the adaptive rule's ``jacobi_window_min``
    B           -      rows the ``generate`` call started with; ``active``: rows still decoding
    count       [b]    tokens a row committed this iteration (accepted drafts + the recovered/bonus token)
    estimate    [b]    per row, an exponential moving average of ``count`` (rate ``jacobi_window_ema``)
    wanted      [b]    per row, ``clamp(ceil(scale * estimate) + margin, L_min, L_max)``
    window      -      the next iteration's width: max of ``wanted`` over the rows that go on (one forward width
                       for the batch), then shrunk near ``max_new_tokens`` by the loop

Every rule starts at ``L``, so a batch of one row runs ``L`` whatever the rule, and switching a rule on never
changes what an explicit ``jacobi_window`` means for the first forward.
``"fixed"`` verifies ``L`` drafts every iteration (the loop's behaviour before this module, bit for bit).
``"adaptive"`` (``L_max = L``) sizes the window from what each row committed in the past iterations: a row that
keeps accepting long runs asks for a wide window, one that commits a token or two per forward asks for a narrow
one, down to ``L_min``. ``"budget"`` (``L_min = L``) keeps the forward's size: the full batch verifies ``L`` drafts
per row, and as rows finish the rows left share the full batch's ``B * (L + 1)`` input tokens, ``clamp(B * (L + 1)
// active - 1, L, L_max)`` drafts each. A batch runs until its slowest row is done; where a forward costs about
the same for 8 x 17 as for 2 x 65 tokens (a large model's memory-bound forward), the stragglers get the wider
window for free. With ``jacobi_budget_siblings = M`` the tokens a capped window leaves unused go to siblings of the
first draft, ``clamp(B * (L + 1) // active - 1 - width, m, max(m, M))`` of them (m = ``jacobi_siblings``, what
every forward carries): past window 32 widening pays little (4.76 -> 4.84 tokens per forward for 32 more drafts
on the reference model), siblings more (5.07 with 7 at window 32, 5.22 with 15 at window 64;
``docs/results/frontier_auto``). ``"auto"`` (the ``mc-sjd`` preset's) asks the forward cost model instead: each
forward takes the cell (L, m) of highest modelled speed-up for the rows still decoding
(:func:`hf_sjd.jacobi.cost_model.plan`, fixed before the first forward), at least as wide as the full batch's. A
forward of fewer rows has cheaper tokens, so the stragglers get wider windows and more siblings where the roofline
makes them free, and none where it does not; where no roofline applies (a CPU) it is the fixed rule.

Invariant (exactness): every rule reads only the past (the counts of iterations already committed; the rows
that already finished), so every window and sibling count is fixed before the draws it verifies; speculative
verification (and recursive rejection sampling of siblings) is exact for ANY window and count so chosen (the same
argument as the shrink near ``max_new_tokens``), hence the output distribution is unchanged.

Cost: the adaptive rule adds a few elementwise kernels per iteration on the device, and its ``wanted`` rides in
the loop's one summary read (:meth:`~hf_sjd.jacobi.loop.JacobiDecoder.commit_cache`); the budget rule is host
arithmetic on the number of rows left, and so is the auto rule (a table lookup). None adds a device read.
"""

from __future__ import annotations

import torch

WINDOW_RULES = ("fixed", "adaptive", "budget", "auto")
WIDENING_RULES = ("budget", "auto")  # the rules whose rows left widen, up to jacobi_window_max
DEFAULT_WINDOW_MIN = 4  # jacobi_window_min=None: the adaptive rule's fewest drafts (lowered to jacobi_window)
# jacobi_window_max=None: the budget rule's widest window for the rows left (raised to jacobi_window): past 32
# drafts widening paid little on the reference model (4.76 -> 4.84 tokens per forward at 64, frontier_auto)
DEFAULT_WINDOW_MAX = 32


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
        """Fold this iteration's ``count`` [b] into the estimates; returns ``wanted`` [b] long (read by the loop)."""
        self.estimate.lerp_(count.to(self.estimate.dtype), self.rate)
        wanted = torch.ceil(self.estimate * self.scale).long() + self.margin  # [b]
        return wanted.clamp_(self.lower, self.upper)

    def width(self, wanted: int | None, active: int) -> int:
        """The next width: the read max of ``wanted`` (``None`` before the first forward: ``L_max``)."""
        return self.upper if wanted is None else wanted

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep the estimates of the rows at indices ``keep`` (finished rows leave the batch)."""
        self.estimate = self.estimate[keep]

    def siblings(self, base: int, active: int, width: int) -> int:
        """Siblings per row in the next forward: ``jacobi_siblings`` (``base``), whatever the width."""
        return base


class BudgetWindow:
    """The full batch's forward size, ``B * (L_min + 1)`` input tokens, shared by the rows still decoding.

    >>> rule = BudgetWindow(upper=64, lower=16, batch=8)
    >>> [rule.width(None, active) for active in (8, 7, 3, 2, 1)]  # 136 tokens: 8 x 17, 7 x 19, 3 x 45, 2 x 65
    [16, 18, 44, 64, 64]
    >>> rule = BudgetWindow(upper=32, lower=16, batch=8, max_siblings=15)
    >>> [rule.siblings(0, active, rule.width(None, active)) for active in (8, 4, 3, 2, 1)]  # 3 x (33 + 12)
    [0, 1, 12, 15, 15]
    """

    def __init__(self, upper: int, lower: int, batch: int, max_siblings: int = 0) -> None:
        self.upper, self.lower, self.max_siblings = upper, min(lower, upper), max_siblings
        self.tokens = batch * (self.lower + 1)  # the full batch's input tokens: drafts + the uncached one, per row

    def update(self, count: torch.Tensor) -> None:
        """Nothing to fold in: the width follows the number of rows left, which the host knows."""
        return None

    def width(self, wanted: int | None, active: int) -> int:
        return max(self.lower, min(self.upper, self.tokens // max(active, 1) - 1))

    def select_rows(self, keep: torch.Tensor) -> None:
        return None

    def siblings(self, base: int, active: int, width: int) -> int:
        """Siblings per row in the next forward: the tokens left of each row's share once its window of ``width``
        drafts is fed, at least ``base`` (``jacobi_siblings``), at most ``max(base, max_siblings)``."""
        spare = self.tokens // max(active, 1) - 1 - width
        return max(base, min(self.max_siblings, spare))


class PlannedWindow:
    """The cost model's cell for the rows left: ``cells[active - 1]`` = (drafts, siblings) per row of a forward of
    ``active`` rows (:func:`hf_sjd.jacobi.cost_model.plan`).

    >>> rule = PlannedWindow(((32, 15), (32, 7), (16, 7)))
    >>> [(rule.width(None, active), rule.siblings(7, active, 0)) for active in (3, 2, 1)]
    [(16, 7), (32, 7), (32, 15)]
    """

    def __init__(self, cells: tuple[tuple[int, int], ...]) -> None:
        self.cells = cells

    def update(self, count: torch.Tensor) -> None:
        """Nothing to fold in: the cell follows the number of rows left, which the host knows."""
        return None

    def width(self, wanted: int | None, active: int) -> int:
        return self.cells[max(active, 1) - 1][0]

    def select_rows(self, keep: torch.Tensor) -> None:
        return None

    def siblings(self, base: int, active: int, width: int) -> int:
        return self.cells[max(active, 1) - 1][1]


def window_rule(config, batch: int, device: torch.device, plan: tuple[tuple[int, int], ...] | None = None
                ) -> AdaptiveWindow | BudgetWindow | PlannedWindow | None:
    """The rule ``config`` asks for: ``None`` for ``"fixed"`` (the loop then uses ``jacobi_window``); ``plan``:
    the auto rule's cells (:meth:`~hf_sjd.jacobi.config.SJDConfig.resolved`)."""
    if config.jacobi_window_rule == "fixed":
        return None
    if config.jacobi_window_rule == "auto":
        if plan is None:
            raise ValueError("jacobi_window_rule='auto' runs the cells SJDConfig.resolved plans for the model and "
                             "batch: resolve the config first (generate does)")
        return PlannedWindow(plan)
    if config.jacobi_window_rule == "budget":
        return BudgetWindow(config.window_max(), config.jacobi_window, batch, config.jacobi_budget_siblings)
    return AdaptiveWindow(config.jacobi_window, config.window_min(), config.jacobi_window_scale,
                          config.jacobi_window_margin, config.jacobi_window_ema, batch, device)
