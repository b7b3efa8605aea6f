"""The shared base of families whose images are rows of VQ-code tokens in a text vocabulary (Emu3, Lumina-mGPT).

Both map VQ code ``c`` to a vocabulary token through the model's ``vocabulary_mapping`` (``img2bpe`` /
``bpe2img``), write ``H`` rows of ``W`` codes each closed by an end-of-line token, then a trailer, and keep
the VQ codebook in ``model.model.vqmodel``. Invariant: ``draft_token_ids[c]`` is the token of code
``_code_table[0][c]``, the order phrase libraries and ``latent_embeddings`` rows use.

    name                 shape      meaning
    _code_table          [n], [n]   (VQ codes in code order, their vocabulary token ids)
    _bpe_to_code         [vocab]    VQ code of each image token id, -1 elsewhere
    _image_mask          [vocab]    which ids are image tokens (free positions sample only these)
    grid                 TokenGrid  this call's layout (set by ``prepare_generation``)
"""

from __future__ import annotations

from functools import cached_property

import torch

from ..reference.vq import codebook_fingerprint
from .base import ImageGenerationAdapter
from .layout import TokenGrid
from .support import input_device


class VQGridAdapter(ImageGenerationAdapter):
    """Subclasses give ``_vocabulary_mapping`` (an object with ``img2bpe``/``bpe2img`` dicts), ``_spatial_factor``
    (pixels per VQ code), ``name`` (for messages) and the layout."""

    name = "VQ grid"

    def __init__(self, model) -> None:
        super().__init__(model)
        self.grid: TokenGrid | None = None  # set per generate call by prepare_generation

    def _token(self, name: str) -> int:
        """The id of the special token ``name`` (the config's ``vocabulary_map``)."""
        vocab = self._vocabulary_mapping.vocab_map
        if name not in vocab:
            raise ValueError(f"{self.name}: the config's vocabulary_map has no {name!r} token; is this an "
                             f"image-generation checkpoint?")
        return int(vocab[name])

    @cached_property
    def _code_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        img2bpe = self._vocabulary_mapping.img2bpe
        codes = sorted(img2bpe)
        return torch.tensor(codes, dtype=torch.long), torch.tensor([img2bpe[c] for c in codes], dtype=torch.long)

    @cached_property
    def _bpe_to_code(self) -> torch.Tensor:
        table = torch.full((self.vocab_size,), -1, dtype=torch.long)
        table[self._code_table[1]] = self._code_table[0]
        return table

    @cached_property
    def _image_mask(self) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self._code_table[1]] = True
        return mask.to(input_device(self.model))

    @property
    def draft_token_ids(self) -> torch.Tensor:
        return self._code_table[1].to(input_device(self.model))

    @property
    def _codebook(self) -> torch.Tensor:
        return self.model.model.vqmodel.quantize.embedding.weight

    @property
    def latent_embeddings(self) -> torch.Tensor:
        """VQ codebook vectors ``[n_image_tokens, embed_dim]``, row ``i`` for ``draft_token_ids[i]``."""
        return self._codebook.detach()[self._code_table[0].to(self._codebook.device)]

    @property
    def tokenizer_fingerprint(self) -> str:
        return codebook_fingerprint(self._codebook)

    @property
    def grid_width(self) -> int | None:
        return self.grid.row_stride if self.grid is not None else None

    def structural_tokens(self, positions: torch.Tensor) -> torch.Tensor | None:
        return self.grid.structural_tokens(positions) if self.grid is not None else None

    def mask_to_images(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [..., vocab] with every non-image token at the dtype's minimum (structural positions are
        forced by the loop)."""
        return logits.masked_fill(~self._image_mask.to(logits.device), torch.finfo(logits.dtype).min)

    def restrict_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Only image tokens (:meth:`mask_to_images`), after guidance as the families' recipes mask them: guidance
        over log-probabilities normalises over the whole vocabulary first."""
        return self.mask_to_images(logits)

    def _one_size(self, sizes: set) -> tuple[int, int]:
        """The one (height, width) all prompts of a batch ask for."""
        if len(sizes) != 1:
            raise ValueError(f"{self.name}: all prompts of a batch must ask for the same grid size; got "
                             f"{sorted(sizes)}")
        height, width = sizes.pop()
        return int(height), int(width)

    def _check_image_sizes(self, images: list) -> None:
        """``images`` (PIL) must share one size whose sides are multiples of the VQ downsampling."""
        sizes, factor = {image.size for image in images}, self._spatial_factor
        if len(sizes) != 1 or any(side % factor for side in next(iter(sizes))):
            raise ValueError(f"{self.name}: encode_images needs images of one size, each side a multiple of the VQ "
                             f"factor {factor} px; got sizes {sorted(sizes)}")

    def _code_indices(self, codes: torch.Tensor) -> torch.Tensor:
        """VQ codes (any shape) -> their indices in :attr:`draft_token_ids`; raises for a code without a token."""
        table_codes = self._code_table[0].to(codes.device)
        index = torch.searchsorted(table_codes, codes.contiguous()).clamp(max=len(table_codes) - 1)
        missing = table_codes[index] != codes
        if bool(missing.any()):
            raise ValueError(f"{self.name}: the VQ encoder produced code {int(codes[missing][0])}, which has no "
                             f"image token in the model's vocabulary (vocabulary_map); the checkpoint's configs "
                             f"disagree")
        return index

    def _grid_codes(self, tokens: torch.Tensor, grid: TokenGrid) -> torch.Tensor:
        """Generated image tokens ``[b, grid.num_tokens]`` -> VQ codes ``[b, h, w]``; raises for other tokens."""
        codes = self._bpe_to_code.to(tokens.device)[grid.code_tokens(tokens)]
        if bool((codes < 0).any()):
            raise ValueError(f"{self.name}: non-image tokens at image-code positions; were these generated in "
                             f"image mode?")
        return codes
