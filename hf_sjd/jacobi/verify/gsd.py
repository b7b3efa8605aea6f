"""Grouped speculative verification (GSD; So et al. 2025, arXiv 2508.07747). Lossy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...checks import check_float, check_int
from ..neighbours import LatentOptions, aligned_embeddings
from .base import accept_ratio, gather_tokens
from .speculative import SpeculativeVerifier


@dataclass
class GSDOptions(LatentOptions):
    PREFIX: ClassVar[str] = "gsd_"
    rank_window: int = 7  # W: candidates within W ranks of the draft
    prob_tol: float = 0.15  # |p(x') - p(x)| below this
    dist_tol: float = 0.5  # squared latent distance below this

    def validate(self) -> "GSDOptions":
        return GSDOptions(self.latent_embeddings, check_int("gsd_rank_window", self.rank_window, minimum=0),
                          check_float("gsd_prob_tol", self.prob_tol, minimum=0.0, low_open=True),
                          check_float("gsd_dist_tol", self.dist_tol, minimum=0.0, low_open=True))


class GSDVerifier(SpeculativeVerifier):
    r"""Grouped speculative verification (GSD; So et al. 2025, arXiv 2508.07747).

    A candidate :math:`x'` within ``gsd_rank_window`` (:math:`W`) ranks of the draft :math:`x` in :math:`p` joins
    its group :math:`G` if :math:`|p(x') - p(x)| <` ``gsd_prob_tol`` and :math:`\lVert E[x] - E[x']\rVert^2 <`
    ``gsd_dist_tol``, :math:`E` the ``latent_embeddings`` (else the adapter's, else the input embeddings); tokens
    with :math:`p = 0` never join. Accept iff :math:`u \le \min(1, \sum_G p / \sum_G q)`; otherwise this is
    :class:`~hf_sjd.SpeculativeVerifier` (an empty group: exactly).

    Example (token 1 is next to the draft 0 in rank, probability and embedding; token 2 is far away)::

        >>> from hf_sjd import GSDVerifier
        >>> gsd = GSDVerifier(torch.tensor([[0.0], [0.1], [3.0]]))
        >>> p = torch.tensor([[[0.3, 0.35, 0.35]]])  # [batch=1, window=1, vocab=3]
        >>> q = torch.tensor([[[0.6, 0.1, 0.3]]])
        >>> gsd.acceptance_probs(torch.tensor([[0]]), q, p)  # (0.3 + 0.35) / (0.6 + 0.1); SJD: 0.3 / 0.6
        tensor([[0.9286]])
    """

    sparse_ready = False  # neighbourhood sums and ranks over the dense p
    siblings_ready = False  # a group acceptance is not speculative sampling: siblings after it would not be exact

    options_class = GSDOptions

    def __init__(self, embeddings: torch.Tensor, row_of_token: torch.Tensor | None = None, rank_window: int = 7,
                 prob_tol: float = 0.15, dist_tol: float = 0.5) -> None:
        """``embeddings`` [n, dim], kept as given (cast when gathered); ``row_of_token`` [vocab] the embedding row of
        each token id (-1: none; default: the id)."""
        self.embeddings = embeddings.detach()
        self.row_of_token = (torch.arange(embeddings.shape[0], device=embeddings.device) if row_of_token is None
                             else row_of_token.long())
        self.rank_window, self.prob_tol, self.dist_tol = int(rank_window), float(prob_tol), float(dist_tol)

    @classmethod
    def from_config(cls, config, adapter, draft_token_ids: torch.Tensor, options: GSDOptions) -> "GSDVerifier":
        vocab_size, device = adapter.vocab_size, draft_token_ids.device
        row_of_token = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
        aligned = aligned_embeddings(options.latent_embeddings, config, adapter, draft_token_ids)
        if aligned is not None:  # latent (VQ) vectors of the drafted tokens
            ids, embeddings = aligned
            row_of_token[ids] = torch.arange(ids.numel(), device=device)
        else:  # the model's input embeddings, by token id
            embeddings = adapter.model.get_input_embeddings().weight.detach()
            rows = min(embeddings.shape[0], vocab_size)
            row_of_token[:rows] = torch.arange(rows, device=device)
        return cls(embeddings, row_of_token, options.rank_window, options.prob_tol, options.dist_tol)

    def acceptance_probs(self, drafts: torch.Tensor, draft_probs: torch.Tensor,
                         target_probs: torch.Tensor) -> torch.Tensor:
        """``accept_prob`` [batch, window] = min(1, sum_G p / sum_G q); 0 where p(d) = 0."""
        p_draft, q_draft = gather_tokens(target_probs, drafts), gather_tokens(draft_probs, drafts)
        if self.rank_window == 0:
            return accept_ratio(p_draft, q_draft, p_draft)
        vocab = target_probs.shape[-1]
        width = min(self.rank_window, vocab - 1)  # (no rank lies further away)
        offsets = torch.arange(-width, width, device=drafts.device)  # -W .. W except 0 (no bool mask: no device read)
        offsets = offsets + (offsets >= 0)
        order = target_probs.sort(dim=-1, descending=True, stable=True).indices  # [b, w, V] ids by rank
        ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(vocab, device=drafts.device).expand_as(order))
        position = ranks.gather(-1, drafts.unsqueeze(-1)) + offsets  # [b, w, 2W] the candidates' ranks
        candidates = order.gather(-1, position.clamp(0, vocab - 1))  # [b, w, 2W]
        p_candidates, p = target_probs.gather(-1, candidates), p_draft.unsqueeze(-1)
        row_of_token = self.row_of_token.to(drafts.device)
        candidate_row, draft_row = row_of_token[candidates], row_of_token[drafts].unsqueeze(-1)  # [b, w, 2W], [b, w, 1]
        embeddings = self.embeddings.to(drafts.device)
        distance = (embeddings[candidate_row.clamp_min(0)].float()
                    - embeddings[draft_row.clamp_min(0)].float()).square().sum(-1)
        in_group = ((position >= 0) & (position < vocab) & ((p_candidates - p).abs() < self.prob_tol)
                    & (distance < self.dist_tol) & (candidate_row >= 0) & (draft_row >= 0) & (p_candidates > 0)
                    & (p > 0))
        p_group = p_draft + (p_candidates * in_group).sum(-1)
        q_group = q_draft + (draft_probs.gather(-1, candidates) * in_group).sum(-1)
        return accept_ratio(p_group, q_group, p_draft)
