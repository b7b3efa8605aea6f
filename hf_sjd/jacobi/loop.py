"""The Jacobi decoding loop: draft -> forward -> verify -> commit -> redraft.

One iteration runs one model forward over ``[uncached token(s), d_1 .. d_L]`` for every active row and
commits, per row, the accepted drafts plus one more token:

* **accepted**: a draft that passed verification (its KV entry from this forward is kept);
* **recovered**: the token resampled at the first rejected position;
* **bonus**: the token drawn from position L+1 when the whole window was accepted.

With ``jacobi_siblings = m`` the forward also carries m *siblings* of the first draft, drawn without replacement
(``jacobi_sibling_sampling``) from its q or from a law that also reads the last committed position's target
(``jacobi_sibling_law``), and attending to the prefix only (a tree forward,
:meth:`RaggedCache.tree_attention_mask`). Where the first draft is rejected, the siblings are verified by recursive
rejection sampling (:func:`~hf_sjd.jacobi.verify.speculative.verify_siblings`); an accepted sibling commits itself
and a token drawn from the distribution after it, which the same forward computed. With ``jacobi_sibling_drafts = C``
the first sibling also carries C drafts of the window's next slots, drawn afresh from their q (a branch of the tree):
where it is the sibling accepted, they are verified behind it like a window of their own.

Rows commit different amounts (ragged), finished rows leave the batch, and the cache is rolled back
per row (:class:`~hf_sjd.jacobi.cache.RaggedCache`). The verifier and drafter are pluggable objects; the
model-specific parts (CFG prompt, how a forward yields logits) come from the model's adapter.

Where the processors bound the support (a top-k warper; greedy), p and q are kept on it
(:mod:`~hf_sjd.jacobi.distributions`), so verification, residuals, coupling and redraft cost O(k), not O(vocab).

The host reads the device once per iteration (:meth:`JacobiDecoder.commit_cache`: the next window size, the
cache bounds, whether a row finished); everything else, sampling included, stays on the device, so on a
GPU the loop queues its kernels behind the forward instead of waiting for each one. A sparse iteration reads
once more, right after the processors: whether every support fits the sparse width (else it goes dense).
The tensor work between those reads is two pure steps (:meth:`JacobiDecoder._verify_step`,
:meth:`JacobiDecoder._redraft_step`), which ``jacobi_compile=True`` fuses with ``torch.compile``
(:mod:`~hf_sjd.jacobi.compiled`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.logits_process import TopKLogitsWarper
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .cache import RaggedCache
from .compiled import CompiledStep
from .config import SJDConfig
from .distributions import (Probs, SparseProbs, expand_window, force_tokens, gather_window, same_kind, sample,
                            where)
from .drafting import Drafter, DraftWindow
from .processing import groups_by_length, is_prefix_free, process_window
from .state import Counters, DecodeState, Ending, ForwardTimer, ReadBack, recent_tokens
from .stats import JacobiStats
from .verify.base import Verifier, at_position
from .verify.speculative import verify_siblings
from .window import window_rule


@dataclass
class Commit:
    tokens: torch.Tensor  # [b, L+1] accepted drafts, then the recovered/bonus token, then junk
    count: torch.Tensor  # [b] tokens committed (prefix of ``tokens``)
    num_accepted: torch.Tensor  # [b] drafts accepted by the verifier
    finished: torch.Tensor  # [b] bool
    sibling: torch.Tensor | None = None  # [b] the accepted sibling of the first draft (jacobi_siblings), -1: none
    on_branch: torch.Tensor | None = None  # [b] bool: the first sibling was accepted and its branch drafts verified
    tree: tuple[int, int] = (0, 0)  # this forward's siblings and branch drafts (jacobi_sibling_drafts)

    def select_rows(self, rows: torch.Tensor) -> "Commit":
        sibling = None if self.sibling is None else self.sibling[rows]
        on_branch = None if self.on_branch is None else self.on_branch[rows]
        return Commit(self.tokens[rows], self.count[rows], self.num_accepted[rows], self.finished[rows], sibling,
                      on_branch, self.tree)


class JacobiDecoder:
    def __init__(self, model, adapter, config: SJDConfig, verifier: Verifier, drafter: Drafter,
                 logits_processor: LogitsProcessorList, stopping_criteria: StoppingCriteriaList,
                 generation_config: GenerationConfig, streamer=None,
                 window_plan: tuple[tuple[int, int], ...] | None = None) -> None:
        self.model, self.adapter, self.config = model, adapter, config
        self.window_plan = window_plan  # the auto window rule's (L, m) per number of rows left (config.resolved)
        self.verifier, self.drafter = verifier, drafter
        self.processors, self.generation_config, self.streamer = logits_processor, generation_config, streamer
        self.extra_stops = StoppingCriteriaList(
            [c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))])
        eos = generation_config._eos_token_tensor
        self.eos_ids = None if eos is None else eos.flatten()
        pad = generation_config._pad_token_tensor
        self.pad_id = int(pad) if pad is not None else 0
        self.guided = config.guided
        self.stats = JacobiStats()
        self.timer = ForwardTimer()
        self.sparse_width = self._sparse_width()
        drafter.sparse = self.sparse_width > 0
        # A trailing top-k warper is applied on the sparse candidates (the same rule, without a dense pass).
        last = logits_processor[-1] if len(logits_processor) else None
        fuse_top_k = (self.sparse_width > 1 and isinstance(last, TopKLogitsWarper)
                      and last.filter_value == float("-inf"))
        self.sparse_top_k = last.top_k if fuse_top_k else None
        self.dense_processors = LogitsProcessorList(logits_processor[:-1]) if fuse_top_k else logits_processor
        # the tensor steps between the device reads, fused by torch.compile under jacobi_compile (compiled.py)
        self.verify_step, self.redraft_step = self._verify_step, self._redraft_step
        self.num_siblings = config.jacobi_siblings  # the full batch's; the budget and auto rules change the rows
        # left's (sibling_count)
        self.num_sibling_drafts = config.jacobi_sibling_drafts  # after the first sibling, wherever there is one
        if self.num_siblings or any(m for _, m in window_plan or ()):
            self._check_siblings("jacobi_siblings")
        elif config.jacobi_window_rule == "budget" and config.jacobi_budget_siblings:
            self._check_siblings("jacobi_budget_siblings")
        if config.jacobi_compile:
            self.verify_step, self.redraft_step = CompiledStep(self._verify_step), CompiledStep(self._redraft_step)

    def _check_siblings(self, knob: str) -> None:
        """Siblings (asked for by ``knob``) are exact only under exact speculative verification, with drafts
        sampled from the q they are verified against, and need an attention that takes the tree forward's 4D
        mask."""
        if not self.verifier.siblings_ready:
            from .registry import VERIFIERS

            exact = " or ".join(repr(name) for name, verifier in VERIFIERS.items() if verifier.siblings_ready)
            raise ValueError(f"{knob} > 0 verifies siblings by recursive rejection sampling, which is exact "
                             f"only with exact speculative verification (verifier={exact}); got "
                             f"verifier={self.config.verifier!r}: set {knob}=0")
        if self.drafter.verify_unfused:
            raise ValueError(f"{knob} > 0 needs drafts sampled from the q they are verified against; the "
                             f"draft prior verifies against another distribution (verify_unfused): set {knob}=0")
        self.adapter.check_tree_attention(self.model, knob)

    def _sparse_width(self) -> int:
        """Support slots of the sparse distributions, or 0 (dense). Greedy targets are point masses (1). With a
        top-k warper the support is k plus the tokens tied with the k-th score (transformers keeps ties; bf16
        logits tie often), so 2k slots are kept; an iteration whose support does not fit goes dense."""
        if not (self.config.jacobi_sparse and self.verifier.sparse_ready and self.drafter.sparse_ready):
            return 0
        if not self.generation_config.do_sample:
            return 1
        top_k = [p.top_k for p in self.processors if isinstance(p, TopKLogitsWarper)]
        return 2 * min(top_k) if top_k else 0

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, uncached: torch.Tensor, window: DraftWindow, siblings: torch.Tensor | None = None,
                branch: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """One model forward over ``[uncached, drafts, siblings, branch]``: (guided logits [b, L+1+m+C, V] float32,
        slots appended). ``siblings`` [b, m] (or None) sit at the first draft's position and see only the prefix;
        ``branch`` [b, C] (or None) at slots 2 .. C + 1, behind the first sibling."""
        drafts = torch.cat([t for t in (window.tokens, siblings, branch) if t is not None], dim=1)
        drafts = torch.cat([drafts, drafts]) if self.guided else drafts
        input_ids = torch.cat([uncached, drafts], dim=1)  # [rows, W]
        width, num_siblings = input_ids.shape[1], 0 if siblings is None else siblings.shape[1]
        num_branch = 0 if branch is None else branch.shape[1]
        if num_siblings:
            allowed = self.cache.tree_attention_mask(width, num_siblings, num_branch)
            mask = self.adapter.tree_attention_mask(self.model, allowed)
            positions = self.cache.tree_position_ids(width, num_siblings, num_branch)
        else:
            mask, positions = self.cache.attention_mask(width), self.cache.position_ids(width)
        started = self.timer.start(input_ids.device)
        logits = self.adapter.window_logits(self.model, input_ids, attention_mask=mask, position_ids=positions,
                                            cache=self.cache.cache,
                                            num_logits=window.size + 1 + num_siblings + num_branch)
        self.timer.stop(started)
        self.stats.num_forward_passes += 1
        self.window_counts[window.size] += 1  # host ints: forwards by drafts per row
        logits = logits.float()
        if self.guided:  # u + g (c - u), in one kernel
            cond, uncond = logits.chunk(2)
            logits = torch.lerp(uncond, cond, self.config.guidance_scale)
        return logits, width

    def target_probs(self, logits: torch.Tensor, window: DraftWindow, siblings: torch.Tensor | None = None,
                     branch: torch.Tensor | None = None) -> tuple[Probs, Probs | None, Probs | None]:
        """Processed target distributions p [b, L+1, V] (dense, or on their support); point masses on the
        argmax for greedy decoding. With ``siblings`` [b, m], also the distributions after each sibling
        [b, m, V] (else None), and with ``branch`` [b, C] the branch's [b, C+1, V]: after the first sibling, then
        after each branch draft (else None), converted with the window's in one pass (one sparse-overflow read)."""
        state = self.state
        size = window.size + 1
        num_siblings = 0 if siblings is None else siblings.shape[1]
        lengths = state.prompt_length + state.num_new
        scores = process_window(self.dense_processors, logits[:, :size], state.tokens, lengths, window.tokens,
                                rows=state.rows)
        if siblings is not None:
            scores = torch.cat([scores, self._sibling_scores(logits[:, size:size + num_siblings], siblings, lengths)],
                               dim=1)
        if branch is not None:
            scores = torch.cat([scores, self._branch_scores(logits[:, size:], siblings[:, 0], branch, lengths)],
                               dim=1)
        table = self.drafter.uniform_q
        if not self.generation_config.do_sample:
            argmax = scores.argmax(-1)
            probs = (SparseProbs.point_masses(argmax, table) if self.sparse_width
                     else torch.nn.functional.one_hot(argmax, scores.shape[-1]).float())
        elif self.sparse_width:
            probs, overflow = SparseProbs.from_scores(scores, self.sparse_width, table, top_k=self.sparse_top_k)
            if overflow:  # a device read: the support may not fit (ties at the k-th score), so go dense
                if self.sparse_top_k is not None:
                    scores = self.processors[-1](None, scores)
                probs = scores.softmax(-1)
        else:
            probs = scores.softmax(-1)
        forced = self.adapter.structural_tokens(state.positions(size))  # [b, L+1] or None
        if forced is not None:
            if siblings is not None:  # a sibling's next token is at the first draft's next position
                forced = torch.cat([forced, forced[:, 1:2].expand(-1, num_siblings)], dim=1)
            if branch is not None:  # the token after branch draft t at slot t + 2
                forced = torch.cat([forced, forced[:, 2:2 + branch.shape[1]]], dim=1)
            probs = force_tokens(forced, probs)
        if siblings is None:
            return probs, None, None
        if branch is None:
            return probs[:, :size], probs[:, size:], None
        after_first = size + torch.cat([branch.new_zeros(1), num_siblings + self.state.offsets(branch.shape[1])])
        return probs[:, :size], probs[:, size:size + num_siblings], gather_window(probs, after_first.expand(
            branch.shape[0], -1))

    def _sibling_scores(self, logits: torch.Tensor, siblings: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Processed scores [b, m, V] after each sibling: position 1 of a window whose first draft is the sibling.
        Processors that read ``input_ids`` get one call per sibling (each has its own prefix)."""
        state = self.state
        if is_prefix_free(self.dense_processors):
            return process_window(self.dense_processors, logits, state.tokens, lengths, siblings, rows=state.rows)
        scores = []
        for i in range(siblings.shape[1]):
            window = torch.stack([torch.zeros_like(logits[:, i]), logits[:, i]], dim=1)  # position 0 is unused
            scores.append(process_window(self.dense_processors, window, state.tokens, lengths, siblings[:, i:i + 1],
                                         rows=state.rows)[:, 1])
        return torch.stack(scores, dim=1)

    def _branch_scores(self, logits: torch.Tensor, first_sibling: torch.Tensor, branch: torch.Tensor,
                       lengths: torch.Tensor) -> torch.Tensor:
        """Processed scores [b, C, V] after each branch draft (``logits`` [b, m + C, V]: the siblings', then the
        branch's), whose prefix is the committed tokens, the first sibling and the branch drafts up to it."""
        state, after_branch = self.state, logits[:, -branch.shape[1]:]
        if is_prefix_free(self.dense_processors):
            return process_window(self.dense_processors, after_branch, state.tokens, lengths, branch, rows=state.rows)
        # a window [first sibling, branch] whose positions 0 and 1 are unused: position t + 1 is after draft t
        window = torch.cat([torch.zeros_like(logits[:, :2]), after_branch], dim=1)
        drafts = torch.cat([first_sibling[:, None], branch], dim=1)
        return process_window(self.dense_processors, window, state.tokens, lengths, drafts, rows=state.rows)[:, 2:]

    # -- verify + commit ----------------------------------------------------------------------------
    def verify_and_commit(self, window: DraftWindow, target: Probs, siblings: torch.Tensor | None = None,
                          sibling_target: Probs | None = None, branch: torch.Tensor | None = None,
                          branch_target: Probs | None = None) -> Commit:
        state = self.state
        batch, size = window.tokens.shape
        draft_probs, target = same_kind(window.probs, target)  # dense both if one iteration went dense
        uniforms = torch.rand(batch, size, device=target.device)  # drawn here: compiled and eager steps agree
        sibling_uniforms = distinct = sibling_law = branch_uniforms = None
        if siblings is not None:
            sibling_uniforms = torch.rand(siblings.shape, device=target.device)
            _, sibling_target = same_kind(target, sibling_target)  # dense too if this iteration went dense
            sibling_law = window.sibling_source  # the siblings' law is of the kind of the window's q (one origin)
            distinct = self.drafter.distinct_siblings(sibling_law)  # from the law as drawn, not as densified
            _, sibling_law = same_kind(target, sibling_law)
        if branch is not None:
            branch_uniforms = torch.rand(branch.shape, device=target.device)
            _, branch_target = same_kind(target, branch_target)
        block, count, num_accepted, ending, finished, sibling, on_branch = self.verify_step(  # views of p: sliced
            window.tokens, draft_probs, target[:, :size], target[:, size], uniforms, state.remaining(),  # outside
            state.offsets(size + 1), siblings, sibling_target, sibling_uniforms, distinct, sibling_law, branch,
            branch_target, branch_uniforms)
        state.write(block, count)
        self.counters.add(count, num_accepted, ending)
        if self.streamer is not None:
            self.streamer.put(block[0, : int(count[0])].cpu())
        if len(self.extra_stops):
            finished |= self._stop_requested()
        tree = (0 if siblings is None else siblings.shape[1], 0 if branch is None else branch.shape[1])
        return Commit(block, count, num_accepted, finished, sibling, on_branch, tree)

    def _verify_step(self, drafts: torch.Tensor, draft_probs: Probs, target: Probs, bonus_probs: Probs,
                     uniforms: torch.Tensor, remaining: torch.Tensor, offsets: torch.Tensor,
                     siblings: torch.Tensor | None = None, sibling_target: Probs | None = None,
                     sibling_uniforms: torch.Tensor | None = None, distinct: bool | torch.Tensor | None = None,
                     sibling_law: Probs | None = None, branch: torch.Tensor | None = None,
                     branch_target: Probs | None = None, branch_uniforms: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor | None, ...]:
        """The tensor part of verify + commit (a pure function: ``torch.compile`` fuses it under
        ``jacobi_compile``): drafts [b, L], q [b, L, V], p [b, L, V] at the drafts and [b, V] after them,
        uniforms [b, L], remaining [b] (before this commit), offsets [L+1]; with siblings of the first draft,
        siblings [b, m], p after each [b, m, V], uniforms [b, m], the rows drawn without replacement
        (``distinct``, :func:`verify_siblings`) and the law they were drawn from [b, V]; with drafts after the
        first sibling, branch [b, C], p after the first sibling and after each branch draft [b, C+1, V], uniforms
        [b, C] -> block [b, L+1] (accepted drafts, then the recovered/bonus token), count [b], num_accepted [b],
        ending [b] (an :class:`~hf_sjd.jacobi.state.Ending`), finished [b] (``max_new_tokens`` or EOS), the
        accepted sibling [b] (-1: none; None without siblings), and whether the branch was verified [b] (None
        without a branch)."""
        batch, size = drafts.shape
        if size:
            result = self.verifier(drafts, draft_probs, target, uniforms)
            num_accepted, residual = result.num_accepted, result.residual_probs
        else:
            num_accepted, residual = torch.zeros(batch, dtype=torch.long, device=drafts.device), bonus_probs
        all_accepted = num_accepted == size
        next_probs, sibling, on_branch, ending = where(all_accepted, bonus_probs, residual), None, None, all_accepted
        if siblings is not None:  # where the first draft was rejected: its siblings, then the last residual
            rescued, index, residual = verify_siblings(residual, sibling_law, drafts[:, 0], siblings, distinct,
                                                       sibling_uniforms, num_accepted == 0)
            next_probs = where(rescued, at_position(sibling_target, index), where(all_accepted, bonus_probs, residual))
            first = torch.arange(size, device=drafts.device) == 0
            drafts = torch.where(rescued[:, None] & first, siblings.gather(1, index[:, None]), drafts)
            num_accepted = num_accepted + rescued.long()  # the sibling is the accepted first draft
            sibling, ending = torch.where(rescued, index, -1), all_accepted + Ending.SIBLING * rescued
        if branch is not None:  # behind an accepted first sibling, its drafts verified as a window of their own
            on_branch = sibling == 0
            drafts, next_probs, num_accepted, ending = self._verify_branch(
                on_branch, drafts, draft_probs, branch, branch_target, branch_uniforms, next_probs, num_accepted,
                ending)
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
        return block, count, num_accepted, ending, finished, sibling, on_branch

    def _verify_branch(self, on_branch: torch.Tensor, drafts: torch.Tensor, draft_probs: Probs,
                       branch: torch.Tensor, branch_target: Probs, uniforms: torch.Tensor, next_probs: Probs,
                       num_accepted: torch.Tensor, ending: torch.Tensor) -> tuple[torch.Tensor, Probs, ...]:
        """Where ``on_branch`` [b] (the first sibling was accepted), the branch drafts [b, C] take window slots
        2 .. C + 1 and are verified by the window's verifier against p behind the sibling (``branch_target`` [b,
        C+1, V], its last entry after the last draft: the bonus) with the window's q at those slots, which they
        were drawn from independently of the window's drafts (:meth:`Drafter.sibling_drafts`). Exact for the
        same reason a window is: given the sibling, they are draws from q that no earlier decision has read."""
        num_branch = branch.shape[1]
        result = self.verifier(branch, draft_probs[:, 1:num_branch + 1], branch_target[:, :num_branch], uniforms)
        whole = result.num_accepted == num_branch
        after_branch = where(whole, branch_target[:, num_branch], result.residual_probs)  # bonus | recovered
        slot = torch.arange(drafts.shape[1], device=drafts.device)
        at_branch = on_branch[:, None] & (slot >= 1) & (slot <= num_branch)  # [b, L]
        drafts = torch.where(at_branch, torch.nn.functional.pad(branch, (1, drafts.shape[1] - 1 - num_branch)),
                             drafts)
        return (drafts, where(on_branch, after_branch, next_probs),
                num_accepted + torch.where(on_branch, result.num_accepted, 0),
                torch.where(on_branch, Ending.BRANCH_RECOVERED + whole.long(), ending))

    def _stop_requested(self) -> torch.Tensor:
        """[b] bool: the user's stopping criteria, each row judged on its own prompt + committed tokens."""
        state = self.state
        tokens, stop = state.tokens[state.rows], torch.zeros(len(state.rows), dtype=torch.bool, device=state.rows.device)
        for length, rows in groups_by_length(state.lengths()):
            stop[rows] = self.extra_stops(tokens[rows, :length], None).to(stop.device)
        return stop

    def commit_cache(self, commit: Commit, num_uncached: int, appended: int) -> ReadBack:
        """Roll the cache back to what each row committed; returns the iteration's one read from the device.

        A row keeps the entries of its uncached token(s) and accepted drafts: a row that goes on committed them
        plus one token (fed next), and one that committed fewer (EOS, ``max_new_tokens``) leaves the cache
        right after. With guidance the cache rows are the batch twice (conditional, unconditional rows), which
        commit alike, so every per-row bound is read off the first copy."""
        state, finished = self.state, commit.finished
        if commit.sibling is not None:  # an accepted sibling's entry goes where the first draft's was
            source = self._promoted_slots(commit, num_uncached)
            self.cache.promote(torch.cat([source, source]) if self.guided else source, appended)
        valid = self.cache.plan(commit.num_accepted + num_uncached)  # [rows] cache slots valid after the commit
        first = slice(0, len(finished))  # [b] the first copy of the cache rows
        going_on = torch.stack([state.remaining(), valid[first]]).masked_fill(finished, 0)  # [2, b]
        parts = [going_on, valid[None, first], finished[None], self.cache.valid[None, first].neg()]
        wanted = None if self.window_rule is None else self.window_rule.update(commit.count)
        if wanted is not None:  # the adaptive rule's next width rides in the same read
            parts.append(wanted.masked_fill(finished, 0)[None])
        max_remaining, max_valid_unfinished, max_valid, any_finished, lowest, *window = \
            torch.cat(parts).amax(1).tolist()  # the read
        host = ReadBack(bool(any_finished), max_remaining, -lowest, max_valid, max_valid_unfinished, *window)
        self.cache.commit(valid, appended, lowest_valid=host.lowest_valid, max_valid=host.max_valid)
        return host

    def _promoted_slots(self, commit: Commit, num_uncached: int) -> torch.Tensor:
        """[b, 1 + C] the appended slots whose cache entries go to slots ``num_uncached + k`` (the window's first
        drafts): the accepted sibling's, then, on the branch, its drafts'; a slot's own index elsewhere."""
        num_siblings, num_branch = commit.tree
        window = num_uncached + commit.tokens.shape[1] - 1  # the first sibling's appended slot
        sibling = torch.where(commit.sibling >= 0, window + commit.sibling, num_uncached)[:, None]  # [b, 1]
        if not num_branch:
            return sibling
        own = num_uncached + 1 + self.state.offsets(num_branch)  # [C] the window's slots 2 .. C + 1
        branch = window + num_siblings + self.state.offsets(num_branch)  # [C] where the branch drafts were appended
        return torch.cat([sibling, torch.where(commit.on_branch[:, None], branch, own)], dim=1)

    @staticmethod
    def _after_siblings(target: Probs, sibling_target: Probs, branch_target: Probs | None, commit: Commit) -> Probs:
        """``target`` [b, L+1, V] with, where a sibling was accepted (``commit.sibling`` [b] >= 0), the distribution
        after it at slot 1, and on the branch those after its drafts at the slots it committed: the committed
        tokens' own distributions, which the drafter records (fresh drafts, the sibling law's last committed
        position). The slots past the commit keep the window's own targets, drafted behind the window's tokens:
        the next window is redrafted from them (from the branch's, behind its independent drafts, it did worse:
        ``docs/results/frontier_sibling_drafts``)."""
        sibling = commit.sibling
        slot = torch.arange(target.shape[1], device=sibling.device)
        after = at_position(sibling_target, sibling.clamp_min(0))  # [b, V]
        target = where((sibling >= 0)[:, None] & (slot == 1), expand_window(after, target.shape[1]), target)
        if branch_target is None:
            return target
        num_branch = branch_target.shape[1] - 1
        at_branch = (commit.on_branch[:, None] & (slot >= 2) & (slot <= num_branch + 1)
                     & (slot < commit.count[:, None]))  # [b, L+1] committed slots of the branch
        index = (slot - 1).clamp(0, num_branch).expand(len(sibling), -1)  # slot t + 1: after branch draft t
        return where(at_branch, gather_window(branch_target, index), target)

    # -- finished rows leave the batch ----------------------------------------------------------------
    def retire_finished(self, commit: Commit, host: ReadBack, window: DraftWindow, target: Probs
                        ) -> tuple[DraftWindow, Probs, Commit]:
        state = self.state
        # a row finishes once, so its forward count goes from 0 to the forwards so far (no bool-mask read)
        state.row_forwards.index_add_(0, state.rows, commit.finished * self.stats.num_forward_passes)
        keep = (~commit.finished).nonzero().squeeze(-1)  # a device read, in iterations where rows finish
        model_rows = torch.cat([keep, keep + len(state.rows)]) if self.guided else keep
        self.cache.select_rows(model_rows, max_valid=host.max_valid_unfinished)
        state.select_rows(keep)
        if self.window_rule is not None:
            self.window_rule.select_rows(keep)
        return window.select_rows(keep), target[keep], commit.select_rows(keep)

    # -- redraft --------------------------------------------------------------------------------------
    def window_size(self, max_remaining: int, wanted: int | None = None) -> int:
        """L (the window rule's width given the read max of ``wanted`` and the rows left, else ``jacobi_window``),
        shrunk near the end so no draft lies beyond ``max_new_tokens``."""
        width = (self.config.jacobi_window if self.window_rule is None
                 else self.window_rule.width(wanted, len(self.state.rows)))
        return max(0, min(width, max_remaining - 1))

    def _grid_inputs(self) -> tuple[torch.Tensor | None, ...]:
        """What the slots' positions and the drafter's grid context are computed from: (committed [b], lengths
        [b], rows [b], tokens [B, n], ``0 .. span - 1``), span = the recent tokens a grid-reading drafter sees;
        the last three are None for the other drafters (nothing computed for them)."""
        state = self.state
        if not self.drafter.needs_grid:
            return state.committed(), None, state.rows, None, None
        return (state.committed(), state.lengths(), state.rows, state.tokens,
                state.offsets(self.drafter.grid_width + 1))

    def _grid_context(self, committed: torch.Tensor, lengths: torch.Tensor | None, rows: torch.Tensor,
                      tokens: torch.Tensor | None, span: torch.Tensor | None) -> dict:
        """The ``recent`` tokens [b, len(span)] and ``num_generated`` [b] a grid-reading drafter gets (a function of
        tensors, so the compiled redraft fuses it); ``{}`` for the other drafters."""
        if not self.drafter.needs_grid:
            return {}
        return {"recent": recent_tokens(tokens, rows, lengths, span, self.pad_id), "num_generated": committed}

    def redraft(self, window: DraftWindow, target: Probs, commit: Commit, size: int
                ) -> tuple[DraftWindow, torch.Tensor | None, torch.Tensor | None]:
        """The next window of ``size`` slots, its first draft's siblings [b, m] (None without siblings) and the
        drafts after the first sibling [b, C] (None without them)."""
        num_siblings = self.sibling_count(size) if size else 0
        num_branch = min(self.num_sibling_drafts, size - 1) if num_siblings else 0
        return self.redraft_step(window, target, commit.count, self.state.offsets(size), *self._grid_inputs(),
                                 num_siblings=num_siblings, num_branch=num_branch)

    def sibling_count(self, size: int) -> int:
        """Siblings of the next forward's first draft: ``jacobi_siblings``, or the window rule's (the budget
        rule hands the rows left the tokens their capped window of ``size`` drafts leaves unused; the auto rule
        the cost model's count for the rows left)."""
        if self.window_rule is None:
            return self.num_siblings
        return self.window_rule.siblings(self.num_siblings, len(self.state.rows), size)

    def _redraft_step(self, window: DraftWindow, target: Probs, count: torch.Tensor, slots: torch.Tensor,
                      committed: torch.Tensor, lengths: torch.Tensor | None, rows: torch.Tensor,
                      tokens: torch.Tensor | None, span: torch.Tensor | None, num_siblings: int = 0,
                      num_branch: int = 0) -> tuple[DraftWindow, torch.Tensor | None, torch.Tensor | None]:
        """The redraft as a function of tensors (``torch.compile`` fuses it under ``jacobi_compile``): the
        drafter slides the window after each row committed ``count`` [b] into ``len(slots)`` new slots
        (``slots``: ``0, 1, ...``); the state after this commit (:meth:`_grid_inputs`) gives the slots' positions
        and the grid context. Then ``num_siblings`` siblings of the new first draft are drawn (from the law
        ``jacobi_sibling_law`` names, which may read the last committed position's target), and ``num_branch``
        drafts after the first of them (:meth:`Drafter.sibling_drafts`)."""
        positions = committed[:, None] + slots  # [b, size]
        window = self.drafter.slide(window, target, count, slots.shape[0], positions=positions, rows=rows,
                                    **self._grid_context(committed, lengths, rows, tokens, span))
        if not num_siblings:
            return window, None, None
        window = self.drafter.with_sibling_law(window, target, count)
        branch = self.drafter.sibling_drafts(window, num_branch) if num_branch else None
        return window, self.drafter.siblings(window, num_siblings), branch

    # -- the loop -------------------------------------------------------------------------------------
    def run(self, prompt: torch.Tensor, model_prompt: torch.Tensor, model_prompt_mask: torch.Tensor, cache
            ) -> tuple[torch.Tensor, JacobiStats]:
        """``prompt`` [B, P] as given (any padding side); ``model_prompt``/mask [M, P'] the forward's prompt rows
        (M = 2B with guidance: conditional rows, then unconditional rows)."""
        start = time.perf_counter()
        max_new = self.generation_config.max_length - prompt.shape[1]
        self.state = state = DecodeState.start(prompt, max_new, self.pad_id)
        self.counters = Counters(self.config.window_max(), prompt.device)
        self.cache = RaggedCache(cache, model_prompt_mask)
        self.window_rule = window_rule(self.config, prompt.shape[0], prompt.device, self.window_plan)  # None: fixed
        self.window_counts = [0] * (self.config.window_max() + 1)

        size = self.window_size(max_new)
        window = self.drafter.initial(prompt.shape[0], size, positions=state.positions(size),
                                      **self._grid_context(*self._grid_inputs()))
        # no siblings (nor their branch) in the prefill: its drafts are blind guesses
        uncached, siblings, branch = model_prompt, None, None
        while True:
            logits, appended = self.forward(uncached, window, siblings, branch)  # forward
            # [b, L+1, V], [b, m, V], [b, C+1, V]
            target, sibling_target, branch_target = self.target_probs(logits, window, siblings, branch)
            # verify + commit
            commit = self.verify_and_commit(window, target, siblings, sibling_target, branch, branch_target)
            host = self.commit_cache(commit, uncached.shape[1], appended)
            if commit.sibling is not None:
                target = self._after_siblings(target, sibling_target, branch_target, commit)
            if host.any_finished:
                window, target, commit = self.retire_finished(commit, host, window, target)
                if not len(state.rows):
                    break
            window, siblings, branch = self.redraft(window, target, commit,
                                                    self.window_size(host.max_remaining, host.window))
            uncached = state.last_tokens()
            if self.guided:
                uncached = torch.cat([uncached, uncached])

        if self.streamer is not None:
            self.streamer.end()
        stats = self._final_stats(start)
        return state.tokens[:, : state.prompt_length + int(stats.num_new_tokens.max())], stats

    def _final_stats(self, start: float) -> JacobiStats:
        stats, state = self.stats, self.state
        (stats.num_accepted, stats.num_recovered, stats.num_bonus, stats.num_siblings_accepted,
         stats.num_branch_accepted) = self.counters.per_kind.tolist()
        stats.tokens_per_forward = self.counters.tokens_per_forward.cpu()
        stats.commits_after = self.counters.commits_after.cpu()
        stats.forward_windows = torch.tensor(self.window_counts)
        stats.jacobi_window, stats.jacobi_siblings = self.config.jacobi_window, self.num_siblings
        stats.window_plan = self.window_plan
        stats.num_new_tokens = state.num_new.cpu()
        stats.row_forward_passes = state.row_forwards.cpu()
        stats.model_seconds = self.timer.total()
        stats.seconds = time.perf_counter() - start
        return stats
