"""Lumina-mGPT (Liu et al. 2024, arXiv 2408.02657) on ``ChameleonForConditionalGeneration`` (Team Chameleon 2024).

Layout (Lumina-mGPT's ``FlexARItemProcessor``): the header ``<racm3:break>`` + two size tokens
``<reserved{8800+n:05d}>`` (height, width; ``n`` units of 32 px = ``2n`` codes of 16 px), then ``H`` rows of ``W``
image tokens each closed by ``<reserved08799>``, then ``<eoss>``: ``H * (W + 1) + 1`` new tokens. The prompt ends
with the header (:meth:`ChameleonAdapter.image_header`), prefilled so the grid is known before drafting.

* logits: transformers' forward sets every image token's logit to the minimum (it generates text only), so
  ``lm_head`` is applied to the decoder's hidden states here, keeping image tokens only;
* CFG: Lumina-mGPT masks the text prompt out of the unconditional branch: its prompt is the header alone;
* decoding: transformers ships only the VQ *encoder*; the VQGAN decoder is loaded from the release's ``vqgan.ckpt``.
"""

from __future__ import annotations

import copy
import os
import re

import torch

from .base import ADAPTERS
from .chameleon_vqgan import VQGANDecoder
from .layout import TokenGrid, to_pil
from .vq_grid import VQGridAdapter

IMAGE_START, IMAGE_END, END_OF_LINE = "<racm3:break>", "<eoss>", "<reserved08799>"
SIZE_TOKEN = "<reserved{:05d}>"  # Lumina-mGPT get_n_grids_token: 8800 + n
SIZE_BASE, SIZE_UNIT_PX, CODE_PX = 8800, 32, 16  # size tokens count 32 px; one VQ code is 16 px


