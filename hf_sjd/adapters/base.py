"""Adapter interface and the generic causal-LM adapter.

An adapter owns the model-specific parts of Jacobi decoding: which token ids are drafted, the token
grid, how the unconditional (CFG) prompt is built, and how one window forward yields logits. The loop in
:mod:`hf_sjd.jacobi.loop` only talks to this interface. Adding a family is one subclass whose
:meth:`matches` recognises the model, plus one line in :data:`ADAPTERS`.
"""

from __future__ import annotations

import torch


class ImageGenerationAdapter:
    """Base adapter. ``model`` is the (enabled) transformers model."""

    family = "base"
    #: the family's vanilla sampling is transformers' own loop over ``model(...)`` logits (no image head, no layout
    #: tokens), so plain decoding may hand the call to it (``jacobi_window="auto"`` where no cell pays)
    plain_sampling = False

    def __init__(self, model) -> None:
        self.model = model

    @classmethod
    def matches(cls, model) -> bool:
        return False

    @property
    def vocab_size(self) -> int:
        head = self.model.get_output_embeddings()
        return int(head.out_features if head is not None else self.model.config.get_text_config().vocab_size)

    @property
    def draft_token_ids(self) -> torch.Tensor | None:
        """Ids random drafts are drawn from (``None``: whatever the logits processors allow)."""
        return None

    @property
    def grid_width(self) -> int | None:
        return None

    @property
    def latent_embeddings(self) -> torch.Tensor | None:
        """``[len(draft_token_ids), dim]`` latent vectors of the draft tokens (LANTERN/GSD distances)."""
        return None

    # -- image-model interface (issue 8: Emu3 / Janus / Lumina-mGPT adapters) -------------------------
    @property
    def tokenizer_fingerprint(self) -> str | None:
        """Stable hash of the VQ codebook (phrase libraries are keyed by it); ``None`` if unknown."""
        return None

    @property
    def default_phrase_library(self):
        """The phrase library ``sjd-pv`` uses when none is given (a folder, Hub repo id or ``PhraseLibrary``);
        its phrases are VQ codes, code ``c`` being model token ``draft_token_ids[c]``."""
        return None

    def prepare_generation(self, input_ids: torch.Tensor | None, kwargs: dict, generation_config=None
                           ) -> "ImageGenerationAdapter":
        """Bind the adapter to one ``generate`` call; runs before any forward.

        ``input_ids`` [B, P] the prompt; ``kwargs`` the remaining ``generate`` kwargs (edited in place: an
        adapter pops its own, e.g. Emu3's ``image_sizes``, and fills in ``max_new_tokens``);
        ``generation_config`` the user's own ``GenerationConfig`` or ``None``. Raises if the requested
        length does not fit the image layout. Returns the adapter to use for this call.
        """
        return self

    def decode_images(self, tokens: torch.Tensor, **kwargs) -> list:
        """Generated sequences (or bare image tokens) ``[b, n]`` -> list of ``PIL.Image``."""
        raise NotImplementedError(f"the {self.family!r} adapter has no image decoder")

    # -- image encoding (phrase libraries: hf_sjd.phrase_builder) --------------------------------------
    def encode_images(self, images: list, image_processor=None) -> torch.Tensor:
        """RGB ``PIL.Image``s, all of one size -> ``[n, h*w]`` VQ codes in raster order.

        Codes are indices into :attr:`draft_token_ids` (code ``c`` is model token ``draft_token_ids[c]``),
        the vocabulary of phrase libraries. Images are encoded at the size given (the image processor
        only converts and normalises); :meth:`encoder_image_size` is the size the model generates at.
        """
        raise NotImplementedError(f"the {self.family!r} adapter ({type(self.model).__name__}) has no image "
                                  f"encoder, so it cannot tokenize images (e.g. for a phrase library)")

    def encoder_image_size(self, image_processor=None) -> int | None:
        """Side in pixels of the square images :meth:`encode_images` expects by default (``None``: unknown)."""
        return None

    def structural_tokens(self, positions: torch.Tensor) -> torch.Tensor | None:
        """Tokens the layout fixes at generated positions ``positions`` [b, k] (0 = first new token).

        Returns ``[b, k]`` ids with ``-1`` where the model chooses freely, or ``None`` if the layout fixes
        nothing (e.g. Emu3's end-of-line token after every grid row). The loop forces these positions: their
        draft and target distributions become point masses, so they are always accepted and never sampled.
        """
        return None

    def unconditional_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(
            f"guidance_scale != 1 needs an unconditional prompt, and the {self.family!r} adapter cannot build one "
            f"for {type(self.model).__name__}: pass negative_prompt_ids=... (and negative_prompt_attention_mask)")

    def prepare_cache(self, model, cache, input_ids: torch.Tensor, generation_config=None):
        """The cache a Jacobi ``generate`` decodes with, before any forward: transformers' (or a ``DynamicCache``
        when the model's config turns caching off, ``use_cache=False``: the tokens are the same), refused unless
        it can be cut per token, its sliding-window layers replaced by full ones (the loop keeps every slot and
        masks the window). An image family's model is a known Llama-style decoder: its rows use the ragged
        layout as they are."""
        from transformers import DynamicCache

        from ..jacobi.cache import check_croppable
        from .support import full_attention_layers, text_config

        if cache is None and not getattr(text_config(model), "use_cache", True):
            cache = DynamicCache(config=text_config(model))
        check_croppable(cache, model)
        return full_attention_layers(cache)

    #: attention implementations that take a custom 4D mask (``jacobi_siblings``' tree forward)
    TREE_ATTENTION = ("sdpa", "eager")

    def tree_attention_ready(self, model) -> bool:
        """Whether the model's attention takes the custom 4D mask of a tree forward (``jacobi_siblings``)."""
        return getattr(model.config, "_attn_implementation", None) in self.TREE_ATTENTION

    def check_tree_attention(self, model, knob: str = "jacobi_siblings") -> None:
        """Raise unless :meth:`tree_attention_ready` (``knob``: what asked for siblings)."""
        if not self.tree_attention_ready(model):
            implementation = getattr(model.config, "_attn_implementation", None)
            raise ValueError(f"{knob} > 0 verifies siblings of a draft in the same forward, which needs an "
                             f"attention that takes a custom 4D mask ({', '.join(map(repr, self.TREE_ATTENTION))}); "
                             f"{type(model).__name__} uses attn_implementation={implementation!r}: load it with "
                             f"attn_implementation='sdpa', or set {knob}=0")

    def tree_attention_mask(self, model, allowed: torch.Tensor) -> torch.Tensor:
        """``allowed`` [rows, 1, W, K] bool (True: attend) in the form the model's attention takes: SDPA reads a
        boolean mask as it is, eager attention adds a float one (0, or the dtype's minimum)."""
        if model.config._attn_implementation == "sdpa":
            return allowed
        blocked = torch.finfo(model.dtype).min
        return torch.zeros(allowed.shape, dtype=model.dtype, device=allowed.device).masked_fill_(~allowed, blocked)

    def window_logits(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor, cache, num_logits: int) -> torch.Tensor:
        """Logits ``[rows, num_logits, vocab]`` of the last ``num_logits`` input positions (cache updated). A window
        forward's cache is cut afterwards, so its sliding-window layers (which cannot be cut once full) are made
        full ones before the first forward stores anything, whoever made the cache (the loop, a cost measurement)."""
        from .support import full_attention_layers

        full_attention_layers(cache)
        # generate() sets logits_to_keep=1; a window needs the last L+1 positions.
        kwargs = {"logits_to_keep": num_logits} if model._supports_logits_to_keep() else {}
        output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                       use_cache=True, **kwargs)
        return output.logits[:, -num_logits:]


