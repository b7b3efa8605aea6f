"""SJD-PV on the trained reference model with its shipped phrase library: faster than SJD, and (with the
default settings) quality proxies within seed noise of vanilla sampling. PV is not lossless, so this is a
statistical check with its own power check: an over-relaxed LANTERN (k = 50 neighbours whose target mass is
borrowed, up to 0.9 of the target mass) must fail it.

Sample size: 16 prompts x 2 images (4 batches of 8, seeds shared by all methods). "Within noise" means
a mean per-image difference to vanilla (images matched by prompt) within 3 standard errors for the
log-likelihood, the equal-adjacent-code rate and classifier accuracy, and a token-frequency TV to vanilla
at most 1.25x the TV between two vanilla sets of the same size. Compression is compared per image
(``row_step_compression``), paired by prompt with the same seeds.
"""

import math

import pytest
import torch

from benchmarks.metrics import adjacent_repeat_rate, token_frequency_tv, token_logliks
from hf_sjd.reference import NUM_CODES, load_classifier

PER_PROMPT, BATCH = 2, 8


@pytest.fixture(scope="module")
def prompts(reference):
    return reference.prompt_ids([p for p in reference.conditions for _ in range(PER_PROMPT)])


@torch.no_grad()
def sample(reference, prompts, method, seed=0, **knobs):
    sequences, compression = [], []
    for index, chunk in enumerate(prompts.split(BATCH)):
        torch.manual_seed(seed + index)
        common = dict(do_sample=True, top_k=100, max_new_tokens=256)
        if method is None:
            sequences.append(reference.model.generate(chunk, **common))
            continue
        out = reference.model.generate(chunk, custom_generate=method, jacobi_window=16, return_dict_in_generate=True,
                                       **common, **knobs)
        sequences.append(out.sequences)
        compression.append(out.stats.row_step_compression)
    return torch.cat(sequences), torch.cat(compression) if compression else None


@pytest.fixture(scope="module")
def vanilla(reference, prompts):
    return sample(reference, prompts, None)[0], sample(reference, prompts, None, seed=10_000)[0]


def proxies(reference, classifier, sequences, prompts):
    images = reference.vq.decode_to_tensor(sequences[:, 1:])
    with torch.no_grad():
        correct = (classifier(images).argmax(-1) == prompts[:, 0] - NUM_CODES).double()
    return {"loglik": token_logliks(reference.model, sequences, prompt_len=1).mean(1),
            "repeat": adjacent_repeat_rate(sequences[:, 1:]), "correct": correct}


def shifts_beyond_noise(reference, prompts, vanilla, sequences) -> list[str]:
    """The quality proxies on which ``sequences`` differ from vanilla beyond seed noise (empty: none)."""
    classifier = load_classifier()
    first, second = vanilla
    base, other = proxies(reference, classifier, first, prompts), proxies(reference, classifier, sequences, prompts)
    failed = []
    for name in ("loglik", "repeat", "correct"):
        diff = other[name] - base[name]  # independent samples, matched by prompt (removes the class effect)
        if abs(float(diff.mean())) > 3 * float(diff.std()) / math.sqrt(len(diff)):
            failed.append(name)
    floor = token_frequency_tv(second[:, 1:], first[:, 1:], NUM_CODES)
    if token_frequency_tv(sequences[:, 1:], first[:, 1:], NUM_CODES) > 1.25 * floor:
        failed.append("tv")
    return failed


def test_sjd_pv_defaults_beat_sjd_and_keep_quality_within_noise(reference, prompts, vanilla):
    _, sjd = sample(reference, prompts, "sjd")
    sequences, pv = sample(reference, prompts, "sjd-pv")
    diff = pv - sjd  # per image, paired by prompt (the class explains most of the compression variance)
    assert float(diff.mean()) > 2 * float(diff.std()) / math.sqrt(len(diff))
    assert shifts_beyond_noise(reference, prompts, vanilla, sequences) == []


def test_the_quality_check_detects_an_over_relaxed_verifier(reference, prompts, vanilla):
    sequences, _ = sample(reference, prompts, "lantern", lantern_k=50, lantern_delta=0.9,
                          latent_embeddings=reference.latent_embeddings)
    assert {"loglik", "repeat"} <= set(shifts_beyond_noise(reference, prompts, vanilla, sequences))
