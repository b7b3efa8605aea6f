"""The fresh-draft rules and the Gumbel coupling are lossless: samples follow the model's law exactly.

Same chi-square as ``test_exactness.py`` (6000 rows, top-3, toy model), on 5 new tokens with a grid width
of 2, so that every mechanism is exercised: with ``jacobi_window=1`` a row that accepts its draft commits
2 tokens and its next window slot is *fresh* (beyond the computed positions: drafted by the rule under
test, from the row above or the last target); with ``jacobi_window=2`` a slot survives a commit, so the
Gumbel coupling redraws it with its kept noise. 243 sequences have positive probability (about 25 samples
each; bins under 5 expected are pooled). The deliberately wrong variant below (fresh drafts that are the mode
of the q stored with them, not a draw from it) is rejected at p < 1e-6, so the test has power against the
mistake it guards against.
"""

import pytest
import torch

from hf_sjd.jacobi import fresh_drafts
from hf_sjd.jacobi.distributions import to_dense
from toy import chi_square_pvalue, sample_mc_sjd

pytestmark = pytest.mark.device  # on a GPU too (tests/conftest.py)

NUM_SAMPLES, NUM_NEW, WIDTH = 6000, 5, 2


def sample_counts(model, window, guidance_scale=None, **knobs):
    return sample_mc_sjd(model, NUM_SAMPLES, NUM_NEW, 3, guidance_scale, jacobi_window=window, grid_width=WIDTH,
                         **knobs)

CASES = [  # (window, guidance, knobs)
    (1, None, {"draft_init": "last-target"}),
    (1, None, {"draft_init": "row-above-dist"}),
    (2, None, {"draft_coupling": "gumbel"}),
    (2, None, {"draft_coupling": "gumbel", "draft_init": "row-above-dist"}),
    (2, 3.0, {"draft_coupling": "gumbel", "draft_init": "last-target"}),
    (1, 3.0, {"draft_init": "row-above-dist"}),
    (2, 3.0, {"draft_coupling": "maximal", "draft_init": "row-above-dist"}),
]


@pytest.mark.parametrize("window,guidance,knobs", CASES, ids=lambda c: str(c))
def test_new_drafting_modes_are_lossless(model, laws, window, guidance, knobs):
    counts, stats = sample_counts(model, window, guidance, **knobs)
    _, pvalue, impossible = chi_square_pvalue(counts, laws[guidance])
    assert impossible == 0
    assert pvalue > 1e-3
    assert stats.num_accepted > NUM_SAMPLES  # drafts, fresh ones included, were verified and accepted


def test_drafts_not_drawn_from_their_q_are_detected(model, laws, monkeypatch):
    """Control: fresh drafts that are the mode of the q stored with them (the mistake the invariant forbids)."""
    original = fresh_drafts.RowAboveDistribution.fill

    def wrong_fill(self, tokens, probs, fresh, *args, **kwargs):
        _, claimed = original(self, tokens, probs, fresh, *args, **kwargs)
        mode = to_dense(claimed).argmax(-1)
        return torch.where(fresh, mode, tokens), claimed

    monkeypatch.setattr(fresh_drafts.RowAboveDistribution, "fill", wrong_fill)
    counts, _ = sample_counts(model, 1, draft_init="row-above-dist")
    _, pvalue, _ = chi_square_pvalue(counts, laws[None])
    assert pvalue < 1e-6
