"""Cheap quality proxies for comparing decoding strategies on the same model and prompts.

Lossless strategies (SJD, MC-SJD) sample exactly from the model, so their proxies differ from vanilla sampling
only by sampling noise; relaxed verifiers (LANTERN, GSD) trade some of that fidelity for speed. Each proxy is
biased at small sample sizes, so it is reported next to its floor (two vanilla sets, or two real sets, of the
same size):

* :func:`mean_token_loglik`: likelihood of the generated tokens under the model's own, *unprocessed* distribution
  (relaxed acceptance commits tokens the model finds less likely);
* :func:`token_frequency_tv`: total variation between the token histograms of two sample sets;
* :func:`frechet_distance`: the FID formula over any features (FD-ref: the reference classifier's, with class
  accuracy, through :class:`ReferenceScorer`);
* :func:`adjacent_repeat_rate`: codes equal to their left neighbour (mode seeking shows up here).

    >>> import torch
    >>> from hf_sjd.quality import token_frequency_tv
    >>> token_frequency_tv(torch.tensor([[0, 1]]), torch.tensor([[1, 1]]), vocab=3)
    0.5
"""

from __future__ import annotations

import torch


@torch.no_grad()
def token_logliks(model, sequences: torch.Tensor, prompt_len: int, batch_size: int = 16) -> torch.Tensor:
    """``[batch, new]`` log-probability of each generated token under the model's raw logits.

    ``sequences`` [batch, prompt_len + new] are full, unpadded sequences (prompt, then generated tokens).
    """
    if sequences.ndim != 2 or not 0 < prompt_len < sequences.shape[1]:
        raise ValueError(f"sequences must be [batch, prompt_len + new] with 0 < prompt_len < length; got shape "
                         f"{tuple(sequences.shape)} and prompt_len={prompt_len}")
    device = next(model.parameters()).device
    rows = []
    for start in range(0, sequences.shape[0], batch_size):
        chunk = sequences[start:start + batch_size].to(device)
        logits = model(input_ids=chunk).logits[:, prompt_len - 1:-1].float()  # predicts tokens prompt_len..end
        logprobs = logits.log_softmax(-1)
        rows.append(logprobs.gather(-1, chunk[:, prompt_len:, None]).squeeze(-1).cpu())
    return torch.cat(rows)


def mean_token_loglik(model, sequences: torch.Tensor, prompt_len: int, batch_size: int = 16) -> float:
    """Mean log-likelihood (nats per token) of the generated tokens under the model's unprocessed distribution.

    ``sequences`` [batch, prompt_len + new] (e.g. ``generate(...).sequences``); every generated token of every
    row counts equally.
    """
    return float(token_logliks(model, sequences, prompt_len, batch_size).mean())


def token_frequencies(sequences: torch.Tensor, vocab: int) -> torch.Tensor:
    """Normalised histogram ``[vocab]`` of all tokens in ``sequences`` (any shape)."""
    tokens = torch.as_tensor(sequences).flatten().long()
    if tokens.numel() == 0:
        raise ValueError("token_frequencies needs at least one token")
    if int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
        raise ValueError(f"tokens must lie in [0, {vocab}); got range [{int(tokens.min())}, {int(tokens.max())}]")
    counts = torch.bincount(tokens.cpu(), minlength=vocab).double()
    return counts / counts.sum()


def token_frequency_tv(seqs_a: torch.Tensor, seqs_b: torch.Tensor, vocab: int) -> float:
    """Total-variation distance ``0.5 * sum |f_a - f_b|`` between the token histograms of two sample sets.

    Pass only the generated tokens (e.g. ``sequences[:, prompt_len:]``). At small sample sizes even two sets
    from the same sampler differ; report the vanilla-vs-vanilla TV at the same size next to it.
    """
    return float(0.5 * (token_frequencies(seqs_a, vocab) - token_frequencies(seqs_b, vocab)).abs().sum())


def adjacent_repeat_rate(sequences: torch.Tensor) -> torch.Tensor:
    """Per row [batch]: fraction of tokens equal to their left neighbour (pass generated tokens only).

    A mode-seeking sampler (e.g. one that commits frequent library phrases) repeats codes more often."""
    tokens = torch.as_tensor(sequences)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"sequences must be [batch, length >= 2], got shape {tuple(tokens.shape)}")
    return (tokens[:, 1:] == tokens[:, :-1]).double().mean(1)


def frechet_distance(features_a, features_b) -> float:
    """Frechet distance between Gaussians fitted to two feature sets ``[N, D]`` (tensors, arrays or nested lists).

    ``|mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^1/2)`` (the FID formula, Heusel et al. 2017), with
    ``Tr (S_a S_b)^1/2`` computed as the sum of square roots of the eigenvalues of the symmetric PSD matrix
    ``S_a^1/2 S_b S_a^1/2`` (stable for the rank-deficient covariances of small samples, unlike a general
    ``sqrtm``). A single sample has zero covariance. Small samples bias it upwards: compare against a floor at
    the same sample size.

    Hand-written rather than torchmetrics' FID: that one is tied to Inception features (and is not a
    dependency); this is the same formula over whatever features are passed, in float64.
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


HELDOUT_PER_CLASS, HELDOUT_SEED = 64, 1  # the held-out crops of scripts/train_reference_model.py (report.json)


class ReferenceScorer:
    """FD-ref and class accuracy on the reference layout: generated codes decoded by its VQ, embedded and
    classified by its shipped classifier; FD-ref against held-out real crops of the prompts' classes."""

    def __init__(self, subject, classifier) -> None:
        self.subject, self.classifier = subject, classifier

    def _embed(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` float64 classifier features on the CPU, the images run where the classifier is."""
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
        """``[N, D]`` features of the held-out crops of the prompts' classes."""
        from .reference.data import CLASS_NAMES, make_dataset

        images, labels = make_dataset(HELDOUT_PER_CLASS, seed=HELDOUT_SEED)
        wanted = torch.tensor([CLASS_NAMES[int(label)] in set(prompts) for label in labels])
        return self._embed(images[wanted])

    @torch.no_grad()
    def real_features(self, prompts: list[str], seed: int, through_vq: bool = False) -> torch.Tensor:
        """Features of fresh real crops, one per prompt (not training data: the training and held-out sets use
        seeds 0-2 of ``make_dataset``); ``through_vq``: of their VQ reconstructions (the best a model over this
        tokenizer can reach). The FD-ref floors at a sample size."""
        from collections import Counter

        from .reference.data import CLASSES, load_source_photo, random_crops

        counts, generator = Counter(prompts), torch.Generator().manual_seed(1_000_003 + seed)
        images = torch.cat([random_crops(load_source_photo(c.source), counts[c.name], generator)
                            for c in CLASSES if counts.get(c.name)])
        if through_vq:
            vq = self.subject.vq
            images = vq.decode_to_tensor(vq.encode(images.to(vq.codebook.device)))
        return self._embed(images)


__all__ = ["ReferenceScorer", "adjacent_repeat_rate", "frechet_distance", "mean_token_loglik", "token_frequencies",
           "token_frequency_tv", "token_logliks"]
