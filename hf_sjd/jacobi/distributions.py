"""Distributions over the vocabulary, dense or stored on their support, behind one set of operations.

Under a top-k warper (or greedy decoding) every target ``p``, and every redraft ``q`` drawn from it, is zero
outside at most k tokens of a 16k-184k vocabulary. :class:`SparseProbs` keeps such a distribution on its support,
so every operation costs O(K) instead of O(vocab), exactly::

    ids       [*lead, K]  long    support token ids, ascending; padding entries hold ``vocab_size``
    probs     [*lead, K]  float   their probabilities (0 on padding)
    uniform   [*lead]     float   weight of the uniform component (random drafts' q over the draft ids);
                                  ``None``: none anywhere (targets, residuals: two ops fewer per lookup)
    table     [vocab + 1] float   the uniform component's probability of every id (0 at ``vocab_size``)

    P(x) = probs[i] if ids[i] == x (else 0) + uniform * table[x]

The functions below take either kind alike. Example: p = 0.75 / 0.25 on tokens 3 / 7, q uniform over tokens 0..4::

    >>> table = torch.tensor([0.2] * 5 + [0.0] * 6)
    >>> p = SparseProbs(torch.tensor([[3, 7]]), torch.tensor([[0.75, 0.25]]), None, table)
    >>> q = SparseProbs.uniform_draws(1, 1, table)[:, 0]
    >>> token_probs(q, torch.tensor([[3, 9]])), residual_distribution(p, q).probs  # (0.75 - 0.2) / 0.8, 0.25 / 0.8
    (tensor([[0.2000, 0.0000]]), tensor([[0.6875, 0.3125]]))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .constants import offsets


@dataclass
class SparseProbs:
    ids: torch.Tensor  # [*lead, K] ascending, padding = vocab_size
    probs: torch.Tensor  # [*lead, K]
    uniform: torch.Tensor | None  # [*lead] weight of the uniform component (None: 0 everywhere)
    table: torch.Tensor  # [vocab + 1] uniform component per id (last entry: padding, 0)

    @property
    def vocab_size(self) -> int:
        return self.table.shape[0] - 1

    @property
    def shape(self) -> torch.Size:
        """The dense shape ``[*lead, vocab]``."""
        return torch.Size((*self.ids.shape[:-1], self.vocab_size))

    @property
    def device(self) -> torch.device:
        return self.probs.device

    @classmethod
    def from_scores(cls, scores: torch.Tensor, width: int, table: torch.Tensor, top_k: int | None = None
                    ) -> tuple["SparseProbs", torch.Tensor]:
        """softmax(``scores`` [*lead, V]) on its ``width`` largest entries (after ``TopKLogitsWarper``'s rule, ties
        kept, if ``top_k`` is given), and a 0-d bool: True where some support may exceed ``width`` (not exact)."""
        width = min(width, scores.shape[-1])
        values, ids = scores.topk(width, dim=-1)  # [*lead, K] descending
        if top_k is not None and top_k < width:
            values = values.masked_fill(values < values[..., top_k - 1: top_k], float("-inf"))
        # the K-th largest is in the support: a (K+1)-th might be too
        overflow = (values[..., -1] > float("-inf")).any() if width < scores.shape[-1] else \
            torch.zeros((), dtype=torch.bool, device=scores.device)
        ids, order = ids.sort(-1)
        probs = values.softmax(-1).float().gather(-1, order)  # (softmaxed in the scores' dtype, as vanilla does)
        return cls(ids, probs, None, table), overflow

    @classmethod
    def point_masses(cls, tokens: torch.Tensor, table: torch.Tensor) -> "SparseProbs":
        """A point mass on each of ``tokens`` [*lead] (greedy targets, copied drafts)."""
        ones = torch.ones((*tokens.shape, 1), dtype=table.dtype, device=tokens.device)
        return cls(tokens.unsqueeze(-1), ones, None, table)

    @classmethod
    def uniform_draws(cls, batch: int, size: int, table: torch.Tensor, width: int = 1) -> "SparseProbs":
        """``[batch, size]`` copies of the uniform draft distribution, with ``width`` padding ids."""
        ids = torch.full((batch, size, width), table.shape[0] - 1, dtype=torch.long, device=table.device)
        return cls(ids, table.new_zeros(batch, size, width), table.new_ones(batch, size), table)

    def __getitem__(self, key) -> "SparseProbs":
        """Index the leading dimensions (rows, window positions) like the dense ``[*lead, vocab]`` tensor."""
        return SparseProbs(self.ids[key], self.probs[key], None if self.uniform is None else self.uniform[key],
                           self.table)

    def padded_to(self, width: int) -> "SparseProbs":
        """At least ``width`` support slots (padding ids with probability 0 appended)."""
        extra = width - self.ids.shape[-1]
        if extra <= 0:
            return self
        ids = torch.nn.functional.pad(self.ids, (0, extra), value=self.vocab_size)
        return SparseProbs(ids, torch.nn.functional.pad(self.probs, (0, extra)), self.uniform, self.table)

    def uniform_weight(self) -> torch.Tensor:
        """[*lead] the uniform component's weight (zeros when there is none)."""
        return self.probs.new_zeros(self.ids.shape[:-1]) if self.uniform is None else self.uniform

    def dense(self) -> torch.Tensor:
        """The same distribution as a dense ``[*lead, vocab]`` tensor (a fallback iteration; tests)."""
        out = self.uniform_weight().unsqueeze(-1) * self.table[:-1]
        return out.scatter_add(-1, self.ids.clamp(max=self.vocab_size - 1), self.probs)