class ChameleonAdapter(VQGridAdapter):
    family, name, model_class = "lumina-mgpt", "Lumina-mGPT/Chameleon", "ChameleonForConditionalGeneration"

    def __init__(self, model, vq_decoder_path: str | os.PathLike | None = None) -> None:
        super().__init__(model)
        self.vq_decoder_path = vq_decoder_path
        self._decoder: "VQGANDecoder | None" = None

    @property
    def _vocabulary_mapping(self):
        return self.model.model.vocabulary_mapping

    def image_header(self, height: int, width: int) -> list[int]:
        """The 3 token ids that open an image of ``height x width`` pixels (multiples of 32)."""
        if height % SIZE_UNIT_PX or width % SIZE_UNIT_PX or height <= 0 or width <= 0:
            raise ValueError(f"Lumina-mGPT image sizes are positive multiples of {SIZE_UNIT_PX} px; "
                             f"got {height}x{width}")
        return [self._token(IMAGE_START), self._token(SIZE_TOKEN.format(SIZE_BASE + height // SIZE_UNIT_PX)),
                self._token(SIZE_TOKEN.format(SIZE_BASE + width // SIZE_UNIT_PX))]

    def make_grid(self, height: int, width: int) -> TokenGrid:
        """Grid of ``height x width`` VQ codes."""
        return TokenGrid(int(height), int(width), end_of_line=self._token(END_OF_LINE),
                         trailer=(self._token(IMAGE_END),))

    def _size_units(self, token: int) -> int:
        match = re.fullmatch(r"<reserved(\d{5})>", self._vocabulary_mapping.val2name.get(int(token), ""))
        if match is None or int(match[1]) <= SIZE_BASE:
            raise ValueError("Lumina-mGPT: an image prompt ends with the header <racm3:break> <height> <width> "
                             "(size tokens <reserved0880n>); append adapter.image_header(height_px, width_px)")
        return int(match[1]) - SIZE_BASE

    def grid_from_prompt(self, input_ids: torch.Tensor) -> TokenGrid:
        sizes, per_unit = set(), SIZE_UNIT_PX // CODE_PX  # (height, width) in codes
        for row in input_ids.cpu():
            if row.shape[0] < 3 or int(row[-3]) != self._token(IMAGE_START):
                raise ValueError("Lumina-mGPT: an image prompt ends with the header <racm3:break> <height> "
                                 "<width>; append adapter.image_header(height_px, width_px). To decode text with "
                                 "this model instead (a plain language model, no image layout), attach the generic "
                                 "adapter after hf_sjd.enable(model): model.sjd_adapter = "
                                 "hf_sjd.adapters.CausalLMAdapter(model)")
            sizes.add((self._size_units(row[-2]) * per_unit, self._size_units(row[-1]) * per_unit))
        return self.make_grid(*self._one_size(sizes))

    def prepare_generation(self, input_ids, kwargs: dict, generation_config=None) -> "ChameleonAdapter":
        if input_ids is None:
            raise ValueError("Lumina-mGPT: pass input_ids ending with the image header")
        bound = copy.copy(self)
        bound.grid = self.grid_from_prompt(input_ids)
        bound.grid.resolve_max_new_tokens("Lumina-mGPT", kwargs, generation_config, input_ids.shape[1],
                                          model_config=self.model.generation_config)
        return bound

    def unconditional_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """The image header alone (Lumina-mGPT masks the text prompt out of the unconditional branch)."""
        header = input_ids[:, -3:]
        return header, torch.ones_like(header)

    def window_logits(self, model, input_ids, attention_mask, position_ids, cache, num_logits: int) -> torch.Tensor:
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=cache, use_cache=True)
        # lm_head on the hidden states: Chameleon's own forward sets every image token's logit to the minimum (the
        # loop keeps only image tokens: restrict_logits)
        return model.lm_head(out.last_hidden_state[:, -num_logits:])

    def generated_tokens(self, tokens: torch.Tensor) -> tuple[torch.Tensor, TokenGrid]:
        """The image tokens after the header in each row of ``tokens`` [b, n] (sequences or bare image
        tokens, whose width is read from the first end-of-line token), and their grid."""
        start = self._token(IMAGE_START)
        if bool((tokens == start).any(1).all()):
            heads = [int((row == start).nonzero()[-1]) for row in tokens]
            grid = self.grid_from_prompt(torch.stack([row[h:h + 3] for row, h in zip(tokens, heads)]))
            rows = [row[h + 3:h + 3 + grid.num_tokens] for row, h in zip(tokens, heads)]
            if any(len(r) != grid.num_tokens for r in rows):
                raise ValueError(f"Lumina-mGPT: an image needs {grid.num_tokens} tokens after its header")
            return torch.stack(rows), grid
        eol = (tokens[0] == self._token(END_OF_LINE)).nonzero()
        if not len(eol):
            raise ValueError("Lumina-mGPT: cannot find the image grid (no header, no end-of-line token)")
        width = int(eol[0])
        grid = self.make_grid(tokens.shape[1] // (width + 1), width)
        return tokens[:, : grid.num_tokens], grid

    @property
    def _spatial_factor(self) -> int:
        return 2 ** (len(self.model.config.vq_config.channel_multiplier) - 1)  # pixels per VQ code (16)

    def encoder_image_size(self, image_processor=None) -> int:
        """The image processor's crop size (512 for Chameleon), else ``vq_config.resolution``; Lumina-mGPT
        checkpoints generate at 512, 768 or 1024 px: pass that size to match their grid."""
        crop = getattr(image_processor, "crop_size", None) or {}
        height = crop.get("height") if isinstance(crop, dict) else getattr(crop, "height", None)
        return int(height or self.model.config.vq_config.resolution)

    @torch.no_grad()
    def encode_images(self, images: list, image_processor=None) -> torch.Tensor:
        """Images -> ``[n, h*w]`` codes via ``ChameleonImageProcessor`` (no resize or crop) and the VQ ``encode``
        of ``get_image_tokens``."""
        if image_processor is None:
            from transformers import ChameleonImageProcessor

            image_processor = ChameleonImageProcessor()
        self._check_image_sizes(images)
        pixels = image_processor(images, do_resize=False, do_center_crop=False, return_tensors="pt")["pixel_values"]
        vq = self.model.model.vqmodel
        pixels = pixels.to(device=vq.device, dtype=vq.dtype)  # [n, 3, H, W]
        codes = vq.encode(pixels, return_dict=True).image_tokens.view(len(images), -1)  # [n, h*w] VQ codes
        return self._code_indices(codes)

    def load_vq_decoder(self, path: str | os.PathLike, allow_pickle: bool = False) -> "VQGANDecoder":
        """Load the VQGAN decoder (``decoder.*``, ``post_quant_conv.*``, optionally ``quantize.embedding.weight``)
        from a taming-transformers / Chameleon ``vqgan.ckpt`` (``state_dict`` inside), a ``.pt`` or a
        ``.safetensors`` file. Architecture from ``config.vq_config`` (the same VQGAN as the encoder)."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"Lumina-mGPT VQGAN decoder checkpoint not found: {path}")
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            try:
                state = torch.load(path, map_location="cpu", weights_only=not allow_pickle)
            except Exception as error:  # pickled non-tensor objects (e.g. Lightning hyper-parameters)
                raise ValueError(f"could not load {path} with weights_only=True ({error}); if you trust the file, "
                                 f"pass allow_pickle=True, or convert it to safetensors") from None
            state = state.get("state_dict", state)
        decoder = VQGANDecoder(self.model.config.vq_config)
        wanted = {k: v for k, v in state.items() if k.startswith(("decoder.", "post_quant_conv.", "quantize."))}
        if "quantize.embedding.weight" not in wanted:  # the encoder side holds the same codebook
            wanted["quantize.embedding.weight"] = self._codebook.detach().cpu()
        missing, _ = decoder.load_state_dict(wanted, strict=False)
        if missing:
            raise ValueError(f"{path} is not a Chameleon/Lumina-mGPT VQGAN checkpoint matching config.vq_config: "
                             f"missing {len(missing)} decoder weights, e.g. {missing[:3]}")
        self._decoder = decoder.to(device=self._codebook.device, dtype=self._codebook.dtype).eval()
        return self._decoder

    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor, vq_decoder_path: str | os.PathLike | None = None,
                      allow_pickle: bool = False) -> list:
        """Sequences (with the header) or bare image tokens -> PIL images with Lumina-mGPT's VQGAN decoder."""
        path = vq_decoder_path or self.vq_decoder_path
        if path is not None and (self._decoder is None or path != self.vq_decoder_path):
            self.load_vq_decoder(path, allow_pickle=allow_pickle)
            self.vq_decoder_path = path
        if self._decoder is None:
            raise ValueError(
                "Lumina-mGPT/Chameleon: transformers ships only Chameleon's VQ encoder, so there is no image decoder. "
                "Generation returned image tokens; to get pixels pass vq_decoder_path= (the VQGAN checkpoint of the "
                "Chameleon / Lumina-mGPT release, e.g. ckpts/chameleon/tokenizer/vqgan.ckpt) to decode_images.")
        pixels = self._decoder(self._grid_codes(*self.generated_tokens(tokens)))
        return to_pil(pixels, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))  # decoder output in [-1, 1]


ADAPTERS.append(ChameleonAdapter)
