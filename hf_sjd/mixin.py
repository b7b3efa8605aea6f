"""``SJDGenerationMixin``: named Jacobi strategies inside transformers' own ``generate``.

``generate(custom_generate="sjd", ...)`` resolves the name in :data:`hf_sjd.STRATEGIES`, then hands
transformers a decoding callable through its public ``custom_generate`` extension point, so input
preparation, logits processors, stopping criteria and the cache all come from transformers unchanged.
Paths, Hub repo ids and callables go to transformers as they are.
"""

from __future__ import annotations

import copy
import copyreg
import dataclasses
import functools
import inspect
import os
import statistics
import time
from dataclasses import dataclass

import torch
from transformers import Cache, DynamicCache, GenerationMixin, StoppingCriteriaList
from transformers.generation import SynthIDTextWatermarkingConfig, SynthIDTextWatermarkLogitsProcessor
from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.stopping_criteria import (EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria,
                                                        StopStringCriteria)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from . import calibration
from .adapters import detect_adapter
from .checks import UnsupportedModelError, check_float, check_int
from .jacobi import cost_model
from .jacobi.config import SJDConfig, check_generation_config_knobs
from .jacobi.cost_model import AUTO
from .jacobi.drafting import Drafter, verifies_unfused
from .jacobi.loop import JacobiDecoder
from .jacobi.processing import allowed_tokens
from .jacobi.registry import DRAFT_PRIORS, STRATEGIES, VERIFIERS, Strategy, build_component
from .jacobi.state import CommitLog
from .jacobi.stops import pads_stopped
from .jacobi.stats import JacobiStats
from .jacobi.verify.base import Verifier
from .timing import ForwardTimer

#: forward arguments a call may pass: what a window forward feeds or sets itself (positions come from the mask, as
#: transformers' own loop takes them), and outputs checked elsewhere; any other input would be dropped by it
WINDOW_INPUTS = {"input_ids", "attention_mask", "past_key_values", "cache", "use_cache", "logits_to_keep",
                 "output_attentions", "output_hidden_states", "return_dict"}
UNSUPPORTED_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
#: settings that make transformers pick another decoding method than sampling or greedy search
#: (``GenerationConfig.get_generation_mode``), which a Jacobi strategy would silently replace
OTHER_METHOD_SETTINGS = ("constraints", "force_words_ids", "penalty_alpha", "dola_layers", "use_mtp",
                         "assistant_early_exit", "num_beam_groups")


@dataclass
class SJDGenerateOutput(GenerateDecoderOnlyOutput):
    """transformers' decoder-only output plus the Jacobi counters in ``stats``."""

    stats: JacobiStats | None = None


def resolve_strategy(custom_generate) -> Strategy | None:
    """The registered strategy named by ``custom_generate``; ``None`` for what transformers handles."""
    if not isinstance(custom_generate, str):
        return None
    if custom_generate in STRATEGIES:
        return STRATEGIES[custom_generate]
    if os.path.exists(custom_generate) or "/" in custom_generate:  # local path or Hub repo id
        return None
    raise ValueError(f"custom_generate={custom_generate!r} is neither a registered strategy nor an existing path; "
                     f"registered strategies: {', '.join(sorted(STRATEGIES))}")


