"""Every kept default reproduces, bit for bit, the tokens it produced before the 1.0 redesign.

``tests/golden_tokens.json`` holds, per case, the first 16 hex digits of the SHA-256 of the generated
``sequences`` (int64) on the shipped reference model: every lossless and lossy default strategy, batch 1 and 8,
CFG 1 and 3, greedy and sampled (top-k 100), one torch thread, seed 1234. It was recorded on the code before the
redesign (by this file's ``--record`` mode, in git history) and must not be re-recorded to make a change pass:
a refactor that changes one token fails here. The suite refuses forward timing (tests/conftest.py), so the
default ``jacobi_window="auto"`` is what it was then on a CPU: window 16, no siblings.

Two deliberate changes since then draw other random numbers from the same laws, so the cases run with what they
replaced: the sampler the hashes were drawn with (``exponential_race``, patched in wherever the library imports
``sample`` by the ``recorded_sampler`` fixture of tests/conftest.py; inverse-transform sampling replaced it for
speed) and ``jacobi_sparse=True`` (the default was ``True``; ``"auto"`` now goes dense at this vocabulary). Both
new ways are tested statistically (``tests/jacobi/test_drafting.py``, the chi-square exactness tests); everything
else runs as users run it. One correction changed tokens on purpose: ``mc-sjd`` verified by blocks, which with its
maximal coupling was not exact (``tests/jacobi/test_exactness.py``), and verifies token by token since; its sampled
cases were recorded again by that commit (its greedy cases, vanilla's tokens, did not change).

The tokens of a sampled case can depend on the CPU (its vector kernels sum in another order, and one
flipped draw changes every hash after it). A case whose tokens differ on another machine lists that machine's hash
too, recorded there by the recording commit's code (a6ef967, ``--record``), never by the code under test: two cases
do on an AMD EPYC with AVX-512.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).with_name("golden_tokens.json")
METHODS = ("sjd", "mc-sjd", "sjd-vp", "sjd-pv", "lantern", "gsd")
PROMPTS = ("coffee", "cat", "dog", "car", "tree", "house", "flower", "bird")
CASES = [f"{method}/b{batch}/cfg{cfg}/{mode}" for method in METHODS for batch in (1, 8) for cfg in (1, 3)
         for mode in ("greedy", "sampled")]
CASES += ["mc-sjd+siblings2/b1/cfg1/sampled", "mc-sjd+siblings2/b8/cfg3/sampled"]


def sequences_hash(ref, case: str) -> str:
    name, batch, cfg, mode = case.split("/")
    method, _, extra = name.partition("+")
    known = sorted(ref.conditions)
    prompts = [p if p in ref.conditions else known[i] for i, p in enumerate(PROMPTS)][:int(batch[1:])]
    kwargs = dict(do_sample=True, top_k=100) if mode == "sampled" else dict(do_sample=False)
    if method == "lantern":
        kwargs["latent_embeddings"] = ref.latent_embeddings
    if extra == "siblings2":
        kwargs["jacobi_siblings"] = 2
    torch.manual_seed(1234)
    out = ref.model.generate(ref.prompt_ids(prompts), custom_generate=method, max_new_tokens=256, jacobi_sparse=True,
                             guidance_scale=float(cfg[3:]), return_dict_in_generate=True, **kwargs)
    assert out.sequences.shape == (len(prompts), 257)
    return hashlib.sha256(out.sequences.cpu().to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def recorded(case: str) -> list[str]:
    """The hashes the recording code produced for ``case``: one, or one per machine where they differ."""
    hashes = json.loads(GOLDEN.read_text())[case]
    return [hashes] if isinstance(hashes, str) else hashes


@pytest.mark.parametrize("case", CASES)
def test_same_tokens_as_before_the_redesign(reference, recorded_sampler, case):
    assert sequences_hash(reference, case) in recorded(case), case
