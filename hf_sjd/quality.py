"""Cheap quality proxies for comparing decoding strategies on the same model and prompts.

Lossless strategies (SJD, MC-SJD) sample exactly from the model, so their proxies differ from vanilla
sampling only by sampling noise; relaxed verifiers (LANTERN, GSD) trade some of that fidelity for speed.
These proxies make the trade visible:

* :func:`mean_token_loglik`: how likely the generated tokens are under the model's own, *unprocessed*
  distribution (no top-k, no guidance). Relaxed acceptance commits tokens the model finds less likely, so
  it drops; compare it to vanilla sampling with the same processors.
* :func:`token_frequency_tv`: total-variation distance between the token histograms of two sample sets.
  It is biased upwards at small sample sizes, so always report it next to the TV between two vanilla sets
  of the same size (the noise floor).
* :func:`class_accuracy`: fraction of images a classifier assigns to their prompt's class (the
  CLIP-score analogue of the reference model).
* :func:`frechet_distance`: the FID formula over any features ``[N, D]`` (``hf-sjd bench`` feeds it the
  reference classifier's features: FD-ref). Biased upwards at small sample sizes: compare against a floor.
* :func:`adjacent_repeat_rate`: share of codes equal to their left neighbour (mode seeking shows up here).

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


@torch.no_grad()
def class_accuracy(classifier, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 64) -> float:
    """Fraction of ``images`` [N, 3, H, W] that ``classifier`` (images -> logits [N, classes]) assigns to
    ``labels`` [N]."""
    labels = torch.as_tensor(labels).flatten().long()
    if images.shape[0] != labels.numel() or labels.numel() == 0:
        raise ValueError(f"got {images.shape[0]} images and {labels.numel()} labels; need the same, non-zero number")
    device = next(classifier.parameters()).device
    predictions = torch.cat([classifier(images[start:start + batch_size].to(device)).argmax(-1).cpu()
                             for start in range(0, images.shape[0], batch_size)])
    return float((predictions == labels).double().mean())


def frechet_distance(features_a, features_b) -> float:
    """Frechet distance between Gaussians fitted to two feature sets ``[N, D]`` (arrays or nested lists).

    ``|mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^1/2)``, with ``Tr (S_a S_b)^1/2`` computed as the sum of
    square roots of the eigenvalues of the symmetric PSD matrix ``S_a^1/2 S_b S_a^1/2`` (stable for the
    rank-deficient covariances of small samples, unlike a general ``sqrtm``). A single sample has zero
    covariance. Small samples bias it upwards: compare against a floor at the same sample size.

    Hand-written rather than torchmetrics' FID: that one is tied to Inception features (and is not a
    dependency); this is the same formula over whatever features are passed.
    """
    import numpy as np
    from scipy.linalg import eigh, eigvalsh

    a, b = np.asarray(features_a, dtype=np.float64), np.asarray(features_b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
        raise ValueError(f"features must be [N, D] with the same D and N >= 1; got {a.shape} and {b.shape}")

    def cov(x):
        return np.cov(x, rowvar=False) if len(x) > 1 else np.zeros((x.shape[1], x.shape[1]))

    cov_a, cov_b = cov(a), cov(b)
    values, vectors = eigh(cov_a)
    root_a = (vectors * np.sqrt(values.clip(min=0))) @ vectors.T
    cross = np.sqrt(eigvalsh(root_a @ cov_b @ root_a).clip(min=0)).sum()
    diff = a.mean(0) - b.mean(0)
    return float(max(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2 * cross, 0.0))


__all__ = ["adjacent_repeat_rate", "class_accuracy", "frechet_distance", "mean_token_loglik", "token_frequencies",
           "token_frequency_tv", "token_logliks"]
