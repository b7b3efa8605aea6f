"""Apply transformers logits processors to every position of a Jacobi window.

Vanilla sampling processes one position per step with that position's prefix: ``input_ids`` is the
prompt as given (padding included) followed by the tokens generated so far, so its length tells a
processor how far the row is (``min_new_tokens``, exponential decay, begin suppression all read it).
Inside a window, position ``j`` of row ``r`` has its own prefix: the row's prompt and committed tokens,
then the drafts before ``j``. In a ragged batch rows have committed different amounts, so the
(row, position) pairs are grouped by prefix length and the processor list is called once per length,
each pair with exactly the prefix vanilla sampling would have given it (at batch 1 that is one call per
window position, as in transformers' assisted decoding). Processors that ignore ``input_ids``
(temperature, top-k, top-p, ...) are applied to all positions in one call instead.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

# Processors whose output depends on the scores only, never on ``input_ids``.
PREFIX_FREE = tuple(getattr(lp, name) for name in (
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
    "EpsilonLogitsWarper", "EtaLogitsWarper", "SuppressTokensLogitsProcessor", "LogitNormalization",
) if hasattr(lp, name))
WARPERS = tuple(getattr(lp, name) for name in (
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
    "EpsilonLogitsWarper", "EtaLogitsWarper", "TopHLogitsWarper") if hasattr(lp, name))


def is_prefix_free(processors: LogitsProcessorList) -> bool:
    return all(isinstance(p, PREFIX_FREE) for p in processors)


def window_prefixes(tokens: torch.Tensor, lengths: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """``tokens`` [b, n] (row r's first ``lengths[r]`` are its prompt + committed tokens), ``drafts`` [b, J]
    -> [b, n + J] where row r reads ``tokens[r, :lengths[r]]`` then its drafts: position j's prefix is
    ``[:lengths[r] + j]``."""
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
                   lengths: torch.Tensor, drafts: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Process the J window positions of the b active rows.

    ``logits`` [b, J, V]; ``tokens`` [B, n] the whole batch's token buffer and ``lengths`` [B] its rows'
    prompt + committed tokens; ``drafts`` [b, >= J - 1] the window's drafts; ``rows`` [b] the active rows'
    indices in the batch (default: all). Position j of active row i is processed with prefix
    ``tokens[rows[i], :lengths[rows[i]]] + drafts[i, :j]``. Returns scores [b, J, V].

    Each call hands the processors the *whole* batch in its original row order (rows outside the call's
    group carry a placeholder prefix and zero logits, and their output is dropped), because some
    processors index per-row state by row: the repetition penalty's ``prompt_ignore_length``, the
    ``batch_id`` of ``prefix_allowed_tokens_fn``.
    """
    batch, num_positions, vocab = logits.shape
    if not processors:
        return logits
    if is_prefix_free(processors):
        flat = processors(tokens[:1, :1].expand(batch * num_positions, 1), logits.reshape(-1, vocab))
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
        scores[pairs] = processors(context[:, :length], call_logits)[batch_rows]
    return scores.view(batch, num_positions, vocab)


def allowed_tokens(processors: LogitsProcessorList, input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token ids that the non-warper processors allow at the first position, for every row (1D tensor).

    Warpers (top-k, top-p, ...) restrict by probability, not by constraint, so they are left out: random
    drafts should cover what the model *may* emit.
    """
    constraints = LogitsProcessorList([p for p in processors if not isinstance(p, WARPERS)])
    scores = torch.zeros(input_ids.shape[0], vocab_size, device=input_ids.device)
    if constraints:
        scores = constraints(input_ids, scores)
    return torch.isfinite(scores).all(0).nonzero().squeeze(-1)
