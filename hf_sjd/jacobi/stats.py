"""The counters of a Jacobi ``generate`` call, its per-token commit map, and :func:`pooled_rates`: the one
definition of the rates every report derives from summed counts."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from .state import CommitLog, Ending


def pooled_rates(num_new_tokens: int, num_images: int, num_forward_passes: int, num_calls: int = 1,
                 num_accepted: int | None = None, num_recovered: int | None = None) -> dict[str, float | None]:
    """Step compression and acceptance of one or more ``generate`` calls, from their summed counts::

        step_compression = (num_new_tokens / num_images) / (num_forward_passes / num_calls)
        acceptance_rate  = num_accepted / (num_accepted + num_recovered)   (None: nothing verified or counted)

    >>> pooled_rates(num_new_tokens=512, num_images=2, num_forward_passes=64, num_accepted=30, num_recovered=10)
    {'step_compression': 4.0, 'acceptance_rate': 0.75}
    """
    per_call = num_forward_passes / num_calls if num_calls else 0
    verified = (num_accepted or 0) + (num_recovered or 0)
    return {"step_compression": num_new_tokens / num_images / per_call if num_images and per_call else 0.0,
            "acceptance_rate": num_accepted / verified if num_accepted is not None and verified else None}


class TokenKind(enum.IntEnum):
    """How a generated token was won (:attr:`CommitMap.kind`)."""

    ACCEPTED = 0  # a draft that passed verification on its own (token by token, or in block verification's prefix)
    RECOVERED = 1  # resampled at the first rejected draft of its window
    BONUS = 2  # drawn after a fully accepted window, or after an accepted sibling
    SIBLING = 3  # a sibling of the first draft, accepted where that draft was rejected (jacobi_siblings)
    PHRASE = 4  # a draft accepted jointly with the rest of its library phrase (phrase verification)


def _empty_map() -> torch.Tensor:
    return torch.full((0, 0), -1, dtype=torch.long)


def _no_counts() -> torch.Tensor:
    return torch.zeros(0, dtype=torch.long)


@dataclass
class CommitMap:
    """Where and how every generated token was committed (``out.stats.commit_map``, drawn by :mod:`hf_sjd.viz`);
    column ``t`` is the row's ``t``-th generated token, ``-1`` past the row's end::

        forward      [batch, new tokens]  the forward that committed the token (0: the prefill forward)
        kind         [batch, new tokens]  how it was won: an index into KINDS (a TokenKind)
        slot         [batch, new tokens]  its slot in that forward's window (a recovered token at the rejected
                                          draft's, a bonus token after the last draft)
        sibling      [batch, new tokens]  kind sibling: which of the forward's siblings (0-based); else -1
        phrase       [batch, new tokens]  kind phrase: the library phrase id of its run; else -1
        phrase_runs  [runs, 4]            per jointly accepted run: (batch row, first token, tokens committed,
                                          phrase id), by row, then first token

    Counts by kind equal :class:`JacobiStats`' counters (accepted + sibling + phrase = ``num_accepted``).
    """

    KINDS: ClassVar[tuple[str, ...]] = tuple(kind.name.lower() for kind in TokenKind)

    forward: torch.Tensor = field(default_factory=_empty_map)
    kind: torch.Tensor = field(default_factory=_empty_map)
    slot: torch.Tensor = field(default_factory=_empty_map)
    sibling: torch.Tensor = field(default_factory=_empty_map)
    phrase: torch.Tensor = field(default_factory=_empty_map)
    phrase_runs: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 4, dtype=torch.long))

    @classmethod
    def from_log(cls, log: CommitLog) -> "CommitMap":
        """The map of a finished call: every logged (forward, row) commit expanded into its tokens, in order."""
        count, num_accepted, ending, row = log.columns()  # [n, B'] each
        forward, position = (count >= 0).nonzero(as_tuple=True)  # [E] the logged commits, forward by forward
        if not len(forward):
            return cls()
        count, num_accepted, ending, row = (column[forward, position] for column in (count, num_accepted, ending, row))
        batch, num_forwards = int(row.max()) + 1, log.iterations
        per_forward = torch.zeros(batch, num_forwards, dtype=torch.long, device=count.device)
        per_forward[row, forward] = count  # [B, n]
        first_token = (per_forward.cumsum(1) - per_forward)[row, forward]  # [E] where each commit starts in its row
        # one entry per committed token: its commit, and its slot in that commit
        commit = torch.repeat_interleave(torch.arange(len(count), device=count.device), count)  # [T]
        slot = torch.arange(len(commit), device=count.device) - (count.cumsum(0) - count)[commit]
        accepted, ending = slot < num_accepted[commit], ending[commit]
        kind = torch.where(accepted, TokenKind.ACCEPTED,
                           torch.where(ending == Ending.RECOVERED, TokenKind.RECOVERED, TokenKind.BONUS))
        is_sibling = accepted & (slot == 0) & (ending >= Ending.SIBLING)
        kind = torch.where(is_sibling, TokenKind.SIBLING, kind)
        sibling = torch.where(is_sibling, ending - Ending.SIBLING, -1)
        phrase = torch.full_like(slot, -1)
        walk, joint = log.runs()  # [n, B', widest window] each
        run_starts = torch.zeros(0, dtype=torch.long, device=count.device)
        if walk.shape[-1]:
            windows = torch.tensor(log.windows, dtype=torch.long, device=count.device)[forward]  # [E]
            runs = _accepted_runs(walk[forward, position], joint[forward, position], windows)  # [E, widest]
            widest = runs.shape[-1]
            value = runs[commit, slot.clamp(max=widest - 1)]  # [T]
            in_run = accepted & (slot < widest) & (value != -1)
            kind = torch.where(in_run, TokenKind.PHRASE, kind)
            starts = in_run & (value >= 0)
            # a continued run's id is its first token's (runs never cross commits, and follow their first token)
            token = torch.arange(len(slot), device=slot.device)
            last_start = torch.where(starts, token, -1).cummax(0).values
            phrase = torch.where(in_run, value[last_start.clamp_min(0)], -1)
            run_starts = starts.nonzero().squeeze(-1)
            run_length = torch.bincount(last_start[in_run], minlength=len(slot))[run_starts]
        target_row, target_column = row[commit], first_token[commit] + slot
        width = int(per_forward.sum(1).max())

        def dense(values: torch.Tensor, dtype=torch.long) -> torch.Tensor:
            out = torch.full((batch, width), -1, dtype=dtype, device=values.device)
            out[target_row, target_column] = values.to(dtype)
            return out.cpu()

        phrase_runs = torch.zeros(0, 4, dtype=torch.long)
        if len(run_starts):
            phrase_runs = torch.stack([target_row[run_starts], target_column[run_starts], run_length,
                                       phrase[run_starts]], dim=1)
            phrase_runs = phrase_runs[(phrase_runs[:, 0] * width + phrase_runs[:, 1]).argsort()]  # by row, then token
        return cls(forward=dense(forward[commit]), kind=dense(kind, torch.int8), slot=dense(slot),
                   sibling=dense(sibling), phrase=dense(phrase), phrase_runs=phrase_runs.cpu())

    def counts(self) -> dict[str, int]:
        """Tokens by kind, over the batch (``{"accepted": ..., "recovered": ..., ...}``)."""
        kinds = torch.bincount(self.kind[self.kind >= 0].long(), minlength=len(self.KINDS))
        return dict(zip(self.KINDS, kinds.tolist()))


_RUN_CONTINUES = -2  # _accepted_runs: a slot inside an accepted run, after its first


def _accepted_runs(walk: torch.Tensor, phrase: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
    """The runs a phrase-verification walk accepted jointly (logged as in :class:`CommitLog`): ``walk``, ``phrase``
    [E, W], ``windows`` [E] -> [E, W]: the phrase id at an accepted run's first slot, -2 on its other slots, -1
    elsewhere. A run is accepted iff its test passed and the walk from slot 0 visits it (by pointer jumping)."""
    num, widest = walk.shape
    slots = torch.arange(widest, device=walk.device)
    moves = (slots < windows[:, None]) & (walk >= 0) & (walk < windows[:, None])
    jump = torch.nn.functional.pad(torch.where(moves, walk, widest), (0, 1), value=widest)  # [E, W+1]; W: stopped
    visited = torch.zeros(num, 1, dtype=torch.long, device=walk.device)  # [E, 2^k] the states after 0 .. 2^k - 1 steps
    for _ in range(max(1, math.ceil(math.log2(widest + 1)))):
        visited = torch.cat([visited, jump.gather(1, visited)], dim=1)
        jump = jump.gather(1, jump)
    on_walk = torch.zeros_like(jump, dtype=torch.bool).scatter_(1, visited, True)[:, :widest]  # [E, W]
    first = on_walk & (phrase >= 0)
    # +1 at a run's first slot, -1 after its last (the state the walk moves to): slots with a positive prefix sum
    # lie in an accepted run (the walk jumps over each, so they never overlap)
    edges = torch.nn.functional.pad(first.long(), (0, 1))  # [E, W+1]
    edges.scatter_add_(1, torch.where(first, walk, widest), -first.long())
    inside = edges.cumsum(1)[:, :widest] > 0
    return torch.where(first, phrase, torch.where(inside, _RUN_CONTINUES, -1))


@dataclass
class JacobiStats:
    """Counters of one ``generate`` call (``out.stats``); histograms are indexed by their count."""

    num_forward_passes: int = 0
    num_new_tokens: torch.Tensor = field(default_factory=_no_counts)  # [batch]
    row_forward_passes: torch.Tensor = field(default_factory=_no_counts)  # [batch] forwards until the row finished
    tokens_per_forward: torch.Tensor = field(default_factory=_no_counts)  # (row, forward) pairs by tokens committed
    forward_windows: torch.Tensor = field(default_factory=_no_counts)  # forwards by drafts per row (prefill included)
    num_accepted: int = 0  # drafts that passed verification and were committed
    num_recovered: int = 0  # tokens resampled at a rejected position
    num_bonus: int = 0  # tokens drawn after a fully accepted window (or after an accepted sibling)
    num_siblings_accepted: int = 0  # of the accepted drafts, siblings of a rejected first draft (jacobi_siblings)
    jacobi_window: int = 0  # the full batch's window this call ran with ("auto" resolved; capped by max_new_tokens)
    jacobi_siblings: int = 0  # the full batch's siblings of the first draft ("auto" resolved)
    window_plan: tuple[tuple[int, int], ...] | None = None  # (window, siblings) for 1, 2, ... rows left
    cells: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # -> (tokens, (row, forward) pairs)
    cost_source: str | None = None  # what "auto" priced the cells with: a measured or pinned profile, the roofline
    seconds: float = 0.0  # wall time of the decoding loop
    model_seconds: float = 0.0  # of which inside model forwards
    commit_map: CommitMap = field(default_factory=CommitMap)

    @classmethod
    def from_log(cls, log: CommitLog, **fields) -> "JacobiStats":
        """The counters and :class:`CommitMap` of a finished call, from its log (device reads at the end only)."""
        count, num_accepted, ending, _ = log.columns()  # [n, B] each, -1 where a row had finished
        extra_token = count > num_accepted  # a recovered or bonus token ends the commit
        accepted = torch.minimum(num_accepted, count).clamp_min(0)
        recovered = extra_token & (ending == Ending.RECOVERED)
        widest = max((window for window, _ in log.cells), default=0)
        tokens, pairs = torch.stack([count.clamp_min(0).sum(1), (count >= 0).sum(1)]).tolist()  # per forward
        cells: dict[tuple[int, int], tuple[int, int]] = {}
        for cell, cell_tokens, cell_pairs in zip(log.cells, tokens, pairs):
            before = cells.get(cell, (0, 0))
            cells[cell] = (before[0] + cell_tokens, before[1] + cell_pairs)
        per_forward = count.flatten()
        histogram = torch.zeros(widest + 2, dtype=torch.long, device=count.device)
        histogram.scatter_add_(0, per_forward.clamp_min(0), (per_forward >= 0).long())
        totals = torch.stack([accepted.sum(), recovered.sum(), (extra_token & ~recovered).sum(),
                              (ending >= Ending.SIBLING).sum()]).tolist()
        return cls(num_accepted=totals[0], num_recovered=totals[1], num_bonus=totals[2],
                   num_siblings_accepted=totals[3], tokens_per_forward=histogram.cpu(),
                   forward_windows=torch.bincount(torch.tensor(log.windows, dtype=torch.long), minlength=widest + 1),
                   cells=cells, commit_map=CommitMap.from_log(log), **fields)

    @property
    def step_compression(self) -> float:
        """Mean new tokens per row divided by the number of forwards: vanilla AR's is 1.0 where every row runs to the
        end, less where rows end apart (the batch's forwards are its longest row's)."""
        return pooled_rates(int(self.num_new_tokens.sum()), self.num_new_tokens.numel(),
                            self.num_forward_passes)["step_compression"]

    @property
    def row_step_compression(self) -> torch.Tensor:
        """[batch] each row's new tokens / the forwards it took: per-image compression inside a batch."""
        return self.num_new_tokens.float() / self.row_forward_passes.clamp_min(1).float()

    @property
    def drafts_per_forward(self) -> float:
        """Mean drafts per row per forward (``jacobi_window`` with a fixed window, less near ``max_new_tokens``)."""
        total = int(self.forward_windows.sum())
        return float((self.forward_windows * torch.arange(len(self.forward_windows))).sum()) / total if total else 0.0

    @property
    def acceptance_rate(self) -> float:
        """accepted / (accepted + recovered): of the drafts up to each iteration's first rejection, those that passed
        (a sibling accepted in place of a rejected first draft counts as passed, that draft not at all)."""
        return pooled_rates(0, 0, 0, num_accepted=self.num_accepted,
                            num_recovered=self.num_recovered)["acceptance_rate"] or 0.0

    @property
    def loop_overhead(self) -> float:
        """Fraction of wall time spent outside model forwards."""
        return (self.seconds - self.model_seconds) / self.seconds if self.seconds else 0.0