# -- operations on either kind -----------------------------------------------------------------------
Probs = torch.Tensor | SparseProbs


def token_probs(probs: Probs, tokens: torch.Tensor) -> torch.Tensor:
    """``probs`` [*lead, vocab], ``tokens`` [*lead, m] -> the probability of each token [*lead, m]."""
    if not isinstance(probs, SparseProbs):
        return probs.gather(-1, tokens)
    if tokens.shape[-1] == 1:  # one token per distribution: a scan of the K slots beats a search
        on_support = (probs.probs * (probs.ids == tokens)).sum(-1, keepdim=True)
    else:  # [*lead, m] into the sorted ids: O(m log K)
        # compiled: a fresh buffer, since inductor before pytorch/pytorch#184043 crashes on a sliced view here
        # (and misreads one whose offset is fixed)
        ids = probs.ids.clone() if torch.compiler.is_compiling() else probs.ids.contiguous()
        slot = torch.searchsorted(ids, tokens).clamp(max=probs.ids.shape[-1] - 1)
        on_support = probs.probs.gather(-1, slot) * (probs.ids.gather(-1, slot) == tokens)
    if probs.uniform is None:
        return on_support
    return torch.addcmul(on_support, probs.uniform.unsqueeze(-1), probs.table[tokens])


def gather_window(probs: Probs, index: torch.Tensor) -> Probs:
    """``probs`` [b, L, vocab], ``index`` [b, k] window positions -> [b, k, vocab]. Dense: indexed by (row, position)
    pairs, which copies whole vocabulary rows (``gather`` with an index expanded over the vocabulary would look up
    every element)."""
    if not isinstance(probs, SparseProbs):
        return probs[offsets(index.shape[0], index.device)[:, None], index]
    wide = index.unsqueeze(-1).expand(-1, -1, probs.ids.shape[-1])
    uniform = None if probs.uniform is None else probs.uniform.gather(1, index)
    return SparseProbs(probs.ids.gather(1, wide), probs.probs.gather(1, wide), uniform, probs.table)


def normalise(weights: torch.Tensor, mass: torch.Tensor | None = None) -> torch.Tensor:
    """``weights`` [*lead, n] over their ``mass`` (default: their sum), 0 where it is 0. The exact sum, however
    small: a floor such as ``finfo.tiny`` leaves a law whose mass is denormal (a point mass's tail) unnormalised."""
    mass = weights.sum(-1, keepdim=True) if mass is None else mass
    return weights / torch.where(mass > 0, mass, torch.ones_like(mass))


