"""Relaxed (lossy) verifiers: accept a draft when the target puts enough mass on *similar* tokens.

Image-token distributions are flat: many codes decode to nearly the same patch, so exact speculative
verification rejects drafts that are visually fine. Both verifiers here trade a little fidelity to the
model's distribution for more accepted drafts per forward:

* :class:`LanternVerifier` (LANTERN, Jang et al. 2024, arXiv 2410.03355): the draft borrows the target
  probability of its nearest neighbours in the VQ latent space.
* :class:`GSDVerifier` (GSD, So et al. 2025, arXiv 2508.07747): the draft is accepted as a member of a
  group of tokens that are close in rank, probability and embedding.

Neither is lossless, but neither ever commits a token the logits processors exclude: a draft with
target probability 0 (outside top-k, a suppressed id, ...) is always rejected, neighbours / group members
with probability 0 contribute nothing, and the resampled token always comes from the processed target.

Both read their knobs from ``generate`` kwargs (or ``GenerationConfig`` attributes) through the
``"lantern"`` and ``"gsd"`` strategies, and validate them in ``from_config`` before any forward.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
from pathlib import Path

import torch

from ..checks import check_float, check_int
from .verifiers import SpeculativeVerifier, Verifier, at_position, gather_tokens

logger = logging.getLogger(__name__)

# (largest codebook size, k, delta): the first row whose size bound covers the codebook gives the defaults.
# Up to 2048 codes: measured on the shipped 512-code reference model (LanternVerifier's docstring,
# docs/results/verifiers.md): LANTERN++'s relative bound, lambda = 2 (delta > 1 is read as lambda).
# Larger codebooks: the paper's k=1000, delta=0.1, tuned on LlamaGen / Anole (8k-16k codes) with a drafter
# model; not measured here (see the caveat on uniform random drafts in LanternVerifier's docstring).
LANTERN_DEFAULTS: tuple[tuple[float, int, float], ...] = (
    (2048, 10, 2.0),
    (math.inf, 1000, 0.1),
)


def lantern_defaults(codebook_size: int) -> tuple[int, float]:
    """Default ``(lantern_k, lantern_delta)`` for a codebook of ``codebook_size`` codes (k capped at size - 1)."""
    for bound, k, delta in LANTERN_DEFAULTS:
        if codebook_size <= bound:
            return min(k, max(codebook_size - 1, 0)), delta
    raise AssertionError("unreachable: the last LANTERN_DEFAULTS row covers every size")


# -- helpers -------------------------------------------------------------------------------------------

def aligned_embeddings(config, adapter, draft_token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(ids [n], embeddings [n, dim] float32)``: the latent vector of each draft token id, or ``None``.

    Embeddings come from the ``latent_embeddings`` knob, else ``adapter.latent_embeddings``. Row ``i``
    belongs to ``draft_token_ids[i]`` in the order the user gave them (``generate(draft_token_ids=...)``),
    else in the order of the ids drafted by default (the adapter's, e.g. ``arange(512)``).
    """
    embeddings = config.extra.get("latent_embeddings")
    if embeddings is None:
        embeddings = adapter.latent_embeddings
    if embeddings is None:
        return None
    if not isinstance(embeddings, torch.Tensor):
        try:
            embeddings = torch.as_tensor(embeddings)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"latent_embeddings must be a tensor [len(draft_token_ids), dim]: {error}") from None
    if embeddings.ndim != 2 or not embeddings.is_floating_point():
        raise ValueError(f"latent_embeddings must be a float tensor [len(draft_token_ids), dim]; got shape "
                         f"{tuple(embeddings.shape)} and dtype {embeddings.dtype}")
    if config.draft_token_ids is not None:
        ids = torch.as_tensor(config.draft_token_ids).long().flatten().to(draft_token_ids.device)
        if ids.unique().numel() != ids.numel():
            raise ValueError("draft_token_ids has repeated ids, so latent_embeddings rows cannot be matched to them")
    else:
        ids = draft_token_ids
    if embeddings.shape[0] != ids.numel():
        raise ValueError(f"latent_embeddings has {embeddings.shape[0]} rows but there are {ids.numel()} "
                         f"draft_token_ids: row i must be the latent vector of draft_token_ids[i]")
    embeddings = embeddings.detach().to(device=draft_token_ids.device, dtype=torch.float32)
    if not torch.isfinite(embeddings).all():
        raise ValueError("latent_embeddings contains NaN or infinite values")
    return ids, embeddings


