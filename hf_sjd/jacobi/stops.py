"""The user's stopping criteria in a window loop, judged after every committed token as transformers' ``_sample``
judges them after every step.

A commit appends several tokens at once, so a criterion is called on each of its prefixes (``stopping_criteria``,
``stop_strings``, ``max_time``; EOS and ``max_new_tokens`` are the loop's own), on the rows of one prefix length at a
time: it must decide a row from its own tokens, not from its index in the batch. What a stopped row does next is
transformers'::

    stopping criteria       a stopped row                          the batch ends
    with an EOS criterion   ends at its stop (padding after)        when every row has ended
    without one             samples on: its tokens are real ones    when every row has stopped, each at the step
                                                                    the last one stopped (rows beyond it are cut)

So a row's tokens past its own stop are real only before where the batch ends, which is known when every row has
stopped: a token there whose law is undefined (the processors allow nothing) is refused then, where transformers would
have sampled it, and dropped with the cut where it would not.
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .processing import groups_by_length, no_law_error, window_prefixes


def pads_stopped(stopping_criteria) -> bool:
    """Whether transformers pads a stopped row (``_sample``'s ``has_eos_stopping_criteria``): a criterion with an EOS
    id; else a stopped row samples on until the batch ends."""
    return any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria)


class UserStops:
    def __init__(self, stopping_criteria: StoppingCriteriaList, processors) -> None:
        self.criteria = StoppingCriteriaList(
            [c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))])
        self.pads_stopped = pads_stopped(stopping_criteria)
        self.processors = processors  # named in the refusal of an undefined law
        self.stop_lengths: torch.Tensor | None = None  # [B] new tokens where each row stopped, -1: not yet
        self.undefined_at: torch.Tensor | None = None  # [B] first position past the row's stop with no law, else max
        self.cut = False  # rows were cut back to where the batch ended (the commit log is cut at the end too)

    def __bool__(self) -> bool:
        return len(self.criteria) > 0

    def apply(self, state, block: torch.Tensor, count: torch.Tensor, finished: torch.Tensor, undefined: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(count, finished, undefined) of a commit of ``count`` [b] tokens of ``block`` [b, L+1] to the active rows
        of ``state`` (a :class:`~hf_sjd.jacobi.state.DecodeState`, its ``max_new`` lowered where the batch ends);
        ``undefined`` [b, L+1] marks the committed tokens whose law is undefined, less those held back (above)."""
        first = self.first_stops(state, block, count)  # [b]
        if self.pads_stopped:
            stopped = first > 0
            return torch.where(stopped, first, count), finished | stopped, undefined
        if self.stop_lengths is None:
            self.stop_lengths = torch.full_like(state.num_new, -1)
            self.undefined_at = torch.full_like(state.num_new, torch.iinfo(torch.long).max)
        committed, known = state.committed(), self.stop_lengths[state.rows]
        stop = torch.where((first > 0) & (known < 0), committed + first, known)  # [b]
        self.stop_lengths[state.rows] = stop
        position = committed[:, None] + state.offsets(block.shape[1])  # [b, L+1] the generated position of each slot
        held = undefined & (stop[:, None] >= 0) & (position >= stop[:, None])  # past the row's own stop
        self.undefined_at[state.rows] = torch.where(held, position, self.undefined_at[state.rows, None]).amin(1)
        undefined = undefined & ~held
        at_limit = state.num_new.index_add(0, state.rows, count) >= state.max_new  # [B] rows that end there anyway
        ends = torch.where(self.stop_lengths >= 0, self.stop_lengths, torch.where(at_limit, state.max_new, -1))
        if bool((ends < 0).any()):  # a host read, only under the user's criteria
            return count, finished, undefined
        state.max_new = int(ends.max())  # every row ends where the last one stopped
        generated = self.undefined_at < state.max_new  # [B] a held-back position the batch reached after all
        if bool(generated.any()):
            row = int(generated.int().argmax())
            raise no_law_error(self.processors, row, int(self.undefined_at[row]))
        self.cut |= bool((state.num_new > state.max_new).any())
        state.num_new = state.num_new.clamp(max=state.max_new)  # rows that sampled past it
        committed = state.committed()
        count = torch.minimum(count, state.max_new - committed)
        return count, finished | (committed + count >= state.max_new), undefined

    def first_stops(self, state, block: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """[b] the first k <= ``count`` whose prefix (the row's prompt and committed tokens, then ``block[:, :k]``)
        the criteria accept, 0: none; one call per distinct prefix length, each row judged on its own."""
        lengths = state.lengths()
        context = window_prefixes(state.tokens[state.rows], lengths, block)  # [b, n + L + 1]
        first = torch.zeros_like(count)
        for k in range(1, int(count.max()) + 1):  # host reads, only under the user's criteria
            pending = ((first == 0) & (count >= k)).nonzero().flatten()
            for length, group in groups_by_length(lengths[pending] + k):
                rows = pending[group]
                first[rows] = self.criteria(context[rows, :length], None).to(first.device).long() * k
        return first
