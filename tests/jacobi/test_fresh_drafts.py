"""Fresh-draft rules (hf_sjd.jacobi.fresh_drafts) and the Gumbel coupling, slot by slot."""

import pytest
import torch
from scipy.stats import chi2

from hf_sjd.jacobi.drafting import Drafter, DraftWindow, sample

VOCAB, WIDTH = 8, 4


def one_hot(tokens):
    return torch.nn.functional.one_hot(torch.as_tensor(tokens), VOCAB).float()


def slide_from(drafter, committed_tokens, count, size, target, old_tokens):
    """Slide a window of ``old_tokens`` after ``count`` commits; ``committed_tokens`` ends with them."""
    n = len(committed_tokens)
    recent = torch.tensor([[0] * max(0, WIDTH + 1 - n) + committed_tokens[-(WIDTH + 1):]])
    window = DraftWindow(torch.tensor([old_tokens]), one_hot([old_tokens]))
    return drafter.slide(window, target, torch.tensor([count]), size, recent=recent, num_generated=torch.tensor([n]))


def test_last_target_drafts_fresh_slots_from_the_last_computed_distribution():
    torch.manual_seed(0)
    drafter = Drafter(torch.arange(VOCAB), VOCAB, init="last-target", coupling="independent")
    target = torch.softmax(torch.randn(1, 3, VOCAB), -1)  # old window of 2 drafts -> 3 distributions
    new = drafter.slide(DraftWindow(torch.tensor([[1, 2]]), one_hot([[1, 2]])), target, torch.tensor([2]), 3)
    # slot 0 <- position 2 (carried: the bonus distribution); slots 1, 2 are fresh: q = p_last = target[:, 2]
    for slot in range(3):
        assert torch.allclose(new.probs[0, slot], target[0, 2])


def test_row_above_copies_the_committed_token_above_or_falls_back_to_p_last():
    drafter = Drafter(torch.arange(VOCAB), VOCAB, init="row-above", coupling="independent", grid_width=WIDTH)
    target = torch.softmax(torch.randn(1, 3, VOCAB), -1)  # old window of 2 drafts -> 3 distributions
    # 6 committed tokens (grid rows [3 4 5 6] [7 1]), the last 2 this iteration -> slots 1, 2 are fresh
    new = slide_from(drafter, [3, 4, 5, 6, 7, 1], count=2, size=3, target=target, old_tokens=[7, 2])
    # slot 0: grid 6 (carried: target[:, 2]); slot 1: grid 7 -> above = grid 3 = 6; slot 2: grid 8 -> grid 4 = 7
    assert torch.allclose(new.probs[0, 0], target[0, 2])
    assert new.tokens[0, 1:].tolist() == [6, 7]
    assert torch.equal(new.probs[0, 1:], one_hot([6, 7]))
    # 2 committed: slot 1 = grid 3 has no row above (q = p_last), slot 2 = grid 4 copies grid 0
    first_row = slide_from(drafter, [3, 5], count=2, size=3, target=target, old_tokens=[3, 5])
    assert torch.allclose(first_row.probs[0, 1], target[0, 2])
    assert first_row.tokens[0, 2] == 3 and torch.equal(first_row.probs[0, 2], one_hot(3))


def test_row_above_inside_the_window_reads_the_final_draft_above():
    """Window wider than the grid: a fresh slot copies a slot of the same window, drafted before it."""
    torch.manual_seed(0)
    drafter = Drafter(torch.arange(VOCAB), VOCAB, init="row-above", coupling="independent", grid_width=WIDTH)
    window = drafter.initial(1, 10, recent=torch.zeros(1, WIDTH + 1, dtype=torch.long),
                             num_generated=torch.tensor([0]))
    tokens = window.tokens[0].tolist()
    assert tokens[4:8] == tokens[0:4] and tokens[8:10] == tokens[0:2]  # chains resolved: slot k copies k - 4
    assert torch.allclose(window.probs[0, :4], torch.full((4, VOCAB), 1 / VOCAB))  # first row: uniform p_last


def test_row_above_dist_draws_from_the_distribution_the_token_above_was_committed_from():
    torch.manual_seed(0)
    drafter = Drafter(torch.arange(VOCAB), VOCAB, init="row-above-dist", coupling="independent", grid_width=WIDTH)
    window = drafter.initial(1, 4, recent=torch.zeros(1, WIDTH + 1, dtype=torch.long), num_generated=torch.tensor([0]))
    first = torch.softmax(torch.randn(1, 5, VOCAB), -1)  # the forward's distributions at grid 0..4
    committed = window.tokens[0].tolist() + [5]  # all 4 accepted + bonus
    recent = torch.tensor([committed[-(WIDTH + 1):]])
    new = drafter.slide(window, first, torch.tensor([5]), 4, recent=recent, num_generated=torch.tensor([5]))
    # every slot is fresh (grid 5..8): q = the committed distribution at grid 1..4
    assert torch.allclose(new.probs[0], first[0, 1:5])


