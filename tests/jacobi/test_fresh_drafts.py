"""Fresh-draft rules (hf_sjd.jacobi.fresh_drafts) and the Gumbel coupling, slot by slot."""

import pytest
import torch
from scipy.stats import chi2

from hf_sjd.jacobi.drafting import Drafter, DraftWindow, sample

VOCAB, WIDTH = 8, 4


def one_hot(tokens):
    return torch.nn.functional.one_hot(torch.as_tensor(tokens), VOCAB).float()


def test_last_target_drafts_fresh_slots_from_the_last_computed_distribution():
    torch.manual_seed(0)
    drafter = Drafter(torch.arange(VOCAB), VOCAB, init="last-target", coupling="independent")
    target = torch.softmax(torch.randn(1, 3, VOCAB), -1)  # old window of 2 drafts -> 3 distributions
    new = drafter.slide(DraftWindow(torch.tensor([[1, 2]]), one_hot([[1, 2]])), target, torch.tensor([2]), 3)
    # slot 0 <- position 2 (carried: the bonus distribution); slots 1, 2 are fresh: q = p_last = target[:, 2]
    for slot in range(3):
        assert torch.allclose(new.probs[0, slot], target[0, 2])


def test_row_above_dist_draws_from_the_distribution_the_token_above_was_committed_from():
    torch.manual_seed(0)
    drafter = Drafter(torch.arange(VOCAB), VOCAB, init="row-above-dist", coupling="independent", grid_width=WIDTH)
    window = drafter.initial(1, 4, num_generated=torch.tensor([0]))
    first = torch.softmax(torch.randn(1, 5, VOCAB), -1)  # the forward's distributions at grid 0..4
    new = drafter.slide(window, first, torch.tensor([5]), 4, num_generated=torch.tensor([5]))  # 4 accepted + bonus
    # every slot is fresh (grid 5..8): q = the committed distribution at grid 1..4
    assert torch.allclose(new.probs[0], first[0, 1:5])


def test_row_above_dist_inside_the_window_reads_the_q_of_the_slot_above():
    """A window wider than the grid row: a fresh slot's q is the q of the slot one row up in the same window, drawn
    before it (blocks of one row), so a chain of slots resolves in order."""
    torch.manual_seed(0)
    drafter = Drafter(torch.arange(VOCAB), VOCAB, init="row-above-dist", coupling="independent", grid_width=WIDTH)
    window = drafter.initial(1, 4, num_generated=torch.tensor([0]))
    target = torch.softmax(torch.randn(1, 5, VOCAB), -1)
    new = drafter.slide(window, target, torch.tensor([1]), 10, num_generated=torch.tensor([1]))
    # slots 0..3 carried (grid 1..4); slots 4..9 fresh: grid 5..10, above = grid 1..6 = slots 0..5
    assert torch.allclose(new.probs[0, 4:8], new.probs[0, 0:4])
    assert torch.allclose(new.probs[0, 8:10], new.probs[0, 4:6])


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
        Drafter(torch.arange(VOCAB), VOCAB, init="row-above-dist")
    from hf_sjd.jacobi.config import SJDConfig

    with pytest.raises(ValueError, match="needs the token-grid width"):
        SJDConfig(draft_init="row-above-dist")


def test_auto_init_is_the_grid_rule_with_a_grid_and_last_target_without():
    from hf_sjd.jacobi.config import SJDConfig

    with_grid, without = SJDConfig(draft_init="auto", grid_width=16), SJDConfig(draft_init="auto")
    assert (with_grid.draft_init, without.draft_init) == ("row-above-dist", "last-target")


class TiedAtTheFirstPosition:
    """Every score tied at the first generated position only: its support (the whole vocabulary) exceeds the sparse
    width there, so that iteration goes dense and the later ones stay sparse."""

    def __init__(self, prompt_length):
        self.prompt_length = prompt_length

    def __call__(self, input_ids, scores):
        return torch.zeros_like(scores) if input_ids.shape[1] == self.prompt_length else scores


def test_row_above_dist_runs_when_the_first_iteration_goes_dense():
    """The ring of committed distributions takes the first commit's kind; a sparse window later reads it sparse (it
    crashed: a dense distribution above a sparse window)."""
    from toy import tiny_llama

    model = tiny_llama(vocab_size=512)
    prompt = torch.randint(1, 512, (2, 4))
    torch.manual_seed(0)
    out = model.generate(prompt, custom_generate="mc-sjd", do_sample=True, top_k=8, max_new_tokens=24,
                         jacobi_window=8, jacobi_siblings=0, jacobi_sparse=True, draft_init="row-above-dist",
                         grid_width=4, logits_processor=[TiedAtTheFirstPosition(4)], return_dict_in_generate=True)
    assert out.sequences.shape == (2, 28) and out.stats.num_forward_passes < 24
