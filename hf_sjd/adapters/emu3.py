"""Emu3 (Wang et al. 2024, arXiv 2409.18869): ``Emu3ForConditionalGeneration`` in image-generation mode.

Layout (``Emu3Processor(return_for_image_generation=True)``): the prompt ends with the header
``<|image start|>{H}*{W}<|image token|>``, then ``H`` rows of ``W`` visual tokens each closed by ``<|extra_200|>``,
then ``<|extra_201|>`` (end of frame), ``<|image end|>`` and eos: ``H * (W + 1) + 3`` new tokens. This is the
Emu3 docs' recipe with its prefix constraint built in (free positions see only visual tokens). CFG:
``negative_prompt_ids`` as in the docs, else ``<bos>`` + the image header.
"""

from __future__ import annotations

import copy
import re
from functools import cached_property

import torch

from .base import ADAPTERS
from .layout import TokenGrid, processor_pil
from .vq_grid import VQGridAdapter

# The negative prompt of the Emu3 docs / original repository (tokenise it with the Emu3 processor).
NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
                   "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
                   "username, blurry.")
# Emu3Processor's default generation area (its `image_area`: 720 x 720 px at ratio 1:1, a 90 x 90 grid).
GENERATION_IMAGE_AREA = 518400

END_OF_LINE, END_OF_FRAME = "<|extra_200|>", "<|extra_201|>"
IMAGE_START, IMAGE_END, IMAGE_WRAPPER = "<|image start|>", "<|image end|>", "<|image token|>"


