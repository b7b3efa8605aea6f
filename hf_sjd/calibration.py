"""What ``jacobi_window="auto"`` picks its cells from: forward costs measured where the model runs, and step
compression learned from the calls that finished on it.

    quantity     meaning                                       source
    t(n)/t(1)    one forward of n new tokens per row, in       :meth:`CostProfile.measure` on the model's own device
                 vanilla decoding steps, per forward rows      and dtype, at the rows :func:`profile_for` names (read
                                                               linearly between them), wider counts only where a
                                                               pick would take them (:func:`widen`); cached per
                                                               model, savable and :func:`pin`-ned
    c(L, m)      step compression at window L, m siblings      :data:`REFERENCE_COMPRESSION` (batch 1) scaled by what
                                                               finished calls of the same batch size committed, and
                                                               moved towards each cell's own calls
                                                               (:class:`CompressionEstimate`)

Where timing is refused (``HF_SJD_CALIBRATE=0``, or torch's deterministic mode) the roofline prior applies on CUDA,
else none. Exactness: both are fixed before a call's first forward (the timing forwards read none of its tokens and
draw no random numbers; the estimate reads only finished calls), so every window is fixed in advance, as an
explicit one is; with a pinned profile and no estimate updates the tokens of a seeded call are reproducible.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache

from .adapters.support import input_device
from .checks import check_int
from .files import atomic_write_text
from .jacobi.cost_model import STEP_COMPRESSION
from .timing import ForwardTimer

# new tokens per row whose cost is measured; the cost between them is linear interpolation
TOKENS = (1, 2, 3, 5, 9, 17, 25, 33, 49, 65, 81)
PRIOR_FORWARDS = 64  # weight of the reference table in an estimate, in forwards of this model's calls
# untimed forwards after the prefix, before any is timed: the first several run slow while the allocator settles
# (timed cold, t(1) made every ratio too low: docs/results.md, the speed row), and a decoding loop runs for hundreds
# of forwards; later token counts settle within one forward
WARMUP_FORWARDS = 10
# the confidence that a count's cost is not below the one the pick reads (:func:`median_upper_bound`): with the five
# rounds a profile times, the 4th of 5; the next level up, 0.97, is their maximum, which one slow forward would set
BOUND_LEVEL = 0.8
# one-token forwards in a row, the last one read: forwards after a wider one run slower until its data leave the
# caches, two of them still on a CPU (docs/results/calibration_settle), and the loop priced against it,
# transformers' own, repeats one-token forwards
ONE_TOKEN_RUN = 3
# row counts timed below a call's own: every ROW_SPACING-fold from the fewest (:func:`profile_for`)
ROW_SPACING = 8
# the widest count timed before a pick asks for wider ones (:func:`widen`); the probes' forwards hold no more
TIMED_FIRST = 17
# the longest dummy prefix a profile is timed over (a call's middle length, up to this; a call that may end early
# passes only what it surely holds): a profile is timed once per model and read by every later call
MAX_CONTEXT = 2048

#: tokens per forward c(L, m) on the reference model (top-k 100, no CFG, batch 1) per strategy family: the mc-sjd
#: preset (docs/results/cells_mc_sjd, windows 8 and up: cost_model.STEP_COMPRESSION), and token-by-token
#: verification with independent redraft (docs/results/cells). (0, 0): plain decoding.
REFERENCE_COMPRESSION: dict[str, dict[tuple[int, int], float]] = {
    "mc-sjd": {(0, 0): 1.0, (1, 0): 1.50, (2, 0): 1.82, (3, 0): 2.10, (4, 0): 2.33, (6, 0): 2.69, (12, 0): 3.64,
               **STEP_COMPRESSION},
    "sjd": {(0, 0): 1.0, (1, 0): 1.31, (2, 0): 1.54, (3, 0): 1.73, (4, 0): 1.88, (6, 0): 2.09, (8, 0): 2.29,
            (12, 0): 2.45, (16, 0): 2.54, (32, 0): 2.73, (64, 0): 2.72},
}


def timing_allowed() -> bool:
    """Whether forwards may be timed to pick cells (timed picks differ from run to run)."""
    return os.environ.get("HF_SJD_CALIBRATE", "1") != "0" and not torch.are_deterministic_algorithms_enabled()


@dataclass
class CostProfile:
    """t(n)/t(1) of one model on one device and dtype, per forward rows (``ratios[rows][n]``)."""

    model: str  # the model's class and parameter count: a profile belongs to one model
    device: str
    dtype: str
    ratios: dict[int, dict[int, float]] = field(default_factory=dict)
    # timed loop (probe_key, or PLAIN: transformers' sampling loop) -> rows -> [seconds of one forward inside the
    # loop, seconds per iteration outside the forwards, and where plain decoding is handed off, seconds of a forward
    # of transformers' loop timed beside it], measured on a few iterations of each (hf_sjd.mixin)
    loops: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    source: str = "measured"  # or the file it was loaded from
    # rows -> the counts of TOKENS the model's positions allow that are not timed yet (priced from below until then:
    # :meth:`cost`), and each timed count's bound before the non-decreasing fit (redone as counts are added). Not
    # saved: a loaded or pinned profile extrapolates beyond its widest timed count
    untimed: dict[int, list[int]] = field(default_factory=dict, repr=False)
    bounds: dict[int, dict[int, float]] = field(default_factory=dict, repr=False)

    @classmethod
    def empty_for(cls, model: torch.nn.Module) -> "CostProfile":
        parameter = next(model.parameters())
        return cls(f"{type(model).__name__}:{sum(p.numel() for p in model.parameters())}", str(parameter.device),
                   str(parameter.dtype).removeprefix("torch."))

    def step_cost(self, loop: str, rows: int, cell: tuple[int, int], handed_off: bool) -> float:
        """One iteration of ``loop`` at ``cell`` = (L, m) in steps of transformers' own sampling, each loop's own work
        included: k (t(L+1+m) + the loop's work) / (t(1) + transformers' work), in one-token forwards. A loop timed at
        :data:`PROBE_CELLS` gives its work per iteration as a share of its own forward, priced by the profile's
        t(n)/t(1) of that forward (:meth:`work`); the work is linear in L and m between them. k: how much dearer the
        loop's forwards run than the profile's (:meth:`in_loop`). Plain decoding ``handed_off`` to transformers'
        loop costs one step. Without timed loops: the forward alone."""
        window, siblings = cell
        if cell == (0, 0) and handed_off:
            return 1.0
        forward = self.cost(rows, window + 1 + siblings)
        narrow, wide, tree = (self.work(probe_key(loop, probe), rows, sum(probe) + 1) for probe in PROBE_CELLS)
        if narrow is None:
            return forward
        work = narrow
        if wide is not None:
            work += (window - PROBE_CELLS[0][0]) * (wide - narrow) / (PROBE_CELLS[1][0] - PROBE_CELLS[0][0])
        if tree is not None:
            work += siblings * max(tree - narrow, 0.0) / PROBE_CELLS[2][1]
        return self.in_loop(loop, rows) * (forward + max(work, 0.0)) / (1 + (self.work(PLAIN, rows, 1) or 0.0))

    def in_loop(self, loop: str, rows: int) -> float:
        """k of :meth:`step_cost`: a probe's forward seconds over those of transformers' loop timed beside it (the
        mean of the runs right before and after; both inside their loops), over the profile's t(n)/t(1) of the
        probe's forward; the median over the probes, 1 where none was timed so. A forward inside a loop runs slower
        than one timed alone, by what the loop's own work leaves in the caches and the slots a batch's shorter rows
        keep: transformers' forward pays the first, the window's both. Read at the timed row count :meth:`timed`
        reads, against the profile's cost there."""
        ratios = []
        for probe in PROBE_CELLS:
            timed = self.timed(probe_key(loop, probe), rows)
            if timed is not None and len(timed[1]) > 2:  # priced at the rows it ran with
                timed_rows, (forward, _, plain) = timed
                ratios.append(forward / (plain * self.cost(timed_rows, sum(probe) + 1)))
        return statistics.median(ratios) if ratios else 1.0

    def work(self, name: str, rows: int, tokens: int) -> float | None:
        """A timed loop's work per iteration in one-token forwards (its forwards hold ``tokens`` per row), or None.
        A share of the loop's own forward, not seconds: the loops are timed one after another, and a forward bound by
        its host changes speed between them on a shared machine (docs/results/gpu/calibration), the loop's work with
        it."""
        timed = self.timed(name, rows)
        return None if timed is None else timed[1][1] / timed[1][0] * self.cost(rows, tokens)

    def timed(self, name: str, rows: int) -> tuple[int, list[float]] | None:
        """(the row count it ran with: the nearest at or above ``rows``, else the most, [forward seconds, work seconds,
        ...]) of a timed loop, None if untimed."""
        at = self.loops.get(name, {})
        if not at:
            return None
        timed_rows = _around(at, rows)[1]
        return timed_rows, at[timed_rows]

    def cost(self, rows: int, n: int) -> float:
        """t(n)/t(1) of a forward of ``rows`` rows: linear in n between the measured token counts (and beyond the
        last, unless wider counts are still :attr:`untimed`: then the widest timed one's, a lower bound), and in
        rows between the measured row counts (beyond them: the nearest)."""
        fewer, more = self.around(rows)
        low, high = self._at(fewer, n), self._at(more, n)
        return low if more == fewer else low + (high - low) * (rows - fewer) / (more - fewer)

    def around(self, rows: int) -> tuple[int, int]:
        """The measured row counts :meth:`cost` reads for ``rows`` rows (:func:`_around`)."""
        return _around(self.ratios, rows)

    def _at(self, rows: int, n: int) -> float:
        ratios = self.ratios[rows]
        widest = max(ratios)
        return ratios[widest] if n > widest and self.untimed.get(rows) else _linear(ratios, n)

    @torch.inference_mode()  # as the decoding loop runs its forwards (mixin.JacobiDecodingMethod)
    def measure(self, model: torch.nn.Module, adapter, rows: int, context: int, repeats: int = 5,
                widest: int | None = None) -> bool:
        """Time forwards of the :data:`TOKENS` counts up to ``widest`` (None: all) not timed yet at ``rows`` rows,
        over a dummy prefix of ``context`` tokens (at most :data:`MAX_CONTEXT`, and fewer where the model's
        positions end sooner: :meth:`position_limit`) through the adapter's window forward, in rounds of
        :data:`ONE_TOKEN_RUN` one-token forwards, then two of the count; store :func:`median_upper_bound` over
        ``repeats`` rounds of the second n-token forward's time over the last one-token forward's, made
        :func:`non_decreasing` with the counts timed before and at least 1 (after :data:`WARMUP_FORWARDS` one-token
        forwards and one untimed round: a count's first forward pays its kernels' first use). Whether any count was
        timed.

        Side by side, because a forward bound by its host runs at two speeds on a shared machine, switching every
        second or so (docs/results/gpu/calibration): a count timed in a run of its own reads the speed of its moment
        as well as its own cost. The last of each, because a forward right after one of another count runs slower
        on a CPU (longer after a wider one), and a decoding loop repeats one count. A bound, not the median itself:
        the pick takes the cell of highest estimated speed-up, so a count read low by chance is picked where it does
        not pay, and plain decoding, the cell a window must beat, is the one cost not read from timings."""
        device = input_device(model)
        limit = adapter.position_limit(model)
        counts = [n for n in TOKENS if limit is None or n < limit]
        context = min(context, MAX_CONTEXT) if limit is None else max(1, min(context, MAX_CONTEXT, limit - max(counts)))
        bounds = self.bounds.setdefault(rows, {})
        timing = [n for n in counts[1:] if n not in bounds and (widest is None or n <= widest)]
        if not timing:
            self.ratios.setdefault(rows, {1: 1.0})  # (a model whose positions hold one new token: none to time)
            return False
        ids = torch.zeros(rows, context + max(timing), dtype=torch.long, device=device)
        cache = DynamicCache(config=model.config)
        positions = torch.arange(context + max(timing), device=device).expand(rows, -1)
        adapter.window_logits(model, ids[:, :context], torch.ones_like(ids[:, :context]), positions[:, :context],
                              cache, num_logits=1)

        def forwards(*tokens: int) -> list[float]:  # seconds of one forward of each count, in turn
            timer = ForwardTimer()
            for n in tokens:
                mask = torch.ones(rows, context + n, dtype=torch.long, device=device)
                started = timer.start(device)
                adapter.window_logits(model, ids[:, context:context + n], mask, positions[:, context:context + n],
                                      cache, num_logits=n)
                timer.stop(started)
                cache.crop(-n)
            return timer.durations()

        forwards(*[1] * WARMUP_FORWARDS, *timing)
        pairs = {n: [] for n in timing}
        for _ in range(repeats):
            for n in pairs:
                *_, one, _, many = forwards(*[1] * ONE_TOKEN_RUN, n, n)
                pairs[n].append(many / one)
        bounds.update({n: median_upper_bound(measured) for n, measured in pairs.items()})
        timed = sorted(bounds)
        self.ratios[rows] = {1: 1.0, **{n: max(1.0, ratio)
                                        for n, ratio in zip(timed, non_decreasing([bounds[n] for n in timed]))}}
        self.untimed[rows] = [n for n in counts[1:] if n not in bounds]
        return True

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps({"model": self.model, "device": self.device, "dtype": self.dtype,
                                            "ratios": {str(r): {str(n): c for n, c in at.items()}
                                                       for r, at in self.ratios.items()},
                                            "loops": {loop: {str(r): t for r, t in at.items()}
                                                      for loop, at in self.loops.items()}}, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CostProfile":
        try:
            data = json.loads(Path(path).read_text())
            ratios = {int(r): {int(n): float(c) for n, c in at.items()} for r, at in data["ratios"].items()}
            loops = {str(loop): {int(r): [float(t) for t in pair] for r, pair in at.items()}
                     for loop, at in data.get("loops", {}).items()}
            profile = cls(str(data["model"]), str(data["device"]), str(data["dtype"]), ratios, loops,
                          source=str(path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{path} is not a cost profile written by CostProfile.save: {error}") from None
        if not ratios or any(not at or at.get(1) != 1.0 for at in ratios.values()):
            raise ValueError(f"{path} is not a cost profile: each row count needs t(n)/t(1) with t(1)/t(1) = 1")
        for at in ratios.values():  # as measure writes them: finite, at least 1, never less for more tokens
            costs = [at[n] for n in sorted(at)]
            if not all(math.isfinite(c) and c >= 1.0 for c in costs) or costs != sorted(costs):
                raise ValueError(f"{path} is not a cost profile written by CostProfile.save: its t(n)/t(1) must be "
                                 f"finite, >= 1 and non-decreasing in n, got {at}")
        for loop, at in loops.items():
            if any(len(times) < 2 or not all(math.isfinite(t) and t >= 0 for t in times) or times[0] <= 0
                   for times in at.values()):
                raise ValueError(f"{path} is not a cost profile written by CostProfile.save: loop {loop!r} needs "
                                 f"[forward seconds > 0, work seconds >= 0, ...] per row count")
        return profile


def median_upper_bound(values: list[float], level: float = BOUND_LEVEL) -> float:
    """The least order statistic x(k) of ``values`` that exceeds the median of their law with probability at least
    ``level``: P(x(k) > median) = P(Binomial(n, 1/2) <= k - 1) for n independent values, whatever their law (timings
    on a shared machine have a heavy right tail); the largest value where no x(k) reaches ``level``.

    >>> median_upper_bound([1.2, 1.0, 1.1, 1.5, 1.3])  # five values: the 4th, P = 26/32
    1.3
    """
    ordered, covered = sorted(values), 0.0
    for k, value in enumerate(ordered, start=1):
        covered += math.comb(len(ordered), k - 1) / 2 ** len(ordered)
        if covered >= level:
            return value
    return ordered[-1]


def non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of ``values`` (pool adjacent violators; a dozen lines rather than a
    dependency on scikit-learn's ``IsotonicRegression``). More tokens never cost less, so a dip is noise; so is a
    count read high, which this averages with its neighbours where a running maximum would carry it to every count
    after it.

    >>> non_decreasing([1.0, 1.3, 1.0, 1.1, 1.4])
    [1.0, 1.1333333333333333, 1.1333333333333333, 1.1333333333333333, 1.4]
    """
    blocks: list[tuple[float, int]] = []  # (mean, values pooled)
    for value in values:
        mean, size = value, 1
        while blocks and blocks[-1][0] > mean:
            before, pooled = blocks.pop()
            mean, size = (before * pooled + mean * size) / (pooled + size), pooled + size
        blocks.append((mean, size))
    return [mean for mean, size in blocks for _ in range(size)]


def _linear(ratios: Mapping[int, float], n: int) -> float:
    """``ratios`` {count: t(count)/t(1)} at ``n``: linear between the two counts around it, or the last two."""
    points = sorted(ratios.items())
    below = [p for p in points if p[0] <= n][-1:] or points[:1]
    above = [p for p in points if p[0] > n][:1] or points[-2:-1] or below
    (n0, c0), (n1, c1) = below[0], above[0]
    return c0 if n1 == n0 else c0 + (c1 - c0) * (n - n0) / (n1 - n0)


def _around(measured, rows: int) -> tuple[int, int]:
    """The measured row counts nearest ``rows`` at or below it (else the fewest) and at or above it (else the most)."""
    ordered = sorted(measured)
    return (max((r for r in ordered if r <= rows), default=ordered[0]),
            min((r for r in ordered if r >= rows), default=ordered[-1]))


_PROFILES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (CostProfile, pinned)


def pin(model: torch.nn.Module, profile: CostProfile | str | Path) -> CostProfile:
    """Use ``profile`` (or the file :meth:`CostProfile.save` wrote) for ``model`` from now on: no more timing, so
    seeded calls pick the same cells in every run. Refused for another model or device."""
    profile = profile if isinstance(profile, CostProfile) else CostProfile.load(profile)
    own = CostProfile.empty_for(model)
    if (profile.model, profile.device, profile.dtype) != (own.model, own.device, own.dtype):
        raise ValueError(f"the cost profile {profile.source} was measured for {profile.model} on {profile.device} "
                         f"{profile.dtype}, not for this {own.model} on {own.device} {own.dtype}")
    profile = dataclasses.replace(profile, untimed={})  # never timed now: wider counts extrapolate, as loaded
    _PROFILES[model] = (profile, True)
    return profile


def _pinned(model: torch.nn.Module) -> bool:
    return _PROFILES.get(model, (None, False))[1]


def forget(model: torch.nn.Module) -> None:
    """Drop ``model``'s cost profile, measured or pinned: its next ``"auto"`` call times its forwards again (after the
    machine's load changed, say)."""
    _PROFILES.pop(model, None)


PLAIN = "plain"  # the timed loops' key of transformers' own sampling loop
# where a loop is timed: (L, m) at 4 and 16 drafts (its work grows with the window) and with 3 siblings (each adds
# the tree mask, its scores, its verification), 32 new tokens each
PROBE_CELLS, PROBE_TOKENS = ((4, 0), (16, 0), (4, 3)), 32


def probe_key(loop: str, cell: tuple[int, int]) -> str:
    return f"{loop}@{cell[0]}+{cell[1]}"


def loop_key(config) -> str:
    """What an iteration's own work depends on: the components and the support's kind."""
    return (f"{config.verifier}/{config.draft_coupling}/{config.draft_init}/{config.draft_prior}/"
            f"{ {True: 'sparse', False: 'dense'}.get(config.jacobi_sparse, config.jacobi_sparse)}")


def time_loops(model: torch.nn.Module, profile: CostProfile, loop: str, rows: int, siblings: bool, handed_off: bool,
               probe) -> None:
    """Time, where not yet timed at ``rows`` forward rows (and the profile is not pinned), ``loop`` at the
    :data:`PROBE_CELLS` (those with siblings only where they may be picked), and where plain decoding is
    ``handed_off`` to transformers' sampling loop, that loop before the first probe and after each, the mean of the
    two beside a probe read as its plain forward (:meth:`CostProfile.in_loop`): ``probe(cell, plain)`` ->
    [forward seconds, work seconds]."""
    if _pinned(model):
        return
    cells = PROBE_CELLS if siblings else PROBE_CELLS[:2]
    untimed = [(probe_key(loop, cell), cell) for cell in cells
               if rows not in profile.loops.get(probe_key(loop, cell), {})]
    before = None
    if handed_off and (untimed or rows not in profile.loops.get(PLAIN, {})):
        plain = probe((0, 0), True)
        profile.loops.setdefault(PLAIN, {}).setdefault(rows, plain)
        before = plain[0]
    for name, cell in untimed:  # the loops as they run here: forwards inside them, and their own work
        measured = probe(cell, False)
        if before is not None:  # a host that changes speed between the loops moves the mean of the two beside it
            after = probe((0, 0), True)[0]
            measured.append((before + after) / 2)
            before = after
        profile.loops.setdefault(name, {})[rows] = measured


def profile_for(model: torch.nn.Module, adapter, rows: int, context: int, fewest: int = 1,
                widest: int | None = TIMED_FIRST, measure: bool = True) -> CostProfile | None:
    """The model's cost profile covering forwards of ``fewest`` .. ``rows`` rows (a batch's rows leave as they
    finish; ``fewest``: one image's, 2 with guidance), or None where timing is refused and nothing is pinned. Timed
    now where missing, at ``rows`` and at ``fewest`` x :data:`ROW_SPACING` ^ k below it; the row counts between are
    interpolated (:meth:`CostProfile.cost`): they price only the cells of a batch's last rows, and each row count
    timed is a large part of the first call's time. Token counts up to ``widest`` (None: all), the wider ones where a
    pick asks for them (:func:`widen`). ``measure=False``: only what is timed already (None where it is not)."""
    rows, context = check_int("rows", rows, minimum=1), check_int("context", context, minimum=1)
    fewest, widest = check_int("fewest", fewest, 1, rows), check_int("widest", widest, minimum=1, allow_none=True)
    profile, pinned = _PROFILES.get(model, (None, False))
    own = CostProfile.empty_for(model)
    if pinned:
        if (profile.device, profile.dtype) != (own.device, own.dtype):
            raise ValueError(f"the cost profile pinned from {profile.source} was measured on {profile.device} "
                             f"{profile.dtype}, and the model has moved to {own.device} {own.dtype} since: pin a "
                             f"profile of this setting, or calibration.forget(model) to time it again")
        return profile
    if not timing_allowed():
        return None
    if profile is None or (profile.model, profile.device, profile.dtype) != (own.model, own.device, own.dtype):
        profile = own  # first call, or the model moved to another device or dtype
    anchors, below = {rows}, fewest
    while below < rows:
        anchors.add(below)
        below *= ROW_SPACING
    missing = [count for count in sorted(anchors)
               if count not in profile.ratios or (widest is None and profile.untimed.get(count))]
    if missing and not measure:
        return None
    for count in missing:
        profile.measure(model, adapter, count, context, widest=widest)
    _PROFILES[model] = (profile, False)
    return profile


def widen(model: torch.nn.Module, adapter, profile: CostProfile, plan, fewest: int, context: int) -> bool:
    """Time wider counts where ``plan`` (``plan[a - 1]``: the cell at ``a`` x ``fewest`` rows) holds a cell priced
    from below (:meth:`CostProfile.cost`), at the row counts that price it; whether anything was timed, so the plan
    is to be picked again. A cell priced from below looks at least as fast as it is, so a plan that holds none is
    the plan that timing every count would give (up to the non-decreasing fit, which a wider count's timing may
    move), without timing the counts no cell pays at (on a CPU, the widest at a batch's rows: the first call's
    largest cost)."""
    if _pinned(model) or not timing_allowed():
        return False
    wanted: dict[int, int] = {}  # timed row count -> the count to time up to
    for images, cell in enumerate(plan, start=1):
        rows, tokens = images * fewest, sum(cell) + 1
        for timed_rows in set(profile.around(rows)):
            untimed = profile.untimed.get(timed_rows)
            if untimed and tokens > max(profile.ratios[timed_rows]):
                # priced at its own row count: up to its width; between two timed ones, the next count at each: a
                # first plan, priced from below, takes the widest cells wherever it may, and few row counts pay them
                widest = next((n for n in untimed if n >= tokens), untimed[-1]) if timed_rows == rows else untimed[0]
                wanted[timed_rows] = max(widest, wanted.get(timed_rows, 0))
    timed = False
    for rows, widest in sorted(wanted.items()):
        timed = profile.measure(model, adapter, rows, context, widest=widest) or timed
    return timed


class CompressionEstimate:
    """Step compression of each cell for one model, strategy family and batch size, from the reference table (batch 1)
    and the finished calls of that batch size (a batch runs until its slowest row is done, so only calls of the same
    size say how far below its rows' own compression it lands)::

        f        the model's compression against the reference: the forward-weighted mean of observed / reference
                 over the calls that drafted, from 1 with :data:`PRIOR_FORWARDS` pseudo-forwards
        c(cell)  max(1, f * reference(cell)) moved towards the cell's own calls (the same weight); plain decoding: 1

    One factor for every cell, so a cell that ran and cells that did not are compared on the same evidence: a
    model that compresses less than the reference scales them all, instead of making each untried cell look better
    than the one just measured."""

    def __init__(self, reference: Mapping[tuple[int, int], float]) -> None:
        self.reference = dict(reference)
        self.totals: dict[tuple[int, int], list[float]] = {}  # cell -> [new tokens per row, forwards]

    def factor(self) -> float:
        """f of the class docstring (1 before any call drafted)."""
        drafted = [(tokens, forwards, self.reference[cell]) for cell, (tokens, forwards) in self.totals.items()
                   if cell in self.reference and cell != (0, 0)]
        return ((PRIOR_FORWARDS + sum(tokens / reference for tokens, _, reference in drafted))
                / (PRIOR_FORWARDS + sum(forwards for _, forwards, _ in drafted)))

    def table(self) -> dict[tuple[int, int], float]:
        scale, out = self.factor(), {}
        for cell, reference in self.reference.items():
            prior = reference if cell == (0, 0) else max(1.0, scale * reference)
            tokens, forwards = self.totals.get(cell, (0, 0))
            out[cell] = (PRIOR_FORWARDS * prior + tokens) / (PRIOR_FORWARDS + forwards)
        return out

    def record(self, cell: tuple[int, int], tokens_per_row: float, forwards: int) -> None:
        """Fold in a finished call whose full batch ran ``cell``: its new tokens per row and its forwards."""
        total = self.totals.setdefault(cell, [0.0, 0])
        total[0] += tokens_per_row
        total[1] += forwards


_ESTIMATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(family, batch): estimate}


def estimate_for(model: torch.nn.Module, config, batch: int) -> CompressionEstimate:
    """The model's estimate for ``batch`` rows, from the reference table of ``config``'s strategy family."""
    family = "mc-sjd" if config.draft_coupling == "maximal" else "sjd"
    estimates = _ESTIMATES.setdefault(model, {})
    return estimates.setdefault((family, batch), CompressionEstimate(REFERENCE_COMPRESSION[family]))
