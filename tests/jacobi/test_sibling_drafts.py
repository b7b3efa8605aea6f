"""Drafts after the first sibling (``jacobi_sibling_drafts = C``): a branch of the tree forward that carries the
window's next C slots behind the first sibling, drawn afresh from their q. The output keeps the model's law exactly,
under both exact verifiers, with and without CFG, sparse and dense, each coupling and sibling law, EOS and a
processor that reads the prefix; branch drafts are really accepted; bad settings are refused before any work.

What is specified, and at which sample size:
- **One forward, 200,000 direct draws** (``enumerable.py``, as in ``test_block.py``: 4 tokens, window 2, C = 1,
  one or two siblings), through the loop's own verify step: the 64 three-token sequences follow p (chi-square,
  level 1e-3). Two mistakes are rejected at p < 1e-6 on the same draws: the branch verified against p after the
  window's first draft instead of after the sibling (a wrong tree mask or gather), and, under block verification,
  a branch that reuses the window's own second draft, which block verification read to reject the first slot
  (the reason :meth:`Drafter.sibling_drafts` draws afresh). In the loop's 6000 toy rows only a few hundred rows
  take the branch, too few to see either mistake (p = 0.003 to 0.8 when tried), hence the direct draws.
- **In the loop** (the chi-square of ``test_siblings.py``: 6000 rows, top-3 toy model, 5 new tokens, 243
  sequences) with window 3, 2 siblings and C = 2. The runs are seeded, so the branch's accepted drafts are fixed
  numbers (124 to several hundred per case); each test asserts more than 100.
"""

import collections
import types

import pytest
import torch
from transformers import LogitsProcessorList

from enumerable import VOCAB, WINDOW, draft_laws, exact_law, target_after, target_table
from hf_sjd.jacobi import loop
from hf_sjd.jacobi.drafting import Drafter, DraftWindow
from hf_sjd.jacobi.verify import BlockVerifier, SpeculativeVerifier
from toy import (COND, NULL, NoRepeat, chi_square_pvalue, exact_distribution, no_forward, sample_mc_sjd,
                 syncs_between_forwards, until_eos)

NUM_SAMPLES, NUM_NEW = 6000, 5
DRAWS = 200_000


