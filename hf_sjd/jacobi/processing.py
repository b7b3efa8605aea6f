"""Apply transformers logits processors to every position of a Jacobi window.

Position ``j`` of row ``r`` is processed with the prefix vanilla sampling would give it: the row's prompt (padding
included) and committed tokens, then the drafts before ``j``. Rows of a ragged batch have different prefix lengths,
so the (row, position) pairs are grouped by length, one processor call per length (at batch 1: one per position,
as in transformers' assisted decoding). Processors that ignore ``input_ids`` get all positions in one call.
"""

from __future__ import annotations

import inspect
import math

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

from .constants import cached

_WARPERS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
            "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper")
# processors whose output depends on the scores only, never on ``input_ids``: exact types, a subclass may read them
PREFIX_FREE = {getattr(lp, name) for name in (*_WARPERS, "SuppressTokensLogitsProcessor", "LogitNormalization")}
WARPERS = tuple(getattr(lp, name) for name in (*_WARPERS, "TopHLogitsWarper") if hasattr(lp, name))
# processors whose distribution does not change when a constant is added to a row's scores (they read them through
# a softmax or a ranking, scale them, or add to them and mask them): exact types, a subclass may do otherwise
SHIFT_FREE = {*WARPERS, *(getattr(lp, name) for name in (
    "SuppressTokensLogitsProcessor", "SuppressTokensAtBeginLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "NoBadWordsLogitsProcessor", "SequenceBiasLogitsProcessor", "MinLengthLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor", "PrefixConstrainedLogitsProcessor", "ForcedBOSTokenLogitsProcessor",
    "ForcedEOSTokenLogitsProcessor", "LogitNormalization", "WatermarkLogitsProcessor") if hasattr(lp, name))}


class PrebuiltSuppressTokens(lp.SuppressTokensLogitsProcessor):
    """transformers' ``SuppressTokensLogitsProcessor`` (the same scores: -inf on the suppressed ids) with its
    vocabulary mask built once per vocabulary size and device: one op per call instead of four."""

    def __init__(self, processor: lp.SuppressTokensLogitsProcessor) -> None:
        self.suppress_tokens = processor.suppress_tokens
        self._masks: dict[tuple, torch.Tensor] = {}  # (vocab, device) -> [vocab] bool

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab, device = scores.shape[-1], scores.device
        mask = cached(self._masks, (vocab, device),
                      lambda: torch.isin(torch.arange(vocab, device=device), self.suppress_tokens.to(device)))
        return scores.masked_fill(mask, -float("inf"))


class WindowPrefixConstrained(lp.PrefixConstrainedLogitsProcessor):
    """transformers' ``PrefixConstrainedLogitsProcessor`` (the same scores), except where ``prefix_allowed_tokens_fn``
    allows nothing: instead of an error, the rows are kept in ``empty_rows`` for :func:`call_processors` to mark
    NaN (no law) after the whole list (a later processor, ``remove_invalid_values``'s, would clear a mark made
    here). A window calls it on prefixes vanilla sampling never builds (behind a draft the function forbids), where
    a function may rightly answer ``[]``; the loop refuses a committed token with no law, where transformers raises,
    greedy or not. (The answers go through transformers' own call, so its masking and its fallback stay its own.)"""

    def __init__(self, processor: lp.PrefixConstrainedLogitsProcessor) -> None:
        vars(self).update(vars(processor))
        self.empty_rows: list[int] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        function, rows, answers = self._prefix_allowed_tokens_fn, iter(range(len(input_ids))), []

        def allowed(batch_id: int, sent: torch.Tensor) -> list[int]:
            # transformers asks row by row, in order; batch_id is the row's prompt (num_return_sequences copies)
            row, tokens = next(rows), function(batch_id, sent)
            if len(tokens) == 0:
                self.empty_rows.append(row)
                return [0]
            answers.append((row, tokens))
            return tokens

        self._prefix_allowed_tokens_fn = allowed
        try:
            processed = super().__call__(input_ids, scores)
        finally:
            self._prefix_allowed_tokens_fn = function
        if self._num_beams > 1:  # copies of a prompt: transformers allows their tokens again where the processors
            # before it forbade them in every copy at one step; a window's copies are at different steps, so a row
            # left nothing has no law here (refused if committed) instead of a fallback read off another step
            self.empty_rows += [row for row, tokens in answers if bool(scores[row, tokens].isneginf().all())]
        return processed


