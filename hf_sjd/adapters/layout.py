"""Shared pieces of the image-model adapters: token-grid layouts, codebook fingerprints, pixels -> PIL.

:class:`TokenGrid`: which generated positions are image codes and which are fixed. Emu3 and Lumina-mGPT write
``height`` rows of ``width`` codes, each followed by an end-of-line token, then a short trailer; Janus and LlamaGen
the bare ``height x width`` codes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: OpenAI CLIP's normalisation: the default of Emu3's and Janus's image processors (checkpoints may ship their own)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class TokenGrid:
    height: int  # rows of image codes
    width: int  # image codes per row
    end_of_line: int | None = None  # token id after every row (None: rows are not delimited)
    trailer: tuple[int, ...] = ()  # token ids after the last row, in order

    @property
    def row_stride(self) -> int:
        """Tokens per row in the generated sequence (codes + end-of-line): the ``grid_width`` drafting sees."""
        return self.width + (self.end_of_line is not None)

    @property
    def num_tokens(self) -> int:
        """New tokens of one image: the ``max_new_tokens`` the layout needs."""
        return self.height * self.row_stride + len(self.trailer)

    def structural_tokens(self, positions: torch.Tensor) -> torch.Tensor | None:
        """``positions`` [b, k] (0 = first generated token) -> ids [b, k], ``-1`` where a code is free."""
        if self.end_of_line is None and not self.trailer:
            return None
        body = self.height * self.row_stride
        forced = torch.full_like(positions, -1)
        if self.end_of_line is not None:
            at_eol = (positions < body) & (positions % self.row_stride == self.width)
            forced = torch.where(at_eol, torch.full_like(positions, self.end_of_line), forced)
        if self.trailer:
            trailer = torch.tensor(self.trailer, dtype=positions.dtype, device=positions.device)
            offset = positions - body
            in_trailer = (offset >= 0) & (offset < len(self.trailer))
            forced = torch.where(in_trailer, trailer[offset.clamp(0, len(self.trailer) - 1)], forced)
        return forced

    def code_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` [b, num_tokens] generated ids -> ``[b, height, width]`` image-code token ids."""
        if tokens.shape[-1] != self.num_tokens:
            raise ValueError(f"expected {self.num_tokens} generated tokens for a {self.height}x{self.width} grid "
                             f"({self.describe()}), got {tokens.shape[-1]}")
        body = tokens[:, : self.height * self.row_stride].reshape(-1, self.height, self.row_stride)
        return body[:, :, : self.width]

    def describe(self) -> str:
        parts = [f"{self.height} rows of {self.width} codes"]
        if self.end_of_line is not None:
            parts[0] += " + end-of-line"
        if self.trailer:
            parts.append(f"{len(self.trailer)} closing token(s)")
        return ", then ".join(parts)

    def resolve_max_new_tokens(self, family: str, kwargs: dict, user_generation_config, prompt_length: int | None,
                               model_config=None, merged: bool = False, ends_generation: bool = False) -> None:
        """Set ``max_new_tokens`` to :attr:`num_tokens` where the length is given (``kwargs``, else the user's own
        ``GenerationConfig``: transformers warns where a config comes with length keywords), or raise if the user
        chose another length (``max_new_tokens``, or ``max_length``): a longer one is the same call where the
        layout's last token ``ends_generation`` (Emu3's EOS: vanilla stops there). Not the user's choice: a config's
        length equal to the model's own (``model_config``'s: a copy of the checkpoint's config), and where
        transformers' defaults were ``merged`` into the config (Janus's text path), its fallback ``max_length``."""
        from transformers import GenerationConfig

        need, config = self.num_tokens, user_generation_config
        own = {name: getattr(model_config, name, None) for name in ("max_new_tokens", "max_length")}
        defaults = {"max_new_tokens": {None, own["max_new_tokens"]}, "max_length": {None, own["max_length"]}}
        if merged:
            defaults["max_length"].add(GenerationConfig._get_default_generation_params().get("max_length"))

        def chosen(name: str):
            value = kwargs.get(name)
            if value is None and config is not None and getattr(config, name, None) not in defaults[name]:
                value = getattr(config, name)
            return value

        given, source, length = chosen("max_new_tokens"), "max_new_tokens", chosen("max_length")
        if given is None and length is not None and prompt_length is not None:
            given, source = length - prompt_length, "max_length - prompt length"
        if given is not None and given != need and not (ends_generation and given > need):
            raise ValueError(
                f"{family}: a {self.height}x{self.width} image is {need} new tokens ({self.describe()}), but "
                f"{source} = {given}. Omit max_new_tokens (it is filled in) or pass max_new_tokens={need}"
                f"{' or more' if ends_generation else ''}.")
        kwargs.pop("max_length", None)
        if config is not None and "max_new_tokens" not in kwargs:
            config.max_new_tokens, config.max_length = need, None
        else:
            kwargs["max_new_tokens"] = need


def processor_pil(pixels: torch.Tensor, image_processor=None) -> list:
    """:func:`to_pil` with ``image_processor``'s normalisation (default: CLIP's)."""
    return to_pil(pixels, getattr(image_processor, "image_mean", None) or CLIP_MEAN,
                  getattr(image_processor, "image_std", None) or CLIP_STD)


def to_pil(pixels: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> list:
    """Decoder output ``[b, 3, H, W]`` in normalised space -> PIL images (``x * std + mean``, then 0..255, clipped
    and truncated to uint8), as the image processors' ``postprocess`` does."""
    from PIL import Image

    x = pixels.detach().float().cpu()
    mean_t = torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    x = ((x * std_t + mean_t) * 255).clamp(0, 255).to(torch.uint8)
    return [Image.fromarray(img.permute(1, 2, 0).numpy()) for img in x]
