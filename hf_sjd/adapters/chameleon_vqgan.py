"""Chameleon / Lumina-mGPT's VQGAN *decoder* (transformers ships only the encoder): the taming-transformers
``Decoder`` as in Chameleon's ``vqgan.py``, built from ``config.vq_config`` and loaded from the release's
``vqgan.ckpt`` by :meth:`hf_sjd.adapters.ChameleonAdapter.load_vq_decoder`.
"""

from __future__ import annotations

import torch
from torch import nn


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class _ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = _norm(in_channels), nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2, self.conv2 = _norm(out_channels), nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(nn.functional.silu(self.norm1(x)))
        h = self.conv2(nn.functional.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class _AttnBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, c, height, width = h.shape
        q, k, v = (f(h).reshape(b, c, height * width).transpose(1, 2) for f in (self.q, self.k, self.v))
        out = nn.functional.scaled_dot_product_attention(q, k, v)  # [b, hw, c]
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, height, width))


class _Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Decoder(nn.Module):
    def __init__(self, ch: int, ch_mult: list[int], num_res_blocks: int, attn_resolutions: list[int],
                 resolution: int, z_channels: int, out_ch: int) -> None:
        super().__init__()
        block_in = ch * ch_mult[-1]
        res = resolution // 2 ** (len(ch_mult) - 1)
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.attn_1, self.mid.block_2 = (
            _ResnetBlock(block_in, block_in), _AttnBlock(block_in), _ResnetBlock(block_in, block_in))
        self.up = nn.ModuleList()
        for level in reversed(range(len(ch_mult))):
            up = nn.Module()
            up.block, up.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(num_res_blocks + 1):
                up.block.append(_ResnetBlock(block_in, ch * ch_mult[level]))
                block_in = ch * ch_mult[level]
                if res in attn_resolutions:
                    up.attn.append(_AttnBlock(block_in))
            if level != 0:
                up.upsample = _Upsample(block_in)
                res *= 2
            self.up.insert(0, up)
        self.norm_out = _norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        for level in reversed(range(len(self.up))):
            up = self.up[level]
            for i, block in enumerate(up.block):
                h = block(h)
                if len(up.attn):
                    h = up.attn[i](h)
            if hasattr(up, "upsample"):
                h = up.upsample(h)
        return self.conv_out(nn.functional.silu(self.norm_out(h)))


class VQGANDecoder(nn.Module):
    """Codes ``[b, h, w]`` -> pixels ``[b, 3, 16h, 16w]`` in [-1, 1] (Chameleon's VQGAN, taming key names)."""

    def __init__(self, vq_config) -> None:
        super().__init__()
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(vq_config.num_embeddings, vq_config.embed_dim)
        self.post_quant_conv = nn.Conv2d(vq_config.embed_dim, vq_config.latent_channels, 1)
        self.decoder = _Decoder(vq_config.base_channels, list(vq_config.channel_multiplier), vq_config.num_res_blocks,
                                list(vq_config.attn_resolutions or []), vq_config.resolution,
                                vq_config.latent_channels, vq_config.in_channels)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        quant = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # [b, embed_dim, h, w]
        return self.decoder(self.post_quant_conv(quant)).clamp(-1, 1)