class UnsortedTopK(lp.TopKLogitsWarper):
    """transformers' ``TopKLogitsWarper`` (the same scores) with its threshold, the k-th largest score, taken by
    ``kthvalue`` (a selection, no sort: on a CPU the sort inside a sorted top-k is most of its cost). ``kthvalue``
    ranks NaN above every number, as the sorted top-k does."""

    def __init__(self, processor: lp.TopKLogitsWarper) -> None:
        vars(self).update(vars(processor))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[-1]
        kth = scores.kthvalue(vocab - min(self.top_k, vocab) + 1, -1, keepdim=True).values  # [*lead, 1]
        return scores.masked_fill(scores < kth, self.filter_value)


_FASTER = {lp.SuppressTokensLogitsProcessor: PrebuiltSuppressTokens, lp.TopKLogitsWarper: UnsortedTopK,
           lp.PrefixConstrainedLogitsProcessor: WindowPrefixConstrained}
SHIFT_FREE |= set(_FASTER.values())
PREFIX_FREE |= {PrebuiltSuppressTokens, UnsortedTopK}


def is_shift_free(processors: LogitsProcessorList) -> bool:
    """Whether adding a constant to a row's scores leaves the distribution ``processors`` make of them as it is."""
    return type(processors) is LogitsProcessorList and all(type(p) in SHIFT_FREE for p in processors)


def with_faster_equivalents(processors: LogitsProcessorList) -> LogitsProcessorList:
    """``processors`` with each plain ``SuppressTokensLogitsProcessor``, ``TopKLogitsWarper`` and
    ``PrefixConstrainedLogitsProcessor`` (the class itself, not a subclass) as its window equivalent above."""
    return LogitsProcessorList(_FASTER[type(p)](p) if type(p) in _FASTER else p for p in processors)


_TAKES_KWARGS: dict[type, bool] = {}  # processor class -> whether its __call__ takes more than (input_ids, scores)


