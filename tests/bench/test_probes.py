"""The siblings probe (the tree lead priced on the loop's own p and q): its formula against a simulation of
recursive rejection sampling, and the probe on the reference model (same tokens, sane gains, nothing left
registered)."""

import torch
from scipy.stats import chi2

import hf_sjd
from hf_sjd.bench.probes import SIBLINGS, probe, sibling_gain

NUM_TRIALS = 200_000  # a rescue rate of 0.2-0.3 has SE ~1e-3: the 5-SE band catches a residual not updated
# between siblings (off by 0.09 for 3 siblings below)


def simulate_rrs(p: torch.Tensor, q: torch.Tensor, siblings: int, trials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Main draft ~ q, then ``siblings`` i.i.d. drafts ~ q, by recursive rejection sampling: (committed token
    [trials], rescued [trials] bool: the main draft was rejected and a sibling accepted)."""
    vocab = p.numel()
    draws = torch.multinomial(q, trials * (siblings + 1), replacement=True).view(trials, siblings + 1)
    uniforms = torch.rand(trials, siblings + 1)
    target = p.expand(trials, vocab).clone()
    token = torch.full((trials,), -1)
    rescued = torch.zeros(trials, dtype=torch.bool)
    for i in range(siblings + 1):
        open_ = token < 0
        x = draws[:, i]
        ratio = target.gather(1, x[:, None]).squeeze(1) / q[x]
        accept = open_ & (uniforms[:, i] < ratio)
        token = torch.where(accept, x, token)
        if i > 0:
            rescued |= accept
        residual = (target - q).clamp_min(0)
        target = torch.where(open_[:, None], residual / residual.sum(1, keepdim=True).clamp_min(1e-30), target)
    left = token < 0  # every draft rejected: sample the last residual
    token[left] = torch.multinomial(target[left], 1).squeeze(1)
    return token, rescued


def test_sibling_gain_matches_a_simulation_of_recursive_rejection_sampling():
    torch.manual_seed(0)
    # r_1 = (0.2, 0.6, 0.2) and r_2 = (0, 5/6, 1/6): each sibling is rescued less often than the one before
    # (0.4, then 0.2), so a formula that kept r_1 would give 0.392 instead of 0.304 for 3 siblings
    p = torch.tensor([0.40, 0.40, 0.20, 0.00, 0.00])
    q = torch.tensor([0.30, 0.10, 0.10, 0.30, 0.20])
    support = p > 0
    for siblings in (1, 3):
        token, rescued = simulate_rrs(p, q, siblings, NUM_TRIALS)
        # the tree's premise: recursive rejection sampling is lossless (chi-square against p on its support)
        counts = torch.bincount(token, minlength=5).double()
        assert counts[~support].sum() == 0
        expected_counts = NUM_TRIALS * p[support]
        statistic = float(((counts[support] - expected_counts) ** 2 / expected_counts).sum())
        assert chi2.sf(statistic, df=int(support.sum()) - 1) > 1e-3
        # averaged over the main draft, P(rejected) = 1 - sum min(p, q); the formula takes the realised
        # acceptance probability, so feed it the average
        rejected = 1 - torch.minimum(p, q).sum()
        expected = float(sibling_gain((1 - rejected).view(1, 1), q.view(1, 1, -1), p.view(1, 1, -1), siblings))
        rate = float(rescued.double().mean())
        se = (rate * (1 - rate) / NUM_TRIALS) ** 0.5
        assert abs(rate - expected) < 5 * se, (siblings, rate, expected)


def test_sibling_gain_counts_only_the_first_rejection():
    accept = torch.tensor([[1.0, 0.5, 0.0]])  # slot 0 always accepted; slot 2 reached with probability 0.5
    q = torch.tensor([[0.5, 0.5]]).expand(1, 3, 2)
    p = torch.tensor([[1.0, 0.0]]).expand(1, 3, 2)  # r_1 = token 0, which a sibling draws half the time
    assert sibling_gain(accept, q, p, siblings=1).tolist() == [[0.0, 0.25, 0.25]]


def test_siblings_probe_prices_without_changing_the_tokens():
    from hf_sjd.reference import load

    torch.set_num_threads(1)
    ref = load()
    hf_sjd.enable(ref.model)
    before = dict(hf_sjd.VERIFIERS)
    knobs = dict(custom_generate="mc-sjd", do_sample=True, top_k=100, max_new_tokens=256, jacobi_window=8)
    torch.manual_seed(0)  # the probe wraps token-by-token verification (the preset verifies by blocks)
    plain = ref.model.generate(ref.prompt_ids(["coffee", "cat"]), verifier="speculative", **knobs)
    with probe("siblings") as state:
        torch.manual_seed(0)
        probed = ref.model.generate(ref.prompt_ids(["coffee", "cat"]), verifier="bench-siblings-probe", **knobs)
    assert torch.equal(plain, probed)  # exact verification unchanged, no random draw of its own
    *gains, rejected, pairs = state.counts
    first, every = gains[:len(SIBLINGS)], gains[len(SIBLINGS):]
    assert first[2] < rejected < pairs  # a rescue needs a rejection; not every first draft is rejected
    assert pairs > 2 * 256 / 9  # (row, forward) pairs: at least the forwards a fully accepted window needs
    assert 0 < first[0] < first[1] < first[2] < pairs  # more siblings rescue more, at most one token each
    assert first[0] < every[0] and first[1] < every[1]  # slots past the first add their own rescues
    assert dict(hf_sjd.VERIFIERS) == before