def left_pad_concat(first: torch.Tensor, first_mask: torch.Tensor, second: torch.Tensor, second_mask: torch.Tensor,
                    pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack two left-padded prompt batches (rows of ``first``, then of ``second``) at a common length."""
    width, pad = max(first.shape[1], second.shape[1]), torch.nn.functional.pad
    ids = [pad(x, (width - x.shape[1], 0), value=pad_id) for x in (first, second)]
    masks = [pad(m.long(), (width - m.shape[1], 0), value=0) for m in (first_mask, second_mask)]
    return torch.cat(ids), torch.cat(masks)


class JacobiDecodingMethod:
    """The callable handed to ``GenerationMixin.generate(custom_generate=...)``; its signature mirrors
    ``GenerationMixin._sample``, so transformers passes it the prepared inputs, processors, criteria and cache."""

    def __init__(self, config: SJDConfig, adapter, streamer=None, negative_prompt_ids: torch.Tensor | None = None,
                 negative_prompt_attention_mask: torch.Tensor | None = None) -> None:
        self.config, self.adapter, self.streamer = config, adapter, streamer
        self.negative_prompt_ids = negative_prompt_ids
        self.negative_prompt_attention_mask = negative_prompt_attention_mask

    def _draft_token_ids(self, input_ids: torch.Tensor, logits_processor) -> torch.Tensor:
        vocab_size = self.adapter.vocab_size
        ids = self.config.draft_ids_tensor(vocab_size, input_ids.device)
        if ids is None:
            ids = self.adapter.draft_token_ids
        if ids is None:
            ids = allowed_tokens(logits_processor, input_ids, vocab_size)
            if ids.numel() == 0:  # no law to draft from: the loop then does as transformers (greedy: the argmax;
                ids = torch.arange(vocab_size, device=input_ids.device)  # sampling: the refusal, when committed)
        return ids.to(input_ids.device)

    def _siblings_allowed(self, model) -> bool:
        """Whether ``jacobi_siblings="auto"`` may pick siblings: exact speculative verification of the drafts'
        own q (no draft prior: the cost model's cells were measured without one) and a tree-ready attention."""
        return (VERIFIERS[self.config.verifier].siblings_ready and self.config.draft_prior is None
                and self.adapter.tree_attention_ready(model))

    def _for_call(self, model, input_ids: torch.Tensor, generation_config, stopping_criteria, probe
                  ) -> tuple[SJDConfig, str | None]:
        """This call's config (its plan of window and siblings per number of rows left, fixed before any forward;
        ``"auto"`` priced by :mod:`hf_sjd.calibration`, or the roofline where timing is refused) and what priced it.
        ``probe(cell, loop)`` times a few iterations of a loop on this call's prompt. A call with ``max_time`` times
        nothing (its clock runs already): it reads what earlier calls timed, or prices as where timing is refused."""
        ends_early = any(not isinstance(criterion, MaxLengthCriteria) for criterion in stopping_criteria)
        measure = not any(isinstance(criterion, MaxTimeCriteria) for criterion in stopping_criteria)
        batch, prompt_length = input_ids.shape
        max_new_tokens = generation_config.max_length - prompt_length
        fewest = 2 if self.config.guided else 1  # forward rows per image
        # the timing's dummy prefix: the middle length of what the call surely generates, all of max_new_tokens
        # where it runs to them (an image's grid), else the probes' tokens (an EOS may end it at any token): its
        # memory follows what the call uses, not what it asked for
        surely = max_new_tokens if self.adapter.grid_width or not ends_early else \
            min(max_new_tokens, calibration.PROBE_TOKENS)
        rows, context = batch * fewest, prompt_length + surely // 2
        auto = AUTO in (self.config.jacobi_window, self.config.jacobi_siblings)
        profile = None
        if auto and not cost_model.roofline_forced():
            profile = calibration.profile_for(model, self.adapter, rows, context, fewest=fewest, measure=measure)
        cost, table, source = None, cost_model.STEP_COMPRESSION, None
        if profile is not None:
            loop, handed_off = calibration.loop_key(self.config), self._hands_off()
            siblings = self.config.jacobi_siblings == AUTO and self._siblings_allowed(model)
            limit = self.adapter.position_limit(model)
            if measure and (limit is None or prompt_length + calibration.PROBE_TOKENS <= limit):  # (else: forwards)
                try:
                    calibration.time_loops(model, profile, loop, rows, siblings, handed_off, probe)
                except Exception:  # noqa: BLE001  the call's own processors or criteria failed on its prompt:
                    pass  # untimed loops are priced by their forwards, and the call itself raises its own error
            cost = functools.partial(profile.step_cost, loop, handed_off=handed_off)
            source, table = profile.source, calibration.estimate_for(model, self.config, batch).table()
        elif auto and (cost_model.roofline_forced() or next(model.parameters()).device.type == "cuda"):
            source = "roofline"
        while True:  # picked again after timing the wider counts a pick priced from below (calibration.widen)
            config = self.config.for_call(model, batch, prompt_length, max_new_tokens,
                                          siblings_allowed=self._siblings_allowed(model), cost=cost, table=table)
            if profile is None or not measure or not calibration.widen(model, self.adapter, profile, config.plan,
                                                                        fewest, context):
                return config, source

    def _probe(self, model, input_ids, prompt_rows, logits_processor, generation_config, model_kwargs, parts,
               cell: tuple[int, int], plain: bool) -> list[float]:
        """[seconds of one forward, seconds per iteration outside the forwards] of the Jacobi loop at ``cell`` (or
        transformers' sampling, ``plain``) over a few iterations on this call's prompt (in the call's inference mode:
        it runs inside :meth:`__call__`). Its draws come from torch's random stream, as any sampling's do: saving and
        restoring the stream around it would replay draws that other threads made meanwhile."""
        short = copy.copy(generation_config)
        short.max_length = input_ids.shape[1] + calibration.PROBE_TOKENS
        start = time.perf_counter()
        if plain:
            with ForwardTimer().hooked(model) as timer:
                GenerationMixin._sample(model, input_ids, logits_processor,
                                        StoppingCriteriaList([MaxLengthCriteria(short.max_length)]), short, False,
                                        None, **{**model_kwargs, "cache": DynamicCache(config=model.config)})
        else:
            pinned = dataclasses.replace(self.config, jacobi_window=cell[0], jacobi_siblings=cell[1])
            config = pinned.for_call(model, input_ids.shape[0], input_ids.shape[1], calibration.PROBE_TOKENS,
                                     cell[1] > 0)
            decoder = self._decoder(model, config, input_ids, logits_processor, StoppingCriteriaList(), short, parts)
            decoder.run(input_ids, *prompt_rows,
                        cache=self.adapter.prepare_cache(model, DynamicCache(config=model.config), input_ids, short))
            timer = decoder.timer
        forwards, gaps = timer.durations(), timer.gaps()
        steps = forwards[1:] or forwards  # the prefill's forward is the prompt's
        # the loop's work per iteration: between forwards, so the setup before the first is not spread over the few
        # iterations of a probe (the median: its last windows shrink); a call of one forward has no iteration
        work = statistics.median(gaps) if gaps else time.perf_counter() - start - sum(forwards)
        return [statistics.median(steps), work]

    def _hands_off(self) -> bool:
        """Whether plain decoding is transformers' own sampling loop (no guidance, an adapter that samples so)."""
        return not self.config.guided and self.adapter.plain_sampling

    def _checked_parts(self, model, input_ids: torch.Tensor, logits_processor) -> tuple[torch.Tensor, Verifier]:
        """The drafted ids and the verifier, built once per call and checked before its first forward (``"auto"``'s
        timing runs forwards, and falls back on any error there), explicit siblings checked against them."""
        self.adapter.check_processors(logits_processor)
        draft_ids = self._draft_token_ids(input_ids, logits_processor)
        verifier = build_component(VERIFIERS, self.config.verifier, self.config, self.adapter, draft_ids,
                                   self.config.verifier_options)
        window, siblings = self.config.jacobi_window, self.config.jacobi_siblings
        if siblings not in (AUTO, 0) and window != 0:  # (a throwaway prior tells what it verifies against)
            provisional = dataclasses.replace(self.config, plan=((1, siblings),))  # (its buffers: one draft)
            self._check_siblings(model, verifier, self._priors(provisional, draft_ids))
        return draft_ids, verifier

    def _priors(self, config: SJDConfig, draft_ids: torch.Tensor) -> list:
        """The draft prior of ``config`` (none, or one), built for its plan (a prior keeps a history per slot)."""
        return [build_component(DRAFT_PRIORS, config.draft_prior, config, self.adapter, draft_ids,
                                config.prior_options)] if config.draft_prior else []

    def _decoder(self, model, config: SJDConfig, input_ids: torch.Tensor, logits_processor, stopping_criteria,
                 generation_config, parts: tuple[torch.Tensor, Verifier], streamer=None) -> JacobiDecoder:
        """The loop for ``config`` over the call's checked ``parts``, its draft prior and drafter built and checked
        (before any forward)."""
        draft_ids, verifier = parts
        priors = self._priors(config, draft_ids)
        drafter = Drafter(draft_ids, self.adapter.vocab_size, init=config.draft_init, coupling=config.draft_coupling,
                          sibling_law=config.jacobi_sibling_law, grid_width=config.grid_width,
                          batch=input_ids.shape[0], window=config.widest, draft_processors=priors,
                          structural_tokens=self.adapter.structural_tokens)
        if any(siblings for _, siblings in config.plan):
            self._check_siblings(model, verifier, priors)
        return JacobiDecoder(model, self.adapter, config, verifier, drafter, logits_processor, stopping_criteria,
                             generation_config, streamer=streamer)

    def _plain(self, model, input_ids, logits_processor, stopping_criteria, generation_config,
               model_kwargs) -> tuple[torch.Tensor, JacobiStats]:
        """Plain decoding, where no cell beats it: transformers' own sampling loop, at vanilla ``generate``'s cost."""
        start = time.perf_counter()
        stops = _RowEnds(stopping_criteria)
        with ForwardTimer().hooked(model) as timer:
            out = GenerationMixin._sample(model, input_ids, logits_processor, stops, generation_config,
                                          False, self.streamer, **model_kwargs)
        sequences = out.sequences if generation_config.return_dict_in_generate else out
        ends = torch.zeros(input_ids.shape[0], dtype=torch.long)  # [B] where each row ended, 0: with the batch
        if stops.ends is not None and pads_stopped(stopping_criteria):  # (else its tokens after a stop are real)
            ends = stops.ends.cpu()
        new = ends.masked_fill(ends == 0, sequences.shape[1]) - input_ids.shape[1]  # [B]
        return sequences, JacobiStats.from_log(
            CommitLog.plain(new), num_forward_passes=timer.count, num_new_tokens=new, row_forward_passes=new,
            model_seconds=timer.total(), seconds=time.perf_counter() - start)

    def _check_siblings(self, model, verifier, priors: list) -> None:
        """Siblings are exact only under exact speculative verification, with drafts sampled from the q they are
        verified against, and need an attention that takes the tree forward's 4D mask."""
        if not verifier.siblings_ready:
            exact = " or ".join(repr(name) for name, v in VERIFIERS.items() if v.siblings_ready)
            raise ValueError(f"jacobi_siblings > 0 verifies siblings by recursive rejection sampling, which is exact "
                             f"only with exact speculative verification (verifier={exact}); got "
                             f"verifier={self.config.verifier!r}: set jacobi_siblings=0")
        if verifies_unfused(priors):
            raise ValueError("jacobi_siblings > 0 needs drafts sampled from the q they are verified against; the "
                             "draft prior verifies against another distribution (verify_unfused): set "
                             "jacobi_siblings=0")
        self.adapter.check_tree_attention(model, "jacobi_siblings")

    def _model_prompt(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_id: int,
                      expansion: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The forward's prompt rows, their mask and what their positions count (None: the mask): the prompts, then
        (with guidance) their unconditional prompts. A negative prompt per prompt is expanded like the prompts were
        (``num_return_sequences`` copies each); transformers' CFG runs it without position_ids, so its positions
        count its padding where the model then places tokens by cache slot (GPT-2; OPT counts its mask). A family
        whose own generate passes no position_ids (``adapter.positions_from_slots``) counts every slot of every row."""
        positions = None
        if not self.config.guided:
            ids, mask = input_ids, attention_mask
        elif self.negative_prompt_ids is None:
            uncond, uncond_mask = self.adapter.unconditional_prompt(input_ids, attention_mask)
            ids, mask = left_pad_concat(input_ids, attention_mask, uncond, uncond_mask, pad_id)
        else:
            uncond = self.negative_prompt_ids.to(input_ids.device).long()
            uncond_mask = (self.negative_prompt_attention_mask if self.negative_prompt_attention_mask is not None
                           else torch.ones_like(uncond)).to(input_ids.device)  # its shape was checked
            copies = input_ids.shape[0] if uncond.shape[0] == 1 else expansion
            uncond, uncond_mask = uncond.repeat_interleave(copies, 0), uncond_mask.repeat_interleave(copies, 0)
            ids, mask = left_pad_concat(input_ids, attention_mask, uncond, uncond_mask, pad_id)
            if not bool(uncond_mask.all()) and self.adapter.slot_positions(model):
                positions = left_pad_concat(input_ids, attention_mask, uncond, torch.ones_like(uncond_mask),
                                            pad_id)[1]
        if self.adapter.positions_from_slots:
            positions = torch.ones_like(mask)
        return ids, mask, positions

    def __call__(self, model, input_ids: torch.LongTensor, logits_processor, stopping_criteria, generation_config,
                 **model_kwargs):
        # Inference mode, as transformers' pipelines run models: no op of the calibration, the loop or the forwards
        # keeps autograd's version counters and view records (on a small model a sizable share of each op's cost).
        # What leaves it is copied into ordinary tensors, which the caller may edit in place or train on.
        with torch.inference_mode():
            out = self._decode(model, input_ids, logits_processor, stopping_criteria, generation_config,
                               **model_kwargs)
        _ordinary(model_kwargs.get("cache"))  # the caller's, kept for a later call (returned or not)
        return _ordinary(out)

    def _decode(self, model, input_ids: torch.LongTensor, logits_processor, stopping_criteria, generation_config,
                **model_kwargs):
        generation_config = _with_criteria_ends(generation_config, stopping_criteria, input_ids.device)
        cache = self.adapter.prepare_cache(model, model_kwargs.get("cache"), input_ids, generation_config)
        try:
            return self._decode_into(model, cache, input_ids, logits_processor, stopping_criteria, generation_config,
                                     model_kwargs)
        finally:  # (the layout is RaggedCache's to read: a caller's cache keeps no trace of it, refused or handed off)
            cache.__dict__.pop("sjd_layout", None)

    def _decode_into(self, model, cache, input_ids: torch.LongTensor, logits_processor, stopping_criteria,
                     generation_config, model_kwargs: dict):
        if cache.get_seq_length() > 0:
            raise ValueError("Jacobi decoding starts from an empty cache; do not pass a pre-filled cache")
        input_ids = input_ids.long()  # int32 prompts are taken, as transformers takes them; tokens are int64
        attention_mask = model_kwargs.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        pad = generation_config._pad_token_tensor
        pad_id = int(pad) if pad is not None else 0
        prompt_rows = model_prompt, model_mask, _ = self._model_prompt(
            model, input_ids, attention_mask, pad_id, generation_config.num_return_sequences or 1)
        if getattr(cache, "sjd_layout", None) == "lockstep" and not bool((model_mask == model_mask[:1]).all()):
            raise UnsupportedModelError(
                model, "positions from the cache length",
                "it derives positions (or attention) from absolute cache slot indices, and with guidance the prompt "
                "and its unconditional prompt (negative_prompt_ids) differ in length or padding: one forward pads "
                "them to one length where transformers' CFG runs each unpadded, so a padded row would see other "
                "positions; pass negative_prompt_ids (and negative_prompt_attention_mask) of the prompt's own "
                "length and padding")

        parts = self._checked_parts(model, input_ids, logits_processor)  # before "auto"'s timing runs forwards
        probe = functools.partial(self._probe, model, input_ids, prompt_rows, logits_processor,
                                  generation_config, model_kwargs, parts)
        config, cost_source = self._for_call(model, input_ids, generation_config, stopping_criteria, probe)
        decoder = self._decoder(model, config, input_ids, logits_processor, stopping_criteria, generation_config,
                                parts, self.streamer)
        if config.plan[-1] == (0, 0) and self._hands_off():  # no drafts for the full batch: vanilla's own loop
            sequences, stats = self._plain(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                           model_kwargs)  # every component was checked above
        else:
            sequences, stats = decoder.run(input_ids, *prompt_rows, cache=cache)
            cache = _as_transformers_leaves(cache, sequences, config.guided)
        stats.cost_source = cost_source
        calibration.estimate_for(model, config, input_ids.shape[0]).record(  # read by later calls only
            config.plan[-1], float(stats.num_new_tokens.float().mean()), stats.num_forward_passes)
        if generation_config.return_dict_in_generate:
            return SJDGenerateOutput(sequences=sequences, stats=stats,
                                     cache=cache if generation_config.use_cache else None)  # (as transformers)
        return sequences


def _with_criteria_ends(generation_config, stopping_criteria, device: torch.device):
    """The call's config with the ends its stopping criteria hold, which the loop reads as its own (max_new_tokens,
    EOS): a user's ``MaxLengthCriteria`` or ``EosTokenCriteria`` replaces the one transformers builds from the config
    (it says so), and its own loop then ends there, sooner or later than the config says."""
    lengths = [c.max_length for c in stopping_criteria if isinstance(c, MaxLengthCriteria)]
    eos = [c.eos_token_id.flatten().to(device) for c in stopping_criteria if isinstance(c, EosTokenCriteria)]
    if not lengths and not eos:
        return generation_config
    config = copy.copy(generation_config)  # (this call's: transformers merged it for the call)
    if lengths:
        config.max_length = min(lengths)
    if eos:
        config._eos_token_tensor = torch.cat(eos).unique()
    return config


def _as_transformers_leaves(cache, sequences: torch.Tensor, guided: bool):
    """The decoding cache after a Jacobi call, for a call that continues from it (``cache=``, ``out.cache``): one
    row without guidance holds the entries of its tokens in order, as transformers' own loop leaves them (those of
    drafts accepted past where the call stopped cut off); rows that left the batch as they finished, or guidance's
    unconditional rows, are not transformers' layout: then it is emptied (a later call recomputes the prefix) and
    ``None`` returned."""
    if sequences.shape[0] == 1 and not guided:
        excess = cache.get_seq_length() - (sequences.shape[1] - 1)  # the last token is never fed
        if excess > 0:
            cache.crop(-excess)
        return cache
    cache.reset()
    return None


class _RowEnds(StoppingCriteriaList):
    """transformers' stopping criteria, noting each row's length when they first stop it (``ends`` [B], 0: not
    stopped): where they pad a stopped row (:func:`~hf_sjd.jacobi.stops.pads_stopped`), it ends there."""

    ends: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        done = super().__call__(input_ids, scores, **kwargs)
        if self.ends is None:
            self.ends = torch.zeros(done.shape, dtype=torch.long, device=done.device)
        self.ends = torch.where(done & (self.ends == 0), input_ids.shape[1], self.ends)
        return done


def _ordinary(value):
    """``value`` with every inference tensor in it (a tensor, a dataclass's fields, nested, or a cache's layers, in
    place) cloned into an ordinary tensor; call it outside inference mode."""
    if isinstance(value, torch.Tensor):
        return value.clone() if value.is_inference() else value
    if isinstance(value, Cache):
        for layer in value.layers:
            for name, tensor in vars(layer).items():
                if isinstance(tensor, torch.Tensor) and tensor.is_inference():
                    setattr(layer, name, tensor.clone())
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            setattr(value, field.name, _ordinary(getattr(value, field.name)))
    return value


def jacobi_generate(model, strategy: Strategy, inputs=None, generation_config=None, streamer=None,
                    negative_prompt_ids=None, negative_prompt_attention_mask=None, **kwargs):
    """Validate the Jacobi knobs, then run transformers' ``generate`` with the Jacobi decoding method."""
    user_config = generation_config is not None
    generation_config = copy.deepcopy(generation_config if user_config else model.generation_config)
    adapter = getattr(model, "sjd_adapter", None) or detect_adapter(model)
    # Adapter hook (image layouts): read the grid from the prompt, fill/check max_new_tokens, before any forward.
    adapter = adapter.prepare_generation(inputs if inputs is not None else kwargs.get("input_ids"), kwargs,
                                         generation_config if user_config else None)
    # the knobs and refusals read what transformers will run: a user's config over the model's own (its knobs
    # included), merged as transformers merges them
    merged = model._prepare_generation_config(copy.deepcopy(generation_config))[0] if user_config else generation_config
    if kwargs.get("grid_width") is None and getattr(merged, "grid_width", None) is None \
            and adapter.grid_width is not None:
        kwargs["grid_width"] = adapter.grid_width
    check_generation_config_knobs(merged)
    config = SJDConfig.resolve(strategy.preset, merged, kwargs)
    _validate_generate_kwargs(model, merged, kwargs, inputs, streamer, negative_prompt_ids,
                              negative_prompt_attention_mask)
    _stop_strings_as_criteria(generation_config if user_config else None, model.generation_config, kwargs,
                              kwargs.get("stop_strings", merged.stop_strings))
    # CFG is batched inside the window; transformers' unbatched CFG processor keeps its own cache and cannot roll back.
    if user_config:  # (1, not None: transformers would fill a None from the model's config again)
        generation_config.guidance_scale = 1.0
    else:
        generation_config = None  # let transformers merge the model's defaults with kwargs, as usual
        if getattr(model.generation_config, "guidance_scale", None) not in (None, 1):
            kwargs["guidance_scale"] = None
    method = JacobiDecodingMethod(config, adapter, streamer=streamer, negative_prompt_ids=negative_prompt_ids,
                                  negative_prompt_attention_mask=negative_prompt_attention_mask)
    return GenerationMixin.generate(model, inputs, generation_config=generation_config, streamer=streamer,
                                    custom_generate=method, **kwargs)


def _stop_strings_as_criteria(user_config, model_config, kwargs: dict, stop_strings) -> None:
    """``stop_strings`` as a ``StopStringCriteria`` in ``kwargs["stopping_criteria"]``, built as transformers'
    ``generate`` builds it: it drops ``tokenizer=`` before calling a custom decoding method (whose arguments it
    reads from the method's signature), and then refuses the stop strings for want of a tokenizer."""
    tokenizer = kwargs.pop("tokenizer", None)
    if not stop_strings:
        return
    if tokenizer is None:
        raise ValueError("stop_strings= needs the model's tokenizer: pass tokenizer=... as well (as transformers asks)")
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(stop_strings=stop_strings, tokenizer=tokenizer))
    kwargs["stopping_criteria"], kwargs["stop_strings"] = criteria, None
    if user_config is not None:
        user_config.stop_strings = None
        if model_config.stop_strings is not None:  # transformers would fill the None from the model's config again
            kwargs["stop_strings"] = None


