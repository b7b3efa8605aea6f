"""The Jacobi decoding loop: draft -> forward -> verify -> commit -> redraft.

One iteration runs one model forward over ``[uncached token(s), d_1 .. d_L]`` for every active row and
commits, per row, the accepted drafts plus one more token:

* **accepted**: a draft that passed verification (its KV entry from this forward is kept);
* **recovered**: the token resampled at the first rejected position;
* **bonus**: the token drawn from position L+1 when the whole window was accepted.

Rows commit different amounts (ragged), finished rows leave the batch, and the cache is rolled back
per row (:class:`~hf_sjd.jacobi.cache.RaggedCache`). The verifier and drafter are pluggable objects; the
model-specific parts (CFG prompt, how a forward yields logits) come from the model's adapter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .cache import RaggedCache
from .config import SJDConfig
from .drafting import Drafter, DraftWindow, sample
from .processing import groups_by_length, is_prefix_free, process_window, right_align
from .verifiers import Verifier


@dataclass
class JacobiStats:
    """Counters of one ``generate`` call. ``num_forward_passes`` counts every forward, prefill included."""

    num_forward_passes: int = 0
    num_new_tokens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))  # [batch]
    # [batch] forwards each row took until it finished (rows leave the batch as they finish)
    row_forward_passes: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    tokens_per_forward: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    num_accepted: int = 0  # drafts that passed verification and were committed
    num_recovered: int = 0  # tokens resampled at a rejected position
    num_bonus: int = 0  # tokens drawn after a fully accepted window
    seconds: float = 0.0  # wall time of the decoding loop
    model_seconds: float = 0.0  # of which inside model forwards

    @property
    def step_compression(self) -> float:
        """Mean new tokens per row divided by the number of forwards (vanilla AR: 1.0)."""
        return float(self.num_new_tokens.float().mean()) / max(self.num_forward_passes, 1)

    @property
    def row_step_compression(self) -> torch.Tensor:
        """[batch] each row's new tokens / the forwards it took: per-image compression inside a batch."""
        return self.num_new_tokens.float() / self.row_forward_passes.clamp_min(1).float()

    @property
    def acceptance_rate(self) -> float:
        """Fraction of verified drafts that passed (each iteration verifies up to its first rejection)."""
        verified = self.num_accepted + self.num_recovered
        return self.num_accepted / verified if verified else 0.0

    @property
    def loop_overhead(self) -> float:
        """Fraction of wall time spent outside model forwards."""
        return (self.seconds - self.model_seconds) / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {"num_forward_passes": self.num_forward_passes, "num_new_tokens": self.num_new_tokens.tolist(),
                "step_compression": self.step_compression, "acceptance_rate": self.acceptance_rate,
                "tokens_per_forward": self.tokens_per_forward.tolist(), "num_accepted": self.num_accepted,
                "row_forward_passes": self.row_forward_passes.tolist(),
                "num_recovered": self.num_recovered, "num_bonus": self.num_bonus, "seconds": self.seconds,
                "model_seconds": self.model_seconds, "loop_overhead": self.loop_overhead}


@dataclass
class Commit:
    tokens: torch.Tensor  # [b, L+1] accepted drafts, then the recovered/bonus token, then junk
    count: torch.Tensor  # [b] tokens committed (prefix of ``tokens``)
    num_accepted: torch.Tensor  # [b] drafts accepted by the verifier
    finished: torch.Tensor  # [b] bool


