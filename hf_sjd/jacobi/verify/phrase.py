"""SJD-PV phrase verification (arXiv:2603.06666): a drafted run that matches a library phrase
(:class:`~hf_sjd.PhraseLibrary`) is verified as a unit. The walk over one window, all rows at once:

* at the first unverified position ``s``, take the longest phrase ``v_1..v_m`` that matches: every ``v_k`` has
  ``p_{s+k}(v_k) >= tau`` and, with ``pv_match="exact"`` (default), equals the draft ``d_{s+k}``;
* accept the run iff ``log u < min(0, log R)``, ``log R = sum_k log p(d_k) - log q(d_k)``, then match again;
* else (or with no match) verify token by token with the base verifier through the run, then match again;
  stop at the first rejection.

The drafts are what is committed (a neighbourhood match only groups them). Not lossless: a run with one
unlikely token can pass jointly.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from ...checks import check_bool, check_choice, check_float, check_int
from ...phrases import PhraseLibrary, resolve_library
from ..constants import cached, offsets
from ..distributions import Probs
from ..options import ComponentOptions
from .base import VerificationResult, Verifier, accept_ratio, gather_tokens
from .speculative import SpeculativeVerifier

PV_MATCH_MODES = ("exact", "neighbourhood")


@dataclass(frozen=True)
class RunLayout:
    """What exact matching reads that depends on the window size only (shapes: L window slots, M = min(L, longest
    phrase) run lengths): built once per size, not once per iteration. Read-only."""

    length: torch.Tensor  # [M] 1 .. M: the run length of each step
    inside: torch.Tensor  # [L, M] bool: step m of the run from slot s lies in the window
    clamped: torch.Tensor  # [L, M] its window slot s + m, clamped into the window
    weight: torch.Tensor  # [M (m), M (i)] B^(m - i) for i <= m, else 0 (the hash of the run of length m + 1)
    after_end: torch.Tensor  # [M (m), M (i)] bool: token i lies past a run of length m + 1
    next_position: torch.Tensor  # [L, M] s + m + 1, clamped to L: where the run's prefix count is read
    candidate: torch.Tensor  # [L, M] bool: a run of at least 2 tokens inside the window

    @classmethod
    def build(cls, size: int, width: int, powers, device: torch.device) -> "RunLayout":
        step = offsets(width, device)
        position = offsets(size, device)[:, None] + step  # [L, M] window index of run token
        inside = position < size
        # hash of the run of length m + 1 starting at s: sum_{i <= m} (t_{s+i} + 1) B^(m-i)
        exponent = step[:, None] - step[None, :]  # [M (m), M (i)]
        weight = torch.where(exponent >= 0, powers(width)[exponent.clamp_min(0)], 0)
        length = step + 1
        return cls(length, inside, position.clamp(max=size - 1), weight, step >= length[:, None],
                   (position + 1).clamp(max=size), inside & (length >= 2))


class PhraseIndex:
    """A phrase library in model token ids, indexed by first token (CSR) and by hash.

    ==================  ==============  ======================================================
    name                shape           meaning
    ==================  ==============  ======================================================
    ``tokens``          [sum(lengths)]  every phrase's token ids, concatenated (never padded)
    ``lengths``         [P]             tokens per phrase
    ``starts``          [P]             where phrase i begins in ``tokens``
    ``by_first``        [P]             phrase ids sorted by first token
    ``offsets``         [vocab + 1]     start of each first token's block in ``by_first``
    ``sorted_hashes``   [P]             phrase hashes (:meth:`_hash_flat`), sorted; ``by_hash`` their owners
    ==================  ==============  ======================================================

    Nothing is padded beyond the window (:meth:`gather`): a phrase longer than the window never matches.
    """

    def __init__(self, phrases: torch.Tensor, lengths: torch.Tensor, vocab_size: int) -> None:
        """``phrases``: concatenated token ids [sum(lengths)], or a padded [P, M] table (-1 after each)."""
        phrases, self.lengths = phrases.long(), lengths.long().to(phrases.device)
        if phrases.ndim == 2:  # padded table -> ragged
            phrases = phrases[torch.arange(phrases.shape[1], device=phrases.device) < self.lengths[:, None]]
        if phrases.ndim != 1 or phrases.numel() != int(self.lengths.sum()):
            raise ValueError(f"phrases must hold sum(lengths) = {int(self.lengths.sum())} token ids, got shape "
                             f"{tuple(phrases.shape)}")
        self.tokens, self.starts = phrases, self.lengths.cumsum(0) - self.lengths
        first = self.tokens[self.starts]  # [P]
        self.by_first = torch.argsort(first, stable=True)
        counts = torch.bincount(first, minlength=vocab_size)
        self.offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        self.max_length = int(self.lengths.max()) if len(self.lengths) else 0
        self.hash_base = vocab_size + 1
        self.sorted_hashes, self.by_hash = self._hash_flat().sort(stable=True)
        self._layouts: dict[tuple, RunLayout] = {}  # (window size, device) -> the exact matcher's constants

    @classmethod
    def from_library(cls, library, code_to_token: torch.Tensor, vocab_size: int) -> "PhraseIndex":
        """``code_to_token`` [codebook]: the model token id of each code (:meth:`PhraseVerifier.from_config`).
        Built once per library and model: cached on the library, keyed on the map's content, device, ``vocab_size``."""
        ids = code_to_token.detach().to("cpu", torch.long).contiguous()
        key = (str(code_to_token.device), ids.numel(), hashlib.sha256(ids.numpy().tobytes()).hexdigest(), vocab_size)
        cache = library.__dict__.setdefault("_phrase_index_cache", {})
        if key not in cache:
            codes = library.codes.to(code_to_token.device)  # [sum(lengths)]
            if len(library) and int(codes.max()) >= code_to_token.numel():
                raise ValueError(f"the phrase library has codes up to {int(codes.max())}, but the model has only "
                                 f"{code_to_token.numel()} tokens they can stand for (its image tokens, the "
                                 f"draft_token_ids given, or its vocabulary)")
            cache[key] = cls(code_to_token[codes], library.lengths.to(code_to_token.device), vocab_size)
        return cache[key]

    def gather(self, phrase: torch.Tensor, width: int) -> torch.Tensor:
        """``phrase`` [*] ids -> their first ``min(width, max_length)`` tokens [*, W'], -1 after each phrase."""
        step = offsets(min(width, self.max_length), self.tokens.device)
        index = (self.starts[phrase][..., None] + step).clamp(max=max(len(self.tokens) - 1, 0))
        return torch.where(step < self.lengths[phrase][..., None], self.tokens[index], -1)

    def _hash_flat(self) -> torch.Tensor:
        """[P] polynomial hash (int64, wrapping) of each phrase: sum_i (t_i + 1) B^(len-1-i), B = vocab + 1.

        Digits are never 0, so phrases of different lengths do not collide before the int64 wraps (a collision
        after it can only hide a phrase: matches are checked token by token)."""
        tokens, lengths = self.tokens, self.lengths
        owner = torch.repeat_interleave(torch.arange(len(lengths), device=tokens.device), lengths)  # [sum(lengths)]
        exponent = (self.starts + lengths)[owner] - 1 - torch.arange(len(tokens), device=tokens.device)
        terms = (tokens + 1) * self._powers(self.max_length)[exponent]
        return torch.zeros(len(lengths), dtype=torch.long, device=tokens.device).index_add_(0, owner, terms)

    def _powers(self, count: int) -> torch.Tensor:
        """[count] B^0 .. B^(count-1) in wrapping int64 arithmetic (the same on every device)."""
        powers = torch.full((max(count, 1),), self.hash_base, dtype=torch.long, device=self.tokens.device)
        powers[0] = 1
        return powers.cumprod(0)

    def _run_layout(self, size: int, device: torch.device) -> "RunLayout":
        """The window's run constants (:class:`RunLayout`), built once per window size and device."""
        return cached(self._layouts, (size, device),
                      lambda: RunLayout.build(size, min(size, self.max_length), self._powers, device))

    def longest_matches(self, drafts: torch.Tensor, target_probs: torch.Tensor, tau: float, exact: bool,
                        p_draft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Longest matching phrase at every window offset: ``(length [b, L] (0: none), phrase id [b, L])``.

        Ties between equally long phrases go to the earlier merge (the more frequent pair)."""
        if exact:
            return self._longest_exact_matches(drafts, target_probs, tau, p_draft)
        return self._longest_neighbourhood_matches(drafts, target_probs, tau)

    def _longest_exact_matches(self, drafts: torch.Tensor, target_probs: torch.Tensor, tau: float,
                               p_draft: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact matching in fixed shapes (no device read): every run ``drafts[s : s + m]`` is hashed, looked up
        in the sorted phrase hashes and checked token by token."""
        size = drafts.shape[1]
        width = min(size, self.max_length)
        if width < 2:
            zeros = torch.zeros_like(drafts)
            return zeros, zeros
        layout = self._run_layout(size, drafts.device)
        length = layout.length
        runs = torch.where(layout.inside, drafts[:, layout.clamped], -1)  # [b, L, M]
        hashes = ((runs[:, :, None, :] + 1) * layout.weight).sum(-1)  # [b, L, M]
        slot = torch.searchsorted(self.sorted_hashes, hashes).clamp(max=len(self.sorted_hashes) - 1)
        phrase = self.by_hash[slot]  # [b, L, M] candidate of each (start, length)
        tokens = self.gather(phrase, width)  # [b, L, M, M]
        same = ((tokens == runs[:, :, None, :]) | layout.after_end).all(-1)  # token check: no collisions
        p_draft = gather_tokens(target_probs, drafts) if p_draft is None else p_draft  # [b, L] p(d)
        good = p_draft >= tau  # [b, L] drafts in the target's tau-neighbourhood
        bad_before = torch.nn.functional.pad((~good).long().cumsum(-1), (1, 0))  # [b, L + 1]
        all_good = bad_before[:, layout.next_position] == bad_before[:, :size, None]  # [b, L, M]
        matched = ((self.sorted_hashes[slot] == hashes) & (self.lengths[phrase] == length) & same & all_good
                   & layout.candidate)
        best = torch.where(matched, length, 0).max(-1)  # longest; one phrase per (start, length)
        return best.values, torch.where(best.values > 0, phrase.gather(-1, best.indices[..., None]).squeeze(-1), 0)

    def _longest_neighbourhood_matches(self, drafts: torch.Tensor, target_probs: torch.Tensor, tau: float
                                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Any token with p >= tau may start or continue a run, so the candidate (row, offset, phrase) triples
        are data-dependent: packed flat by cumulative counts (one device read to size them)."""
        batch, size = drafts.shape
        device, num_phrases = drafts.device, max(len(self.lengths), 1)
        cand_row, cand_pos, cand_first = (target_probs >= tau).nonzero(as_tuple=True)
        per_candidate = self.offsets[cand_first + 1] - self.offsets[cand_first]  # [C]
        owner = torch.repeat_interleave(torch.arange(len(per_candidate), device=device), per_candidate)  # [N]
        rank = torch.arange(len(owner), device=device) - (per_candidate.cumsum(0) - per_candidate)[owner]
        phrase = self.by_first[self.offsets[cand_first][owner] + rank]  # [N]
        row, start, length = cand_row[owner], cand_pos[owner], self.lengths[phrase]
        fits = start + length <= size
        row, start, length, phrase = row[fits], start[fits], length[fits], phrase[fits]

        tokens = self.gather(phrase, size)  # [N, M']
        step = torch.arange(tokens.shape[1], device=device)
        position = (start[:, None] + step).clamp(max=size - 1)
        ok = target_probs[row[:, None], position, tokens.clamp_min(0)] >= tau
        matched = (ok | (step >= length[:, None])).all(1)  # [N]

        key = torch.where(matched, length * num_phrases + (num_phrases - 1 - phrase), -1)
        best = torch.full((batch * size,), -1, dtype=torch.long, device=device)
        best.scatter_reduce_(0, row * size + start, key, reduce="amax")
        best = best.view(batch, size)
        length = torch.where(best >= 0, best // num_phrases, 0)
        return length, torch.where(best >= 0, num_phrases - 1 - best % num_phrases, 0)


@dataclass
class PhraseOptions(ComponentOptions):
    """SJD-PV's knobs (``pv_*``, ``phrase_library``), and the options of the per-token verifier it runs on."""

    PREFIX: ClassVar[str] = "pv_"
    SELECTS: ClassVar[dict[str, str]] = {"base_verifier": "base_options"}
    library: Any = field(default=None, metadata={"knob": "phrase_library"})  # None: the adapter's default
    tau: float = 0.01  # neighbourhood threshold p >= tau
    match: str = "exact"  # "exact" (phrase = drafts) | "neighbourhood"
    num_merges: int | None = None  # use the library's first M merges (None: all)
    base_verifier: str = "speculative"  # the per-token verifier (hf_sjd.jacobi.registry.per_token_verifiers)
    ignore_fingerprint: bool = False  # accept a library built for another tokenizer
    base_options: ComponentOptions | None = field(default=None, init=False)  # the base verifier's, set by the registry

    def validate(self) -> "PhraseOptions":
        """Every value, before the library is loaded (the base verifier is checked by the registry)."""
        if self.library is not None and not isinstance(self.library, (PhraseLibrary, str, Path)):
            raise ValueError(f"phrase_library must be a PhraseLibrary, a folder or a Hub repo id, got "
                             f"{type(self.library).__name__}")
        return PhraseOptions(
            library=self.library,
            tau=check_float("pv_tau", self.tau, minimum=0.0, maximum=1.0, low_open=True, high_open=True),
            match=check_choice("pv_match", self.match, PV_MATCH_MODES),
            num_merges=check_int("pv_num_merges", self.num_merges, minimum=1, allow_none=True),
            base_verifier=self.base_verifier,
            ignore_fingerprint=check_bool("pv_ignore_fingerprint", self.ignore_fingerprint))


class PhraseVerifier(Verifier):
    r"""SJD-PV (the module docstring's walk) over a per-token ``base`` verifier, whose residual it returns.

    Example (library: the phrase [1, 2]; the first draft alone would be rejected, the pair passes)::

        >>> import torch
        >>> from hf_sjd.jacobi.verify import SpeculativeVerifier
        >>> index = PhraseIndex(torch.tensor([[1, 2]]), torch.tensor([2]), vocab_size=3)
        >>> pv = PhraseVerifier(index, SpeculativeVerifier(), tau=0.1)
        >>> p = torch.tensor([[[0.1, 0.2, 0.7], [0.1, 0.1, 0.8]]])  # [batch, window, vocab]
        >>> q = torch.tensor([[[0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]])
        >>> drafts = torch.tensor([[1, 2]])  # p/q: 0.25 and 1.0 -> joint ratio 0.25
        >>> pv(drafts, q, p, torch.tensor([[0.5, 0.5]]), joint_uniforms=torch.tensor([[0.2, 0.9]])).num_accepted
        tensor([2])
        >>> SpeculativeVerifier()(drafts, q, p, torch.tensor([[0.5, 0.5]])).num_accepted
        tensor([0])
    """

    options_class = PhraseOptions

    def __init__(self, index: PhraseIndex, base: Verifier, tau: float = 0.01, match: str = "exact") -> None:
        options = PhraseOptions(tau=tau, match=match).validate()
        self.index, self.base, self.tau, self.exact = index, base, options.tau, match == "exact"
        self.sparse_ready = self.exact and base.sparse_ready  # neighbourhood matching scans dense p >= tau

    @classmethod
    def from_config(cls, config, adapter, draft_ids: torch.Tensor, options: PhraseOptions,
                    base_verifier: Verifier) -> "PhraseVerifier":
        library = resolve_library(options.library, adapter, ignore_fingerprint=options.ignore_fingerprint)
        if options.num_merges is not None:
            library = library.first(options.num_merges, name="pv_num_merges")
        # code c is the c-th image token; on a text model the c-th of the caller's draft_token_ids, else token c
        # (never the tokens this call's processors allow, which would move the codes with the processors)
        code_ids = adapter.draft_token_ids
        if code_ids is None:
            code_ids = config.draft_ids_tensor(adapter.vocab_size, draft_ids.device, keyed="phrase codes")
        if code_ids is None:
            code_ids = torch.arange(adapter.vocab_size)
        index = PhraseIndex.from_library(library, code_ids.to(draft_ids.device), adapter.vocab_size)
        return cls(index, base_verifier, tau=options.tau, match=options.match)

    def joint_log_ratio(self, drafts: torch.Tensor, draft_probs: Probs, target_probs: Probs,
                        length: torch.Tensor, p_draft: torch.Tensor | None = None,
                        q_draft: torch.Tensor | None = None) -> torch.Tensor:
        """[b, L]: per offset s, log R = sum over the run d_s .. d_{s+length-1} of log p(d) - log q(d) (``p_draft``,
        ``q_draft`` [b, L]: every draft's p(d) and q(d), if already read)."""
        size = drafts.shape[1]
        step = offsets(min(size, max(self.index.max_length, 1)), drafts.device)  # run offsets
        position = (offsets(size, drafts.device)[:, None] + step).clamp(max=size - 1)  # [L, M]
        p_draft = gather_tokens(target_probs, drafts) if p_draft is None else p_draft  # [b, L]
        q_draft = gather_tokens(draft_probs, drafts) if q_draft is None else q_draft
        # [b, L, M]: p of the drafts under each offset's run; log 0 = -inf, so a run holding a draft the processors
        # exclude (neighbourhood matching reads no draft's p) is never accepted jointly
        log_p = p_draft[:, position].log()
        log_q = q_draft[:, position].clamp_min(1e-30).log()
        return torch.where(step < length.unsqueeze(-1), log_p - log_q, 0.0).sum(-1)

    def __call__(self, drafts: torch.Tensor, draft_probs: Probs, target_probs: Probs,
                 uniforms: torch.Tensor, joint_uniforms: torch.Tensor | None = None) -> "PhraseVerificationResult":
        batch, size = drafts.shape
        device = drafts.device
        p_draft, q_draft = gather_tokens(target_probs, drafts), gather_tokens(draft_probs, drafts)  # [b, L] each
        length, phrase = self.index.longest_matches(drafts, target_probs, self.tau, self.exact,
                                                    p_draft=p_draft)  # [b, L] each
        log_ratio = self.joint_log_ratio(drafts, draft_probs, target_probs, length, p_draft, q_draft)
        if joint_uniforms is None:
            joint_uniforms = torch.rand(batch, size, device=device)
        joint = (length >= 2) & (joint_uniforms.clamp_min(1e-30).log() < log_ratio.clamp(max=0.0))

        if type(self.base) is SpeculativeVerifier:  # its acceptance_probs, from the p(d) and q(d) read above
            accept_prob = accept_ratio(p_draft, q_draft, p_draft)
        else:
            accept_prob = self.base.acceptance_probs(drafts, draft_probs, target_probs)
        token_ok = (uniforms <= accept_prob) & (accept_prob > 0)  # [b, L] per-token decisions
        start = offsets(size, device).expand(batch, -1)
        # [b, L] the first per-token rejection at or after each slot (L if none)
        next_fail = torch.where(token_ok, size, start).flip(-1).cummin(-1).values.flip(-1)

        # State graph: 0..L-1 "verify from s", L "window done", L+1+r "rejected at r"; pointer jumping
        # (log2(L) gathers) follows it instead of a loop over the window.
        run = torch.where(length >= 2, length, 1)
        per_token = torch.where(next_fail < start + run, size + 1 + next_fail, start + run)
        step = torch.where(joint, start + length, per_token)
        graph = offsets(2 * size + 1, device).repeat(batch, 1)  # terminals point to themselves (a copy: written)
        graph[:, :size] = step
        for _ in range(max(1, math.ceil(math.log2(size + 1)))):
            graph = graph.gather(1, graph)
        final = graph[:, 0]  # [b]
        num_accepted = torch.where(final == size, size, final - size - 1)
        residual = self.base.residual_at(drafts, draft_probs, target_probs, num_accepted.clamp(max=size - 1))
        return PhraseVerificationResult(num_accepted=num_accepted, residual_probs=residual,
                                        runs=(step, torch.where(joint, phrase, -1)))


@dataclass
class PhraseVerificationResult(VerificationResult):
    """Plus ``runs = (walk, phrase)`` [b, L] each, for :meth:`hf_sjd.jacobi.stats.CommitMap.from_log`: the state
    the walk moves to from each slot, and the phrase whose run from it passed jointly (-1: none)."""

    runs: tuple[torch.Tensor, torch.Tensor] | None = None

