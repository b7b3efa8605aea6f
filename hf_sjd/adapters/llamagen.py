"""LlamaGen-style models: a ``LlamaForCausalLM`` over VQ codes with a condition-token prefix.

The checkpoint's config describes its layout (the shipped reference model does)::

    image_token_range = [first, last)    # drafted ids; image token id - first = VQ code
    image_grid = [height, width]
    null_condition_token_id = ...        # the unconditional prompt for classifier-free guidance
    vq_fingerprint = "..."               # optional: codebook hash of its VQ tokenizer (phrase libraries)
    phrase_library = "phrases"           # optional: default SJD-PV library: a subfolder of the model's own
                                         # folder / Hub repo (no "/"), or a library repo id ("owner/name")
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..files import looks_local
from ..reference.vq import VQTokenizer, image_codes
from .base import ADAPTERS, ImageGenerationAdapter, MissingPhraseLibrary
from .layout import TokenGrid
from .support import input_device


class LlamaGenAdapter(ImageGenerationAdapter):
    family = "llamagen"
    plain_sampling = True  # its images are sampled by transformers' own generate

    @classmethod
    def matches(cls, model) -> bool:
        return getattr(model.config, "image_token_range", None) is not None

    @property
    def draft_token_ids(self) -> torch.Tensor:
        first, last = self.model.config.image_token_range
        return torch.arange(first, last, device=input_device(self.model))

    @property
    def grid(self) -> TokenGrid | None:
        """``config.image_grid`` as a :class:`TokenGrid` (bare rows of codes, nothing structural)."""
        grid = getattr(self.model.config, "image_grid", None)
        return TokenGrid(height=int(grid[0]), width=int(grid[1])) if grid else None

    @property
    def grid_width(self) -> int | None:
        return self.grid.width if self.grid is not None else None

    def prepare_generation(self, input_ids, kwargs: dict, generation_config=None) -> "LlamaGenAdapter":
        """An image is exactly ``height x width`` new tokens: fill ``max_new_tokens`` in, refuse another length."""
        if self.grid is not None:
            prompt_length = input_ids.shape[1] if isinstance(input_ids, torch.Tensor) and input_ids.ndim == 2 else None
            self.grid.resolve_max_new_tokens("llamagen", kwargs, generation_config, prompt_length,
                                             model_config=self.model.generation_config)
        return self

    def decode_images(self, tokens: torch.Tensor, vq_tokenizer=None) -> list:
        """Generated sequences ``[b, prompt + h*w]`` (or bare codes ``[b, h*w]``) -> PIL images, through the VQ
        tokenizer next to the checkpoint (:func:`~hf_sjd.reference.vq.image_codes` checks the tokens)."""
        if self.grid is None:
            raise NotImplementedError("llamagen: the checkpoint's config has no image_grid; cannot decode")
        codes = image_codes(tokens, self.grid.height * self.grid.width, self.draft_token_ids)
        vq = vq_tokenizer or self.vq_tokenizer()
        return vq.decode(codes.to(vq.codebook.device))

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """``config.vq_fingerprint`` (the VQ tokenizer's codebook hash) if the checkpoint records it, else the hash
        of the ``vq/`` tokenizer next to the model where there is one (phrase libraries are checked against it)."""
        recorded = getattr(self.model.config, "vq_fingerprint", None)
        if recorded is not None or not getattr(self.model.config, "_name_or_path", ""):
            return recorded
        try:
            return self.vq_tokenizer().fingerprint()
        except (OSError, ValueError, TypeError, RuntimeError, KeyError):  # none there, or not one hf_sjd reads:
            return None  # nothing to check against (SJD-PV warns)

    @property
    def default_phrase_library(self) -> str | None:
        """``config.phrase_library``: a name without "/" (the reference model's ``"phrases"``) is a subfolder of
        the model's own checkpoint, so the library travels with the model (from its folder, else from its Hub repo
        at ``main``: transformers keeps no revision on the loaded config); else a library repo of its own."""
        library = getattr(self.model.config, "phrase_library", None)
        if library is None:
            return None
        source = str(getattr(self.model.config, "_name_or_path", "") or "")
        local = Path(source).expanduser() / library
        if source and local.is_dir():
            return str(local.resolve())
        if "/" in library.strip("/"):
            return library  # a library repo id (or a folder path) of its own
        if not source or Path(source).expanduser().is_dir() or looks_local(source):
            raise MissingPhraseLibrary(f"the model's config names phrase_library={library!r}, a subfolder of the "
                                       f"model's folder, but {local} does not exist: copy the library there, or ")
        return _hub_subfolder(source, library)

    def vq_tokenizer(self):
        """The :class:`~hf_sjd.reference.vq.VQTokenizer` in the ``vq/`` folder next to the model's (``<root>/ar``,
        ``<root>/vq``), loaded once per process."""
        folder = Path(getattr(self.model.config, "_name_or_path", "") or ".").parent / "vq"
        if not (folder / "config.json").is_file():
            raise ValueError(f"llamagen: no VQ tokenizer next to the model (looked for {folder}/config.json); lay "
                             f"the checkpoint out as <root>/ar + <root>/vq, or pass vq_tokenizer=")
        return _load_vq_tokenizer(str(folder.resolve()))

    def encoder_image_size(self, image_processor=None, vq_tokenizer=None) -> int:
        """The VQ tokenizer's input size (64 px for the reference model)."""
        return int((vq_tokenizer or self.vq_tokenizer()).image_size)

    @torch.no_grad()
    def encode_images(self, images: list, image_processor=None, vq_tokenizer=None) -> torch.Tensor:
        """Images -> ``[n, h*w]`` codes with the VQ tokenizer (pixels scaled to [-1, 1]; no image processor)."""
        import numpy as np

        vq = vq_tokenizer or self.vq_tokenizer()
        expected = getattr(self.model.config, "vq_fingerprint", None)  # (not the vq/ folder's: vq may be the caller's)
        if expected is not None and vq.fingerprint() != expected:
            raise ValueError(f"llamagen: the VQ tokenizer has fingerprint {vq.fingerprint()!r}, but the model's "
                             f"config records vq_fingerprint={expected!r}: it is another model's tokenizer")
        if vq.codebook_size != self.draft_token_ids.numel():
            raise ValueError(f"llamagen: the VQ tokenizer has {vq.codebook_size} codes, but image_token_range "
                             f"spans {self.draft_token_ids.numel()} tokens")
        sizes = {image.size for image in images}
        if sizes != {(vq.image_size, vq.image_size)}:
            raise ValueError(f"llamagen: the VQ tokenizer takes {vq.image_size}x{vq.image_size} px images; got "
                             f"sizes {sorted(sizes)}")
        pixels = torch.from_numpy(np.stack([np.asarray(image.convert("RGB")) for image in images]))  # [n, H, W, 3]
        pixels = pixels.permute(0, 3, 1, 2).float().div(127.5).sub(1.0)  # [n, 3, H, W] in [-1, 1]
        return vq.encode(pixels.to(vq.codebook.device)).flatten(1)  # [n, grid*grid] raster order

    def unconditional_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        null_id = getattr(self.model.config, "null_condition_token_id", None)
        if null_id is None:
            return super().unconditional_prompt(input_ids, attention_mask)
        ones = torch.ones(input_ids.shape[0], 1, dtype=torch.long, device=input_ids.device)
        return ones * null_id, ones


