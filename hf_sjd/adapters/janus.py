"""Janus / Janus-Pro (Wu et al. 2024, arXiv 2410.13848; Chen et al. 2025, arXiv 2501.17811) in image mode.

What ``JanusForConditionalGeneration.generate(generation_mode="image")``'s own loop does, for Jacobi strategies:

* image tokens are VQ codes ``0 .. num_embeddings-1``, scored by ``model.model.generation_head`` and embedded by
  ``prepare_embeddings_for_image_generation``; the text prompt (first forward only) by the text embeddings;
* the grid is ``num_patches x num_patches`` codes (576 for 384 px), no separators; EOS never stops an image;
* CFG rows as ``Janus.generate`` builds them: the prompt with every token but BOS and ``boi_token_id`` replaced
  by the pad token; ``guidance_scale`` defaults to the model's generation config.
"""

from __future__ import annotations

import copy

import torch

from ..reference.vq import codebook_fingerprint
from .base import ADAPTERS, ImageGenerationAdapter
from .layout import TokenGrid, processor_pil
from .support import input_device


#: the guidance scale Janus.generate(generation_mode="image") uses where none is given
JANUS_DEFAULT_GUIDANCE = 5.0


class JanusAdapter(ImageGenerationAdapter):
    family, model_class = "janus", "JanusForConditionalGeneration"
    guides_log_probs = False  # Janus.generate guides raw logits (ClassifierFreeGuidanceLogitsProcessor)
    samples_in_model_dtype = True  # ... and processes and softmaxes its head's scores in their dtype
    positions_from_slots = True  # ... and passes no position_ids: a right-padded prompt's padding counts too
    pad_token_id: int | None = None  # set per generate call
    boi_token_id: int | None = None

    @property
    def _vq(self):
        return self.model.model.vqmodel

    @property
    def vocab_size(self) -> int:
        return int(self._vq.config.num_embeddings)  # the generation head scores VQ codes only

    @property
    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(self.vocab_size, device=input_device(self.model))

    @property
    def latent_embeddings(self) -> torch.Tensor:
        """The L2-normalised VQ codebook ``[num_embeddings, embed_dim]`` (what its decoder consumes)."""
        return torch.nn.functional.normalize(self._vq.quantize.embedding.weight.detach().float(), dim=-1)

    @property
    def tokenizer_fingerprint(self) -> str:
        return codebook_fingerprint(self._vq.quantize.embedding.weight)

    @property
    def grid(self) -> TokenGrid:
        height, width = self._vq.quantize.quant_state_dims
        return TokenGrid(int(height), int(width))

    @property
    def grid_width(self) -> int:
        return self.grid.width

    def prepare_generation(self, input_ids, kwargs: dict, generation_config=None) -> "JanusAdapter":
        mode = kwargs.pop("generation_mode", "image")
        if mode != "image":
            raise ValueError(f"Janus: Jacobi strategies generate images (generation_mode='image'); got "
                             f"generation_mode={mode!r}. For text, call generate() without custom_generate")
        grid = self.grid
        num_tokens = int(self.model.model.vision_model.config.num_image_tokens)
        if num_tokens != grid.num_tokens:
            raise ValueError(f"Janus: vision_config.num_image_tokens={num_tokens} but the VQ grid is "
                             f"{grid.height}x{grid.width}; the checkpoint's configs disagree")
        if input_ids is None:
            raise ValueError("Janus: pass the text prompt as input_ids (Janus.generate does not take inputs_embeds)")
        # Janus.generate's text path (how the Hub recipe is reached) merges the model's and transformers' defaults
        # into generation_config and passes guidance_scale=None on (below)
        text_path = "guidance_scale" in kwargs and kwargs["guidance_scale"] is None
        grid.resolve_max_new_tokens("Janus", kwargs, generation_config, input_ids.shape[1],
                                    model_config=self.model.generation_config, merged=text_path)
        kwargs["eos_token_id"] = None  # Janus's image loop always writes the full grid; codes may equal EOS ids

        if text_path and getattr(generation_config, "guidance_scale", None):
            # the text path folds the caller's guidance_scale into generation_config and passes guidance_scale=None
            # on, so that its own unbatched CFG does not run
            kwargs["guidance_scale"] = generation_config.guidance_scale
        if self.call_setting("guidance_scale", kwargs, generation_config) is None:  # Janus.generate's default: CFG 5
            kwargs["guidance_scale"] = JANUS_DEFAULT_GUIDANCE
        bound = copy.copy(self)
        bound.pad_token_id = self.call_setting("pad_token_id", kwargs, generation_config)
        if bound.pad_token_id is None:
            bound.pad_token_id = self.model.config.get_text_config().pad_token_id
        extra = self.call_setting("generation_kwargs", kwargs, generation_config) or {}
        # Janus's processor ends an image prompt with <begin_of_image>; use it when the config has no boi id.
        bound.boi_token_id = extra.get("boi_token_id", int(input_ids[0, -1]))
        return bound

    def check_processors(self, processors) -> None:
        """Only warpers (temperature, top-k, top-p, ...): ``Janus.generate`` runs every other processor before its
        guidance, on the conditional and unconditional rows apart and with the text prompt's ids in place of the
        generated codes, which guiding first cannot reproduce."""
        from ..jacobi.processing import WARPERS

        others = sorted({type(p).__name__ for p in processors if not isinstance(p, WARPERS)})
        if others:
            raise ValueError(f"Janus: {', '.join(others)} cannot run exactly: Janus.generate applies such processors "
                             "before its classifier-free guidance, to the conditional and unconditional rows apart "
                             "and reading the text prompt's ids, not the generated codes. Drop them "
                             "(repetition_penalty, no_repeat_ngram_size, suppress_tokens, logits_processor=...); "
                             "temperature, top_k, top_p and the other warpers are fine")

    def unconditional_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.boi_token_id is None:
            raise ValueError("Janus: unconditional_prompt needs prepare_generation (done by generate)")
        if self.pad_token_id is None:
            raise ValueError("Janus: classifier-free guidance needs a pad_token_id: its unconditional rows replace the "
                             "prompt's text with padding, as Janus.generate does; pass pad_token_id=... (or set "
                             "model.generation_config.pad_token_id)")
        bos = self.model.generation_config.bos_token_id
        keep = input_ids == self.boi_token_id
        if bos is not None:
            keep |= input_ids == bos
        return torch.where(keep, input_ids, self.pad_token_id), attention_mask.clone()

    def window_logits(self, model, input_ids, attention_mask, position_ids, cache, num_logits: int) -> torch.Tensor:
        """``[rows, num_logits, num_embeddings]`` from the generation head; the first forward (empty cache) is
        ``[text prompt, L codes]``."""
        num_codes = input_ids.shape[1] if cache.get_seq_length() > 0 else num_logits - 1
        text, codes = input_ids[:, : input_ids.shape[1] - num_codes], input_ids[:, input_ids.shape[1] - num_codes:]
        parts = []
        if text.shape[1]:
            parts.append(model.get_input_embeddings()(text))
        if codes.shape[1]:
            parts.append(model.prepare_embeddings_for_image_generation(codes))
        embeds = torch.cat(parts, dim=1)
        out = model.model.language_model(inputs_embeds=embeds, attention_mask=attention_mask,
                                         position_ids=position_ids, cache=cache, use_cache=True)
        return model.model.generation_head(out.last_hidden_state[:, -num_logits:])

    def encoder_image_size(self, image_processor=None) -> int:
        """The only size whose VQ grid is the generation grid: ``num_patches`` x the VQ downsampling."""
        factor = 2 ** (len(self._vq.config.channel_multiplier) - 1)
        return self.grid.height * factor

    @torch.no_grad()
    def encode_images(self, images: list, image_processor=None) -> torch.Tensor:
        """Images -> ``[n, h*w]`` codes (the image tokens themselves) via ``JanusImageProcessor`` (no resizing) and
        ``vqmodel.encode``."""
        if image_processor is None:
            from transformers import JanusImageProcessor

            image_processor = JanusImageProcessor()
        side = self.encoder_image_size()
        sizes = {image.size for image in images}
        if sizes != {(side, side)}:
            raise ValueError(f"Janus: the VQ grid is {self.grid.height}x{self.grid.width}, so images must be "
                             f"{side}x{side} px; got sizes {sorted(sizes)}")
        pixels = image_processor(images, do_resize=False, return_tensors="pt")["pixel_values"]  # [n, 3, H, W]
        pixels = pixels.to(device=self._vq.device, dtype=self._vq.dtype)
        codes = self._vq.encode(pixels, return_dict=True).image_tokens  # [n*h*w]
        return codes.view(len(images), -1)

    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor, image_processor=None) -> list:
        """Sequences (prompt + codes) or bare codes ``[b, n]`` -> PIL images via ``decode_image_tokens``."""
        codes = tokens[:, -self.grid.num_tokens:]
        if codes.shape[1] != self.grid.num_tokens:
            raise ValueError(f"Janus: need {self.grid.num_tokens} image codes per row, got {tokens.shape[1]} tokens")
        pixels = self.model.decode_image_tokens(codes).permute(0, 3, 1, 2)  # [b, H, W, 3] -> [b, 3, H, W]
        return processor_pil(pixels, image_processor)


ADAPTERS.append(JanusAdapter)