class Emu3Adapter(VQGridAdapter):
    family, name, model_class = "emu3", "Emu3", "Emu3ForConditionalGeneration"

    @property
    def _vocabulary_mapping(self):
        return self.model.vocabulary_mapping

    @cached_property
    def _eos(self) -> int:
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.model.config.get_text_config().eos_token_id
        return int(eos[0] if isinstance(eos, (list, tuple)) else eos)

    def make_grid(self, height: int, width: int) -> TokenGrid:
        return TokenGrid(int(height), int(width), end_of_line=self._token(END_OF_LINE),
                         trailer=(self._token(END_OF_FRAME), self._token(IMAGE_END), self._eos))

    def _header_start(self, row: torch.Tensor) -> int:
        """Index of the last ``<|image start|>`` in a prompt row that ends with ``<|image token|>``."""
        if int(row[-1]) != self._token(IMAGE_WRAPPER):
            raise ValueError("Emu3: an image-generation prompt ends with the image header "
                             "'<|image start|>{H}*{W}<|image token|>'; build it with "
                             "Emu3Processor(..., return_for_image_generation=True)")
        starts = (row == self._token(IMAGE_START)).nonzero()
        if not len(starts):
            raise ValueError("Emu3: the prompt has no '<|image start|>' token before '<|image token|>'")
        return int(starts[-1])

    def grid_from_prompt(self, input_ids: torch.Tensor) -> tuple[int, int]:
        """Parse ``{H}*{W}`` from each row's image header (the processor writes it as text)."""
        names = {v: k for k, v in self._vocabulary_mapping.vocab_map.items()}
        sizes = set()
        for row in input_ids.cpu():
            start = self._header_start(row)
            text = "".join(names.get(int(t), "?") for t in row[start + 1:-1])
            match = re.fullmatch(r"\s*(\d+)\s*\*\s*(\d+)\s*", text)
            if match is None:
                raise ValueError(f"Emu3: cannot read the grid size from the image header {text!r}; "
                                 f"pass image_sizes=[[H, W]] (token rows, columns)")
            sizes.add((int(match[1]), int(match[2])))
        return self._one_size(sizes)

    def prepare_generation(self, input_ids, kwargs: dict, generation_config=None) -> "Emu3Adapter":
        sizes = kwargs.pop("image_sizes", None)  # the processor's output; its forward would ignore it anyway
        if sizes is None and input_ids is None:
            raise ValueError("Emu3: pass input_ids (ending with the image header) or image_sizes=[[H, W]]")
        header = None
        if input_ids is not None:
            for row in input_ids.cpu():
                self._header_start(row)
            try:
                header = self.grid_from_prompt(input_ids)
            except ValueError:
                if sizes is None:
                    raise
        if sizes is not None:
            given = torch.as_tensor(sizes)
            if given.is_floating_point() and not torch.equal(given, given.round()):
                raise ValueError(f"Emu3: image_sizes must hold integer (rows, columns) pairs, got {sizes!r}")
            height, width = self._one_size({tuple(size) for size in given.long().reshape(-1, 2).tolist()})
            if header is not None and header != (height, width):
                raise ValueError(f"Emu3: image_sizes=[[{height}, {width}]] disagrees with the prompt's image header "
                                 f"{header[0]}*{header[1]}, which the model is conditioned on: pass the header's "
                                 "size, or drop image_sizes")
        else:
            height, width = header
        if height < 1 or width < 1:
            raise ValueError(f"Emu3: the image grid must be at least 1 x 1 (image_sizes or the prompt's image "
                             f"header), got {height} x {width}")
        bound = copy.copy(self)
        bound.grid = self.make_grid(height, width)
        bound.grid.resolve_max_new_tokens("Emu3", kwargs, generation_config,
                                          None if input_ids is None else input_ids.shape[1],
                                          model_config=self.model.generation_config,
                                          ends_generation=self._eos in self._stop_ids(kwargs, generation_config))
        return bound

    def _stop_ids(self, kwargs: dict, generation_config) -> set[int]:
        """The ids that end generation as transformers builds its criteria: ``eos_token_id`` (the keyword, else the
        passed config's, else the model's) and those of a user's ``EosTokenCriteria`` (an exact one replaces it)."""
        from transformers.generation.stopping_criteria import EosTokenCriteria

        users = [c for c in kwargs.get("stopping_criteria") or [] if isinstance(c, EosTokenCriteria)]
        ids = {int(i) for c in users for i in c.eos_token_id.flatten().tolist()}
        if any(type(c) is EosTokenCriteria for c in users):  # (transformers replaces its own by exact type only)
            return ids
        eos = self.call_setting("eos_token_id", kwargs, generation_config)
        return ids | set(torch.as_tensor(eos if eos is not None else []).flatten().tolist())

    def unconditional_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``<bos>`` + each row's image header: the empty-text prompt (left padded to a common length)."""
        bos = self.model.generation_config.bos_token_id
        bos = bos if bos is not None else self.model.config.get_text_config().bos_token_id
        rows = [torch.cat([input_ids.new_tensor([bos]), row[self._header_start(row):]]) for row in input_ids]
        width = max(len(r) for r in rows)
        pad = self.model.generation_config.pad_token_id or 0
        ids = input_ids.new_full((len(rows), width), pad)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
        return ids, mask

    @property
    def _spatial_factor(self) -> int:
        return int(self.model.model.vqmodel.vision_spatial_factor)  # pixels per VQ code along each side

    def encoder_image_size(self, image_processor=None) -> int:
        """720 px: ``Emu3Processor``'s default generation area (1:1) within the processor's ``min_pixels`` ..
        ``max_pixels`` (what its resize would keep), as a multiple of the VQ factor."""
        factor, area = self._spatial_factor, GENERATION_IMAGE_AREA
        if image_processor is not None:
            area = min(max(area, getattr(image_processor, "min_pixels", 0) or 0),
                       getattr(image_processor, "max_pixels", None) or area)
        return max(factor, int(area ** 0.5 / factor) * factor)

    @torch.no_grad()
    def encode_images(self, images: list, image_processor=None) -> torch.Tensor:
        """Images -> ``[n, h*w]`` codes via ``Emu3ImageProcessor`` (no resizing) and the VQ ``encode`` that
        ``get_image_tokens`` runs."""
        if image_processor is None:
            from transformers import Emu3ImageProcessor

            image_processor = Emu3ImageProcessor()
        self._check_image_sizes(images)
        batch = image_processor(images, do_resize=False, return_tensors="pt")
        vq = self.model.model.vqmodel
        pixels = batch["pixel_values"].to(device=vq.device, dtype=vq.dtype)  # [n, 3, H, W]
        grids = vq.encode(pixels, batch["image_sizes"], return_dict=True).image_tokens  # n x [h, w] VQ codes
        codes = torch.stack(list(grids)).flatten(1)  # [n, h*w] raster order
        return self._code_indices(codes)

    def generated_tokens(self, tokens: torch.Tensor, height: int | None = None, width: int | None = None
                         ) -> tuple[torch.Tensor, TokenGrid]:
        """The ``H * (W + 1) + 3`` image tokens of each row of ``tokens`` [b, n] (sequences with the header, or
        bare generated tokens), and their grid: from ``height``/``width``, the header or the first end-of-line."""
        wrapper = self._token(IMAGE_WRAPPER)
        has_header = bool((tokens == wrapper).any(1).all())
        if height is None or width is None:
            if has_header:
                prompt_end = int((tokens[0] == wrapper).nonzero()[-1]) + 1
                height, width = self.grid_from_prompt(tokens[:, :prompt_end])
            else:
                eol = (tokens[0] == self._token(END_OF_LINE)).nonzero()
                if not len(eol):
                    raise ValueError("Emu3: cannot infer the grid from tokens without an end-of-line; "
                                     "pass height= and width=")
                width = int(eol[0])
                height = (tokens.shape[1] - 3) // (width + 1)
        grid = self.make_grid(height, width)
        if has_header:
            starts = [int((row == wrapper).nonzero()[-1]) + 1 for row in tokens]
            tokens = torch.stack([row[s:s + grid.num_tokens] for row, s in zip(tokens, starts)])
        return tokens[:, : grid.num_tokens], grid

    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor, height: int | None = None, width: int | None = None,
                      image_processor=None) -> list:
        """Sequences or generated tokens -> PIL images via Emu3's own ``decode_image_tokens`` (its VQ decoder)."""
        tokens, grid = self.generated_tokens(tokens, height, width)
        self._grid_codes(tokens, grid)
        return processor_pil(self.model.decode_image_tokens(image_tokens=tokens, height=grid.height,
                                                            width=grid.width), image_processor)


ADAPTERS.append(Emu3Adapter)