class CausalLMAdapter(ImageGenerationAdapter):
    """Any decoder-only transformers model: drafts from what the processors allow, no grid, no built-in CFG.

    A model that Jacobi decoding cannot run exactly is refused when the adapter is made (``hf_sjd.enable``, or the
    start of the Hub recipe's ``generate``) from its class and config, and at the start of the decoding method
    from the cache transformers built and a probe of a few tokens (:mod:`hf_sjd.adapters.support`); never after
    a forward of the call. Also the way to decode text with an image family's model (Chameleon / Lumina-mGPT):
    ``model.sjd_adapter = CausalLMAdapter(model)`` after ``hf_sjd.enable(model)``."""

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
        """As the base class, refusing also what is exact only up to a length this call may pass
        (``generation_config.max_length``), and decide the cache layout (:func:`hf_sjd.adapters.support.layout`,
        which probes the model with a few tokens once per model object, through ``model.forward``: a caller's
        hooks on the model do not see it) for :class:`~hf_sjd.jacobi.cache.RaggedCache` to read: a model that
        cannot be exact is refused here, before any forward of the call (forward-cost measurements included)."""
        from .support import FORWARD_FAILS, UnsupportedModelError, check_length, check_model, layout

        check_model(model)
        if generation_config is not None:
            check_length(model, generation_config.max_length)
        cache = super().prepare_cache(model, cache, input_ids, generation_config)
        try:
            cache.sjd_layout = layout(model, input_ids.shape[0])
        except UnsupportedModelError as refusal:
            if refusal.reason != FORWARD_FAILS or not isinstance(refusal.__cause__, ImportError):
                raise
            # a package the attention backend needs is missing: not the architecture's doing, so the request's own
            # checks speak first; RaggedCache raises this before the first decoding forward
            cache.sjd_layout = refusal
        return cache

    def tree_attention_ready(self, model) -> bool:
        """Also: no attention window measured in cache slots (a tree forward's siblings sit at slots that are not
        their positions, and its 4D mask replaces the model's window masks) and a probed ``"ragged"`` layout if
        the model was probed already."""
        from .support import window_layers

        probed = model.__dict__.get("_sjd_probe")
        return (super().tree_attention_ready(model) and window_layers(model) is None
                and (probed is None or (probed.ragged and probed.causal)))

    def check_tree_attention(self, model, knob: str = "jacobi_siblings") -> None:
        from .support import UnsupportedModelError, probe, window_layers

        windows = window_layers(model)
        if windows is None:
            if not ImageGenerationAdapter.tree_attention_ready(self, model):  # no 4D mask: the base class says so
                ImageGenerationAdapter.check_tree_attention(self, model, knob)
            seen = probe(model)
        if windows is not None or not (seen.ragged and seen.causal):
            what = windows or "attention that depends on cache slot indices"
            raise UnsupportedModelError(
                model, f"{knob} with slot-indexed attention",
                f"its {what} would see a tree forward's siblings at cache slots that are not their positions, and "
                f"the tree's 4D mask replaces the model's own window masks: set {knob}=0")


def check_image_sizes(images: list, factor: int, family: str) -> None:
    """``images`` (PIL) must share one size whose sides are multiples of the VQ downsampling ``factor``."""
    sizes = {image.size for image in images}
    if len(sizes) != 1 or any(side % factor for side in next(iter(sizes))):
        raise ValueError(f"{family}: encode_images needs images of one size, each side a multiple of the VQ factor "
                         f"{factor} px; got sizes {sorted(sizes)}")


def code_indices(codes: torch.Tensor, table_codes: torch.Tensor, family: str) -> torch.Tensor:
    """VQ codes (any shape) -> their positions in ``table_codes`` [n] (sorted: the adapter's code table,
    whose ``i``-th entry is the VQ code of ``draft_token_ids[i]``). Raises if a code has no image token."""
    table_codes = table_codes.to(codes.device)
    index = torch.searchsorted(table_codes, codes.contiguous()).clamp(max=len(table_codes) - 1)
    missing = table_codes[index] != codes
    if bool(missing.any()):
        raise ValueError(f"{family}: the VQ encoder produced code {int(codes[missing][0])}, which has no image "
                         f"token in the model's vocabulary (vocabulary_map); the checkpoint's configs disagree")
    return index


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