def test_row_above_mix_stores_the_mixture_and_samples_from_it():
    """q = w delta(above) + (1 - w) p_last, and 20000 drafts follow it (chi-square, 8 categories)."""
    torch.manual_seed(0)
    n, weight = 20000, 0.3
    drafter = Drafter(torch.arange(VOCAB), VOCAB, init="row-above-mix", coupling="independent", grid_width=WIDTH,
                      init_weight=weight)
    last = torch.softmax(torch.randn(VOCAB), -1)
    target = last.expand(n, 2, VOCAB).contiguous()
    recent = torch.tensor([[0, 3, 4, 5, 6]]).expand(n, -1)  # 5 committed: grid 5 -> above = grid 1 = 3
    window = DraftWindow(torch.zeros(n, 1, dtype=torch.long), one_hot(torch.zeros(n, 1, dtype=torch.long)))
    new = drafter.slide(window, target, torch.full((n,), 1), 2, recent=recent, num_generated=torch.full((n,), 5))
    expected_q = weight * one_hot(4) + (1 - weight) * last  # slot 1: grid 6, above = grid 2 = 4
    assert torch.allclose(new.probs[0, 1], expected_q)
    observed = torch.bincount(new.tokens[:, 1], minlength=VOCAB).double()
    statistic = float(((observed - n * expected_q.double()) ** 2 / (n * expected_q.double())).sum())
    assert chi2.sf(statistic, VOCAB - 1) > 1e-3


def test_gumbel_redraft_keeps_each_positions_noise():
    """A slot that survives the commit is redrawn with its own noise: draft = argmax(p_new / E)."""
    torch.manual_seed(0)
    drafter = Drafter(torch.arange(VOCAB), VOCAB, coupling="gumbel")
    window = drafter.initial(1, 3)
    assert window.noise.shape == (1, 3, VOCAB)
    assert torch.equal(window.tokens, sample(window.probs, window.noise))  # Gumbel-max of the uniform q
    target = torch.softmax(torch.randn(1, 4, VOCAB), -1)
    new = drafter.slide(window, target, torch.tensor([1]), 3)
    assert torch.equal(new.noise[0, :2], window.noise[0, 1:3])  # positions 1, 2 keep their noise
    assert not torch.equal(new.noise[0, 2], window.noise[0, 0])  # position 3 is new: fresh noise
    assert torch.equal(new.tokens, sample(new.probs, new.noise))


def test_gumbel_redraft_marginal_is_the_new_distribution_and_sticks_to_the_old_draft():
    """Drawn again with the same noise, y = argmax(p_new / E) ~ p_new (chi-square, 40000 draws), and it agrees
    with x = argmax(p_old / E) far more often than an independent draw does."""
    torch.manual_seed(1)
    n = 40000
    p_old, p_new = torch.softmax(torch.randn(VOCAB), -1), torch.softmax(torch.randn(VOCAB), -1)
    noise = torch.empty(n, VOCAB).exponential_()
    x, y = sample(p_old.expand(n, -1), noise), sample(p_new.expand(n, -1), noise)
    observed = torch.bincount(y, minlength=VOCAB).double()
    expected = p_new.double() * n
    assert chi2.sf(float(((observed - expected) ** 2 / expected).sum()), VOCAB - 1) > 1e-3
    independent = float((p_old * p_new).sum())
    assert float((x == y).double().mean()) > independent + 0.1


def test_grid_rules_need_the_grid_width():
    with pytest.raises(ValueError, match="needs the token-grid width"):
        Drafter(torch.arange(VOCAB), VOCAB, init="row-above")


def test_auto_init_is_the_grid_rule_with_a_grid_and_last_target_without():
    from hf_sjd.jacobi.config import SJDConfig

    with_grid, without = SJDConfig(draft_init="auto", grid_width=16), SJDConfig(draft_init="auto")
    with_grid.validate(), without.validate()
    assert (with_grid.draft_init, without.draft_init) == ("row-above-dist", "last-target")


def test_draft_init_weight_out_of_range_is_refused():
    from hf_sjd.jacobi.config import SJDConfig

    with pytest.raises(ValueError, match="draft_init_weight"):
        SJDConfig(draft_init="row-above-mix", grid_width=4, draft_init_weight=1.5).validate()
