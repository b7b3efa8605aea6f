"""Knob resolution: SJDConfig fields plus one options dataclass per selected component (a field is a knob)."""

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from transformers import GenerationConfig

import hf_sjd
from hf_sjd import SJDConfig
from hf_sjd.jacobi.config import known_knobs
from hf_sjd.jacobi.options import ComponentOptions
from toy import COND, toy_model


def resolve(strategy: str, generation_config=None, **kwargs):
    return SJDConfig.resolve(hf_sjd.STRATEGIES[strategy].preset, generation_config, kwargs), kwargs


def test_precedence_is_kwarg_then_generation_config_then_preset_then_default():
    config, _ = resolve("sjd-vp")
    assert config.draft_coupling == "independent"  # the preset
    assert config.prior_options.strength == 1.0 and config.prior_options.max_gain == 1.0  # defaults
    config, _ = resolve("sjd-vp", GenerationConfig(vp_strength=2.0, draft_coupling="maximal"))
    assert config.prior_options.strength == 2.0 and config.draft_coupling == "maximal"
    config, rest = resolve("sjd-vp", GenerationConfig(vp_strength=2.0), vp_strength=0.5, vp_max_gain=None,
                           jacobi_window=None)
    assert config.prior_options.strength == 0.5  # the kwarg wins
    assert config.prior_options.max_gain is None  # an explicit None is a value (the unbounded gain) ...
    assert config.jacobi_window == "auto"  # ... but for a loop field it means the default, as in transformers
    assert rest == {}  # every knob read was taken out of the kwargs


def test_only_the_selected_components_take_their_knobs():
    config, rest = resolve("sjd", vp_strength=2.0, lantern_k=3)
    assert rest == {"vp_strength": 2.0, "lantern_k": 3}  # left for transformers to refuse as unused
    config, rest = resolve("mc-sjd", draft_prior="verification-prediction", vp_strength=2.0)
    assert config.prior_options.strength == 2.0 and rest == {}


def test_phrase_verification_nests_the_options_of_its_base_verifier():
    config, rest = resolve("sjd-pv", pv_base_verifier="lantern", lantern_k=3, pv_tau=0.05)
    assert config.verifier_options.base_verifier == "lantern" and config.verifier_options.tau == 0.05
    assert config.verifier_options.base_options.k == 3 and rest == {}
    assert {"lantern_k", "lantern_delta", "latent_embeddings", "phrase_library", "pv_tau"} <= config.knob_names()
    assert "gsd_rank_window" not in config.knob_names()
    assert {"vp_strength", "pv_tau", "lantern_k", "gsd_prob_tol", "jacobi_window"} <= known_knobs()


def test_adding_a_knob_is_one_field(monkeypatch):
    """A new component declares its options; its knob is then read from generate like every other."""
    seen = []

    @dataclass
    class ScaledOptions(ComponentOptions):
        PREFIX: ClassVar[str] = "scaled_"
        factor: float = 1.0

        def validate(self):
            if not 0 < self.factor <= 1:
                raise ValueError(f"scaled_factor must lie in (0, 1], got {self.factor}")
            return self

    class ScaledVerifier(hf_sjd.SpeculativeVerifier):
        options_class = ScaledOptions

        def __init__(self, factor):
            self.factor = factor

        @classmethod
        def from_config(cls, config, adapter, draft_ids, options):
            seen.append(options.factor)
            return cls(options.factor)

        def acceptance_probs(self, drafts, draft_probs, target_probs):
            return super().acceptance_probs(drafts, draft_probs, target_probs) * self.factor

    monkeypatch.setitem(hf_sjd.VERIFIERS, "scaled", ScaledVerifier)
    model = toy_model()
    out = model.generate(torch.full((2, 1), COND), do_sample=True, top_k=3, max_new_tokens=4, custom_generate="sjd",
                         verifier="scaled", scaled_factor=0.5)
    assert out.shape == (2, 5) and seen == [0.5]
    with pytest.raises(ValueError, match=r"scaled_factor must lie in \(0, 1\], got 2.0"):
        model.generate(torch.full((1, 1), COND), do_sample=True, max_new_tokens=4, custom_generate="sjd",
                       verifier="scaled", scaled_factor=2.0)


def test_every_strategy_is_a_composition_of_knobs():
    """A strategy is only a preset: the same knobs given to another strategy name give the same configuration, so
    every combination of components is one knob away (no name is needed for it)."""
    for name, strategy in hf_sjd.STRATEGIES.items():
        config, _ = resolve("sjd", **strategy.preset)
        assert config == resolve(name)[0], name
    combined, _ = resolve("lantern", draft_coupling="maximal", draft_prior="verification-prediction")
    assert (combined.verifier, combined.draft_coupling, combined.draft_prior) == \
        ("lantern", "maximal", "verification-prediction")


def test_the_config_is_frozen_and_validated_on_construction():
    with pytest.raises(Exception):
        SJDConfig().jacobi_window = 4
    with pytest.raises(ValueError, match="jacobi_sibling_law='previous' is not supported; allowed values: 'draft', "
                                         "'mixture'"):
        SJDConfig(jacobi_sibling_law="previous")
    assert SJDConfig(jacobi_window=__import__("numpy").int64(8)).jacobi_window == 8


def test_guidance_scale_one_is_no_guidance():
    from toy import tiny_llama
    model = tiny_llama(vocab_size=40)
    prompt = torch.tensor([[5, 6, 7]])
    kw = dict(do_sample=False, max_new_tokens=8, custom_generate="sjd", jacobi_window=3, return_dict_in_generate=True)
    torch.manual_seed(0)
    plain = model.generate(prompt, **kw)
    torch.manual_seed(0)  # the same random drafts
    one = model.generate(prompt, guidance_scale=1.0, **kw)
    assert torch.equal(one.sequences, plain.sequences)
    assert one.stats.num_forward_passes == plain.stats.num_forward_passes
