"""Quality proxies: token log-likelihood and token-frequency TV (benchmarks/metrics.py), Frechet distance
(hf_sjd.quality; the reference scorer's class accuracy and FD-ref run in tests/test_bench.py and
tests/benchmarks/test_suites.py)."""

import doctest

import pytest
import torch

from benchmarks import metrics
from benchmarks.metrics import mean_token_loglik, token_frequency_tv, token_logliks
from hf_sjd import quality
from hf_sjd.quality import frechet_distance
from toy import COND, VOCAB, toy_model


def test_tv_of_identical_and_disjoint_sets():
    seqs = torch.randint(0, 10, (5, 30))
    assert token_frequency_tv(seqs, seqs, vocab=10) == 0.0
    assert token_frequency_tv(seqs, seqs[torch.randperm(5)].flip(1), vocab=10) == pytest.approx(0.0, abs=1e-12)
    assert token_frequency_tv(torch.zeros(3, 4, dtype=torch.long), torch.ones(2, 2, dtype=torch.long), 2) == 1.0


def test_tv_by_hand():
    a = torch.tensor([[0, 0, 1, 2]])  # 0.5, 0.25, 0.25, 0
    b = torch.tensor([[1, 3], [3, 3]])  # 0, 0.25, 0, 0.75
    assert token_frequency_tv(a, b, vocab=4) == pytest.approx(0.5 * (0.5 + 0 + 0.25 + 0.75))
    assert token_frequency_tv(b, a, vocab=4) == token_frequency_tv(a, b, vocab=4)
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
        token_frequency_tv(a, b, vocab=3)


def test_loglik_matches_manual_computation():
    model = toy_model()
    sequences = torch.cat([torch.full((3, 1), COND), torch.randint(0, VOCAB, (3, 5))], dim=1)
    manual = torch.zeros(3, 5)
    with torch.no_grad():
        for row in range(3):
            for step in range(5):
                prefix = sequences[row:row + 1, :1 + step]
                logits = model(input_ids=prefix).logits[0, -1]
                manual[row, step] = logits.log_softmax(-1)[sequences[row, 1 + step]]
    assert torch.allclose(token_logliks(model, sequences, prompt_len=1, batch_size=2), manual, atol=1e-5)
    assert mean_token_loglik(model, sequences, prompt_len=1) == pytest.approx(float(manual.mean()), abs=1e-5)
    with pytest.raises(ValueError, match="prompt_len"):
        mean_token_loglik(model, sequences, prompt_len=6)


def test_frechet_distance_by_hand():
    """Equal covariances: FD = |mu_a - mu_b|^2. Diagonal covariances: sum (sqrt(a_i) - sqrt(b_i))^2 on top."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(200, 3, generator=generator, dtype=torch.float64)
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-9)
    assert frechet_distance(a, a + torch.tensor([3.0, 0.0, 4.0], dtype=torch.float64)) == pytest.approx(25.0)
    x = torch.tensor([[-1.0, -2.0], [1.0, 2.0]], dtype=torch.float64)  # covariance diag(2, 8)
    y = torch.tensor([[-2.0, -1.0], [2.0, 1.0]], dtype=torch.float64)  # covariance diag(8, 2)
    expected = (2 ** 0.5 - 8 ** 0.5) ** 2 * 2
    assert frechet_distance(x.numpy(), y.tolist()) == pytest.approx(expected)
    assert frechet_distance(x[:1], y[:1] + 1) == pytest.approx(4.0)  # one sample each: zero covariance, |(0, 2)|^2
    with pytest.raises(ValueError, match=r"features must be \[N, D\] with the same D"):
        frechet_distance(x, torch.zeros(2, 3))


def test_doctests():
    assert doctest.testmod(quality).failed == 0
    assert doctest.testmod(metrics).failed == 0


def test_reference_features_are_cached_per_folder_and_per_image(tmp_path):
    """The FID reference cache key names the folder and each image's size and modification time: another folder of
    same-named, same-sized images (BMPs of one resolution), or new images under the same names, is another key."""
    import os

    import numpy as np
    from PIL import Image

    from hf_sjd.quality import reference_images

    for name, value in (("dark", 10), ("bright", 245)):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(tmp_path / name / f"{i}.bmp")
    keys = {name: reference_images(str(tmp_path / name), check_only=True)[0] for name in ("dark", "bright")}
    assert keys["dark"] != keys["bright"]
    os.utime(tmp_path / "dark" / "0.bmp", ns=(1, 1))  # the same name and size, written at another time
    assert reference_images(str(tmp_path / "dark"), check_only=True)[0] != keys["dark"]


def test_bootstrap_draws_every_index_with_replacement():
    from hf_sjd.quality import bootstrap

    drawn = bootstrap(lambda index: torch.bincount(index, minlength=5), size=5, resamples=200)
    assert drawn.shape == (200, 5) and (drawn.sum(0) > 0).all() and (drawn.sum(1) == 5).all()