def nearest_neighbours(embeddings: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """``[n, k]`` row indices of the k nearest rows of each row by L2 distance, nearest first, self excluded."""
    n = embeddings.shape[0]
    if k > n - 1:
        raise ValueError(f"k={k} neighbours requested but only {n - 1} other codes exist")
    embeddings = embeddings.float()
    out = torch.empty(n, k, dtype=torch.long, device=embeddings.device)
    if k == 0:
        return out
    for start in range(0, n, chunk):
        rows = embeddings[start:start + chunk]
        dist = torch.cdist(rows, embeddings, compute_mode="donot_use_mm_for_euclid_dist")
        index = torch.arange(start, start + rows.shape[0], device=embeddings.device)
        dist[torch.arange(rows.shape[0], device=embeddings.device), index] = math.inf  # exclude self
        out[start:start + rows.shape[0]] = dist.topk(k, dim=-1, largest=False, sorted=True).indices
    return out


def embeddings_digest(embeddings: torch.Tensor) -> str:
    """Stable hash of a codebook (shape + float32 values): the key of its cached neighbour tables."""
    data = embeddings.detach().to(device="cpu", dtype=torch.float32).contiguous()
    digest = hashlib.sha256(str(tuple(data.shape)).encode())
    digest.update(data.numpy().tobytes())
    return digest.hexdigest()[:16]


def neighbour_cache_path(embeddings: torch.Tensor, k: int) -> Path:
    """``$HF_HOME/hf_sjd/lantern-<sha of embeddings>-k<k>.safetensors``."""
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "hf_sjd" / f"lantern-{embeddings_digest(embeddings)}-k{k}.safetensors"


def cached_nearest_neighbours(embeddings: torch.Tensor, k: int, cache: bool = True) -> torch.Tensor:
    """:func:`nearest_neighbours`, computed once per codebook and ``k`` and cached as safetensors.

    The file is written atomically (temporary file + ``os.replace``), so concurrent ``generate`` calls
    never read a half-written table; an unreadable or mismatched file is recomputed and replaced.
    """
    if not cache or k == 0:
        return nearest_neighbours(embeddings, k)
    from safetensors.torch import load_file, save_file

    n = embeddings.shape[0]
    path = neighbour_cache_path(embeddings, k)
    if path.exists():
        try:
            table = load_file(str(path))["neighbours"].long().to(embeddings.device)
            if table.shape == (n, k) and int(table.min()) >= 0 and int(table.max()) < n:
                return table
            logger.warning("ignoring LANTERN neighbour cache %s: wrong shape or ids", path)
        except Exception as error:  # noqa: BLE001 - any unreadable file is recomputed
            logger.warning("ignoring unreadable LANTERN neighbour cache %s: %s", path, error)
    table = nearest_neighbours(embeddings, k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        os.close(handle)
        try:
            save_file({"neighbours": table.to(device="cpu", dtype=torch.int32).contiguous()}, temp)
            os.chmod(temp, 0o644)  # mkstemp creates 0600; the cache may be shared
            os.replace(temp, path)
        finally:
            if os.path.exists(temp):
                os.remove(temp)
    except OSError as error:
        logger.warning("could not cache the LANTERN neighbour table at %s: %s", path, error)
    return table


# -- LANTERN -----------------------------------------------------------------------------------------------

class LanternVerifier(Verifier):
    r"""LANTERN relaxed speculative verification (Jang et al. 2024, "LANTERN: Accelerating Visual
    Autoregressive Models with Relaxed Speculative Decoding", arXiv 2410.03355), training-free form.

    Let :math:`A_k(x)` be the :math:`k` nearest draft tokens of :math:`x` by L2 distance between latent
    (VQ codebook) embeddings, nearest first, and :math:`c_j = \sum_{i \le j} p(a_i)` the cumulative target
    probability over them. The draft borrows the mass of the longest prefix
    :math:`B(x) = \{a_1..a_m\}` with :math:`c_m \le \delta` (LANTERN) or, when ``lantern_delta > 1`` is
    read as :math:`\lambda` (LANTERN++), :math:`c_m \le (\lambda - 1)\,p(x)`:

    .. math::  \tilde p(x) = p(x) + c_m, \qquad \text{accept iff } u \le \min(1, \tilde p(x) / q(x)).

    On rejection the position is resampled from :math:`\mathrm{norm}(\max(p' - q, 0))`, where
    :math:`p'` is :math:`p` with :math:`B(x)` zeroed (falling back to :math:`\mathrm{norm}(p')`), i.e.
    the residual of the relaxed distribution whose neighbour mass moved onto :math:`x`. A draft with
    :math:`p(x) = 0` is always rejected and zero-probability neighbours add nothing, so no token outside
    the processors' support is ever committed. ``k = 0`` or ``delta = 0`` is exactly
    :class:`~hf_sjd.SpeculativeVerifier`.

    **Defaults** (:func:`lantern_defaults`). The paper's ``k=1000, delta=0.1`` is for 8k-16k-code
    codebooks and far too loose for the 512-code reference model (``k=10, delta=0.1`` already costs
    0.75 nats/token). Measured there with
    ``scripts/benchmark_verifiers.py`` (64 images: 16 prompts x 4, batch 8, top-k 100, window 16; full table
    in ``docs/results/verifiers.md``); d loglik is the change of the mean token log-likelihood under the
    model's unprocessed distribution vs vanilla sampling (noise: vanilla vs vanilla -0.01, lossless SJD -0.03):

    ============================ =========== =========
    setting                      compression d loglik
    ============================ =========== =========
    SJD (exact)                  2.11x       -0.03
    k=1, delta=0.02              2.31x       -0.17
    k=1, delta=0.05              2.41x       -0.21
    k=2, delta=0.1               2.73x       -0.37
    k=5, delta=0.1               3.02x       -0.55
    k=10, delta=0.1              3.27x       -0.75
    k=10, lambda=1.5 (LANTERN++) 2.23x       -0.07
    k=10, lambda=2 (default)     2.43x       -0.06
    k=10, lambda=3               2.70x       -0.11
    k=10, lambda=5               3.05x       -0.18
    k=50, lambda=10              3.66x       -0.36
    ============================ =========== =========

    The absolute bound ``delta`` is a poor fit for Jacobi decoding: fresh drafts are uniform,
    :math:`q = 1/512`, so *any* in-support draft whose neighbour carries a little mass gets
    :math:`\tilde p / q \gg 1` and is accepted however unlikely it is; even ``delta=0.02`` costs 0.17 nats.
    LANTERN++'s relative bound caps the inflation at :math:`\tilde p(x) \le \lambda\, p(x)`, and at equal
    speed loses 3-4x less likelihood. The default for codebooks up to 2048 codes is therefore
    ``k=10, lantern_delta=2.0`` (lambda = 2): 15% more tokens per forward than SJD (2.43x vs 2.11x) for
    -0.035 nats/token relative to SJD; token-frequency TV and classifier accuracy stay within their
    vanilla-vs-vanilla noise at this sample size (TV 0.20 vs 0.21; accuracy 0.59 vs 0.64-0.66, +-0.06).
    ``lantern_delta=5`` (3.05x, -0.18) matches GSD's default (3.04x, -0.19). Larger codebooks get the
    paper's values, unmeasured here; with random (uniform) drafts the same caveat applies, so consider
    ``lantern_delta > 1`` there too.

    Example (codes on a line at 0, 1 and 5: code 0's nearest neighbour is code 1)::

        >>> import torch
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

    knobs = ("lantern_k", "lantern_delta", "latent_embeddings")

    def __init__(self, neighbours: torch.Tensor, code_of_token: torch.Tensor, delta: float) -> None:
        """``neighbours`` [codes, k] token ids of each drafted token's neighbours, nearest first;
        ``code_of_token`` [vocab] row of ``neighbours`` for each token id (-1: not drafted, no neighbours).

        The table is indexed by code, not by token id, so it costs ``codes x k`` (Emu3: 32k codes in a 184k
        vocabulary; k=1000 over the vocabulary would be 740 MB) plus one int per vocabulary entry."""
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
    def from_config(cls, config, adapter, draft_token_ids: torch.Tensor) -> "LanternVerifier":
        aligned = aligned_embeddings(config, adapter, draft_token_ids)
        if aligned is None:
            raise ValueError("the 'lantern' verifier needs latent_embeddings=... (a [len(draft_token_ids), dim] "
                             "tensor of VQ codebook vectors, e.g. ReferenceModel.latent_embeddings), and the "
                             f"{adapter.family!r} adapter does not provide them")
        ids, embeddings = aligned
        default_k, default_delta = lantern_defaults(ids.numel())
        k = config.extra.get("lantern_k", default_k)
        delta = config.extra.get("lantern_delta", default_delta)
        k = check_int("lantern_k", k, minimum=0)
        if k > ids.numel() - 1:
            raise ValueError(f"lantern_k={k} exceeds the {ids.numel() - 1} other codes of the codebook")
        delta = check_float("lantern_delta", delta, minimum=0.0)  # > 1 is read as LANTERN++'s lambda
        return cls.from_embeddings(embeddings, ids, adapter.vocab_size, k, delta)

    def relaxation(self, drafts: torch.Tensor, target_probs: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(p_tilde [b, w], neighbour ids [b, w, k] (clamped), used [b, w, k] bool)`` for each draft."""
        p_draft = gather_tokens(target_probs, drafts)
        neighbours = self.neighbours_of(drafts)  # [b, w, k]
        valid = neighbours >= 0
        index = neighbours.clamp(min=0)
        p_neighbours = target_probs.gather(-1, index) * valid
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
        return self._accept_prob(p_tilde, drafts, draft_probs, target_probs)

    @staticmethod
    def _accept_prob(p_tilde, drafts, draft_probs, target_probs) -> torch.Tensor:
        q_draft = gather_tokens(draft_probs, drafts)
        accept_prob = (p_tilde / q_draft.clamp_min(torch.finfo(q_draft.dtype).tiny)).clamp(max=1.0)
        return torch.where(gather_tokens(target_probs, drafts) > 0, accept_prob, torch.zeros_like(accept_prob))

    def residual_at(self, drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                    position: torch.Tensor) -> torch.Tensor:
        """norm(max(p' - q, 0)) at ``position`` [b], p' being p with the draft's borrowed neighbours zeroed
        (falling back to norm(p'))."""
        draft = drafts.gather(1, position[:, None])  # [b, 1]
        target = at_position(target_probs, position)  # [b, V]
        _, index, used = self.relaxation(draft, target[:, None])  # [b, 1, k]
        borrowed = torch.zeros_like(target).scatter_add_(-1, index[:, 0], used[:, 0].to(target.dtype))
        target = torch.where(borrowed > 0, torch.zeros_like(target), target)  # p': borrowed neighbours zeroed
        normalised = target / target.sum(-1, keepdim=True).clamp_min(torch.finfo(target.dtype).tiny)
        residual = (target - at_position(draft_probs, position)).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), normalised)


