"""A small VQ-VAE image tokenizer: 64x64 RGB <-> 16x16 grid of codebook indices. A normalised codebook (ViT-VQGAN,
Yu et al. 2021), EMA updates and dead-code re-seeding keep it from collapsing onto a few dozen codes."""

from __future__ import annotations

import hashlib

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn
from torch.nn import functional as F


def codebook_fingerprint(codebook: torch.Tensor) -> str:
    """sha256 of the fp16 bytes of a VQ codebook ``[codes, dim]``, 16 hex chars."""
    return hashlib.sha256(codebook.detach().to(torch.float16).cpu().numpy().tobytes()).hexdigest()[:16]


class ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.GroupNorm(8, channels), nn.SiLU(), nn.Conv2d(channels, channels, 3, padding=1),
            nn.GroupNorm(8, channels), nn.SiLU(), nn.Conv2d(channels, channels, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class NormalizedEMAQuantizer(nn.Module):
    """Nearest-code quantisation on the unit sphere with EMA updates and dead-code re-seeding."""

    def __init__(self, codebook_size: int, code_dim: int, decay: float = 0.95, dead_threshold: float = 0.03) -> None:
        super().__init__()
        self.decay, self.dead_threshold = decay, dead_threshold
        codebook = F.normalize(torch.randn(codebook_size, code_dim), dim=-1)
        self.register_buffer("codebook", codebook)  # [codes, dim], unit rows
        self.register_buffer("ema_sum", codebook.clone())
        self.register_buffer("ema_count", torch.ones(codebook_size))

    def indices(self, z: torch.Tensor) -> torch.Tensor:
        """``z``: [N, dim] -> nearest code index [N] (cosine similarity)."""
        return (F.normalize(z, dim=-1) @ self.codebook.T).argmax(-1)

    @torch.no_grad()
    def _ema_update(self, z: torch.Tensor, idx: torch.Tensor) -> None:
        one_hot = F.one_hot(idx, self.codebook.shape[0]).type_as(z)  # [N, codes]
        self.ema_count.mul_(self.decay).add_(one_hot.sum(0), alpha=1 - self.decay)
        self.ema_sum.mul_(self.decay).add_(one_hot.T @ z, alpha=1 - self.decay)
        self.codebook.copy_(F.normalize(self.ema_sum, dim=-1))
        dead = (self.ema_count < self.dead_threshold).nonzero().squeeze(-1)
        if len(dead):  # re-seed dead codes on random encoder outputs of this batch
            pick = z[torch.randint(0, z.shape[0], (len(dead),), device=z.device)]
            self.codebook[dead] = pick
            self.ema_sum[dead] = pick
            self.ema_count[dead] = 1.0

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``z``: [N, dim] -> (straight-through quantised [N, dim], indices [N], commitment loss)."""
        z = F.normalize(z, dim=-1)
        idx = (z @ self.codebook.T).argmax(-1)
        if self.training:
            self._ema_update(z.detach(), idx)
        quantized = self.codebook[idx]
        commitment = F.mse_loss(z, quantized.detach())
        return z + (quantized - z).detach(), idx, commitment


class VQTokenizer(nn.Module, PyTorchModelHubMixin, library_name="hf_sjd", tags=["vq-vae", "image-tokenizer"]):
    """Encoder -> normalised EMA quantiser -> decoder. ``encode`` gives ``[N, 16, 16]`` code grids."""

    def __init__(self, codebook_size: int = 512, code_dim: int = 32, channels: int = 64, image_size: int = 64) -> None:
        super().__init__()
        self.codebook_size, self.image_size = codebook_size, image_size
        c = channels
        # Full resolution is touched only by one strided conv each way: CPU training time is dominated
        # by 64x64 feature maps, and 4x4 patches are easy to (de)code at 32x32 and 16x16.
        self.encoder = nn.Sequential(
            nn.Conv2d(3, c, 4, stride=2, padding=1), ResBlock(c),  # 32x32
            nn.Conv2d(c, 2 * c, 4, stride=2, padding=1), ResBlock(2 * c), ResBlock(2 * c),  # 16x16
            nn.GroupNorm(8, 2 * c), nn.SiLU(), nn.Conv2d(2 * c, code_dim, 1),
        )
        self.quantizer = NormalizedEMAQuantizer(codebook_size, code_dim)
        self.decoder = nn.Sequential(
            nn.Conv2d(code_dim, 2 * c, 3, padding=1), ResBlock(2 * c), ResBlock(2 * c),  # 16x16
            nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1), ResBlock(c),  # 32x32
            nn.GroupNorm(8, c), nn.SiLU(), nn.ConvTranspose2d(c, 3, 4, stride=2, padding=1),  # 64x64
        )

    @property
    def grid_size(self) -> int:
        return self.image_size // 4

    @property
    def codebook(self) -> torch.Tensor:
        """``[codes, dim]`` unit-norm code embeddings (the latent space LANTERN/GSD measure distance in)."""
        return self.quantizer.codebook

    def fingerprint(self) -> str:
        """Stable hash of the codebook: phrase libraries and neighbour tables are keyed by it."""
        return codebook_fingerprint(self.codebook)

    def _latents(self, images: torch.Tensor) -> torch.Tensor:
        z = self.encoder(images)  # [N, dim, g, g]
        return z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])  # [N*g*g, dim]

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training pass: (reconstruction [N, 3, H, W], indices [N, g, g], commitment loss)."""
        n = images.shape[0]
        quantized, idx, commitment = self.quantizer(self._latents(images))
        g = self.grid_size
        recon = self.decoder(quantized.view(n, g, g, -1).permute(0, 3, 1, 2))
        return recon, idx.view(n, g, g), commitment

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, 3, 64, 64]`` in [-1, 1] -> code grid ``[N, 16, 16]`` (long)."""
        n = images.shape[0]
        g = self.grid_size
        return self.quantizer.indices(self._latents(images.to(self.codebook.dtype))).view(n, g, g)

    @torch.no_grad()
    def decode_to_tensor(self, codes: torch.Tensor) -> torch.Tensor:
        """Code grid ``[N, 16, 16]`` (or flat ``[N, 256]``) -> images ``[N, 3, 64, 64]`` in [-1, 1]."""
        g = self.grid_size
        codes = codes.reshape(-1, g, g)
        if codes.min() < 0 or codes.max() >= self.codebook_size:
            raise ValueError(f"codes must lie in [0, {self.codebook_size}); got range "
                             f"[{int(codes.min())}, {int(codes.max())}]")
        latents = self.codebook[codes].permute(0, 3, 1, 2)
        return self.decoder(latents).clamp(-1, 1)

    def decode(self, codes: torch.Tensor) -> list:
        """Code grid -> list of PIL images."""
        from .data import to_pil

        return to_pil(self.decode_to_tensor(codes))


def image_codes(sequences: torch.Tensor, num_codes: int, image_token_ids: torch.Tensor) -> torch.Tensor:
    """The VQ codes ``[b, num_codes]`` of sequences ``[b, prompt + num_codes]`` (or bare codes ``[b, num_codes]``);
    raises unless the last ``num_codes`` tokens, and only they, are image tokens (else another ``max_new_tokens``
    would decode silently from the wrong tokens)."""
    if sequences.ndim != 2 or sequences.shape[1] < num_codes:
        raise ValueError(f"expected sequences [batch, prompt + {num_codes}] ending in {num_codes} image tokens, got "
                         f"shape {tuple(sequences.shape)}")
    first, count = int(image_token_ids[0]), image_token_ids.numel()
    is_image = (sequences >= first) & (sequences < first + count)  # image_token_range is contiguous
    if not bool(is_image[:, -num_codes:].all()):
        raise ValueError(f"the last {num_codes} tokens are not all image tokens [{first}, {first + count}): not a "
                         f"generated image (was it generated with another max_new_tokens?)")
    if sequences.shape[1] > num_codes and bool(is_image[:, -num_codes - 1].any()):
        raise ValueError(f"the token before the last {num_codes} is an image token: the sequences hold more than "
                         f"one image's {num_codes} tokens after the prompt (generated with a larger max_new_tokens?)")
    return sequences[:, -num_codes:] - first
