"""The probes of the study suites (``benchmarks/probes.py``): they count what they claim through the public
registries, change no token, and leave the registries exactly as they found them (also when the block fails)."""

import pytest
import torch

import hf_sjd
from benchmarks.probes import PRIOR_NAME, probe


def registries() -> tuple[dict, dict]:
    return dict(hf_sjd.VERIFIERS), dict(hf_sjd.DRAFT_PRIORS)


def test_growth_probe_counts_and_leaves_nothing_registered(reference):
    before = registries()
    torch.manual_seed(0)
    with probe("growth") as state:
        reference.model.generate(reference.prompt_ids(["coffee"]), custom_generate="sjd", do_sample=True, top_k=100,
                                 max_new_tokens=256, jacobi_window=4, draft_prior=PRIOR_NAME,
                                 verifier="bench-growth-probe", vp_strength=0.0, vp_growth_steps=1)
    grew_accepted, grew_verified, accepted, verified = state.counts
    assert 0 < accepted < verified and grew_accepted <= min(grew_verified, accepted) and grew_verified <= verified
    assert registries() == before
    with pytest.raises(RuntimeError), probe("growth"):  # also when the block fails
        raise RuntimeError
    assert registries() == before


@pytest.mark.parametrize("name, method, knobs", [("pv-cost", "sjd-pv", {}),
                                                 ("prior-cost", "sjd-vp", {"draft_prior": PRIOR_NAME})])
def test_cost_probes_time_every_call_without_changing_the_tokens(reference, name, method, knobs):
    """The timed component is the component itself: the same seeded tokens, one call per decoding iteration
    (the prefill forward decides no drafts), and the registry as it was."""
    before = registries()
    run = dict(custom_generate=method, do_sample=True, top_k=100, max_new_tokens=256, jacobi_window=8,
               return_dict_in_generate=True)
    torch.manual_seed(0)
    plain = reference.model.generate(reference.prompt_ids(["coffee", "cat"]), **run,
                                     **({"draft_prior": "verification-prediction"} if knobs else {}))
    with probe(name) as state:
        torch.manual_seed(0)
        timed = reference.model.generate(reference.prompt_ids(["coffee", "cat"]), **run, **knobs)
    assert torch.equal(plain.sequences, timed.sequences)
    seconds, calls = state.counts
    assert seconds > 0 and 0 < calls <= timed.stats.num_forward_passes
    assert calls >= timed.stats.num_forward_passes - 2  # every iteration but the prefill's (and the last's)
    assert registries() == before
