"""Token-level quality proxies of the study suites (research tooling, not in the wheel): the generated tokens'
likelihood under the model, their histogram's distance between two sample sets, and repeats of the left neighbour.

    >>> import torch
    >>> token_frequency_tv(torch.tensor([[0, 1]]), torch.tensor([[1, 1]]), vocab=3)
    0.5
"""

from __future__ import annotations

import torch


@torch.no_grad()
def token_logliks(model, sequences: torch.Tensor, prompt_len: int, batch_size: int = 16) -> torch.Tensor:
    """``[batch, new]`` log-probability of each generated token of ``sequences`` [batch, prompt_len + new] (full,
    unpadded) under the model's raw, unprocessed logits (relaxed acceptance commits less likely tokens)."""
    if sequences.ndim != 2 or not 0 < prompt_len < sequences.shape[1]:
        raise ValueError(f"sequences must be [batch, prompt_len + new] with 0 < prompt_len < length; got shape "
                         f"{tuple(sequences.shape)} and prompt_len={prompt_len}")
    device = next(model.parameters()).device
    rows = []
    for start in range(0, sequences.shape[0], batch_size):
        chunk = sequences[start:start + batch_size].to(device)
        logits = model(input_ids=chunk).logits[:, prompt_len - 1:-1].float()  # predicts tokens prompt_len..end
        rows.append(logits.log_softmax(-1).gather(-1, chunk[:, prompt_len:, None]).squeeze(-1).cpu())
    return torch.cat(rows)


def mean_token_loglik(model, sequences: torch.Tensor, prompt_len: int, batch_size: int = 16) -> float:
    """Mean of :func:`token_logliks` (nats per token), every generated token of every row counted equally."""
    return float(token_logliks(model, sequences, prompt_len, batch_size).mean())


def token_frequency_tv(seqs_a: torch.Tensor, seqs_b: torch.Tensor, vocab: int) -> float:
    """Total variation ``0.5 * sum |f_a - f_b|`` between the token histograms of two sample sets (pass only the
    generated tokens)."""

    def frequencies(sequences) -> torch.Tensor:  # [vocab], normalised
        tokens = torch.as_tensor(sequences).flatten().long()
        if tokens.numel() == 0:
            raise ValueError("token_frequency_tv needs at least one token per set")
        if int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
            raise ValueError(f"tokens must lie in [0, {vocab}); got range [{int(tokens.min())}, {int(tokens.max())}]")
        counts = torch.bincount(tokens.cpu(), minlength=vocab).double()
        return counts / counts.sum()

    return float(0.5 * (frequencies(seqs_a) - frequencies(seqs_b)).abs().sum())


def adjacent_repeat_rate(sequences: torch.Tensor) -> torch.Tensor:
    """Per row [batch]: fraction of (generated) tokens equal to their left neighbour; mode seeking raises it."""
    tokens = torch.as_tensor(sequences)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"sequences must be [batch, length >= 2], got shape {tuple(tokens.shape)}")
    return (tokens[:, 1:] == tokens[:, :-1]).double().mean(1)