# -- GSD -------------------------------------------------------------------------------------------------

class GSDVerifier(SpeculativeVerifier):
    r"""Grouped speculative verification (GSD; So et al. 2025, "Grouped Speculative Decoding for
    Autoregressive Image Generation", arXiv 2508.07747).

    Sort the target :math:`p` in descending order. For a draft :math:`x`, the candidates are the tokens
    within ``gsd_rank_window`` (:math:`W`, default 7) ranks of :math:`x`; a candidate :math:`x'` joins
    the group if :math:`|p(x') - p(x)| <` ``gsd_prob_tol`` (0.15) and
    :math:`\lVert E[x] - E[x']\rVert^2 <` ``gsd_dist_tol`` (0.5), with :math:`E` the ``latent_embeddings``
    (knob, else ``adapter.latent_embeddings``) or else the model's input embeddings. With
    :math:`G = \{x\} \cup \text{kept}`:

    .. math::  \text{accept iff } u \le \min\Big(1, \frac{\sum_{x' \in G} p(x')}{\sum_{x' \in G} q(x')}\Big),

    and a rejected position is resampled from :math:`\mathrm{norm}(\max(p - q, 0))`. Tokens with
    :math:`p = 0` never join a group and a draft with :math:`p(x) = 0` is always rejected, so nothing the
    logits processors exclude is committed. With an empty group this is exactly
    :class:`~hf_sjd.SpeculativeVerifier` (the comparison is ``<=``, as there; the paper's ``<`` differs on
    a set of probability zero). Only :meth:`acceptance_probs` differs: the walk to the first rejection and
    the residual are inherited from it.

    Example (token 1 is next to the draft 0 in rank, probability and embedding; token 2 is far away)::

        >>> import torch
        >>> from hf_sjd import GSDVerifier
        >>> gsd = GSDVerifier(torch.tensor([[0.0], [0.1], [3.0]]))
        >>> p = torch.tensor([[[0.3, 0.35, 0.35]]])  # [batch=1, window=1, vocab=3]
        >>> q = torch.tensor([[[0.6, 0.1, 0.3]]])
        >>> gsd.acceptance_probs(torch.tensor([[0]]), q, p)  # (0.3 + 0.35) / (0.6 + 0.1); SJD: 0.3 / 0.6
        tensor([[0.9286]])
    """

    knobs = ("gsd_rank_window", "gsd_prob_tol", "gsd_dist_tol", "latent_embeddings")

    def __init__(self, embeddings: torch.Tensor, row_of_token: torch.Tensor | None = None, rank_window: int = 7,
                 prob_tol: float = 0.15, dist_tol: float = 0.5) -> None:
        """``embeddings`` [n, dim]; ``row_of_token`` [vocab] the embedding row of each token id (-1: none;
        default: row = token id). Rows are kept as given (no float copy of a model's input embeddings:
        Emu3's are 184k x 4096) and cast when gathered."""
        self.embeddings = embeddings.detach()
        self.row_of_token = (torch.arange(embeddings.shape[0], device=embeddings.device) if row_of_token is None
                             else row_of_token.long())
        self.rank_window, self.prob_tol, self.dist_tol = int(rank_window), float(prob_tol), float(dist_tol)

    @classmethod
    def from_config(cls, config, adapter, draft_token_ids: torch.Tensor) -> "GSDVerifier":
        window = check_int("gsd_rank_window", config.extra.get("gsd_rank_window", 7), minimum=0)
        prob_tol = check_float("gsd_prob_tol", config.extra.get("gsd_prob_tol", 0.15), minimum=0.0, low_open=True)
        dist_tol = check_float("gsd_dist_tol", config.extra.get("gsd_dist_tol", 0.5), minimum=0.0, low_open=True)
        vocab_size, device = adapter.vocab_size, draft_token_ids.device
        row_of_token = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
        aligned = aligned_embeddings(config, adapter, draft_token_ids)
        if aligned is not None:  # latent (VQ) vectors of the drafted tokens
            ids, embeddings = aligned
            row_of_token[ids] = torch.arange(ids.numel(), device=device)
        else:  # the model's input embeddings, by token id
            embeddings = adapter.model.get_input_embeddings().weight.detach()
            rows = min(embeddings.shape[0], vocab_size)
            row_of_token[:rows] = torch.arange(rows, device=device)
        return cls(embeddings, row_of_token, window, prob_tol, dist_tol)

    def group(self, drafts: torch.Tensor, target_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(candidates [b, w, 2W], in_group [b, w, 2W] bool)``: the rank neighbours of each draft and
        which of them join its group."""
        vocab = target_probs.shape[-1]
        offsets = torch.arange(-self.rank_window, self.rank_window + 1, device=drafts.device)
        offsets = offsets[offsets != 0]
        order = target_probs.sort(dim=-1, descending=True, stable=True).indices  # [b, w, V] ids by rank
        ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(vocab, device=drafts.device).expand_as(order))
        rank = ranks.gather(-1, drafts.unsqueeze(-1))  # [b, w, 1]
        position = rank + offsets
        in_range = (position >= 0) & (position < vocab)
        candidates = order.gather(-1, position.clamp(0, vocab - 1))  # [b, w, 2W]
        p_draft = gather_tokens(target_probs, drafts).unsqueeze(-1)
        p_candidates = target_probs.gather(-1, candidates)
        row_of_token = self.row_of_token.to(drafts.device)
        candidate_row, draft_row = row_of_token[candidates], row_of_token[drafts].unsqueeze(-1)  # [b, w, 2W], [b, w, 1]
        embeddings = self.embeddings.to(drafts.device)
        distance = (embeddings[candidate_row.clamp_min(0)].float()
                    - embeddings[draft_row.clamp_min(0)].float()).square().sum(-1)
        in_group = (in_range & ((p_candidates - p_draft).abs() < self.prob_tol) & (distance < self.dist_tol)
                    & (candidate_row >= 0) & (draft_row >= 0) & (p_candidates > 0) & (p_draft > 0))
        return candidates, in_group

    def acceptance_probs(self, drafts: torch.Tensor, draft_probs: torch.Tensor,
                         target_probs: torch.Tensor) -> torch.Tensor:
        """``accept_prob`` [batch, window] = min(1, sum_G p / sum_G q); 0 where p(d) = 0."""
        p_draft, q_draft = gather_tokens(target_probs, drafts), gather_tokens(draft_probs, drafts)
        if self.rank_window > 0:
            candidates, in_group = self.group(drafts, target_probs)
            p_group = p_draft + (target_probs.gather(-1, candidates) * in_group).sum(-1)
            q_group = q_draft + (draft_probs.gather(-1, candidates) * in_group).sum(-1)
        else:
            p_group, q_group = p_draft, q_draft
        accept_prob = (p_group / q_group.clamp_min(torch.finfo(q_group.dtype).tiny)).clamp(max=1.0)
        return torch.where(p_draft > 0, accept_prob, torch.zeros_like(accept_prob))

