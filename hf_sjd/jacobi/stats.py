"""The counters of a Jacobi ``generate`` call, and the one definition of the rates derived from counts.

Every report (``out.stats``, ``hf-sjd generate``, ``hf-sjd bench``) computes step compression and
acceptance with :func:`pooled_rates`, from summed counts: never a mean of per-batch rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .state import CommitLog, Ending


def pooled_rates(num_new_tokens: int, num_images: int, num_forward_passes: int, num_calls: int = 1,
                 num_accepted: int | None = None, num_recovered: int | None = None) -> dict[str, float | None]:
    """Step compression and acceptance of one or more ``generate`` calls, from their summed counts.

    * ``step_compression = (num_new_tokens / num_images) / (num_forward_passes / num_calls)``: new tokens per
      image over forwards per call -- a batch's forwards count once for all its rows (vanilla AR: 1.0);
    * ``acceptance_rate = num_accepted / (num_accepted + num_recovered)``: accepted drafts over verified
      drafts, pooled (not a mean of per-call rates); ``None`` when nothing was verified or not counted.

    >>> pooled_rates(num_new_tokens=512, num_images=2, num_forward_passes=64, num_accepted=30, num_recovered=10)
    {'step_compression': 4.0, 'acceptance_rate': 0.75}
    """
    per_call = num_forward_passes / num_calls if num_calls else 0
    verified = (num_accepted or 0) + (num_recovered or 0)
    return {"step_compression": num_new_tokens / num_images / per_call if num_images and per_call else 0.0,
            "acceptance_rate": num_accepted / verified if num_accepted is not None and verified else None}


@dataclass
class JacobiStats:
    """Counters of one ``generate`` call (``out.stats``). ``num_forward_passes`` counts every forward, prefill
    included; per-row tensors are ``[batch]``, histograms are indexed by their count."""

    num_forward_passes: int = 0
    num_new_tokens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))  # [batch]
    # [batch] forwards each row took until it finished (rows leave the batch as they finish)
    row_forward_passes: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    # [max window + 2] (row, forward) pairs by the tokens the row committed in that forward
    tokens_per_forward: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    # [max window + 1] forwards by drafts per row (the window width L; prefill included)
    forward_windows: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    num_accepted: int = 0  # drafts that passed verification and were committed
    num_recovered: int = 0  # tokens resampled at a rejected position
    num_bonus: int = 0  # tokens drawn after a fully accepted window (or after an accepted sibling)
    num_siblings_accepted: int = 0  # of the accepted drafts, siblings of a rejected first draft (jacobi_siblings)
    jacobi_window: int = 0  # the full batch's window this call ran with ("auto" resolved; capped by max_new_tokens)
    jacobi_siblings: int = 0  # the full batch's siblings of the first draft ("auto" resolved)
    # (window, siblings) for 1, 2, ... rows left (the last: the full batch's): what "auto" picked as rows finish
    window_plan: tuple[tuple[int, int], ...] | None = None
    # (window, siblings) -> (tokens committed, (row, forward) pairs) at that cell: what each cell bought
    cells: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    cost_source: str | None = None  # what "auto" priced the cells with: a measured or pinned profile, the roofline
    seconds: float = 0.0  # wall time of the decoding loop
    model_seconds: float = 0.0  # of which inside model forwards

    @classmethod
    def from_log(cls, log: CommitLog, **fields) -> "JacobiStats":
        """The counters of a finished call from its :class:`~hf_sjd.jacobi.state.CommitLog` (one device read)."""
        count, num_accepted, ending = log.columns()  # [n, B] each, -1 where a row had finished
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
                              (ending == Ending.SIBLING).sum()]).tolist()
        return cls(num_accepted=totals[0], num_recovered=totals[1], num_bonus=totals[2],
                   num_siblings_accepted=totals[3], tokens_per_forward=histogram.cpu(),
                   forward_windows=torch.bincount(torch.tensor([w for w, _ in log.cells], dtype=torch.long),
                                                  minlength=widest + 1), cells=cells, **fields)

    @property
    def step_compression(self) -> float:
        """Mean new tokens per row divided by the number of forwards (vanilla AR: 1.0)."""
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
        """Fraction of verified drafts that passed (each iteration verifies up to its first rejection)."""
        return pooled_rates(0, 0, 0, num_accepted=self.num_accepted,
                            num_recovered=self.num_recovered)["acceptance_rate"] or 0.0

    @property
    def loop_overhead(self) -> float:
        """Fraction of wall time spent outside model forwards."""
        return (self.seconds - self.model_seconds) / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        plain = {name: value.tolist() if isinstance(value, torch.Tensor) else value
                 for name, value in vars(self).items()}
        plain["window_plan"] = None if self.window_plan is None else [list(cell) for cell in self.window_plan]
        plain["cells"] = [[*cell, *totals] for cell, totals in self.cells.items()]
        return {**plain, "step_compression": self.step_compression, "acceptance_rate": self.acceptance_rate,
                "drafts_per_forward": self.drafts_per_forward, "loop_overhead": self.loop_overhead}
