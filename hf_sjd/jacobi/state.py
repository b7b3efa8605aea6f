"""Per-call state of the Jacobi loop, kept on the device: the token buffer (:class:`DecodeState`), the one
host read per iteration (:class:`ReadBack`), the run's statistics (:class:`Counters`) and the forward timer
(:class:`ForwardTimer`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass
class DecodeState:
    """The per-call state. Invariant: row ``r`` of ``tokens`` holds the prompt as given in ``[0, P)`` and its
    committed tokens in ``[P, P + num_new[r])``, padding after; ``rows`` are the batch indices still decoding.
    ``tokens`` grows with what is committed (``max_new`` is only a bound, possibly a huge one for text)."""

    tokens: torch.Tensor  # [B, capacity]
    prompt_length: int
    max_new: int
    pad_id: int
    num_new: torch.Tensor  # [B] committed tokens per row
    rows: torch.Tensor  # [b] active rows
    row_forwards: torch.Tensor  # [B] forwards each row took until it finished
    committed_bound: int = 0  # host-side upper bound on any row's num_new (no device read)

    @classmethod
    def start(cls, prompt: torch.Tensor, max_new: int, pad_id: int) -> "DecodeState":
        batch, prompt_length = prompt.shape
        tokens = torch.nn.functional.pad(prompt, (0, min(max_new, 1024)), value=pad_id)
        zeros = torch.zeros(batch, dtype=torch.long, device=prompt.device)
        return cls(tokens, prompt_length, max_new, pad_id, zeros, torch.arange(batch, device=prompt.device),
                   zeros.clone())

    def lengths(self) -> torch.Tensor:
        """[b] prompt + committed tokens of every active row (its prefix in ``tokens``)."""
        return self.prompt_length + self.num_new[self.rows]

    def positions(self, width: int) -> torch.Tensor:
        """[b, width] generated-token index of the next ``width`` positions of every active row."""
        return self.num_new[self.rows, None] + torch.arange(width, device=self.num_new.device)

    def last_tokens(self) -> torch.Tensor:
        """[b, 1] each active row's last committed token (the next forward's uncached input)."""
        return self.tokens[self.rows, self.lengths() - 1][:, None]

    def write(self, block: torch.Tensor, count: torch.Tensor) -> None:
        """Append the first ``count`` [b] tokens of ``block`` [b, w] to the active rows (the rest: padding)."""
        width = block.shape[1]
        needed, capacity = self.prompt_length + self.committed_bound + width, self.tokens.shape[1]
        if needed > capacity:  # grow by doubling: columns up to needed - 1 are written below
            grown = max(needed, min(2 * capacity, self.prompt_length + self.max_new + width))
            self.tokens = torch.nn.functional.pad(self.tokens, (0, grown - capacity), value=self.pad_id)
        self.committed_bound = min(self.max_new, self.committed_bound + width)
        offset = torch.arange(width, device=block.device)
        columns = self.lengths()[:, None] + offset  # [b, w]
        values = torch.where(offset < count[:, None], block, self.pad_id)
        self.tokens.index_put_((self.rows[:, None], columns), values)
        self.num_new.index_add_(0, self.rows, count)


class ReadBack(NamedTuple):
    """What the host needs from the device after a commit, read in one transfer."""

    any_finished: bool
    max_remaining: int  # over unfinished rows: tokens still to generate
    cache_aligned: bool  # every cache row's valid prefix ends where the forward appended
    max_valid: int  # cache slots in use after the commit, over all rows
    max_valid_unfinished: int  # ... over the rows that go on


class Counters:
    """The run's statistics, accumulated on the device and read once at the end."""

    def __init__(self, window: int, device: torch.device) -> None:
        self.per_kind = torch.zeros(3, dtype=torch.long, device=device)  # accepted, recovered, bonus
        self.tokens_per_forward = torch.zeros(window + 2, dtype=torch.long, device=device)

    def add(self, count: torch.Tensor, num_accepted: torch.Tensor, all_accepted: torch.Tensor) -> None:
        extra_token = count > num_accepted
        self.per_kind += torch.stack([torch.minimum(num_accepted, count).sum(),
                                      (extra_token & ~all_accepted).sum(), (extra_token & all_accepted).sum()])
        self.tokens_per_forward.scatter_add_(0, count, torch.ones_like(count))


class ForwardTimer:
    """Time inside model forwards: CUDA events on a GPU (read once, at the end: timing never waits for the
    device mid-run), the wall clock elsewhere."""

    def __init__(self) -> None:
        self.seconds, self.events = 0.0, []

    def start(self, device: torch.device):
        if device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started) -> None:
        if isinstance(started, float):
            self.seconds += time.perf_counter() - started
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.events.append((started, end))

    def total(self) -> float:
        if self.events:
            torch.cuda.synchronize()
            self.seconds += sum(start.elapsed_time(end) for start, end in self.events) / 1000
            self.events = []
        return self.seconds