@functools.lru_cache(maxsize=4)
def _load_vq_tokenizer(folder: str):
    return VQTokenizer.from_pretrained(folder).eval()


@functools.lru_cache(maxsize=8)
def _hub_subfolder(repo_id: str, subfolder: str) -> str:
    """``subfolder`` of the model repo ``repo_id``, downloaded once per process (then served by the HF cache)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from ..hub import head

    _, reason = head(repo_id, "config.json")  # fail in seconds, not after retries, when the Hub is away
    try:
        root = Path(snapshot_download(repo_id, allow_patterns=f"{subfolder}/*", local_files_only=reason is not None))
    except LocalEntryNotFoundError:
        raise MissingPhraseLibrary(f"the model's default phrase library is the {subfolder}/ folder of its Hub repo "
                                   f"{repo_id}, which is not in the Hub cache and cannot be fetched"
                                   f"{f' ({reason})' if reason else ' (HF_HUB_OFFLINE=1)'}: check the connection, or ",
                                   "phrase_library=<local folder>") from None
    if not (root / subfolder).is_dir():
        raise MissingPhraseLibrary(f"the model's config names phrase_library={subfolder!r}, a subfolder of its Hub "
                                   f"repo {repo_id}, but the repo has no {subfolder}/ folder; ")
    return str(root / subfolder)


ADAPTERS.append(LlamaGenAdapter)
