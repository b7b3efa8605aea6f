"""Adapter interface and the generic causal-LM adapter.

An adapter owns what is model-specific (drafted ids, token grid, unconditional prompt, the window forward); the
loop (:mod:`hf_sjd.jacobi.loop`) talks only to this interface. A family is one subclass whose :meth:`matches`
recognises the model, appended to :data:`ADAPTERS`.
"""

from __future__ import annotations

import weakref

import torch

#: model -> whether its forward takes ``logits_to_keep`` (read once per model, see ``window_logits``)
_KEEPS_LOGITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class MissingPhraseLibrary(FileNotFoundError):
    """The phrase library a model's config names as its default is not there. The message is ``reason`` then the
    Python keyword to pass instead; a command names its own way out with :meth:`instead`."""

    def __init__(self, reason: str, keyword: str = "phrase_library=<folder or Hub repo id>") -> None:
        super().__init__(f"{reason}pass {keyword}")
        self.reason = reason  # ends with "; " or ", or "

    def instead(self, remedy: str) -> str:
        return f"{self.reason}{remedy}"


class ImageGenerationAdapter:
    """Base adapter. ``model`` is the (enabled) transformers model."""

    family = "base"
    #: vanilla sampling is transformers' own loop over ``model(...)`` logits, so plain decoding may hand it the call
    plain_sampling = False
    #: name of the transformers class whose instances :meth:`matches` recognises
    model_class: str | None = None
    #: ids random drafts are drawn from (``None``: whatever the logits processors allow)
    draft_token_ids: torch.Tensor | None = None
    #: tokens per grid row, the step to the row above (``draft_init="row-above-dist"``; ``None``: no grid)
    grid_width: int | None = None
    #: ``[len(draft_token_ids), dim]`` latent vectors of the draft tokens (LANTERN/GSD distances)
    latent_embeddings: torch.Tensor | None = None
    #: stable hash of the VQ codebook (phrase libraries are keyed by it); ``None`` if unknown
    tokenizer_fingerprint: str | None = None
    #: the library ``sjd-pv`` uses when none is given (a folder, Hub repo id or ``PhraseLibrary``)
    default_phrase_library = None
    #: vanilla CFG guides log-softmaxed scores (transformers' ``UnbatchedClassifierFreeGuidanceLogitsProcessor``);
    #: ``False``: raw logits (a model's own ``generate``, Janus's)
    guides_log_probs = True
    #: vanilla sampling processes and softmaxes the scores in the model's dtype (a model's own ``generate``, Janus's);
    #: ``False``: in float32, as transformers' loop does
    samples_in_model_dtype = False
    #: vanilla passes no ``position_ids`` (a model's own ``generate``, Janus's), so every prompt slot, padding too,
    #: counts a position; ``False``: the prompt's mask counts them, as transformers' loop does
    positions_from_slots = False

    def __init__(self, model) -> None:
        import transformers

        from .support import check_own_generate

        check_own_generate(model, known=getattr(transformers, self.model_class or "", None))
        self.model = model

    @classmethod
    def matches(cls, model) -> bool:
        import transformers

        return cls.model_class is not None and isinstance(model, getattr(transformers, cls.model_class))

    @property
    def vocab_size(self) -> int:
        head = self.model.get_output_embeddings()
        return int(head.out_features if head is not None else self.model.config.get_text_config().vocab_size)

    def prepare_generation(self, input_ids: torch.Tensor | None, kwargs: dict, generation_config=None
                           ) -> "ImageGenerationAdapter":
        """The adapter bound to one ``generate`` call, before any forward: ``kwargs`` (the remaining ``generate``
        kwargs) edited in place (own kwargs popped, ``max_new_tokens`` filled in from the image layout, another
        length refused); ``generation_config``: the user's own, or ``None``."""
        return self

    def call_setting(self, name: str, kwargs: dict, generation_config=None):
        """A generation setting as :meth:`prepare_generation`'s call resolves it: the keyword, else the user's
        ``generation_config``'s, else the model's own."""
        value = kwargs.get(name, getattr(generation_config, name, None))
        return value if value is not None else getattr(self.model.generation_config, name, None)

    def position_limit(self, model) -> int | None:
        """Positions the model has (:func:`~.support.position_limit`): the calibration's dummy prefix and probes
        stay below it, as the call itself does."""
        from .support import position_limit

        return position_limit(model)

    def slot_positions(self, model) -> bool:
        """Whether the model, given no position_ids (as transformers' CFG runs the negative prompt), places a
        left-padded prompt's tokens by cache slot, its padding counted: an image family's Llama-style decoder does."""
        return True

    def decode_images(self, tokens: torch.Tensor, **kwargs) -> list:
        """Generated sequences (or bare image tokens) ``[b, n]`` -> list of ``PIL.Image``."""
        raise NotImplementedError(f"the {self.family!r} adapter has no image decoder")

    def encode_images(self, images: list, image_processor=None) -> torch.Tensor:
        """RGB ``PIL.Image``s of one size, encoded at that size -> ``[n, h*w]`` codes in raster order, code ``c``
        being model token ``draft_token_ids[c]`` (the vocabulary of phrase libraries)."""
        raise NotImplementedError(f"the {self.family!r} adapter ({type(self.model).__name__}) has no image "
                                  f"encoder, so it cannot tokenize images (e.g. for a phrase library)")

    def encoder_image_size(self, image_processor=None) -> int | None:
        """Side in pixels of the square images :meth:`encode_images` expects by default (``None``: unknown)."""
        return None

    def structural_tokens(self, positions: torch.Tensor) -> torch.Tensor | None:
        """Tokens the layout fixes (Emu3's end-of-line) at generated positions ``positions`` [b, k] (0: the first
        new token): ``[b, k]`` ids, ``-1`` where free; ``None``: nothing fixed. The loop forces them."""
        return None

    def unconditional_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(
            f"guidance_scale != 1 needs an unconditional prompt, and the {self.family!r} adapter cannot build one "
            f"for {type(self.model).__name__}: pass negative_prompt_ids=... (and negative_prompt_attention_mask)")

    def prepare_cache(self, model, cache, input_ids: torch.Tensor, generation_config=None):
        """The cache a Jacobi ``generate`` decodes with, checked before any forward: transformers' (a
        ``DynamicCache`` under ``use_cache=False``, the model's or the call's: the tokens are the same), with full
        attention layers. An image family's model is a known Llama-style decoder: the ragged layout."""
        from transformers import DynamicCache

        from ..jacobi.cache import check_croppable
        from .support import full_attention_layers, text_config

        if cache is None:  # use_cache=False: a window needs the committed tokens' entries
            cache = DynamicCache(config=text_config(model))
        check_croppable(cache, model)
        return full_attention_layers(cache)

    def check_processors(self, processors) -> None:
        """Refuse, before any forward, logits processors whose vanilla effect the loop cannot reproduce (none
        here: the loop applies transformers' processors per window position as its loop does)."""

    def guide(self, logits: torch.Tensor, scale: float | None, shift_free: bool) -> torch.Tensor:
        """The scores vanilla sampling processes, from the window's logits ``[rows, n, vocab]`` (with guidance: the
        conditional rows, then the unconditional ones), guided as it guides them (``scale``; None: no guidance) and
        in its dtype: float32 (transformers' loop) or the model's (:attr:`samples_in_model_dtype`). Guidance over
        log-probabilities (:attr:`guides_log_probs`) differs from guidance over the logits by a constant per row,
        which only processors that read a score's sign or size see (not ``shift_free``), and by rounding, which
        half precision shows: only there is vanilla's own arithmetic worth its normalisation."""
        half = logits.dtype != torch.float32
        if scale is None:
            return logits if self.samples_in_model_dtype else logits.float()
        cond, uncond = logits.chunk(2)
        if self.samples_in_model_dtype and half:  # u + (c - u) g, as a family's own CFG processor computes it
            return uncond + (cond - uncond) * scale
        if self.guides_log_probs and (half or not shift_free):  # g (c - u) + u over log-probabilities, as
            uncond = uncond.log_softmax(-1)  # transformers: the unconditional's in the model's dtype
            return (cond.float().log_softmax(-1) - uncond).mul_(scale).add_(uncond)
        return torch.lerp(uncond.float(), cond.float(), scale)  # u + g (c - u), in one kernel

    def restrict_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The layout's own constraint on the (guided) logits ``[..., vocab]``, applied after guidance and before
        the processors, where the family's recipe applies it (Emu3's prefix constraint); none here."""
        return logits

    def tree_attention_ready(self, model) -> bool:
        """Whether the model's attention takes the custom 4D mask of a tree forward (``jacobi_siblings``)."""
        from .support import tree_mask_supported

        return tree_mask_supported(model)

    def check_tree_attention(self, model, knob: str = "jacobi_siblings") -> None:
        """Raise unless the model's attention takes the tree's 4D mask (``knob``: what asked for siblings)."""
        from .support import TREE_ATTENTION, tree_mask_supported

        if not tree_mask_supported(model):
            raise ValueError(f"{knob} > 0 verifies siblings of a draft in the same forward, which needs an "
                             f"attention that takes a custom 4D mask ({', '.join(map(repr, TREE_ATTENTION))}); "
                             f"{type(model).__name__} uses attn_implementation="
                             f"{getattr(model.config, '_attn_implementation', None)!r}: load it with "
                             f"attn_implementation='sdpa', or set {knob}=0")

    def tree_attention_mask(self, model, allowed: torch.Tensor) -> torch.Tensor:
        """``allowed`` [rows, 1, W, K] bool in the form the model's attention takes (:func:`~.support.tree_mask`)."""
        from .support import tree_mask

        return tree_mask(model, allowed)

    def window_logits(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor, cache, num_logits: int) -> torch.Tensor:
        """Logits ``[rows, num_logits, vocab]`` of the last ``num_logits`` input positions (cache updated; its
        sliding-window layers made full first, whoever made it)."""
        from .support import full_attention_layers

        full_attention_layers(cache)
        # generate() sets logits_to_keep=1; a window needs the last L+1 positions. Whether the forward takes it is
        # read from its signature (inspect, tens of microseconds): once per model, not once per forward.
        if model not in _KEEPS_LOGITS:
            _KEEPS_LOGITS[model] = model._supports_logits_to_keep()
        kwargs = {"logits_to_keep": num_logits} if _KEEPS_LOGITS[model] else {}
        output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                       use_cache=True, **kwargs)
        return output.logits[:, -num_logits:]