# Sampling settings of transformers' own that a NaN would silently disable (its comparisons are all False).
FINITE_SETTINGS = ("temperature", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
                   "top_h")


def _check_token_ids(name: str, ids, vocab_size: int, mask=None) -> None:
    """``ids`` must be an integer [batch, length] tensor with at least one token per row, inside the vocabulary."""
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[1] == 0:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be [batch, prompt length] with at least one prompt token per row, got {shape}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids of dtype torch.int64 or torch.int32 (what the model's "
                        f"embedding takes), got dtype {ids.dtype}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name} must lie in [0, {vocab_size}) (the model's input vocabulary); got range "
                         f"[{low}, {high}]")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
            shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"the attention mask of {name} has shape {shape}; it must match {tuple(ids.shape)}")
        empty = (mask == 0).all(dim=1)
        if bool(empty.any()):
            raise ValueError(f"the attention mask of {name} masks out every token of row(s) "
                             f"{empty.nonzero().flatten().tolist()}; each row needs at least one real token")


def _active_dropout(model) -> str | None:
    """What dropout a model in training mode would apply (a module's, or its config's attention / hidden
    dropout), or None."""
    if not model.training:
        return None
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.training and module.p > 0:
            return f"{type(module).__name__}(p={module.p})"
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("attention_dropout", "attn_pdrop", "hidden_dropout", "dropout"):
        if isinstance(getattr(config, name, None), (int, float)) and getattr(config, name) > 0:
            return f"config.{name}={getattr(config, name)}"
    return None


