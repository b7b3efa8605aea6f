"""The Jacobi decoding loop: draft -> forward -> verify -> commit -> redraft.

One iteration runs one forward over ``[uncached token(s), d_1 .. d_L, m siblings of d_1]`` per active row and
commits the accepted drafts plus a *recovered* token (resampled at the first rejection) or a *bonus* token (after a
fully accepted window). Rows commit different amounts and leave the batch as they finish (``RaggedCache``).

Host reads: one per iteration (:meth:`JacobiDecoder.commit_cache`), and in a sparse iteration one more after the
processors (whether every support fits). The tensor work between them is two pure steps (``_verify_step``,
``_redraft_step``) that ``jacobi_compile=True`` fuses with ``torch.compile``: dynamic shapes (no recompiles as rows
leave) and ``fallback_random`` (the eager step's random numbers, so the same tokens). The steps specialise on the
window's width, so only the plan's widths run compiled; the shrunk windows of a call's last iterations run eager.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.logits_process import TopKLogitsWarper

from ..timing import ForwardTimer
from .cache import RaggedCache
from .config import SJDConfig
from .cost_model import AUTO
from .distributions import (Probs, SparseProbs, expand_window, force_tokens, greedy_targets, same_kind, sample,
                            total_mass, where)
from .drafting import Drafter, DraftWindow
from .processing import (is_prefix_free, is_shift_free, marks_no_law, no_law_error, process_window,
                         with_faster_equivalents)
from .state import CommitLog, DecodeState, Ending, ReadBack
from .stops import UserStops
from .stats import JacobiStats
from .verify.base import Verifier, at_position
from .verify.speculative import verify_siblings


#: ``jacobi_sparse="auto"`` keeps p and q sparse where the support width is at most 1/16 of the vocabulary: on
#: narrower vocabularies the dense ops cost less than the support's top-k, sort and lookups (docs/results/sparse)
SPARSE_MIN_RATIO = 16


_UNCOMPILABLE: set[str] = set()  # steps this process's torch failed to compile: not tried again in later calls


def compiled_or_eager(step):
    """``torch.compile`` of a pure loop step that runs the step itself from the first time this torch fails to
    compile it (with a warning naming the error; inductor has refused lowerings that other releases take), in this
    call and every later one (dynamo does not cache a failed compile: each call would pay the attempt again). A step
    traces to one graph (no graph break), compiled before any of it runs, and reads only its arguments and the random
    state, so the eager call that follows returns what the eager loop would."""
    name = step.__qualname__
    compiled = step if name in _UNCOMPILABLE else torch.compile(step, dynamic=True, options={"fallback_random": True})

    def run(*args, **kwargs):
        nonlocal compiled
        try:  # past dynamo's recompile_limit a step would run eagerly without a word: raised here, and said
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                return compiled(*args, **kwargs)
        except (torch._dynamo.exc.BackendCompilerFailed, torch._dynamo.exc.FailOnRecompileLimitHit) as error:
            inner = getattr(error, "inner_exception", error)
            warnings.warn(f"jacobi_compile: torch {torch.__version__} could not compile {step.__name__} "
                          f"({type(inner).__name__}: {(str(inner).strip().splitlines() or [''])[0]}); "
                          "it runs eagerly from now on", RuntimeWarning, stacklevel=2)
            _UNCOMPILABLE.add(name)
            compiled = step
            return step(*args, **kwargs)

    return run


@dataclass
class Commit:
    tokens: torch.Tensor  # [b, L+1] accepted drafts, then the recovered/bonus token, then junk
    count: torch.Tensor  # [b] tokens committed (prefix of ``tokens``)
    num_accepted: torch.Tensor  # [b] drafts accepted by the verifier
    finished: torch.Tensor  # [b] bool
    undefined: torch.Tensor  # [b, L+1] bool: committed tokens whose law is undefined (the processors allow nothing)
    sibling: torch.Tensor | None = None  # [b] the accepted sibling of the first draft (jacobi_siblings), -1: none

    def select_rows(self, rows: torch.Tensor) -> "Commit":
        return Commit(*(None if value is None else value[rows] for value in vars(self).values()))


class JacobiDecoder:
    def __init__(self, model, adapter, config: SJDConfig, verifier: Verifier, drafter: Drafter,
                 logits_processor: LogitsProcessorList, stopping_criteria: StoppingCriteriaList,
                 generation_config: GenerationConfig, streamer=None) -> None:
        """``config`` is resolved for this call (:meth:`SJDConfig.for_call`: its ``plan`` is set)."""
        self.model, self.adapter, self.config = model, adapter, config
        self.verifier, self.drafter = verifier, drafter
        self.processors, self.generation_config, self.streamer = logits_processor, generation_config, streamer
        self.stopping_criteria = stopping_criteria
        eos = generation_config._eos_token_tensor
        self.eos_ids = None if eos is None else eos.flatten()
        pad = generation_config._pad_token_tensor
        self.pad_id = int(pad) if pad is not None else 0
        self.guided, self.shift_free = config.guided, is_shift_free(logits_processor)
        self.timer = ForwardTimer()
        self.sparse_width = self._sparse_width()
        drafter.sparse = self.sparse_width > 0
        # A trailing top-k warper (its exact class) is applied on the sparse candidates (the same rule, no dense pass).
        last = logits_processor[-1] if len(logits_processor) else None
        fuse_top_k = (self.sparse_width > 1 and type(last) is TopKLogitsWarper
                      and last.filter_value == float("-inf"))
        self.sparse_top_k = last.top_k if fuse_top_k else None
        self.dense_processors = with_faster_equivalents(logits_processor[:-1] if fuse_top_k else logits_processor)
        self.prefix_free = is_prefix_free(self.dense_processors)  # the processors read no prefix (no lengths)
        self.marks_no_law = marks_no_law(self.dense_processors)  # greedy reads a NaN row as no law too
        self.eager_steps = (self._verify_step, self._redraft_step)
        self.fused_steps = {}  # window width -> the steps compiled (module docstring)
        if config.jacobi_compile:
            fused = tuple(compiled_or_eager(step) for step in self.eager_steps)
            self.fused_steps = dict.fromkeys({window for window, _ in config.plan}, fused)

    def _sparse_width(self) -> int:
        """Support slots of the sparse distributions, or 0 (dense): 1 for greedy point masses; 2k under a top-k
        warper (transformers keeps ties at the k-th score); an iteration whose support does not fit goes dense.
        ``jacobi_sparse="auto"``: dense where the width exceeds 1/:data:`SPARSE_MIN_RATIO` of the vocabulary."""
        if not (self.config.jacobi_sparse and self.verifier.sparse_ready and self.drafter.sparse_ready):
            return 0
        top_k = [p.top_k for p in self.processors if isinstance(p, TopKLogitsWarper)]
        width = 1 if not self.generation_config.do_sample else 2 * min(top_k) if top_k else 0
        vocab = self.drafter.uniform_q.numel() - 1
        return 0 if self.config.jacobi_sparse == AUTO and width * SPARSE_MIN_RATIO > vocab else width

    # -- forward ------------------------------------------------------------------------------------------------
    def forward(self, uncached: torch.Tensor, window: DraftWindow, siblings: torch.Tensor | None
                ) -> tuple[torch.Tensor, int]:
        """One forward over ``[uncached, drafts, siblings]``: (guided logits [b, L+1+m, V], slots appended)."""
        drafts = window.tokens if siblings is None else torch.cat([window.tokens, siblings], dim=1)
        drafts = torch.cat([drafts, drafts]) if self.guided else drafts
        input_ids = torch.cat([uncached, drafts], dim=1)  # [rows, W]
        width, num_siblings = input_ids.shape[1], 0 if siblings is None else siblings.shape[1]
        if num_siblings:
            mask = self.adapter.tree_attention_mask(self.model, self.cache.tree_attention_mask(width, num_siblings))
            positions = self.cache.tree_position_ids(width, num_siblings)
        else:
            mask, positions = self.cache.attention_mask(width), self.cache.position_ids(width)
        started = self.timer.start(input_ids.device)
        logits = self.adapter.window_logits(self.model, input_ids, attention_mask=mask, position_ids=positions,
                                            cache=self.cache.cache, num_logits=window.size + 1 + num_siblings)
        self.timer.stop(started)
        logits = self.adapter.guide(logits, self.config.guidance_scale if self.guided else None, self.shift_free)
        return self.adapter.restrict_logits(logits), width

    def target_probs(self, logits: torch.Tensor, window: DraftWindow, siblings: torch.Tensor | None
                     ) -> tuple[Probs, Probs | None]:
        """Processed targets p [b, L+1, V] and the distributions after each sibling [b, m, V] (or None)."""
        state = self.state
        size = window.size + 1
        lengths = None if self.prefix_free else state.prompt_length + state.num_new  # (prefix-free: not read)
        if siblings is None or self.prefix_free:  # the siblings' positions too, in one call (prefixes not read)
            scores = process_window(self.dense_processors, logits, state.tokens, lengths, window.tokens,
                                    rows=state.rows)
        else:
            scores = torch.cat([process_window(self.dense_processors, logits[:, :size], state.tokens, lengths,
                                               window.tokens, rows=state.rows),
                                self._sibling_scores(logits[:, size:], siblings, lengths)], dim=1)
        table = self.drafter.uniform_q
        if not self.generation_config.do_sample:
            probs = greedy_targets(scores, table, sparse=self.sparse_width > 0, marked=self.marks_no_law)
        elif self.sparse_width:
            probs, overflow = SparseProbs.from_scores(scores, self.sparse_width, table, top_k=self.sparse_top_k)
            if overflow:  # a device read: the support may not fit (ties at the k-th score), so go dense
                if self.sparse_top_k is not None:
                    scores = self.processors[-1](None, scores)
                probs = scores.softmax(-1).float()
        else:
            probs = scores.softmax(-1).float()  # (in the dtype vanilla sampling softmaxes in)
        forced = self.adapter.structural_tokens(state.positions(size))  # [b, L+1] or None
        if forced is not None:
            if siblings is not None:  # a sibling's next token is at the first draft's next position
                forced = torch.cat([forced, forced[:, 1:2].expand(-1, siblings.shape[1])], dim=1)
            probs = force_tokens(forced, probs)
        if siblings is None:
            return probs, None
        return probs[:, :size], probs[:, size:]

    def _sibling_scores(self, logits: torch.Tensor, siblings: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Processed scores [b, m, V] after each sibling (position 1 of a window whose first draft it is)."""
        state = self.state
        scores = []
        for i in range(siblings.shape[1]):
            window = torch.stack([torch.zeros_like(logits[:, i]), logits[:, i]], dim=1)  # position 0 is unused
            scores.append(process_window(self.dense_processors, window, state.tokens, lengths, siblings[:, i:i + 1],
                                         rows=state.rows)[:, 1])
        return torch.stack(scores, dim=1)

    # -- verify + commit ----------------------------------------------------------------------------------------
    def verify_and_commit(self, window: DraftWindow, target: Probs, siblings: torch.Tensor | None,
                          sibling_target: Probs | None) -> Commit:
        state = self.state
        batch, size = window.tokens.shape
        draft_probs, target = same_kind(window.probs, target)  # dense both if one iteration went dense
        uniforms = torch.rand(batch, size, device=target.device)  # drawn here: compiled and eager steps agree
        sibling_uniforms = distinct = sibling_law = None
        if siblings is not None:
            sibling_uniforms = torch.rand(siblings.shape, device=target.device)
            _, sibling_target = same_kind(target, sibling_target)  # dense too if this iteration went dense
            sibling_law = window.sibling_source  # the siblings' law is of the kind of the window's q (one origin)
            distinct = self.drafter.distinct_siblings(sibling_law)  # from the law as drawn, not as densified
            _, sibling_law = same_kind(target, sibling_law)
        verify_step, _ = self.fused_steps.get(size, self.eager_steps)
        block, count, num_accepted, ending, finished, undefined, sibling, runs = verify_step(  # views of p: sliced
            window.tokens, draft_probs, target[:, :size], target[:, size], uniforms, state.remaining(),
            state.offsets(size + 1), siblings, sibling_target, sibling_uniforms, distinct, sibling_law)
        if self.stops:
            count, finished, undefined = self.stops.apply(state, block, count, finished, undefined)
            undefined &= state.offsets(size + 1) < count[:, None]
        state.write(block, count)
        self.log.add((size, 0 if siblings is None else siblings.shape[1]), count, num_accepted, ending, state.rows,
                     runs)  # the per-token map's columns, one op
        if self.streamer is not None:  # one [1] tensor per token, as transformers' loop puts them (batch 1)
            for token in block[0, : int(count[0])].cpu():
                self.streamer.put(token[None])
        return Commit(block, count, num_accepted, finished, undefined, sibling)

    def _verify_step(self, drafts: torch.Tensor, draft_probs: Probs, target: Probs, bonus_probs: Probs,
                     uniforms: torch.Tensor, remaining: torch.Tensor, offsets: torch.Tensor,
                     siblings: torch.Tensor | None = None, sibling_target: Probs | None = None,
                     sibling_uniforms: torch.Tensor | None = None, distinct: bool | torch.Tensor | None = None,
                     sibling_law: Probs | None = None) -> tuple[torch.Tensor | None, ...]:
        """Verify + commit as a pure function of tensors (``jacobi_compile`` fuses it). In: drafts [b, L], q and
        p [b, L, V], p after the window [b, V], uniforms [b, L], remaining [b], offsets [L+1]; with siblings [b, m],
        p after each [b, m, V], their uniforms, ``distinct`` and law (:func:`verify_siblings`). Out: block [b, L+1]
        (accepted drafts, then the recovered/bonus token), count, num_accepted, ending (an
        :class:`~hf_sjd.jacobi.state.Ending`), finished (EOS or ``max_new_tokens``), undefined [b, L+1] (committed
        tokens whose law is all -inf/NaN), the accepted sibling [b] (-1: none), the verifier's runs (phrases)."""
        batch, size = drafts.shape
        if size:
            result = self.verifier(drafts, draft_probs, target, uniforms)
            num_accepted, residual, runs = result.num_accepted, result.residual_probs, getattr(result, "runs", None)
        else:
            num_accepted, residual, runs = torch.zeros(batch, dtype=torch.long, device=drafts.device), bonus_probs, None
        all_accepted = num_accepted == size
        next_probs, sibling, ending = where(all_accepted, bonus_probs, residual), None, all_accepted
        if siblings is not None:  # where the first draft was rejected: its siblings, then the last residual
            rescued, index, residual = verify_siblings(residual, sibling_law, drafts[:, 0], siblings, distinct,
                                                       sibling_uniforms, num_accepted == 0)
            next_probs = where(rescued, at_position(sibling_target, index), where(all_accepted, bonus_probs, residual))
            first = torch.arange(size, device=drafts.device) == 0
            drafts = torch.where(rescued[:, None] & first, siblings.gather(1, index[:, None]), drafts)
            num_accepted = num_accepted + rescued.long()  # the sibling is the accepted first draft
            sibling, ending = torch.where(rescued, index, -1), all_accepted + (index + Ending.SIBLING) * rescued
        next_token = sample(next_probs)
        block = torch.cat([drafts, next_token[:, None]], dim=1)  # [b, L+1]
        block.scatter_(1, num_accepted[:, None], next_token[:, None])
        count = torch.minimum(num_accepted + 1, remaining)
        finished = count >= remaining  # max_new_tokens reached
        if self.eos_ids is not None:
            is_eos = torch.isin(block, self.eos_ids) & (offsets < count[:, None])
            hit_eos = is_eos.any(1)
            count = torch.where(hit_eos, is_eos.int().argmax(1) + 1, count)
            finished = finished | hit_eos
        # a committed token whose law is undefined (every score -inf/NaN: softmax gives NaN) is refused later
        # [b, L+1]: slot j < num_accepted holds p_j's, slot num_accepted the next token's (later slots: not committed)
        next_mass = total_mass(next_probs)[:, None]
        law_mass = torch.cat([total_mass(target), next_mass], dim=1).scatter_(1, num_accepted[:, None], next_mass)
        undefined = law_mass.isnan() & (offsets < count[:, None])
        return block, count, num_accepted, ending, finished, undefined, sibling, runs

    def commit_cache(self, commit: Commit, num_uncached: int, appended: int) -> ReadBack:
        """Keep each row's cache entries of its uncached token(s) and accepted drafts (an accepted sibling's replaces
        the first draft's); returns the iteration's one device read (off the first copy of guided rows)."""
        state, finished = self.state, commit.finished
        valid = self.cache.plan(commit.num_accepted + num_uncached)  # [rows] cache slots valid after the commit
        first = slice(0, len(finished))  # [b] the first copy of the cache rows
        going_on = torch.stack([state.remaining(), valid[first]]).masked_fill(finished, 0)  # [2, b]
        parts = [going_on, valid[None, first], finished[None], self.cache.valid[None, first].neg(),
                 commit.undefined.any(1)[None]]
        if commit.sibling is not None:
            parts.append(commit.sibling[None] + 1)  # > 0 where a sibling was accepted
        max_remaining, max_valid_unfinished, max_valid, any_finished, lowest, undefined, *sibling = \
            torch.cat(parts).amax(1).tolist()  # the read
        if undefined:
            self._refuse_undefined(commit)
        host = ReadBack(bool(any_finished), max_remaining, -lowest, max_valid, max_valid_unfinished,
                        bool(sibling and sibling[0]))
        if host.any_sibling:  # the accepted sibling's appended slot, or the first draft's own (a no-op copy)
            first_sibling = num_uncached + commit.tokens.shape[1] - 1
            source = torch.where(commit.sibling >= 0, first_sibling + commit.sibling, num_uncached)
            self.cache.promote(torch.cat([source, source]) if self.guided else source, appended)
        self.cache.commit(valid, appended, lowest_valid=host.lowest_valid, max_valid=host.max_valid)
        return host

    def _refuse_undefined(self, commit: Commit) -> None:
        """Raise, as transformers' sampling does, where the processors left a committed token no finite score."""
        row, slot = commit.undefined.nonzero()[0].tolist()  # the error path: reads are free here
        position = int(self.state.committed()[row] - commit.count[row]) + slot
        raise no_law_error(self.processors, int(self.state.rows[row]), position)

    @staticmethod
    def _after_sibling(target: Probs, sibling_target: Probs, commit: Commit) -> Probs:
        """``target`` [b, L+1, V] with, where a sibling was accepted, the distribution after it at slot 1."""
        sibling = commit.sibling
        slot = torch.arange(target.shape[1], device=sibling.device)
        after = at_position(sibling_target, sibling.clamp_min(0))  # [b, V]
        return where((sibling >= 0)[:, None] & (slot == 1), expand_window(after, target.shape[1]), target)

    def retire_finished(self, commit: Commit, host: ReadBack, window: DraftWindow, target: Probs
                        ) -> tuple[DraftWindow, Probs, Commit]:
        """Finished rows leave the batch (state, cache, window), so they cost no more compute."""
        state = self.state
        # a row finishes once, so its forward count goes from 0 to the forwards so far (no bool-mask read)
        state.row_forwards.index_add_(0, state.rows, commit.finished * self.timer.count)
        keep = (~commit.finished).nonzero().squeeze(-1)  # a device read, in iterations where rows finish
        if len(keep):  # (the last rows' entries stay: the caller's cache, for a call that continues from it)
            self.cache.select_rows(torch.cat([keep, keep + len(state.rows)]) if self.guided else keep,
                                   max_valid=host.max_valid_unfinished)
        state.select_rows(keep)
        return window.select_rows(keep), target[keep], commit.select_rows(keep)

    # -- redraft ------------------------------------------------------------------------------------------------
    def cell(self, max_remaining: int) -> tuple[int, int]:
        """(drafts, siblings) of the next forward: the plan's cell for the rows left, shrunk near the end."""
        window, siblings = self.config.plan[len(self.state.rows) - 1]
        size = max(0, min(window, max_remaining - 1))
        if self.slot_limit is not None:  # keys after the forward: the slots, the uncached token (or prompt), drafts
            uncached = self.cache.num_slots + 1 if self.cache.num_slots else self.cache.prompt_length
            size = max(0, min(size, self.slot_limit - uncached))
        return size, siblings if size else 0

    def redraft(self, window: DraftWindow, target: Probs, commit: Commit, max_remaining: int
                ) -> tuple[DraftWindow, torch.Tensor | None]:
        """The next window and its first draft's siblings [b, m] (None without siblings)."""
        size, num_siblings = self.cell(max_remaining)
        state = self.state
        _, redraft_step = self.fused_steps.get(size, self.eager_steps)
        return redraft_step(window, target, commit.count, state.offsets(size), state.committed(), state.rows,
                            num_siblings=num_siblings)

    def _redraft_step(self, window: DraftWindow, target: Probs, count: torch.Tensor, slots: torch.Tensor,
                      committed: torch.Tensor, rows: torch.Tensor, num_siblings: int = 0
                      ) -> tuple[DraftWindow, torch.Tensor | None]:
        """The redraft as a pure function of tensors (``jacobi_compile`` fuses it): slide the window past the
        ``count`` [b] committed tokens into ``len(slots)`` slots, then draw the new first draft's siblings."""
        window = self.drafter.slide(window, target, count, slots.shape[0], positions=committed[:, None] + slots,
                                    rows=rows, num_generated=committed)
        if not num_siblings:
            return window, None
        window = self.drafter.with_sibling_law(window, target, count)
        return window, self.drafter.siblings(window, num_siblings)

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self, prompt: torch.Tensor, model_prompt: torch.Tensor, model_prompt_mask: torch.Tensor,
            position_mask: torch.Tensor | None = None, *, cache) -> tuple[torch.Tensor, JacobiStats]:
        """``prompt`` [B, P] as given; ``model_prompt``/mask [M, P'] the forward's rows (M = 2B with guidance),
        ``position_mask`` [M, P'] what their positions count (None: the mask; :class:`RaggedCache`)."""
        start = time.perf_counter()
        max_new = self.generation_config.max_length - prompt.shape[1]
        self.state = state = DecodeState.start(prompt, max_new, self.pad_id)
        self.log = CommitLog(prompt.device)
        self.stops = UserStops(self.stopping_criteria, self.processors)
        self.cache = RaggedCache(cache, model_prompt_mask, max_new, position_mask)
        # slot-measured attention (the aligned layout) indexes tables by slot: a forward's keys stay below their end
        self.slot_limit = self.adapter.position_limit(self.model) if self.cache.aligned else None

        # the prefill's drafts are blind guesses: no siblings, and none after a right-padded row (its last slot's
        # query may see no real key, all padding in a sliding window, and then spreads over every key, drafts too)
        size = self.cell(max_new)[0] if bool(model_prompt_mask[:, -1].all()) else 0
        window = self.drafter.initial(prompt.shape[0], size, positions=state.positions(size),
                                      num_generated=state.committed())
        uncached, siblings = model_prompt, None
        while True:
            logits, appended = self.forward(uncached, window, siblings)  # forward
            target, sibling_target = self.target_probs(logits, window, siblings)  # [b, L+1, V], [b, m, V]
            commit = self.verify_and_commit(window, target, siblings, sibling_target)  # verify + commit
            host = self.commit_cache(commit, uncached.shape[1], appended)
            if host.any_sibling:
                target = self._after_sibling(target, sibling_target, commit)
            if host.any_finished:
                window, target, commit = self.retire_finished(commit, host, window, target)
                if not len(state.rows):
                    break
            window, siblings = self.redraft(window, target, commit, host.max_remaining)  # redraft
            uncached = state.last_tokens()
            if self.guided:
                uncached = torch.cat([uncached, uncached])

        if self.streamer is not None:
            self.streamer.end()
        if self.stops.cut:
            self.log.cut(state.num_new)
        plan = self.config.plan
        stats = JacobiStats.from_log(
            self.log, num_forward_passes=self.timer.count, num_new_tokens=state.num_new.cpu(),
            row_forward_passes=state.row_forwards.cpu(), jacobi_window=self.config.jacobi_window,
            jacobi_siblings=self.config.jacobi_siblings, window_plan=plan if len(set(plan)) > 1 else None,
            model_seconds=self.timer.total(), seconds=time.perf_counter() - start)
        return state.tokens[:, : state.prompt_length + int(stats.num_new_tokens.max())], stats
