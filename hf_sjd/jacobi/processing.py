"""Apply transformers logits processors to every position of a Jacobi window.

Vanilla sampling processes one position per step with that position's prefix. Inside a window each
position has its own prefix (the committed tokens plus the drafts before it), so, like transformers'
assisted decoding, we call the processor list once per window position with that prefix. Processors that
ignore ``input_ids`` (temperature, top-k, top-p, ...) are applied to all positions in one call instead.
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


def right_align(sequences: torch.Tensor, lengths: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """Rows of ``sequences`` [b, n] with ``lengths`` [b] valid leading tokens -> right-aligned, left-padded
    [b, max(lengths)], so every row's prefix of the window is the same slice."""
    width = int(lengths.max())
    column = torch.arange(width, device=sequences.device)[None]
    source = column - (width - lengths[:, None])
    gathered = sequences.gather(1, source.clamp(min=0, max=sequences.shape[1] - 1))
    return torch.where(source >= 0, gathered, torch.full_like(gathered, pad_token_id))


def process_window(processors: LogitsProcessorList, logits: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """``logits`` [b, J, V] for the J window positions; ``context`` [b, n + J - 1] right-aligned tokens
    ending with the window's drafts (position j's prefix is ``context[:, : n + j]``). Returns scores [b, J, V]."""
    batch, num_positions, vocab = logits.shape
    if not processors:
        return logits
    if is_prefix_free(processors):
        flat = processors(context[:, :1].repeat_interleave(num_positions, 0), logits.reshape(-1, vocab))
        return flat.view(batch, num_positions, vocab)
    first = context.shape[1] - (num_positions - 1)
    return torch.stack([processors(context[:, :first + j], logits[:, j]) for j in range(num_positions)], dim=1)


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
