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


@pytest.mark.parametrize("sparse", [False, True])
def test_sample_draws_each_token_with_its_probability(sparse):
    """Inverse-transform sampling: the draws of every row follow its distribution, tokens without mass are never
    drawn (a row whose mass sits on its last tokens too, where a rounded ``u * total`` would overshoot), and a
    sparse distribution draws the same law over its support.

    n = 20000 draws per row over 5 tokens with mass: a chi-square at p > 1e-4 per row (4 rows) rejects a TV shift of
    0.03 with power ~1; the seed is fixed, so the outcome is deterministic."""
    from hf_sjd.jacobi.distributions import SparseProbs, sample

    n, vocab = 20000, 12
    gen = torch.Generator().manual_seed(5)
    probs = torch.zeros(4, vocab)
    support = torch.stack([torch.randperm(vocab, generator=gen)[:5] for _ in range(3)] + [torch.arange(7, 12)])
    probs.scatter_(1, support, torch.rand(4, 5, generator=gen) + 0.05)
    probs = probs / probs.sum(-1, keepdim=True)  # [4, V], row 3's mass on its last five tokens
    if sparse:
        ids = support.sort(-1).values
        law = SparseProbs(ids, probs.gather(1, ids), None, torch.zeros(vocab + 1))
        law = SparseProbs(law.ids[:, None].expand(-1, n, -1), law.probs[:, None].expand(-1, n, -1), None, law.table)
    else:
        law = probs[:, None].expand(-1, n, -1)  # [4, n, V]
    torch.manual_seed(0)
    drawn = sample(law)  # [4, n]
    for row in range(4):
        counts = torch.bincount(drawn[row], minlength=vocab).double()
        assert counts[probs[row] == 0].sum() == 0, row
        expected = n * probs[row][probs[row] > 0].double()
        statistic = ((counts[probs[row] > 0] - expected) ** 2 / expected).sum().item()
        assert chi2.sf(statistic, df=4) > 1e-4, (row, statistic)


@pytest.mark.parametrize("precision", [torch.float64, torch.float32])
def test_sample_finds_a_token_with_mass_at_the_largest_uniform(monkeypatch, precision):
    """u = the largest value torch.rand draws in each precision (float32 on MPS): ``u * total`` stays below the
    total, so the last token with mass is drawn, never a massless one after it."""
    from hf_sjd.jacobi import distributions

    probs = torch.tensor([[0.1, 0.2, 0.7, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]])
    largest = {torch.float64: 1 - 2.0 ** -53, torch.float32: 1 - 2.0 ** -24}[precision]
    monkeypatch.setattr(distributions, "_cdf_dtype", lambda device: precision)
    monkeypatch.setattr(torch, "rand", lambda *shape, **kwargs: torch.full(*shape, largest, **kwargs))
    assert distributions.sample(probs).tolist() == [2, 2]