def _validate_generate_kwargs(model, generation_config, kwargs: dict, inputs, streamer, negative_prompt_ids=None,
                              negative_prompt_attention_mask=None) -> None:
    def setting(name):
        return kwargs.get(name, getattr(generation_config, name, None))

    dropout = _active_dropout(model)
    if dropout:
        raise ValueError(f"the model is in training mode with dropout ({dropout}): a forward over a window shares "
                         "one draw of dropout across its positions, where vanilla sampling draws anew for each token, "
                         "so the tokens would not follow vanilla's law; call model.eval() before generate")
    if setting("token_healing"):
        raise ValueError("token_healing=True needs transformers' tokenizer=..., which transformers does not hand to a "
                         "custom decoding method: heal the prompt's tokens before generate, or set token_healing=False")
    # synced_gpus as transformers' generate resolves it, by its own rule (None: DeepSpeed ZeRO-3 or FSDP over several
    # processes); it hands a custom decoding method no such argument
    if GenerationMixin._extract_generation_mode_kwargs(model, None, {}, kwargs.get("synced_gpus"), None,
                                                       None)["synced_gpus"]:
        raise ValueError("synced_gpus=True: processes that share a model's weights (DeepSpeed ZeRO-3, FSDP) run "
                         "their forwards in lockstep, and a Jacobi call's number of forwards depends on its tokens; "
                         "drop custom_generate there, or run one whole model per process")
    if (setting("num_beams") or 1) > 1:
        raise ValueError("num_beams > 1 is not supported by Jacobi decoding (it samples or decodes greedily); "
                         "use num_beams=1")
    try:  # 0, as in transformers: no top-k filtering
        check_int("top_k", setting("top_k"), minimum=0, allow_none=True)
    except (TypeError, ValueError):
        raise ValueError(f"top_k must be an integer >= 0 (0 or None: no top-k), got {setting('top_k')!r}") from None
    for name in FINITE_SETTINGS:
        check_float(name, setting(name), allow_none=True)
    for name in UNSUPPORTED_OUTPUTS:
        if setting(name):
            raise ValueError(f"{name}=True is not supported by Jacobi decoding; set it to False")
    for name in ("assistant_model", "prompt_lookup_num_tokens"):  # other drafters than the Jacobi window
        if setting(name) is not None:
            raise ValueError(f"{name}= selects transformers' assisted decoding, which a Jacobi strategy replaces "
                             f"(its drafts come from the Jacobi window): drop {name}, or drop custom_generate to "
                             f"use transformers' own")
    mode_config = copy.copy(generation_config)  # every field get_generation_mode reads, as this call sets it
    mode_config.update(**{name: kwargs[name] for name in (*OTHER_METHOD_SETTINGS, "top_k", "do_sample", "num_beams",
                                                          "prompt_lookup_num_tokens") if name in kwargs})
    mode = mode_config.get_generation_mode()
    if mode not in (GenerationMode.SAMPLE, GenerationMode.GREEDY_SEARCH):
        named = ", ".join(f"{name}={setting(name)!r}" for name in OTHER_METHOD_SETTINGS
                          if setting(name) and not (name == "num_beam_groups" and setting(name) == 1))
        raise ValueError(f"{named} selects transformers' {mode.value}, which a Jacobi strategy (sampling or greedy "
                         f"search over a window of drafts) would replace: drop it, or drop custom_generate to use "
                         f"transformers' own")
    processors = setting("logits_processor") or ()
    if isinstance(setting("watermarking_config"), SynthIDTextWatermarkingConfig) or any(
            isinstance(processor, SynthIDTextWatermarkLogitsProcessor) for processor in processors):
        raise ValueError("SynthID watermarking (watermarking_config=SynthIDTextWatermarkingConfig(...), or its "
                         "processor in logits_processor=) keeps a state that advances with every processor call and "
                         "assumes one call per generated token; a window processes several positions per forward "
                         "(rejected ones too), so its watermark would not be transformers'; use WatermarkingConfig "
                         "(its green list reads only the previous token), or drop custom_generate")
    if any(isinstance(processor, UnbatchedClassifierFreeGuidanceLogitsProcessor) for processor in processors):
        raise ValueError("UnbatchedClassifierFreeGuidanceLogitsProcessor in logits_processor= runs the model on its "
                         "own cache, one token per call; a window processes several positions per forward (rejected "
                         "drafts too), so its cache would take them in. Pass guidance_scale=... (with "
                         "negative_prompt_ids=... for its unconditional prompt): a Jacobi strategy batches that "
                         "guidance into the window, the same tokens")
    if setting("prefill_chunk_size"):
        raise ValueError(f"prefill_chunk_size={setting('prefill_chunk_size')!r}: a Jacobi call prefills the prompt "
                         "together with its first window of drafts, in one forward; drop prefill_chunk_size, or "
                         "drop custom_generate for transformers' chunked prefill")
    # "hybrid" (Gemma 2/3 checkpoints ship it): transformers reads it as unset and decodes with a DynamicCache
    if setting("cache_implementation") not in (None, "dynamic", "hybrid"):
        raise ValueError(f"cache_implementation={setting('cache_implementation')!r} cannot be rolled back; "
                         f"Jacobi decoding needs the default dynamic cache")
    prompt = inputs if isinstance(inputs, torch.Tensor) else kwargs.get("input_ids")
    if kwargs.get("inputs_embeds") is not None:
        raise ValueError("Jacobi decoding runs on the prompt's token ids (input_ids): its windows append drafted "
                         "tokens to them, and its prefill embeds them; inputs_embeds is not supported (alone or "
                         "beside input_ids): pass input_ids only")
    dropped = sorted(name for name, value in kwargs.items() if value is not None and name not in WINDOW_INPUTS
                     and name in inspect.signature(model.forward).parameters)
    if dropped:
        raise ValueError(f"{', '.join(dropped)}: a Jacobi strategy's window forwards take the prompt's token ids, "
                         f"its attention mask and the positions it implies only, so they would decode without them "
                         f"(other tokens than transformers'); image or video inputs, token_type_ids, position_ids and "
                         f"the like are not supported: drop custom_generate for such a call")
    vocab_size = model.get_input_embeddings().num_embeddings
    if prompt is not None:
        _check_token_ids("input_ids", prompt, vocab_size, kwargs.get("attention_mask"))
    batch = prompt.shape[0] if prompt is not None else 1
    if negative_prompt_ids is not None:
        _check_token_ids("negative_prompt_ids", negative_prompt_ids, vocab_size, negative_prompt_attention_mask)
        if negative_prompt_ids.shape[0] not in (1, batch):
            raise ValueError(f"negative_prompt_ids has {negative_prompt_ids.shape[0]} rows; expected 1 (shared by "
                             f"every prompt) or one per prompt ({batch})")
    if streamer is not None and batch * (setting("num_return_sequences") or 1) > 1:
        raise ValueError("streamer= needs batch size 1 with a Jacobi strategy: its rows commit different numbers of "
                         "tokens per forward (transformers' TextStreamer needs batch size 1 too)")