def one_forward(verifier, num_siblings: int, branch_of=None, wrong_target: bool = False, seed: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """DRAWS forwards of the loop's verify step over an enumerable target (``enumerable``: 4 tokens, window 2):
    drafts d_i ~ q_i, siblings of d_1 from q_1 without replacement, one branch draft c_1 ~ q_2 (``branch_of``: the
    drafts -> the branch instead), each verified against p after its own prefix; then every row completed to 3
    tokens from p -> (sequences [N, 3], whether the branch was verified [N])."""
    table, q = target_table(seed), draft_laws(seed + 1)
    torch.manual_seed(seed + 2)
    drafts = torch.multinomial(q, DRAWS, replacement=True).T  # [N, L]
    window = DraftWindow(drafts, q.expand(DRAWS, -1, -1))
    drafter = Drafter(torch.arange(VOCAB), VOCAB)
    siblings = drafter.siblings(window, num_siblings)  # [N, m]
    branch = drafter.sibling_drafts(window, 1) if branch_of is None else branch_of(drafts)  # [N, 1]
    target = torch.stack([target_after(table, drafts[:, :i]) for i in range(WINDOW + 1)], 1)  # [N, L + 1, V]
    after_sibling = torch.stack([target_after(table, siblings[:, j:j + 1]) for j in range(num_siblings)], 1)
    on_branch = torch.cat([siblings[:, :1], branch], 1)
    branch_target = torch.stack([target_after(table, on_branch[:, :i + 1]) for i in range(2)], 1)  # [N, C + 1, V]
    if wrong_target:  # the control: the branch verified behind the first draft
        branch_target = target[:, 1:]
    decoder = types.SimpleNamespace(verifier=verifier, eos_ids=None)
    decoder._verify_branch = types.MethodType(loop.JacobiDecoder._verify_branch, decoder)
    block, count, *_, verified = loop.JacobiDecoder._verify_step(
        decoder, drafts, window.probs, target[:, :WINDOW], target[:, WINDOW], torch.rand(DRAWS, WINDOW),
        torch.full((DRAWS,), 10), torch.arange(WINDOW + 1), siblings, after_sibling,
        torch.rand(DRAWS, num_siblings), True, q[0].expand(DRAWS, -1), branch, branch_target, torch.rand(DRAWS, 1))
    for i in range(1, WINDOW + 1):  # complete each row from p after its committed prefix
        block[:, i] = torch.where(count <= i, torch.multinomial(target_after(table, block[:, :i]), 1)[:, 0],
                                  block[:, i])
    return block, verified


def law_pvalue(sequences: torch.Tensor, seed: int = 0) -> float:
    _, pvalue, impossible = chi_square_pvalue(collections.Counter(map(tuple, sequences.tolist())),
                                              exact_law(target_table(seed)))
    return pvalue if impossible == 0 else 0.0


@pytest.mark.parametrize("verifier", [BlockVerifier(), SpeculativeVerifier()], ids=["block", "speculative"])
@pytest.mark.parametrize("num_siblings", [1, 2])
def test_one_forward_with_a_branch_commits_the_target_law(verifier, num_siblings):
    sequences, verified = one_forward(verifier, num_siblings)
    assert law_pvalue(sequences) > 1e-3
    assert verified.sum() > DRAWS // 20  # the branch decides thousands of rows


def test_one_forward_controls_are_detected():
    """The branch verified behind the first draft, and (under block verification) a branch of the window's own
    second draft, which block verification read to reject the first slot: both change the law."""
    wrong, _ = one_forward(BlockVerifier(), 1, wrong_target=True)
    assert law_pvalue(wrong) < 1e-6
    shared, _ = one_forward(BlockVerifier(), 1, branch_of=lambda drafts: drafts[:, 1:])
    assert law_pvalue(shared) < 1e-6


def sample_counts(model, guidance_scale=None, window=3, siblings=2, drafts=2, **knobs):
    return sample_mc_sjd(model, NUM_SAMPLES, NUM_NEW, 4, guidance_scale, jacobi_window=window, jacobi_siblings=siblings,
                         jacobi_sibling_drafts=drafts, grid_width=2, **knobs)

CASES = [  # (guidance, knobs)
    (None, {}),  # block verification, the mc-sjd preset's
    (3.0, {}),
    (None, {"verifier": "speculative"}),
    (3.0, {"verifier": "speculative", "jacobi_sibling_law": "draft"}),
    (None, {"jacobi_sparse": False}),
    (None, {"draft_init": "random"}),  # fresh slots with a uniform q (a sparse uniform component) on the branch
    (None, {"draft_init": "random", "jacobi_sparse": False}),
    (3.0, {"draft_coupling": "gumbel"}),
    (None, {"draft_coupling": "independent", "jacobi_sibling_sampling": "iid"}),
    (None, {"jacobi_sibling_law": "previous"}),
]


@pytest.mark.parametrize("guidance,knobs", CASES, ids=lambda c: str(c))
def test_sibling_drafts_are_lossless(model, laws, guidance, knobs):
    counts, stats = sample_counts(model, guidance, **knobs)
    _, pvalue, impossible = chi_square_pvalue(counts, laws[guidance])
    assert impossible == 0
    assert pvalue > 1e-3
    assert stats.num_branch_accepted > 100, stats.num_branch_accepted  # branch drafts really were accepted


def test_sibling_drafts_under_a_processor_that_reads_the_prefix(model):
    """After branch draft t the prefix is the committed tokens, the first sibling and branch drafts 1 .. t."""
    law = exact_distribution(model, [COND], NUM_NEW, top_k=3, processors=[NoRepeat()])
    counts, stats = sample_counts(model, draft_init="random", logits_processor=LogitsProcessorList([NoRepeat()]))
    _, pvalue, impossible = chi_square_pvalue(counts, law)
    assert impossible == 0 and pvalue > 1e-3
    assert stats.num_branch_accepted > 100


def test_sibling_drafts_with_eos(model):
    """EOS (token 5) ends rows on the branch too."""
    law = collections.Counter()
    for sequence, prob in exact_distribution(model, [COND], NUM_NEW, top_k=3).items():
        law[until_eos(sequence, NULL)] += prob
    counts, stats = sample_counts(model, draft_init="random", eos_token_id=NULL)
    counts = collections.Counter(until_eos(sequence, NULL) for sequence in counts.elements())
    _, pvalue, impossible = chi_square_pvalue(counts, dict(law))
    assert impossible == 0 and pvalue > 1e-3
    assert stats.num_branch_accepted > 100


def test_no_sibling_drafts_is_the_loop_without_them(model):
    """``jacobi_sibling_drafts=0`` draws nothing more: the tokens of a run that never heard of them."""
    runs = []
    for knobs in ({}, {"jacobi_sibling_drafts": 0}):
        torch.manual_seed(0)
        runs.append(model.generate(torch.full((64, 1), COND), do_sample=True, top_k=3, max_new_tokens=8,
                                   custom_generate="mc-sjd", jacobi_window=3, jacobi_siblings=2, grid_width=2,
                                   **knobs))
    assert torch.equal(*runs)


@pytest.mark.parametrize("knobs,match", [
    ({"jacobi_sibling_drafts": -1, "jacobi_siblings": 2}, "jacobi_sibling_drafts must be an integer >= 0, got -1"),
    ({"jacobi_sibling_drafts": 2, "jacobi_siblings": 0},
     "jacobi_sibling_drafts=2 follow the first sibling .* set jacobi_siblings >= 1"),
    ({"jacobi_sibling_drafts": 3, "jacobi_siblings": 2},
     r"jacobi_sibling_drafts must be < jacobi_window \(they are the window's slots 2 .. C \+ 1\), got "
     "jacobi_sibling_drafts=3 >= jacobi_window=3"),
])
def test_bad_sibling_drafts_are_refused_before_any_work(model, knobs, match):
    with no_forward(model):
        with pytest.raises(ValueError, match=match):
            model.generate(torch.full((1, 1), COND), do_sample=True, top_k=3, max_new_tokens=4,
                           custom_generate="mc-sjd", grid_width=2, jacobi_window=3, **knobs)


def test_sibling_drafts_add_no_device_read():
    """Syncs between forwards (simulated device): 2 per iteration with a branch as without."""
    assert syncs_between_forwards(jacobi_siblings=3, jacobi_sibling_drafts=4) == [2] * 6
