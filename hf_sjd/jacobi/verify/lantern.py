"""LANTERN relaxed verification (Jang et al. 2024, arXiv 2410.03355). Lossy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...checks import check_float, check_int
from ..neighbours import LatentOptions, aligned_embeddings, cached_nearest_neighbours
from ..distributions import SparseProbs, normalise, normalised_residual, token_probs
from .base import Verifier, accept_ratio, at_position, gather_tokens

def lantern_defaults(codebook_size: int) -> tuple[int, float]:
    """Default ``(lantern_k, lantern_delta)`` for a codebook of ``codebook_size`` codes (k capped at size - 1): up to
    2048 codes LANTERN++'s lambda = 2, measured on the reference model (docs/results/verifiers.md), else the paper's."""
    k, delta = (10, 2.0) if codebook_size <= 2048 else (1000, 0.1)
    return min(k, max(codebook_size - 1, 0)), delta


@dataclass
class LanternOptions(LatentOptions):
    """LANTERN's knobs; ``None``: the defaults for the codebook's size (:func:`lantern_defaults`)."""

    PREFIX: ClassVar[str] = "lantern_"
    k: int | None = None  # neighbours per code
    delta: float | None = None  # mass bound (<= 1) or LANTERN++'s lambda (> 1)

    def validate(self) -> "LanternOptions":
        return LanternOptions(self.latent_embeddings, check_int("lantern_k", self.k, minimum=0, allow_none=True),
                              check_float("lantern_delta", self.delta, minimum=0.0, allow_none=True))


class LanternVerifier(Verifier):
    r"""LANTERN relaxed speculative verification (training-free form). With :math:`a_1..a_k` the nearest draft
    tokens of :math:`x` in the latent (VQ) space and :math:`c_j = \sum_{i \le j} p(a_i)`, the draft borrows the
    longest prefix :math:`B(x) = \{a_1..a_m\}` with :math:`c_m \le \delta` (LANTERN) or, ``lantern_delta > 1`` read
    as :math:`\lambda` (LANTERN++), :math:`c_m \le (\lambda - 1)\,p(x)`: accept iff
    :math:`u \le \min(1, (p(x) + c_m) / q(x))`. A rejection resamples from :math:`\mathrm{norm}(\max(p' - q, 0))`,
    :math:`p'` = p with :math:`B(x)` zeroed (else :math:`\mathrm{norm}(p')`). A draft with :math:`p(x) = 0` is
    always rejected; ``k = 0`` or ``delta = 0`` is :class:`~hf_sjd.SpeculativeVerifier`. Small codebooks default to
    LANTERN++ (:func:`lantern_defaults`): with uniform fresh drafts the absolute bound accepts nearly any draft.

    Example (codes on a line at 0, 1 and 5: code 0's nearest neighbour is code 1)::

        >>> from hf_sjd import LanternVerifier
        >>> lantern = LanternVerifier.from_embeddings(torch.tensor([[0.0], [1.0], [5.0]]), torch.arange(3),
        ...                                           vocab_size=3, k=1, delta=0.3, cache=False)
        >>> p = torch.tensor([[[0.2, 0.3, 0.5]]])  # [batch=1, window=1, vocab=3]
        >>> q = torch.tensor([[[0.8, 0.1, 0.1]]])
        >>> lantern.acceptance_probs(torch.tensor([[0]]), q, p)  # (0.2 + 0.3) / 0.8; SJD: 0.2 / 0.8
        tensor([[0.6250]])
        >>> result = lantern(torch.tensor([[0]]), q, p, torch.tensor([[0.7]]))
        >>> result.num_accepted  # rejected: resample from norm(max(p' - q, 0)), p' = p with token 1 zeroed
        tensor([0])
        >>> result.residual_probs
        tensor([[0., 0., 1.]])
    """

    options_class = LanternOptions
    sparse_ready = True  # neighbours are looked up in p's support; p' zeroes them there

    def __init__(self, neighbours: torch.Tensor, code_of_token: torch.Tensor, delta: float) -> None:
        """``neighbours`` [codes, k] token ids of each drafted token's neighbours, nearest first (indexed by code,
        not by token id: Emu3 has 32k codes in a 184k vocabulary); ``code_of_token`` [vocab] (-1: not drafted)."""
        self.neighbours = neighbours.to(torch.int32)
        self.code_of_token = code_of_token.to(torch.int32)
        self.delta = float(delta)

    @classmethod
    def from_embeddings(cls, embeddings: torch.Tensor, draft_token_ids: torch.Tensor, vocab_size: int, k: int,
                        delta: float, cache: bool = True) -> "LanternVerifier":
        """Build from latent ``embeddings`` [n, dim] of the ``draft_token_ids`` [n] (row i <-> id i)."""
        draft_token_ids = torch.as_tensor(draft_token_ids).long().to(embeddings.device)
        table = cached_nearest_neighbours(embeddings.float(), k, cache=cache)  # [n, k] row indices
        code_of_token = torch.full((vocab_size,), -1, dtype=torch.int32, device=embeddings.device)
        code_of_token[draft_token_ids] = torch.arange(draft_token_ids.numel(), dtype=torch.int32,
                                                      device=embeddings.device)
        return cls(draft_token_ids[table], code_of_token, delta)

    def neighbours_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` [...] -> [..., k] their neighbours' token ids, nearest first (-1 for undrafted tokens)."""
        code = self.code_of_token.to(tokens.device)[tokens].long()  # [...]
        neighbours = self.neighbours.to(tokens.device)[code.clamp_min(0)].long()  # [..., k]
        return torch.where((code >= 0).unsqueeze(-1), neighbours, -1)

    @classmethod
    def from_config(cls, config, adapter, draft_token_ids: torch.Tensor, options: LanternOptions
                    ) -> "LanternVerifier":
        aligned = aligned_embeddings(options.latent_embeddings, config, adapter, draft_token_ids)
        if aligned is None:
            raise ValueError("the 'lantern' verifier needs latent_embeddings=... (a [len(draft_token_ids), dim] "
                             "tensor of VQ codebook vectors, e.g. ReferenceModel.latent_embeddings), and the "
                             f"{adapter.family!r} adapter does not provide them")
        ids, embeddings = aligned
        default_k, default_delta = lantern_defaults(ids.numel())
        k = default_k if options.k is None else options.k
        if k > ids.numel() - 1:
            raise ValueError(f"lantern_k={k} exceeds the {ids.numel() - 1} other codes of the codebook")
        delta = default_delta if options.delta is None else options.delta
        return cls.from_embeddings(embeddings, ids, adapter.vocab_size, k, delta)

    def relaxation(self, drafts: torch.Tensor, target_probs: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(p_tilde [b, w], neighbour ids [b, w, k] (clamped), used [b, w, k] bool)`` for each draft."""
        p_draft = gather_tokens(target_probs, drafts)
        neighbours = self.neighbours_of(drafts)  # [b, w, k]
        valid = neighbours >= 0
        index = neighbours.clamp(min=0)
        p_neighbours = token_probs(target_probs, index) * valid
        cumulative = p_neighbours.cumsum(-1)
        # LANTERN: c_j <= delta; LANTERN++ (delta read as lambda > 1): c_j <= (lambda - 1) p(x)
        bound = torch.full_like(p_draft, self.delta) if self.delta <= 1 else (self.delta - 1) * p_draft
        # p >= 0, so {j : c_j <= bound} is a prefix; nothing is borrowed for an excluded draft.
        used = (cumulative <= bound.unsqueeze(-1)) & valid & (p_draft > 0).unsqueeze(-1)
        return p_draft + (p_neighbours * used).sum(-1), index, used

    def acceptance_probs(self, drafts: torch.Tensor, draft_probs: torch.Tensor,
                         target_probs: torch.Tensor) -> torch.Tensor:
        """``accept_prob`` [batch, window] = min(1, p_tilde(d) / q(d)); 0 where p(d) = 0."""
        p_tilde, _, _ = self.relaxation(drafts, target_probs)
        return accept_ratio(p_tilde, gather_tokens(draft_probs, drafts), gather_tokens(target_probs, drafts))

    def residual_at(self, drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                    position: torch.Tensor) -> torch.Tensor:
        """norm(max(p' - q, 0)) at ``position`` [b] (class docstring)."""
        draft = drafts.gather(1, position[:, None])  # [b, 1]
        target = at_position(target_probs, position)  # [b, V]
        _, index, used = self.relaxation(draft, target[:, None])  # [b, 1, k]
        index, used = index[:, 0], used[:, 0]  # [b, k]
        draft_q = at_position(draft_probs, position)
        if isinstance(target, SparseProbs):  # p' on p's support, q looked up there
            borrowed = ((target.ids.unsqueeze(-1) == index.unsqueeze(-2)) & used.unsqueeze(-2)).any(-1)  # [b, K]
            kept = target.probs.masked_fill(borrowed, 0.0)
            draft_q = token_probs(draft_q, target.ids.clamp(max=target.vocab_size - 1))
        else:
            borrowed = torch.zeros_like(target).scatter_add_(-1, index, used.to(target.dtype))
            kept = torch.where(borrowed > 0, torch.zeros_like(target), target)  # p': borrowed neighbours zeroed
        normalised = normalise(kept)  # the fallback
        if isinstance(target, SparseProbs):
            normalised = SparseProbs(target.ids, normalised, None, target.table)
        return normalised_residual((kept - draft_q).clamp_min(0.0), normalised)