def greedy_targets(scores: torch.Tensor, table: torch.Tensor, sparse: bool, marked: bool = False) -> Probs:
    """Greedy decoding's targets: a point mass on each row's argmax of ``scores`` [*lead, V] (sparse or dense);
    ``marked``: no law (NaN) where a row's scores are marked NaN (a NaN score wins the max)."""
    argmax = scores.argmax(-1)
    if sparse:
        probs = SparseProbs.point_masses(argmax, table)
        weights = probs.probs
    else:
        probs = weights = torch.nn.functional.one_hot(argmax, scores.shape[-1]).float()
    if marked:
        weights.masked_fill_(scores.amax(-1, keepdim=True).isnan(), math.nan)  # [*lead, 1]
    return probs


def residual_distribution(target: Probs, draft: Probs) -> Probs:
    """norm(max(p - q, 0)) row-wise, on p's support if sparse; p itself where p == q (never drawn from then)."""
    return normalised_residual(unnormalised_residual(target, draft), target)


def unnormalised_residual(target: Probs, draft: Probs, weight: torch.Tensor | None = None) -> torch.Tensor:
    """max(w p - q, 0) [*lead, K or vocab] (``weight`` w [*lead], default 1), laid out like ``target``."""
    if isinstance(target, SparseProbs):
        # a sparse q looks padding ids (vocab_size) up as 0 (its padding and its table's last entry), a dense q as
        # the last id: harmless either way, p is 0 there so the residual is +0 (contiguous: for searchsorted)
        ids = target.ids.contiguous() if isinstance(draft, SparseProbs) else target.ids.clamp(max=target.vocab_size - 1)
        p, q = target.probs, token_probs(draft, ids)
    else:
        p, q = target, to_dense(draft)
    if weight is not None:  # a prefix of weight 0 weighs nothing, even where p after it is no law (NaN)
        p = torch.where(weight.unsqueeze(-1) > 0, weight.unsqueeze(-1) * p, 0.0)
    return p.sub(q).clamp_min(0.0)


def normalised_residual(residual: torch.Tensor, target: Probs) -> Probs:
    """``residual`` normalised, of ``target``'s kind; ``target`` itself where it has no mass."""
    mass = residual.sum(-1, keepdim=True)  # (where it is 0, the quotient's NaN is not taken)
    normalised = torch.where(mass > 0, residual / mass, target.probs if isinstance(target, SparseProbs) else target)
    return SparseProbs(target.ids, normalised, None, target.table) if isinstance(target, SparseProbs) else normalised


def sample(probs: Probs, noise: torch.Tensor | None = None) -> torch.Tensor:
    r"""One token per distribution [*lead], by inverse transform: the first token whose cumulative mass exceeds
    :math:`u \cdot` total, one :math:`u \sim U[0, 1)` per distribution. No host sync. A sparse distribution draws
    over its support (not its uniform component).

    Why not ``torch.multinomial`` (or its exponential race :math:`\arg\max_v p_v / E_v`): both draw one
    exponential per token, and on a CPU those draws cost more than the rest of an iteration's sampling (one uniform
    per distribution here). The token found always has mass: ``u * total`` stays
    below the total in floating point (u is at most 1 - ulp/2, and the product rounds down), and the cumulative sum
    rises only at a token with mass. float64 where the device has it (not MPS), for the sum's rounding over large
    vocabularies. ``noise`` (the Gumbel coupling's kept :math:`E`, dense): the race on that noise.

    >>> _ = torch.manual_seed(0)
    >>> counts = sample(torch.tensor([[0.0, 0.25, 0.0, 0.75]]).expand(4000, -1)).bincount(minlength=4)
    >>> counts[[0, 2]].tolist(), round(counts[1].item() / 4000, 1)  # no draw without mass; about a quarter
    ([0, 0], 0.2)
    """
    if noise is not None:
        return (probs / noise).argmax(-1)
    weights = probs.probs if isinstance(probs, SparseProbs) else probs
    cdf = weights.cumsum(-1, dtype=_cdf_dtype(weights.device))  # [*lead, K or V]
    total = cdf[..., -1:]
    threshold = torch.rand(total.shape, dtype=cdf.dtype, device=total.device) * total  # [*lead, 1]
    # clamped: a law with no finite mass (NaN, refused by the loop) still indexes in range
    index = torch.searchsorted(cdf, threshold, right=True).clamp_(max=weights.shape[-1] - 1)
    return probs.ids.gather(-1, index).squeeze(-1) if isinstance(probs, SparseProbs) else index.squeeze(-1)