class CausalLMAdapter(ImageGenerationAdapter):
    """Any decoder-only transformers model: drafts from what the processors allow, no grid, no built-in CFG.

    A model that cannot run exactly is refused when the adapter is made and before the call's first forward
    (:mod:`hf_sjd.adapters.support`). Also decodes text with an image family's model: ``model.sjd_adapter =
    CausalLMAdapter(model)`` after ``hf_sjd.enable(model)``."""

    family = "causal-lm"
    plain_sampling = True

    def __init__(self, model) -> None:
        from .support import check_model

        check_model(model)
        super().__init__(model)

    @classmethod
    def matches(cls, model) -> bool:
        return not getattr(model.config, "is_encoder_decoder", False)

    def prepare_cache(self, model, cache, input_ids: torch.Tensor, generation_config=None):
        """As the base class, also refusing a length this call may pass, and setting ``cache.sjd_layout``
        (:func:`hf_sjd.adapters.support.layout`) for :class:`~hf_sjd.jacobi.cache.RaggedCache` to read."""
        from .support import FORWARD_FAILS, PLAIN_FORWARD_FAILS, UnsupportedModelError, check_length, check_model, \
            layout

        check_model(model)
        if generation_config is not None:
            check_length(model, generation_config.max_length, input_ids.shape[1])
        cache = super().prepare_cache(model, cache, input_ids, generation_config)
        try:
            cache.sjd_layout = layout(model, input_ids.shape[0])
        except UnsupportedModelError as refusal:
            missing_package = refusal.reason == FORWARD_FAILS and isinstance(refusal.__cause__, ImportError)
            if refusal.reason != PLAIN_FORWARD_FAILS and not missing_package:
                raise
            # any forward fails (a package or kernel the attention backend needs is missing): not the architecture's
            # doing, so the request's own checks speak first; RaggedCache raises this before the first decoding
            # forward
            cache.sjd_layout = refusal
        return cache

    def slot_positions(self, model) -> bool:
        """What the probe saw (:class:`~.support.Probe`; a model it refuses is refused before the first forward)."""
        from .support import UnsupportedModelError, probe

        try:
            return probe(model).slot_positions
        except UnsupportedModelError:
            return False

    def tree_attention_ready(self, model) -> bool:
        """Also: no window measured in cache slots, and the probe's ragged layout and tree forward (see
        :meth:`check_tree_attention`; a model the probe refuses is refused again, with its reason, before the
        call's first forward)."""
        from .support import UnsupportedModelError, probe, window_layers

        if not super().tree_attention_ready(model) or window_layers(model) is not None:
            return False
        try:
            seen = probe(model)
        except UnsupportedModelError:
            return False
        return seen.ragged and seen.causal and seen.tree

    def check_tree_attention(self, model, knob: str = "jacobi_siblings") -> None:
        from .support import UnsupportedModelError, probe, window_layers

        what = window_layers(model)
        if what is None:
            super().check_tree_attention(model, knob)
            seen = probe(model)
            if not (seen.ragged and seen.causal):
                what = "attention that depends on cache slot indices"
            elif not seen.tree:
                raise UnsupportedModelError(
                    model, f"{knob} with attention that takes no 4D mask",
                    f"a tree forward (a sibling at its draft's position, neither seeing the other, through a 4D "
                    f"attention mask) does not give the logits of each branch decoded on its own: its attention "
                    f"does not take that mask as it is (ALiBi biases built from a 2D mask, or a mask of its own): "
                    f"set {knob}=0")
        if what is not None:
            raise UnsupportedModelError(
                model, f"{knob} with slot-indexed attention",
                f"its {what} would see a tree forward's siblings at cache slots that are not their positions, and "
                f"the tree's 4D mask replaces the model's own window masks: set {knob}=0")


# Tried in order; the generic adapter comes last.
ADAPTERS: list[type[ImageGenerationAdapter]] = []


def detect_adapter(model) -> ImageGenerationAdapter:
    for adapter_class in (*ADAPTERS, CausalLMAdapter):
        if adapter_class.matches(model):
            return adapter_class(model)
    names = ", ".join(a.family for a in ADAPTERS) or "none"
    raise ValueError(f"{type(model).__name__} is not supported: Jacobi decoding needs a decoder-only model. "
                     f"Registered image-model families: {names}. To add one, subclass "
                     f"hf_sjd.adapters.ImageGenerationAdapter and append it to hf_sjd.adapters.ADAPTERS.")