class SJDGenerationMixin(GenerationMixin):
    """Adds named Jacobi strategies to ``generate(custom_generate=...)``; everything else is transformers'."""

    def __reduce_ex__(self, protocol):
        # pickle / torch.save: the enabled class shares its name with the model's class, so pickle cannot find it
        # by name; rebuild it from the model's class instead
        func, args, *rest = super().__reduce_ex__(protocol)
        if func is copyreg.__newobj__ and args and args[0] is type(self):
            return (_new_enabled, (type(self).__bases__[1], *args[1:]), *rest)
        return (func, args, *rest)

    def generate(self, inputs=None, generation_config=None, *args, custom_generate=None, **kwargs):
        strategy = resolve_strategy(custom_generate)
        positional = isinstance(generation_config, torch.Tensor)  # a model's own argument (Janus: attention_mask)
        if strategy is None:
            if args or positional:
                return super().generate(inputs, generation_config, *args, custom_generate=custom_generate, **kwargs)
            # By keyword: a model's own generate may take other positional arguments (Janus: attention_mask).
            named = {"generation_config": generation_config, "custom_generate": custom_generate}
            return super().generate(inputs, **{k: v for k, v in named.items() if v is not None}, **kwargs)
        if positional:
            raise TypeError("generate()'s second positional argument is generation_config; pass the attention "
                            "mask by keyword (attention_mask=...)")
        if args:
            raise TypeError("pass generate() arguments after generation_config by keyword")
        return jacobi_generate(self, strategy, inputs=inputs, generation_config=generation_config, **kwargs)