def _cdf_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def sample_without_replacement(probs: Probs, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``count`` distinct tokens per distribution ``probs`` [*lead, vocab] -> (tokens [*lead, count], whether
    each was drawn: False, with a placeholder token, once the support is used up).

    The first ``count`` finishers of one exponential race, :math:`\arg\max_v p_v / E_v` with
    :math:`E_v \sim \mathrm{Exp}(1)`: token i is a draw from ``probs`` with tokens 1..i-1 removed (Gumbel-top-k,
    Kool et al. 2019, arXiv 1903.06059). Sparse: over the support only.

    >>> torch.manual_seed(0) and None
    >>> tokens, drawn = sample_without_replacement(torch.tensor([[0.0, 0.7, 0.3]]), 3)
    >>> sorted(tokens[0, :2].tolist()), drawn  # token 0 has no mass: the third draw finds nothing left
    ([1, 2], tensor([[ True,  True, False]]))
    """
    weights = probs.probs if isinstance(probs, SparseProbs) else probs
    keys = torch.where(weights > 0, weights / torch.empty_like(weights).exponential_(), -1.0)
    top, index = keys.topk(min(count, keys.shape[-1]), dim=-1)  # [*lead, k], race order
    tokens = probs.ids.gather(-1, index) if isinstance(probs, SparseProbs) else index
    missing = count - tokens.shape[-1]  # a support smaller than count: pad with placeholders
    drawn = torch.nn.functional.pad(top > 0, (0, missing), value=False)
    return torch.nn.functional.pad(tokens, (0, missing), value=0), drawn


def without_token(probs: Probs, tokens: torch.Tensor) -> Probs:
    """``probs`` [b, vocab] with ``tokens`` [b] removed, renormalised (a uniform component dropped)."""
    if isinstance(probs, SparseProbs):
        kept = probs.probs * (probs.ids != tokens[:, None])
    else:
        kept = probs.scatter(-1, tokens[:, None], 0.0)
    kept = normalise(kept)
    return SparseProbs(probs.ids, kept, None, probs.table) if isinstance(probs, SparseProbs) else kept


def force_tokens(forced: torch.Tensor, probs: Probs) -> Probs:
    """``probs`` [*lead, vocab] with a point mass on ``forced`` [*lead] wherever it is ``>= 0``."""
    keep = forced < 0
    if isinstance(probs, SparseProbs):
        width = probs.ids.shape[-1]
        first = torch.arange(width, device=forced.device) == 0  # the point mass sits in slot 0, padding after
        ids = torch.where(keep.unsqueeze(-1), probs.ids, torch.where(first, forced.unsqueeze(-1), probs.vocab_size))
        masses = torch.where(keep.unsqueeze(-1), probs.probs, first.to(probs.probs.dtype))
        return SparseProbs(ids, masses, None if probs.uniform is None else probs.uniform * keep, probs.table)
    return torch.where(keep.unsqueeze(-1), probs, torch.nn.functional.one_hot(forced.clamp_min(0), probs.shape[-1])
                       .to(probs.dtype))


def where(condition: torch.Tensor, chosen: Probs, other: Probs) -> Probs:
    """``chosen`` where ``condition`` [*lead] holds, else ``other`` (of one kind; sparse widths padded to match)."""
    if isinstance(chosen, SparseProbs):
        chosen, other = chosen.padded_to(other.ids.shape[-1]), other.padded_to(chosen.ids.shape[-1])
        wide = condition.unsqueeze(-1)
        ids, probs = torch.where(wide, chosen.ids, other.ids), torch.where(wide, chosen.probs, other.probs)
        uniform = _where_uniform(condition, chosen.uniform, other.uniform)
        if uniform is not None and uniform.shape != ids.shape[:-1]:  # a side None was wider than the other two
            uniform = uniform.expand(ids.shape[:-1])
        return SparseProbs(ids, probs, uniform, chosen.table)
    return torch.where(condition.unsqueeze(-1), chosen, other)


def _where_uniform(condition: torch.Tensor, chosen: torch.Tensor | None, other: torch.Tensor | None
                   ) -> torch.Tensor | None:
    """:func:`where` of two uniform weights [*lead] (finite, >= 0), ``None`` standing for zeros: one op where one
    side is None (a weight times a bool is itself or +0, as the zeros ``torch.where`` would pick)."""
    if chosen is None and other is None:
        return None
    if chosen is None:
        fits = torch.broadcast_shapes(condition.shape, other.shape) == other.shape
        return other.masked_fill(condition, 0.0) if fits else other * ~condition
    return chosen * condition if other is None else torch.where(condition, chosen, other)


def mixture(first: Probs, second: Probs, weight: float) -> Probs:
    """``(1 - weight) * first + weight * second``, of one kind. Sparse: on the union of the supports (K1 + K2
    slots, ascending, a repeated id's second slot padding).

    >>> table = torch.zeros(5)
    >>> a = SparseProbs(torch.tensor([[1, 3]]), torch.tensor([[0.5, 0.5]]), None, table)
    >>> b = SparseProbs(torch.tensor([[0, 3]]), torch.tensor([[0.75, 0.25]]), None, table)
    >>> mixed = mixture(a, b, 0.5)
    >>> mixed.ids, mixed.probs  # id 3 is in both: 0.5 * 0.5 + 0.5 * 0.25
    (tensor([[0, 1, 3, 4]]), tensor([[0.3750, 0.2500, 0.3750, 0.0000]]))
    """
    if not isinstance(first, SparseProbs):
        return torch.lerp(first, second, weight)
    vocab = first.vocab_size
    ids = torch.cat([first.ids, second.ids], -1).sort(-1).values
    repeated = torch.nn.functional.pad(ids[..., 1:] == ids[..., :-1], (1, 0), value=False)
    ids = ids.masked_fill(repeated, vocab).sort(-1).values  # [*lead, K1 + K2], padding last
    lookup = ids.clamp(max=vocab - 1)  # a padding id looks up the last id: zeroed below

    def on_support(probs: SparseProbs) -> torch.Tensor:  # the support part only: the uniform parts mix apart
        return token_probs(SparseProbs(probs.ids, probs.probs, None, probs.table), lookup)

    probs = torch.lerp(on_support(first), on_support(second), weight).masked_fill(ids == vocab, 0.0)
    uniform = None if first.uniform is None and second.uniform is None else \
        torch.lerp(first.uniform_weight(), second.uniform_weight(), weight)
    return SparseProbs(ids, probs, uniform, first.table)


def expand_window(probs: Probs, size: int) -> Probs:
    """``probs`` [b, vocab] -> [b, size, vocab], the same distribution at every slot (a view)."""
    if not isinstance(probs, SparseProbs):
        return probs[:, None, :].expand(-1, size, -1)
    uniform = None if probs.uniform is None else probs.uniform[:, None].expand(-1, size)
    return SparseProbs(probs.ids[:, None].expand(-1, size, -1), probs.probs[:, None].expand(-1, size, -1), uniform,
                       probs.table)


def total_mass(probs: Probs) -> torch.Tensor:
    """[*lead] the total mass of ``probs`` [*lead, V] (NaN where its scores were all -inf/NaN)."""
    return (probs.probs if isinstance(probs, SparseProbs) else probs).sum(-1)


def to_dense(probs: Probs) -> torch.Tensor:
    return probs.dense() if isinstance(probs, SparseProbs) else probs


def same_kind(first: Probs, second: Probs) -> tuple[Probs, Probs]:
    """Both sparse, or both dense (an iteration whose support did not fit goes dense)."""
    if isinstance(first, SparseProbs) == isinstance(second, SparseProbs):
        return first, second
    return to_dense(first), to_dense(second)