def call_processors(processors: LogitsProcessorList, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``processors(input_ids, scores)``, each plain processor called directly: transformers' list reads every
    processor's ``inspect.signature`` on every call (tens of microseconds each, every iteration)."""
    if type(processors) is not LogitsProcessorList:  # a subclass may call its processors otherwise
        return processors(input_ids, scores)
    marked = []  # rows whose prefix function allows nothing (WindowPrefixConstrained)
    for processor in processors:
        kind = type(processor)
        if kind not in _TAKES_KWARGS:
            _TAKES_KWARGS[kind] = len(inspect.signature(processor.__call__).parameters) > 2  # transformers' test
        if _TAKES_KWARGS[kind] or "__call__" in vars(processor):
            scores = LogitsProcessorList([processor])(input_ids, scores)  # transformers' own checks and errors
        else:
            scores = processor(input_ids, scores)
        if type(processor) is WindowPrefixConstrained and processor.empty_rows:  # marked once the list has run
            marked.extend(processor.empty_rows)
            processor.empty_rows = []
    if marked:
        scores = scores.index_fill(0, torch.tensor(marked, device=scores.device), math.nan)
    return scores


def no_law_error(processors: LogitsProcessorList, row: int, position: int) -> ValueError:
    """The refusal of a generated token whose processed scores are all -inf/NaN, as transformers' sampling refuses."""
    names = ", ".join(type(p).__name__ for p in processors) or "none"
    copies = any(isinstance(p, lp.PrefixConstrainedLogitsProcessor) and p._num_beams > 1 for p in processors)
    return ValueError(f"the logits processors leave no token allowed at generated position {position} of row {row} "
                      f"(every score is -inf or NaN there), so there is nothing to sample; transformers' own sampling "
                      f"refuses it too" + (
                          " unless every copy of the prompt allows nothing at that step, when its prefix constraint "
                          "allows its tokens again; a window decodes the copies at different steps, so that fallback "
                          "is not taken: repeat the prompts instead of num_return_sequences for a fallback per row"
                          if copies else "") + f". Processors: {names}")


def marks_no_law(processors: LogitsProcessorList) -> bool:
    """Whether :func:`call_processors` may mark a row's scores NaN (no law): a prefix function allows nothing."""
    return any(type(p) is WindowPrefixConstrained for p in processors)


def is_prefix_free(processors: LogitsProcessorList) -> bool:
    return all(type(p) in PREFIX_FREE for p in processors)


def window_prefixes(tokens: torch.Tensor, lengths: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """``tokens`` [b, n], ``drafts`` [b, J] -> [b, n + J]: row r reads ``tokens[r, :lengths[r]]`` then its drafts."""
    batch, num_drafts = drafts.shape
    context = torch.nn.functional.pad(tokens, (0, num_drafts))
    columns = lengths[:, None] + torch.arange(num_drafts, device=tokens.device)[None]  # [b, J]
    return context.scatter(1, columns, drafts)


def groups_by_length(lengths: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """``lengths`` [n] -> [(length, indices with that length)], one entry per distinct length."""
    values, inverse = torch.unique(lengths, return_inverse=True)
    order = torch.argsort(inverse, stable=True)
    counts = torch.bincount(inverse, minlength=values.numel()).tolist()
    return list(zip(values.tolist(), order.split(counts)))


def process_window(processors: LogitsProcessorList, logits: torch.Tensor, tokens: torch.Tensor,
                   lengths: torch.Tensor | None, drafts: torch.Tensor, rows: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Scores [b, J, V] of the J window positions of the ``rows`` [b] (default: all) of the batch's buffer ``tokens``
    [B, n] with prefix ``lengths`` [B]. Each call gets the *whole* batch in its row order (other rows' output
    dropped): some processors keep per-row state (``prefix_allowed_tokens_fn``'s ``batch_id``)."""
    batch, num_positions, vocab = logits.shape
    if not processors:
        return logits
    if is_prefix_free(processors):
        flat = call_processors(processors, tokens[:1, :1].expand(batch * num_positions, 1), logits.reshape(-1, vocab))
        return flat.view(batch, num_positions, vocab)
    if rows is None:
        rows = torch.arange(tokens.shape[0], device=tokens.device)
    active = window_prefixes(tokens[rows], lengths[rows], drafts[:, :num_positions - 1])  # [b, n + J - 1]
    context = torch.nn.functional.pad(tokens, (0, num_positions - 1)).index_copy(0, rows, active)  # [B, n + J - 1]
    position = torch.arange(num_positions, device=logits.device)
    prefix_length = (lengths[rows, None] + position[None]).flatten()  # [b * J]: pair (i, j) -> i * J + j
    flat_logits, scores = logits.reshape(-1, vocab), torch.empty_like(logits).view(-1, vocab)
    for length, pairs in groups_by_length(prefix_length):  # at most one pair per row in a group
        batch_rows = rows[pairs // num_positions]
        call_logits = logits.new_zeros(tokens.shape[0], vocab).index_copy(0, batch_rows, flat_logits[pairs])
        scores[pairs] = call_processors(processors, context[:, :length], call_logits)[batch_rows]
    return scores.view(batch, num_positions, vocab)


def allowed_tokens(processors: LogitsProcessorList, input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token ids the non-warper processors allow at the first position for some row (what random drafts cover: a
    draft a row's processors forbid has p = 0 there and is rejected, so the union is as exact as any draft set)."""
    constraints = LogitsProcessorList([p for p in processors if not isinstance(p, WARPERS)])
    scores = torch.zeros(input_ids.shape[0], vocab_size, device=input_ids.device)
    if constraints:
        scores = constraints(input_ids, scores)
    return torch.isfinite(scores).any(0).nonzero().squeeze(-1)
