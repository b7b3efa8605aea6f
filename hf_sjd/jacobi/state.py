"""Per-call state of the Jacobi loop, on the device: the token buffer (:class:`DecodeState`), the one host read per
iteration (:class:`ReadBack`) and the record of each forward's commits (:class:`CommitLog`).

Each op is a kernel launch, so what an iteration reads is derived once per state change, not once per reader::

    quantity             shape    derived from                    dropped by
    committed()          [b]      num_new[rows]                   write, select_rows (and assigning rows)
    lengths()            [b]      prompt_length + committed()     the same
    remaining()          [b]      max_new - committed()           the same
    positions(width)     [b, w]   committed() + 0..w-1            (one op per call)
    CommitLog.log        [n, B, C]  (count, accepted, Ending, row[, runs]) per iteration and row; reduced at the end
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from .constants import offsets


@dataclass
class DecodeState:
    """Invariant: row ``r`` of ``tokens`` holds the prompt as given in ``[0, P)`` and its committed tokens in
    ``[P, P + num_new[r])``, padding after (grown as needed); ``rows`` are the batch indices still decoding."""

    tokens: torch.Tensor  # [B, capacity]
    prompt_length: int
    max_new: int
    pad_id: int
    num_new: torch.Tensor  # [B] committed tokens per row
    rows: torch.Tensor  # [b] active rows
    row_forwards: torch.Tensor  # [B] forwards each row took until it finished
    committed_bound: int = 0  # host-side upper bound on any row's num_new (no device read)
    _derived: dict = field(default_factory=dict, repr=False, compare=False)  # name -> tensor, until the next change
    _prompt_columns: torch.Tensor | None = field(default=None, repr=False, compare=False)  # [n] P..P+n-1, the same

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name in ("rows", "num_new", "max_new") and "_derived" in self.__dict__:  # drops the derived tensors
            self._derived.clear()

    @classmethod
    def start(cls, prompt: torch.Tensor, max_new: int, pad_id: int) -> "DecodeState":
        batch, prompt_length = prompt.shape
        tokens = torch.nn.functional.pad(prompt, (0, min(max_new, 1024)), value=pad_id)
        zeros = torch.zeros(batch, dtype=torch.long, device=prompt.device)
        return cls(tokens, prompt_length, max_new, pad_id, zeros, torch.arange(batch, device=prompt.device),
                   zeros.clone())

    def _cached(self, name: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        value = self._derived.get(name)
        if value is None:
            value = self._derived[name] = compute()
        return value

    def offsets(self, width: int) -> torch.Tensor:
        """[width] ``0 .. width - 1`` on the state's device (:func:`hf_sjd.jacobi.constants.offsets`)."""
        return offsets(width, self.num_new.device)

    def _columns(self, width: int) -> torch.Tensor:
        """[width] ``P .. P + width - 1``: the columns after the prompt (one device tensor, sliced)."""
        if self._prompt_columns is None or self._prompt_columns.numel() < width:
            self._prompt_columns = self.offsets(max(2 * width, 64)) + self.prompt_length
        return self._prompt_columns[:width]

    def committed(self) -> torch.Tensor:
        """[b] committed tokens of every active row."""
        return self._cached("committed", lambda: self.num_new[self.rows])

    def lengths(self) -> torch.Tensor:
        """[b] prompt + committed tokens of every active row (its prefix in ``tokens``)."""
        return self._cached("lengths", lambda: self.committed() + self.prompt_length)

    def remaining(self) -> torch.Tensor:
        """[b] tokens every active row may still commit (``max_new - committed``)."""
        return self._cached("remaining", lambda: self.max_new - self.committed())

    def positions(self, width: int) -> torch.Tensor:
        """[b, width] generated-token index of the next ``width`` positions of every active row."""
        return self.committed()[:, None] + self.offsets(width)

    def last_tokens(self) -> torch.Tensor:
        """[b, 1] each active row's last committed token (the next forward's uncached input)."""
        last_column = self._cached("last_column", lambda: self.committed() + (self.prompt_length - 1))
        return self.tokens[self.rows, last_column][:, None]

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only the active rows at indices ``keep`` [b'] of ``rows`` (finished rows leave)."""
        self.rows = self.rows[keep]

    def write(self, block: torch.Tensor, count: torch.Tensor) -> None:
        """Append the first ``count`` [b] tokens of ``block`` [b, w] to the active rows (the rest: padding)."""
        width = block.shape[1]
        needed, capacity = self.prompt_length + self.committed_bound + width, self.tokens.shape[1]
        if needed > capacity:  # grow by doubling: columns up to needed - 1 are written below
            grown = max(needed, min(2 * capacity, self.prompt_length + self.max_new + width))
            self.tokens = torch.nn.functional.pad(self.tokens, (0, grown - capacity), value=self.pad_id)
        self.committed_bound = min(self.max_new, self.committed_bound + width)
        columns = self.committed()[:, None] + self._columns(width)  # [b, w]: lengths + 0 .. w-1
        values = block.masked_fill(self.offsets(width) >= count[:, None], self.pad_id)
        self.tokens.index_put_((self.rows[:, None], columns), values)
        self.num_new.index_add_(0, self.rows, count)
        self._derived.clear()


class ReadBack(NamedTuple):
    """What the host reads from the device after a commit, in one transfer."""

    any_finished: bool
    max_remaining: int  # over unfinished rows: tokens still to generate
    lowest_valid: int  # the cache's fewest valid slots over its rows, before the commit
    max_valid: int  # cache slots in use after the commit, over all rows
    max_valid_unfinished: int  # ... over the rows that go on
    any_sibling: bool = False  # some row accepted a sibling of its first draft (jacobi_siblings)


class Ending(enum.IntEnum):
    """What the token after a row's accepted drafts was drawn from; the k-th sibling (0-based) logs ``SIBLING + k``."""

    RECOVERED = 0  # the residual at the first rejected draft of the window
    BONUS = 1  # p after the last draft: the whole window was accepted
    SIBLING = 2  # p after an accepted sibling of the first draft (jacobi_siblings)


class CommitLog:
    """What every row committed in every forward: one op per iteration into row ``i`` of a preallocated
    ``[iterations, B, columns]`` log (``-1``: no value), reduced at the end (``JacobiStats.from_log``). Columns::

        count         tokens the row committed in this forward
        accepted      drafts the verifier accepted (the commit may stop earlier: EOS, max_new_tokens)
        ending        an Ending; SIBLING + k where the k-th sibling of the first draft was accepted
        row           the row's index in the batch (rows leave as they finish, so positions shift)
        walk[0..L)    (phrase verification) the state the walk moves to from each window slot (>= L: it stops)
        phrase[0..L)  the library phrase id whose run from that slot passed the joint test, -1: none
    """

    COLUMNS = ("count", "accepted", "ending", "row")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.log: torch.Tensor | None = None  # [capacity, B, columns] long
        self.iterations = 0
        self.cells: list[tuple[int, int]] = []  # (drafts, siblings) per row of each forward

    @property
    def windows(self) -> list[int]:
        """Drafts per row of each forward."""
        return [window for window, _ in self.cells]

    def add(self, cell: tuple[int, int], count: torch.Tensor, num_accepted: torch.Tensor, ending: torch.Tensor,
            rows: torch.Tensor | None = None, runs: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """One forward of ``cell`` = (drafts, siblings): the columns above, [b] each (``ending`` may be a bool:
        BONUS else RECOVERED; ``rows`` None: the first b), ``runs = (walk, phrase)`` [b, window] or None."""
        window = cell[0]
        batch, width = count.shape[0], len(self.COLUMNS) + (0 if runs is None else 2 * window)
        if self.log is None:
            self.log = torch.full((256, batch, width), -1, dtype=torch.long, device=count.device)
        elif self.iterations == self.log.shape[0]:
            self.log = torch.cat([self.log, torch.full_like(self.log, -1)])
        if width > self.log.shape[2]:  # a wider window than any before (host ints: no device read)
            self.log = torch.nn.functional.pad(self.log, (0, width - self.log.shape[2]), value=-1)
        rows = torch.arange(batch, device=count.device) if rows is None else rows  # (the loop passes its rows)
        parts = [count[:, None], num_accepted[:, None], ending[:, None], rows[:, None]]
        torch.cat(parts if runs is None else [*parts, *runs], dim=1, out=self.log[self.iterations, :batch, :width])
        self.iterations += 1
        self.cells.append(cell)

    @classmethod
    def plain(cls, num_new: torch.Tensor) -> "CommitLog":
        """The log of plain decoding (every forward draws one bonus token per row) of rows ending after ``num_new``
        [B] tokens; a row's columns are -1 after its end, as the loop logs finished rows."""
        log, forwards = cls(num_new.device), int(num_new.max()) if len(num_new) else 0
        active = torch.arange(forwards, device=num_new.device)[:, None] < num_new[None]  # [n, B]
        rows = torch.arange(len(num_new), device=num_new.device).expand(forwards, -1)
        columns = (torch.ones_like(rows), torch.zeros_like(rows), torch.full_like(rows, Ending.BONUS), rows)
        log.log = torch.stack([column.masked_fill(~active, -1) for column in columns], dim=-1)
        log.iterations, log.cells = forwards, [(0, 0)] * forwards
        return log

    def cut(self, num_new: torch.Tensor) -> None:
        """Keep of each row's logged commits its first ``num_new`` [B] tokens (rows that decoded past where the
        batch ended: :meth:`hf_sjd.jacobi.stops.UserStops.apply`); a commit past them counts 0 tokens."""
        table = self.table()  # [n, B', columns], a view of the log
        count, row = table[..., 0], table[..., 3]
        logged = count >= 0
        step = torch.arange(self.iterations, device=count.device)[:, None].expand_as(count)[logged]
        per_row = torch.zeros(self.iterations, len(num_new), dtype=torch.long, device=count.device)
        per_row[step, row[logged]] = count[logged]  # [n, B]
        kept = (num_new.to(count.device) - (per_row.cumsum(0) - per_row)).clamp_min(0).minimum(per_row)
        count[logged] = kept[step, row[logged]]

    def columns(self) -> tuple[torch.Tensor, ...]:
        """(count, num_accepted, ending, row) [n, B] over the logged iterations, ``-1`` where no row was."""
        return tuple(self.table()[..., : len(self.COLUMNS)].unbind(-1))

    def runs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(walk, phrase) [n, B, widest window], -1 beyond each forward's window and where none was reported."""
        table = self.table()
        widest = (table.shape[-1] - len(self.COLUMNS)) // 2
        windows = torch.tensor(self.windows, dtype=torch.long, device=table.device)  # [n]
        slots = torch.arange(widest, device=table.device)
        inside = (slots < windows[:, None])[:, None, :]  # [n, 1, widest]
        walk = table[..., len(self.COLUMNS): len(self.COLUMNS) + widest]
        phrase_columns = (len(self.COLUMNS) + windows[:, None] + slots).clamp(max=table.shape[-1] - 1)  # [n, widest]
        phrase = table.gather(2, phrase_columns[:, None, :].expand(-1, table.shape[1], -1))
        return walk.masked_fill(~inside, -1), phrase.masked_fill(~inside, -1)

    def table(self) -> torch.Tensor:
        """[n, B, columns] the logged iterations."""
        if self.log is None:
            return torch.full((0, 0, len(self.COLUMNS)), -1, dtype=torch.long, device=self.device)
        return self.log[: self.iterations]