def _new_enabled(model_class: type, *args):
    """An uninitialised instance of the enabled ``model_class`` (unpickling; the state is set after)."""
    return object.__new__(_sjd_class(model_class))


@functools.cache
def _sjd_class(model_class: type) -> type:
    """``model_class`` with :class:`SJDGenerationMixin` first. It keeps the class's own name: ``save_pretrained``
    records ``config.architectures = [type(model).__name__]``, which ``AutoModel*`` and others load by."""
    return type(model_class.__name__, (SJDGenerationMixin, model_class),
                {"__module__": model_class.__module__, "__qualname__": model_class.__qualname__})


def enable(model):
    """Give ``model`` Jacobi strategies in ``generate``; returns the same object (class swapped once, cached).

    An unsupported model is refused before anything changes. ``generation_config`` stops counting as derived from
    the model config, whose extra attributes (``jacobi_window``) transformers would drop on reload."""
    if type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):  # torch.compile(model)
        raise ValueError(f"hf_sjd.enable takes the model itself, not torch.compile's wrapper of it (a "
                         f"{type(model).__name__} of {type(model._orig_mod).__name__}): enable the model, then compile "
                         f"its forward (model.forward = torch.compile(model.forward)), as transformers' docs do")
    adapter = detect_adapter(model)
    if not isinstance(model, SJDGenerationMixin):
        model.__class__ = _sjd_class(type(model))
    model.sjd_adapter = adapter
    if getattr(model, "generation_config", None) is not None:
        model.generation_config._from_model_config = False
    return model


def _explain_unenabled(load_custom_generate):
    """Wrap ``GenerationMixin.load_custom_generate``: a registered strategy name on a model that was never
    enabled gets "call hf_sjd.enable(model)" instead of "does not contain a custom_generate subdirectory"."""

    @functools.wraps(load_custom_generate)
    def load(self, pretrained_model_name_or_path=None, *args, **kwargs):
        name = pretrained_model_name_or_path
        if isinstance(name, str) and name in STRATEGIES and not os.path.exists(name):
            raise ValueError(f"custom_generate={name!r} is an hf_sjd strategy, but this {type(self).__name__} was not "
                             f"enabled: call `model = hf_sjd.enable(model)` first, or pass the hf_sjd recipe "
                             f"(custom_generate=<its Hub repo id or local path>, trust_remote_code=True, "
                             f"sjd_method={name!r})")
        return load_custom_generate(self, pretrained_model_name_or_path, *args, **kwargs)

    load.explains_unenabled = True
    return load


if not getattr(GenerationMixin.load_custom_generate, "explains_unenabled", False):
    GenerationMixin.load_custom_generate = _explain_unenabled(GenerationMixin.load_custom_generate)
