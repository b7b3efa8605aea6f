"""Drafting: maximal coupling (MC-SJD) and grid-neighbour initialisation."""

import pytest
import torch
from scipy.stats import chi2

from hf_sjd.jacobi.drafting import Drafter, DraftWindow, maximal_coupling


def test_maximal_coupling_marginal_and_agreement():
    """For random p_old, p_new: y ~ p_new exactly and P(y = x) = sum_v min(p_old, p_new).

    n = 40000 draws per case: the chi-square over 6 categories has power ~1 against a TV shift of 0.02,
    and the standard error of P(y = x) is at most 0.0025, so the 5-sigma tolerance is 0.0125."""
    n, vocab = 40000, 6
    for case in range(3):
        gen = torch.Generator().manual_seed(case)
        p_old = torch.rand(vocab, generator=gen) ** 2
        p_new = torch.rand(vocab, generator=gen) ** 2
        p_old, p_new = p_old / p_old.sum(), p_new / p_new.sum()
        x = torch.multinomial(p_old, n, replacement=True, generator=gen)
        y = maximal_coupling(x, p_old.expand(n, -1), p_new.expand(n, -1))
        observed = torch.bincount(y, minlength=vocab).double()
        expected = p_new.double() * n
        statistic = float(((observed - expected) ** 2 / expected).sum())
        assert chi2.sf(statistic, vocab - 1) > 1e-3
        agreement = float((y == x).double().mean())
        assert agreement == pytest.approx(float(torch.minimum(p_old, p_new).sum()), abs=0.0125)


def test_independent_redraft_agrees_less_than_maximal():
    torch.manual_seed(0)
    vocab, n = 8, 20000
    p_old = torch.softmax(torch.randn(vocab), -1)
    p_new = torch.softmax(torch.randn(vocab), -1)
    x = torch.multinomial(p_old, n, replacement=True)
    coupled = maximal_coupling(x, p_old.expand(n, -1), p_new.expand(n, -1))
    independent = torch.multinomial(p_new, n, replacement=True)
    assert (coupled == x).float().mean() > (independent == x).float().mean() + 0.05


def test_slide_couples_only_positions_with_a_previous_draft():
    torch.manual_seed(0)
    vocab = 5
    drafter = Drafter(torch.arange(vocab), vocab, coupling="maximal")
    tokens = torch.tensor([[1, 2, 3]])
    point = torch.nn.functional.one_hot(tokens, vocab).float()  # previous drafts were certain
    window = DraftWindow(tokens, point)
    target = point.new_zeros(1, 4, vocab)
    target[0, :, :] = torch.nn.functional.one_hot(torch.tensor([1, 2, 3, 4]), vocab).float() * 0.5 + 0.1
    new = drafter.slide(window, target, num_committed=torch.tensor([1]), size=3)
    # slot 0 <- old slot 1 (draft 2), slot 1 <- old slot 2 (draft 3), slot 2 <- position 3 (no draft: fresh sample)
    assert new.tokens.shape == (1, 3)
    assert torch.allclose(new.probs[0, :2], target[0, 1:3])
    assert torch.allclose(new.probs[0, 2], target[0, 3])


def test_sample_draws_what_torch_multinomial_draws_without_reading_the_device():
    """The exponential race is torch.multinomial's own one-sample path: seeded outputs stay bit-identical to the
    multinomial-based loop (and its benchmarks), while no sync point is left (it never validates on the host)."""
    from hf_sjd.jacobi.drafting import sample

    probs = torch.rand(8, 17, 530).softmax(-1)
    probs[..., :100] = 0  # zero-probability tokens are never drawn
    torch.manual_seed(3)
    expected = torch.multinomial(probs.reshape(-1, 530), 1).view(8, 17)
    torch.manual_seed(3)
    drawn = sample(probs)
    assert torch.equal(drawn, expected) and (drawn >= 100).all()
