"""Quality proxies for comparing decoding strategies on the same model and prompts.

Lossless strategies (SJD, MC-SJD) differ from vanilla sampling only by sampling noise; relaxed verifiers (LANTERN,
GSD) trade fidelity for speed. Every proxy is biased at small sample sizes: report it next to its floor (two
vanilla sets, or two real sets, of the same size). The papers' FID and CLIP score (``hf-sjd bench``) run through
torchmetrics (``pip install 'hf_sjd[bench]'``), each image scored once, so standard errors and paired differences
need no second pass. Token-level proxies of the study suites: ``benchmarks/metrics.py`` (a checkout).

    >>> import torch
    >>> from hf_sjd.quality import frechet_distance
    >>> round(frechet_distance(torch.tensor([[0.0], [2.0]]), torch.tensor([[1.0], [3.0]])), 6)  # means 1 apart
    1.0
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
from pathlib import Path

import torch


def frechet_distance(features_a, features_b) -> float:
    """Frechet distance between Gaussians fitted to two feature sets ``[N, D]`` (tensors, arrays or lists).

    ``|mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^1/2)`` (FID's formula, Heusel et al. 2017), the trace term from
    the eigenvalues of the symmetric ``S_a^1/2 S_b S_a^1/2`` (stable for the rank-deficient covariances of small
    samples; one sample has zero covariance). Hand-written rather than torchmetrics' FID (:class:`Frechet`),
    which needs torchmetrics: this is the base install's, over any features, in float64.
    """
    a, b = (torch.as_tensor(f, dtype=torch.float64) for f in (features_a, features_b))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
        raise ValueError(f"features must be [N, D] with the same D and N >= 1; got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")

    def cov(x):
        return torch.cov(x.T).reshape(x.shape[1], x.shape[1]) if len(x) > 1 else x.new_zeros(x.shape[1], x.shape[1])

    cov_a, cov_b = cov(a), cov(b)
    values, vectors = torch.linalg.eigh(cov_a)
    root_a = (vectors * values.clamp(min=0).sqrt()) @ vectors.T
    inner = root_a @ cov_b @ root_a
    cross = torch.linalg.eigvalsh((inner + inner.T) / 2).clamp(min=0).sqrt().sum()
    diff = a.mean(0) - b.mean(0)
    return float((diff @ diff + cov_a.trace() + cov_b.trace() - 2 * cross).clamp(min=0))


class ReferenceScorer:
    """FD-ref and class accuracy on the reference layout: codes decoded by its VQ, embedded and classified by its
    shipped classifier; FD-ref against held-out real crops of the prompts' classes."""

    def __init__(self, subject, classifier) -> None:
        self.subject, self.classifier = subject, classifier

    def _embed(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` float64 classifier features on the CPU."""
        return self.classifier.embed(images.to(next(self.classifier.parameters()).device)).double().cpu()

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, prompts: list[str]) -> dict:
        """``tokens`` [batch, new] -> per image: ``features`` (lists) and ``correct`` (the prompt's class)."""
        from .reference import CLASS_NAMES

        images = self.subject.vq.decode_to_tensor(tokens[:, -self.subject.num_image_tokens:])
        features = self.classifier.features(images)
        predictions = self.classifier.head(features).argmax(-1).cpu()
        labels = torch.tensor([CLASS_NAMES.index(p) for p in prompts])
        return {"features": features.cpu().double().tolist(), "correct": (predictions == labels).tolist()}

    @torch.no_grad()
    def heldout(self, prompts: list[str]) -> torch.Tensor:
        """``[N, D]`` features of the held-out crops (64 per class, seed 1: scripts/train_reference_model.py) of
        the prompts' classes."""
        from .reference.data import CLASS_NAMES, make_dataset

        images, labels = make_dataset(64, seed=1)
        wanted = torch.tensor([CLASS_NAMES[int(label)] in set(prompts) for label in labels])
        return self._embed(images[wanted])

    @torch.no_grad()
    def real_features(self, prompts: list[str], seed: int, through_vq: bool = False) -> torch.Tensor:
        """Features of fresh real crops (not the seeds 0-2 of training and held-out data), one per prompt: the
        FD-ref floor at a sample size; ``through_vq``: of their VQ reconstructions (the tokenizer's best)."""
        from collections import Counter

        from .reference.data import CLASSES, load_source_photo, random_crops

        counts, generator = Counter(prompts), torch.Generator().manual_seed(1_000_003 + seed)
        images = torch.cat([random_crops(load_source_photo(c.source), counts[c.name], generator)
                            for c in CLASSES if counts.get(c.name)])
        if through_vq:
            vq = self.subject.vq
            images = vq.decode_to_tensor(vq.encode(images.to(vq.codebook.device)))
        return self._embed(images)


# -- FID and CLIP score through torchmetrics -------------------------------------------------------------------
# the Inception input side; every image is centre-cropped to a square and resized to it (bicubic), where pytorch-fid
# and torchmetrics resize the whole image: on images that are not square the two give other FIDs
FID_SIDE = 299
BENCH_EXTRA = "pip install 'hf_sjd[bench]'"


def _need(module: str, message: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{message}: {BENCH_EXTRA}")


def to_uint8(images, side: int = FID_SIDE) -> torch.Tensor:
    """PIL images -> ``[N, 3, side, side]`` uint8, each centre-cropped to a square and resized (bicubic)."""
    import numpy as np
    from PIL import Image, ImageOps

    arrays = [np.asarray(ImageOps.fit(image.convert("RGB"), (side, side), Image.BICUBIC)) for image in images]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


class _TensorFeatures(torch.nn.Module):
    """A ``CLIPModel`` whose ``get_*_features`` return tensors, as torchmetrics 1.9's CLIP score expects
    (transformers 5 returns an output object: Lightning-AI/torchmetrics#3407)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.clip, self.config = model, model.config

    def get_image_features(self, *args, **kwargs) -> torch.Tensor:
        out = self.clip.get_image_features(*args, **kwargs)
        return getattr(out, "pooler_output", out)

    def get_text_features(self, *args, **kwargs) -> torch.Tensor:
        out = self.clip.get_text_features(*args, **kwargs)
        return getattr(out, "pooler_output", out)


class ClipScorer:
    """Per-image CLIP score (Hessel et al. 2021): torchmetrics' ``clip_score``, ``100 * max(cos, 0)`` of an image's
    and its prompt's embeddings. ``name``: folder or Hub id of a ``CLIPModel`` with its ``CLIPProcessor``."""

    def __init__(self, name: str, device) -> None:
        from transformers import AutoConfig, CLIPModel, CLIPProcessor

        _need("torchmetrics", "--clip-model is computed by torchmetrics, which is not installed")
        fetch = (f"download it (`hf download {name}`; the papers use openai/clip-vit-base-patch16) or pass a folder "
                 "holding a CLIPModel and its CLIPProcessor saved with save_pretrained")
        try:
            kind = AutoConfig.from_pretrained(name).model_type
        except Exception as error:  # no folder, offline Hub, no config.json
            raise ValueError(f"--clip-model {name!r}: no model config ({type(error).__name__}); {fetch}") from None
        if kind != "clip":
            raise ValueError(f"--clip-model {name!r} is a {kind!r} model, not CLIP (model_type 'clip'); {fetch}")
        try:
            model, self.processor = CLIPModel.from_pretrained(name).eval(), CLIPProcessor.from_pretrained(name)
        except Exception as error:  # weights or processor files missing
            raise ValueError(f"--clip-model {name!r}: cannot load its weights and processor ({type(error).__name__}: "
                             f"{str(error).splitlines()[0] if str(error) else ''}); {fetch}") from None
        self.device, self.model = torch.device(device), _TensorFeatures(model).to(device)

    @torch.no_grad()
    def __call__(self, images, prompts: list[str]) -> list[float]:
        from torchmetrics.functional.multimodal import clip_score

        pixels = to_uint8(images, 224).to(self.device)  # [N, 3, 224, 224]: CLIP's input, cropped as it does
        return [float(clip_score(pixels[i:i + 1], prompt, model_name_or_path=lambda: (self.model, self.processor)))
                for i, prompt in enumerate(prompts)]


class FidFeatures:
    """The FID feature network: ``"inception"`` (pytorch-fid's InceptionV3 pool features, torchmetrics' default)
    or a saved network (``torch.export`` ``.pt2`` with a dynamic batch, or TorchScript) mapping uint8
    ``[N, 3, 299, 299]`` to ``[N, D]``, probed on two blank images."""

    def __init__(self, kind: str, device) -> None:
        _need("torchmetrics", "FID is computed by torchmetrics, which is not installed")
        self.device, self.key = torch.device(device), kind
        if kind == "inception":
            _need("torch_fidelity", "--fid-features inception needs torch-fidelity")
            from torchmetrics.image.fid import NoTrainInceptionV3

            try:
                self.network = NoTrainInceptionV3(name="inception-v3-compat", features_list=["2048"])
            except Exception as error:  # offline: the weights are downloaded on first use (by torch-fidelity)
                raise ValueError(f"--fid-features inception: the Inception weights are not on this machine "
                                 f"({type(error).__name__}); download https://github.com/toshas/torch-fidelity/"
                                 f"releases/download/v0.2.0/weights-inception-2015-12-05-6726825d.pth into "
                                 f"{Path(torch.hub.get_dir()) / 'checkpoints'}/, or pass --fid-features a saved "
                                 "feature network (.pt2)") from None
        else:
            path = Path(kind).expanduser()
            if not path.is_file():
                raise ValueError(f"--fid-features {kind!r}: allowed values: inception, or the path of a saved "
                                 "feature network (torch.export .pt2, or TorchScript); no file there")
            try:
                self.network = (torch.export.load(str(path)).module() if path.suffix == ".pt2" else
                                torch.jit.load(str(path), map_location=self.device).eval())
            except Exception as error:  # a state dict, safetensors, any other file
                raise ValueError(f"--fid-features {kind!r} is not a saved network (torch.export.save -> .pt2, or "
                                 f"torch.jit.save) mapping uint8 [N, 3, 299, 299] to [N, D]: {type(error).__name__}"
                                 ) from None
            self.key = f"network:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
        self.network.to(self.device)
        try:
            probe = self(None, torch.zeros(2, 3, FID_SIDE, FID_SIDE, dtype=torch.uint8))
        except Exception as error:
            probe = error
        if not (isinstance(probe, torch.Tensor) and probe.shape[0] == 2 and probe.ndim == 2):
            shown = tuple(probe.shape) if isinstance(probe, torch.Tensor) else f"{type(probe).__name__}: {probe}"
            raise ValueError(f"--fid-features {kind!r}: a feature network maps uint8 [N, 3, 299, 299] to [N, D]; on "
                             f"[2, 3, 299, 299] this one gave {shown}")

    @torch.no_grad()
    def __call__(self, images, pixels: torch.Tensor | None = None) -> torch.Tensor:
        """PIL images (or uint8 ``pixels`` [N, 3, 299, 299]) -> ``[N, D]`` float64 features on the CPU."""
        pixels = to_uint8(images) if pixels is None else pixels
        return torch.cat([self.network(chunk.to(self.device)).double().cpu() for chunk in pixels.split(64)])


class Frechet:
    """FID of feature sets ``[N, D]`` against the reference set's: torchmetrics' ``FrechetInceptionDistance``
    over precomputed features, so bootstrap resamples need no feature network."""

    def __init__(self, reference: torch.Tensor, device="cpu") -> None:
        from torchmetrics.image.fid import FrechetInceptionDistance

        identity = torch.nn.Identity()  # the "feature network" over features computed already
        identity.num_features = reference.shape[1]  # read instead of a probe forward on an image
        self.metric = FrechetInceptionDistance(feature=identity, reset_real_features=False)
        self.metric.to(device).update(reference.double().to(device), real=True)

    def __call__(self, features: torch.Tensor) -> float:
        self.metric.reset()  # the generated side only
        self.metric.update(features.double().to(self.metric.device), real=False)
        return float(self.metric.compute())


def reference_images(spec: str, check_only: bool = False):
    """``--fid-reference``: ``coco2017-val``, a folder of images or a Hub dataset ``owner/name:split`` with an image
    column, ``[:N]``: the first N -> ``(cache key, count, read(i, j) -> PIL images i..j-1)``, read lazily (5000
    decoded images would not fit in memory); ``check_only`` opens nothing (and its key lacks the dataset's
    fingerprint)."""
    import re

    from .files import looks_local

    source, split, count = re.fullmatch(r"(.+?)(?::(\w+))?(?:\[:(\d+)\])?", spec.strip()).groups()
    limit = None if count is None else int(count)
    folder = Path(source).expanduser()
    if source == "coco2017-val" or not (folder.exists() or looks_local(source) or "/" not in source):
        dataset_id, split = ("lmms-lab/COCO-Caption2017", "val") if source == "coco2017-val" else (
            source, split or "validation")
        key = f"dataset:{dataset_id}:{split}:{limit}"
        if check_only:
            return key, None, None
        from datasets import Image, load_dataset

        try:
            rows = load_dataset(dataset_id, split=split if limit is None else f"{split}[:{limit}]")
        except Exception as error:  # offline, missing dataset or split
            raise ValueError(f"--fid-reference {spec!r}: cannot load the Hub dataset {dataset_id} (split {split}): "
                             f"{type(error).__name__}. Download it, or pass a folder of the reference images "
                             "(e.g. COCO's val2017/)") from None
        column = next((name for name, kind in rows.features.items() if isinstance(kind, Image)), None)
        if column is None:
            raise ValueError(f"--fid-reference {spec!r}: the dataset {dataset_id} has no image column")
        # the loaded rows' fingerprint (datasets hashes their data files): another revision of the dataset, another
        # key; hand-written because datasets has no public content id for a loaded split
        key += f":{getattr(rows, '_fingerprint', '')}"
        return key, len(rows), lambda i, j: rows[i:j][column]
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp", ".bmp")
                   ) if folder.is_dir() else []
    if not files:
        raise ValueError(f"--fid-reference {spec!r}: {'no image in' if folder.is_dir() else 'no folder'} "
                         f"{str(folder)!r}; allowed: coco2017-val, a folder of images, a Hub dataset owner/name:split")
    files = files[:limit]
    # the folder itself and each file's size and modification time: another folder, or the same names with other
    # images, is another key (a content hash would read every reference image on each run)
    key = f"folder:{folder.resolve()}:" + ";".join(
        f"{p.relative_to(folder)}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    from PIL import Image

    return key, len(files), lambda i, j: [Image.open(p) for p in files[i:j]]


def reference_features(spec: str, features: FidFeatures, cache: str, quiet: bool = True) -> torch.Tensor:
    """``[M, D]`` features of the ``--fid-reference`` images, computed once per (images, feature network) and
    cached as ``cache/fid-<hash>.pt``."""
    from tqdm.auto import tqdm

    from .files import atomic_write_bytes

    key, count, read = reference_images(spec)  # (a Hub dataset's rows are loaded for their fingerprint, not read)
    path = Path(cache).expanduser() / f"fid-{hashlib.sha256(f'{key}|{features.key}'.encode()).hexdigest()[:24]}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    if count < 2:
        raise ValueError(f"--fid-reference {spec!r}: FID needs at least 2 reference images, got {count}")
    found = torch.cat([features(read(i, i + 64)) for i in tqdm(range(0, count, 64), desc="FID reference",
                                                                disable=quiet)]).float()  # [M, D]
    buffer = io.BytesIO()
    torch.save(found, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return found


def bootstrap(statistic, size: int, resamples: int, seed: int = 0) -> torch.Tensor:
    """``[resamples, ...]``: ``statistic(index)`` over index sets of ``size`` drawn with replacement (Efron and
    Tibshirani 1993): their standard deviation is the statistic's standard error, and statistics computed in one
    call share the indices, so their difference is paired."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.as_tensor(statistic(torch.randint(0, size, (size,), generator=generator)))
                        for _ in range(resamples)])


__all__ = ["ClipScorer", "FidFeatures", "Frechet", "ReferenceScorer", "bootstrap", "frechet_distance",
           "reference_features"]
