"""An enumerable target for direct tests of one forward's verification: random laws p(. | prefix) over ``VOCAB``
tokens for every prefix of up to ``WINDOW`` tokens, and the exact law of ``WINDOW + 1`` tokens sampled from them."""

from __future__ import annotations

import itertools

import torch

VOCAB, WINDOW = 4, 2


def target_table(seed: int = 0) -> list[torch.Tensor]:
    """p(. | prefix) for every prefix of i = 0..WINDOW tokens: ``table[i]`` [VOCAB ** i, VOCAB] (a prefix indexed by
    its tokens in base VOCAB), each a random law over VOCAB tokens."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(VOCAB ** i, VOCAB, generator=gen) * 1.5).softmax(-1) for i in range(WINDOW + 1)]


def target_after(table: list[torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """p(. | tokens) [N, VOCAB] for prefixes ``tokens`` [N, i]."""
    index = (tokens * VOCAB ** torch.arange(tokens.shape[1] - 1, -1, -1)).sum(1)
    return table[tokens.shape[1]][index]


def draft_laws(seed: int = 1) -> torch.Tensor:
    """q_1 .. q_L [WINDOW, VOCAB], fixed before the forward (as SJD's redraft and fresh drafts are)."""
    return (torch.randn(WINDOW, VOCAB, generator=torch.Generator().manual_seed(seed)) * 1.5).softmax(-1)


def exact_law(table: list[torch.Tensor]) -> dict[tuple, float]:
    """The probability of each of the VOCAB ** (WINDOW + 1) sequences under the table."""
    law = {}
    for seq in itertools.product(range(VOCAB), repeat=WINDOW + 1):
        tokens = torch.tensor([seq])
        law[seq] = float(torch.prod(torch.stack([target_after(table, tokens[:, :i])[0, t]
                                                 for i, t in enumerate(seq)])))
    return law
