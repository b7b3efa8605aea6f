"""Sampled Jacobi decoding follows the model's exact distribution on three kinds of attention (issue 32): GPT-2
(full attention, learned absolute positions from ``position_ids``: the ragged layout), Bloom (ALiBi biases built
from the attention mask: the ragged layout, whose prefill mask was too wide) and Gemma-2 with a sliding window
of 2 next to a full layer (the aligned layout: the window is passed, and rows of the batch commit different
amounts, so they are moved every forward).

Sample size, as in ``tests/jacobi/test_exactness.py``: 6000 rows over the 27 top-3 sequences of 3 tokens; a
chi-square test at that size has power ~1 against a total-variation shift of 0.05, while a correct sampler passes
at level 1e-3 with probability 0.999 (three models: 0.997 together).
"""

import collections

import pytest
import torch
from transformers import BloomConfig, BloomForCausalLM, Gemma2Config, Gemma2ForCausalLM, GPT2Config, GPT2LMHeadModel

import hf_sjd
from hf_sjd.adapters import support
from toy import COND, VOCAB, chi_square_pvalue, exact_distribution

NUM_SAMPLES = 6000
NUM_NEW = 3
TINY = dict(vocab_size=VOCAB, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def gpt2():
    return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=32, **TINY))


def bloom():
    return BloomForCausalLM(BloomConfig(hidden_size=16, n_layer=2, n_head=2, **TINY))


def gemma2():
    return Gemma2ForCausalLM(Gemma2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=2,
                                          layer_types=["sliding_attention", "full_attention"],
                                          max_position_embeddings=32, **TINY))


def enabled(build):
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():  # peaked but not deterministic distributions, like a trained image model
        model.get_output_embeddings().weight.mul_(4.0)
    model.generation_config.pad_token_id = 0
    return hf_sjd.enable(model)


def sample(model):
    """``NUM_SAMPLES`` rows of ``mc-sjd`` (top-3, window 2) after the condition token: (counts, stats)."""
    torch.manual_seed(1)
    with torch.no_grad():
        out = model.generate(torch.full((NUM_SAMPLES, 1), COND), do_sample=True, top_k=3, max_new_tokens=NUM_NEW,
                             custom_generate="mc-sjd", jacobi_window=2, return_dict_in_generate=True)
    return collections.Counter(tuple(row) for row in out.sequences[:, 1:].tolist()), out.stats


@pytest.mark.device
@pytest.mark.parametrize("build, layout", [(gpt2, "ragged"), (bloom, "ragged"), (gemma2, "aligned")],
                         ids=["gpt2", "bloom", "gemma2-sliding"])
def test_sampled_tokens_follow_the_exact_distribution(build, layout):
    model = enabled(build)
    assert support.layout(model, batch=NUM_SAMPLES) == layout
    exact = exact_distribution(model, [COND], NUM_NEW, top_k=3)
    counts, stats = sample(model)
    _, pvalue, impossible = chi_square_pvalue(counts, exact)
    assert impossible == 0 and pvalue > 1e-3
    # meaningful only if drafts were accepted (rows then commit different amounts: the layouts' moves run)
    assert stats.num_accepted > NUM_SAMPLES / 2


def test_the_ragged_layout_on_a_sliding_window_model_is_detected(monkeypatch):
    """The same test catches what the aligned layout fixes: with gaps before the rows' windows (the ragged layout),
    Gemma-2's sliding window sees other tokens and the samples leave the exact law."""
    monkeypatch.setattr(support, "layout", lambda *_: "ragged")
    model = enabled(gemma2)
    counts, _ = sample(model)
    assert chi_square_pvalue(counts, exact_distribution(model, [COND], NUM_NEW, top_k=3))[1] < 1e-20
