"""Latent-space neighbours of the drafted codes (LANTERN, GSD): aligned embeddings, k-NN and its cache.

``latent_embeddings`` row ``i`` is the VQ codebook vector of draft token ``draft_token_ids[i]``. The k-NN table
of a codebook is computed once and cached on disk by the codebook's digest (under ``$HF_HOME/hf_sjd``).
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..files import atomic_write_bytes
from .options import ComponentOptions

logger = logging.getLogger(__name__)


@dataclass
class LatentOptions(ComponentOptions):
    latent_embeddings: Any = field(default=None, metadata={"knob": "latent_embeddings"})  # [n codes, dim]


def aligned_embeddings(embeddings, config, adapter, draft_token_ids: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(ids [n], embeddings [n, dim] float32)`` from the ``latent_embeddings`` knob, else the adapter's, or
    ``None``: row ``i`` belongs to ``draft_token_ids[i]`` as the user gave them, else as drafted by default."""
    embeddings = adapter.latent_embeddings if embeddings is None else embeddings
    if embeddings is None:
        return None
    try:
        embeddings = torch.as_tensor(embeddings)  # a tensor as it is
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"latent_embeddings must be a tensor [len(draft_token_ids), dim]: {error}") from None
    if embeddings.ndim != 2 or not embeddings.is_floating_point():
        raise ValueError(f"latent_embeddings must be a float tensor [len(draft_token_ids), dim]; got shape "
                         f"{tuple(embeddings.shape)} and dtype {embeddings.dtype}")
    ids = config.draft_ids_tensor(adapter.vocab_size, draft_token_ids.device, keyed="latent_embeddings rows")
    ids = draft_token_ids if ids is None else ids
    if embeddings.shape[0] != ids.numel():
        raise ValueError(f"latent_embeddings has {embeddings.shape[0]} rows but there are {ids.numel()} "
                         f"draft_token_ids: row i must be the latent vector of draft_token_ids[i]")
    embeddings = embeddings.detach().to(device=draft_token_ids.device, dtype=torch.float32)
    if not torch.isfinite(embeddings).all():
        raise ValueError("latent_embeddings contains NaN or infinite values")
    return ids, embeddings


def nearest_neighbours(embeddings: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """``[n, k]`` row indices of the k nearest rows of each row by L2 distance, nearest first, self excluded."""
    n = embeddings.shape[0]
    if k > n - 1:
        raise ValueError(f"k={k} neighbours requested but only {n - 1} other codes exist")
    embeddings = embeddings.float()
    out = torch.empty(n, k, dtype=torch.long, device=embeddings.device)
    if k == 0:
        return out
    for start in range(0, n, chunk):
        rows = embeddings[start:start + chunk]
        dist = torch.cdist(rows, embeddings, compute_mode="donot_use_mm_for_euclid_dist")
        index = torch.arange(start, start + rows.shape[0], device=embeddings.device)
        dist[torch.arange(rows.shape[0], device=embeddings.device), index] = math.inf  # exclude self
        out[start:start + rows.shape[0]] = dist.topk(k, dim=-1, largest=False, sorted=True).indices
    return out


def neighbour_cache_path(embeddings: torch.Tensor, k: int) -> Path:
    """``$HF_HOME/hf_sjd/lantern-<sha of the codebook's shape and float32 values>-k<k>.safetensors``."""
    from huggingface_hub import constants

    data = embeddings.detach().to(device="cpu", dtype=torch.float32).contiguous()
    digest = hashlib.sha256(str(tuple(data.shape)).encode())
    digest.update(data.numpy().tobytes())
    return Path(constants.HF_HOME) / "hf_sjd" / f"lantern-{digest.hexdigest()[:16]}-k{k}.safetensors"


def cached_nearest_neighbours(embeddings: torch.Tensor, k: int, cache: bool = True) -> torch.Tensor:
    """:func:`nearest_neighbours`, cached per codebook and ``k`` (a bad file is recomputed and replaced)."""
    if not cache or k == 0:
        return nearest_neighbours(embeddings, k)
    from safetensors.torch import load_file, save

    n = embeddings.shape[0]
    path = neighbour_cache_path(embeddings, k)
    if path.exists():
        try:
            table = load_file(str(path))["neighbours"].long().to(embeddings.device)
            if table.shape == (n, k) and int(table.min()) >= 0 and int(table.max()) < n:
                return table
            logger.warning("ignoring LANTERN neighbour cache %s: wrong shape or ids", path)
        except Exception as error:  # noqa: BLE001 - any unreadable file is recomputed
            logger.warning("ignoring unreadable LANTERN neighbour cache %s: %s", path, error)
    table = nearest_neighbours(embeddings, k)
    try:
        atomic_write_bytes(path, save({"neighbours": table.to(device="cpu", dtype=torch.int32).contiguous()}))
    except OSError as error:
        logger.warning("could not cache the LANTERN neighbour table at %s: %s", path, error)
    return table