class JacobiDecoder:
    def __init__(self, model, adapter, config: SJDConfig, verifier: Verifier, drafter: Drafter,
                 logits_processor: LogitsProcessorList, stopping_criteria: StoppingCriteriaList,
                 generation_config: GenerationConfig, streamer=None) -> None:
        self.model, self.adapter, self.config = model, adapter, config
        self.verifier, self.drafter = verifier, drafter
        self.processors, self.generation_config, self.streamer = logits_processor, generation_config, streamer
        self.prefix_free = is_prefix_free(logits_processor)
        self.extra_stops = StoppingCriteriaList(
            [c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))])
        eos = generation_config._eos_token_tensor
        self.eos_ids = None if eos is None else eos.flatten()
        pad = generation_config._pad_token_tensor
        self.pad_id = int(pad) if pad is not None else 0
        self.guided = config.guidance_scale is not None and config.guidance_scale != 1
        self.stats = JacobiStats()

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, uncached: torch.Tensor, window: DraftWindow) -> torch.Tensor:
        """One model forward over ``[uncached, drafts]``; returns guided logits [b, L+1, V] (float32)."""
        drafts = torch.cat([window.tokens, window.tokens]) if self.guided else window.tokens
        input_ids = torch.cat([uncached, drafts], dim=1)  # [rows, W]
        width = input_ids.shape[1]
        start = time.perf_counter()
        logits = self.adapter.window_logits(
            self.model, input_ids, attention_mask=self.cache.attention_mask(width),
            position_ids=self.cache.position_ids(width), cache=self.cache.cache, num_logits=window.size + 1)
        if logits.is_cuda:
            torch.cuda.synchronize(logits.device)
        self.stats.model_seconds += time.perf_counter() - start
        self.stats.num_forward_passes += 1
        self._num_appended = width
        logits = logits.float()
        if self.guided:
            cond, uncond = logits.chunk(2)
            logits = uncond + self.config.guidance_scale * (cond - uncond)
        return logits

    def target_probs(self, logits: torch.Tensor, window: DraftWindow) -> torch.Tensor:
        """Processed target distributions p [b, L+1, V]; one-hot argmax for greedy decoding."""
        scores = process_window(self.processors, logits, self.tokens, self.prompt_len + self.num_new, window.tokens,
                                rows=self.rows)
        if not self.generation_config.do_sample:
            probs = torch.nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).float()
        else:
            probs = scores.softmax(-1)
        return self._force_structure(probs)

    def _lengths(self) -> torch.Tensor:
        """[b] prompt + committed tokens of every active row (its prefix in ``self.tokens``)."""
        return self.prompt_len + self.num_new[self.rows]

    def _positions(self, width: int) -> torch.Tensor:
        """Generated-token index of the next ``width`` positions of every active row [b, width]."""
        return self.num_new[self.rows, None] + torch.arange(width, device=self.num_new.device)

    def _force_structure(self, probs: torch.Tensor) -> torch.Tensor:
        """Point masses at the positions whose token the model's layout fixes (adapter's ``structural_tokens``)."""
        forced = self.adapter.structural_tokens(self._positions(probs.shape[1]))  # [b, L+1]
        if forced is None:
            return probs
        point_mass = torch.nn.functional.one_hot(forced.clamp_min(0), probs.shape[-1]).to(probs.dtype)
        return torch.where((forced >= 0).unsqueeze(-1), point_mass, probs)

    # -- verify + commit ----------------------------------------------------------------------------
    def verify_and_commit(self, window: DraftWindow, target: torch.Tensor) -> Commit:
        batch, size = window.tokens.shape
        if size:
            result = self.verifier(window.tokens, window.probs, target[:, :size],
                                   torch.rand(batch, size, device=target.device))
            num_accepted, residual = result.num_accepted, result.residual_probs
        else:
            num_accepted, residual = torch.zeros(batch, dtype=torch.long, device=target.device), target[:, 0]
        all_accepted = num_accepted == size
        next_token = sample(torch.where(all_accepted[:, None], target[:, size], residual))  # recovered | bonus
        block = torch.cat([window.tokens, next_token[:, None]], dim=1)  # [b, L+1]
        block.scatter_(1, num_accepted[:, None], next_token[:, None])
        remaining = self.max_new - self.num_new[self.rows]
        count = torch.minimum(num_accepted + 1, remaining)
        hit_eos = torch.zeros_like(all_accepted)
        if self.eos_ids is not None:
            in_block = torch.arange(size + 1, device=block.device)[None] < count[:, None]
            is_eos = torch.isin(block, self.eos_ids) & in_block
            hit_eos = is_eos.any(1)
            count = torch.where(hit_eos, is_eos.int().argmax(1) + 1, count)
        self._reserve(block.shape[1])
        self._write(block, count)
        self._record(count, num_accepted, all_accepted, block)
        finished = hit_eos | (self.num_new[self.rows] >= self.max_new)
        if len(self.extra_stops):
            finished |= self._stop_requested()
        return Commit(block, count, num_accepted, finished)

    def _stop_requested(self) -> torch.Tensor:
        """[b] bool: the user's stopping criteria, each row judged on its own prompt + committed tokens."""
        tokens, stop = self.tokens[self.rows], torch.zeros(len(self.rows), dtype=torch.bool, device=self.rows.device)
        for length, rows in groups_by_length(self._lengths()):
            stop[rows] = self.extra_stops(tokens[rows, :length], None).to(stop.device)
        return stop

    def _reserve(self, width: int) -> None:
        """Grow the token buffer (doubling) so that every row can commit ``width`` more tokens."""
        self.committed_bound = min(self.max_new, self.committed_bound + width)
        needed, capacity = self.prompt_len + self.committed_bound, self.tokens.shape[1]
        if needed > capacity:
            grown = max(needed, min(2 * capacity, self.prompt_len + self.max_new))
            self.tokens = torch.nn.functional.pad(self.tokens, (0, grown - capacity), value=self.pad_id)

    def _write(self, block: torch.Tensor, count: torch.Tensor) -> None:
        columns = self.prompt_len + self.num_new[self.rows, None] + torch.arange(block.shape[1], device=block.device)
        keep = torch.arange(block.shape[1], device=block.device)[None] < count[:, None]
        rows = self.rows[:, None].expand_as(columns)
        self.tokens[rows[keep], columns[keep]] = block[keep]
        self.num_new[self.rows] += count

    def _record(self, count: torch.Tensor, num_accepted: torch.Tensor, all_accepted: torch.Tensor,
                block: torch.Tensor) -> None:
        stats = self.stats
        extra_token = count > num_accepted
        stats.num_accepted += int(torch.minimum(num_accepted, count).sum())
        stats.num_recovered += int((extra_token & ~all_accepted).sum())
        stats.num_bonus += int((extra_token & all_accepted).sum())
        stats.tokens_per_forward += torch.bincount(count.cpu(), minlength=stats.tokens_per_forward.numel())
        if self.streamer is not None:
            self.streamer.put(block[0, : int(count[0])].cpu())

    # -- redraft --------------------------------------------------------------------------------------
    def window_size(self) -> int:
        """L, shrunk near the end so no draft lies beyond ``max_new_tokens``."""
        remaining = int((self.max_new - self.num_new[self.rows]).max())
        return max(0, min(self.config.jacobi_window, remaining - 1))

    def _grid_context(self, size: int) -> dict:
        if self.drafter.init != "repeat-horizon":
            return {}
        recent = right_align(self.tokens[self.rows], self._lengths(), self.pad_id)[:, -(self.drafter.grid_width + 1):]
        if recent.shape[1] < self.drafter.grid_width + 1:
            recent = torch.nn.functional.pad(recent, (self.drafter.grid_width + 1 - recent.shape[1], 0),
                                             value=self.pad_id)
        return {"recent": recent, "num_generated": self.num_new[self.rows]}

    def redraft(self, window: DraftWindow, target: torch.Tensor, commit: Commit) -> DraftWindow:
        size = self.window_size()
        return self.drafter.slide(window, target, commit.count, size, positions=self._positions(size), rows=self.rows,
                                  **self._grid_context(size))

    # -- bookkeeping ----------------------------------------------------------------------------------
    def _model_rows(self, keep: torch.Tensor) -> torch.Tensor:
        """Indices of the model-batch rows (conditional, then unconditional) of the kept logical rows."""
        return torch.cat([keep, keep + len(self.rows)]) if self.guided else keep

    def _uncached(self) -> torch.Tensor:
        last = self.tokens[self.rows, self.prompt_len + self.num_new[self.rows] - 1][:, None]  # [b, 1]
        return torch.cat([last, last]) if self.guided else last

    # -- the loop -------------------------------------------------------------------------------------
    def run(self, prompt: torch.Tensor, model_prompt: torch.Tensor, model_prompt_mask: torch.Tensor, cache
            ) -> tuple[torch.Tensor, JacobiStats]:
        """``prompt`` [B, P] as given (any padding side); ``model_prompt``/mask [M, P'] the forward's prompt rows
        (M = 2B with guidance: conditional rows, then unconditional rows)."""
        start = time.perf_counter()
        batch, self.prompt_len = prompt.shape
        device = prompt.device
        self.max_new = self.generation_config.max_length - self.prompt_len
        # Room for the first 1024 new tokens; _reserve grows it with what is generated (max_new_tokens is only a bound).
        self.committed_bound = 0  # host-side upper bound on any row's committed tokens (no device sync)
        self.tokens = torch.full((batch, self.prompt_len + min(self.max_new, 1024)), self.pad_id, dtype=torch.long,
                                 device=device)
        self.tokens[:, :self.prompt_len] = prompt
        self.num_new = torch.zeros(batch, dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)
        self.row_forwards = torch.zeros(batch, dtype=torch.long, device=device)
        self.stats.tokens_per_forward = torch.zeros(self.config.jacobi_window + 2, dtype=torch.long)
        self.cache = RaggedCache(cache, model_prompt_mask)

        size = self.window_size()
        window = self.drafter.initial(batch, size, positions=self._positions(size), **self._grid_context(size))
        uncached = model_prompt
        while self.rows.numel():
            logits = self.forward(uncached, window)  # forward
            target = self.target_probs(logits, window)  # [b, L+1, V]
            commit = self.verify_and_commit(window, target)  # verify + commit
            kept = uncached.shape[1] + torch.minimum(commit.num_accepted, commit.count)
            self.cache.commit(torch.cat([kept, kept]) if self.guided else kept, self._num_appended)
            self.row_forwards[self.rows[commit.finished]] = self.stats.num_forward_passes
            keep = (~commit.finished).nonzero().squeeze(-1)
            if keep.numel() < len(self.rows):  # finished rows leave the batch
                self.cache.select_rows(self._model_rows(keep))
                window, target = window.select_rows(keep), target[keep]
                commit = Commit(commit.tokens[keep], commit.count[keep], commit.num_accepted[keep],
                                commit.finished[keep])
                self.rows = self.rows[keep]
            if not self.rows.numel():
                break
            window = self.redraft(window, target, commit)  # redraft
            uncached = self._uncached()

        if self.streamer is not None:
            self.streamer.end()
        self.stats.num_new_tokens = self.num_new.cpu()
        self.stats.row_forward_passes = self.row_forwards.cpu()
        self.stats.seconds = time.perf_counter() - start
        return self.tokens[:, : self.prompt_len + int(self.num_new.max())], self.stats
