"""Where a window's positions differ from one-token decoding's: rotary embeddings that rescale with the longest
position (dynamic, LongRoPE), a position table named otherwise (Whisper's decoder), the prompt rows of a lockstep
model under guidance, and the prefill's drafts after a right-padded row. Each case is exact or refused."""

import copy
import warnings

import pytest
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, PegasusConfig, PegasusForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, WhisperConfig, WhisperForCausalLM)

import hf_sjd
from hf_sjd.adapters import UnsupportedModelError, support

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=None, initializer_range=0.1)
ENCODER_DECODER_SIZES = dict(vocab_size=256, d_model=64, decoder_layers=2, encoder_layers=2,
                             decoder_attention_heads=4, encoder_attention_heads=4, decoder_ffn_dim=128,
                             encoder_ffn_dim=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             decoder_start_token_id=1)


def sharpened(model):
    """A random model with confident logits (no near ties for greedy decoding to break either way)."""
    torch.manual_seed(0)
    model = model.eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    model.generation_config.eos_token_id = None
    return model


def prompt(length: int, rows: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 200, (rows, length), generator=torch.Generator().manual_seed(seed))


def dynamic_llama():
    """Dynamic NTK scaling rescales past max_position_embeddings (its original_max_position_embeddings key, here
    larger, is not what transformers reads for it)."""
    torch.manual_seed(0)
    return sharpened(LlamaForCausalLM(LlamaConfig(**SIZES, max_position_embeddings=32, rope_parameters={
        "rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64})))


def longrope_phi3():
    torch.manual_seed(0)
    return sharpened(Phi3ForCausalLM(Phi3Config(**SIZES, max_position_embeddings=128,
                                                original_max_position_embeddings=32, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
        "original_max_position_embeddings": 32})))


@pytest.mark.parametrize("build", [dynamic_llama, longrope_phi3])
def test_a_rescaling_rotary_embedding_is_exact_within_its_switch_and_refused_past_it(build):
    """transformers' dynamic_rope_update recomputes the frequencies from the longest position a forward holds; a
    window holds positions ahead of the committed token, so past the switch it would rescale earlier than one-token
    decoding (other tokens from the first window that crosses). Within it the frequencies never move, also not
    through the calibration's and probe's forwards (a later vanilla call sees the model as it was)."""
    model = build()
    assert support.rope_switch(model) == (32, build is dynamic_llama) and support.position_limit(model) == 32
    ids = prompt(10)
    settings = dict(do_sample=False, pad_token_id=0)
    expected = copy.deepcopy(model).generate(ids, max_new_tokens=22, **settings)  # 32 positions: within the switch
    enabled = hf_sjd.enable(model)
    rotary = [(name, buffer.clone()) for name, buffer in model.named_buffers() if "inv_freq" in name]
    for window in (4, 15, "auto"):
        assert torch.equal(enabled.generate(ids, max_new_tokens=22, custom_generate="sjd", jacobi_window=window,
                                            **settings), expected), window
    assert all(torch.equal(dict(model.named_buffers())[name], before) for name, before in rotary)
    with pytest.raises(UnsupportedModelError, match=r"rotary frequencies .* past 32 .* may reach 33 tokens"):
        enabled.generate(ids, max_new_tokens=23, custom_generate="sjd", jacobi_window=4, **settings)
    long_prompt = prompt(40)  # past the switch: longrope's prefill already runs on the long factors, dynamic's not
    if build is longrope_phi3:
        expected = copy.deepcopy(model).generate(long_prompt, max_new_tokens=16, **settings)
        assert torch.equal(enabled.generate(long_prompt, max_new_tokens=16, custom_generate="sjd", jacobi_window=4,
                                            **settings), expected)
    else:
        with pytest.raises(UnsupportedModelError, match="rotary frequencies"):
            enabled.generate(long_prompt, max_new_tokens=16, custom_generate="sjd", jacobi_window=4, **settings)


def learned_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return sharpened(GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                                initializer_range=0.3, bos_token_id=1, eos_token_id=None,
                                                pad_token_id=0)))


def alibi_mpt():
    """ALiBi biases sized by max_seq_len, over the cache's slots (the aligned layout)."""
    from transformers import MptConfig, MptForCausalLM

    torch.manual_seed(0)
    return sharpened(MptForCausalLM(MptConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=32, vocab_size=256,
                                              initializer_range=0.3, bos_token_id=1, eos_token_id=None,
                                              pad_token_id=0)))


@pytest.mark.parametrize("build", [dynamic_llama, learned_gpt2, alibi_mpt])
@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
def test_a_batch_decodes_up_to_the_models_last_position(build, strategy):
    """A window is sized for the row with the most tokens left, so a row near its end holds drafts past it: their
    positions stay at the last one transformers feeds (they ran past a learned table's end: an IndexError; past a
    dynamic rotary embedding's switch: other tokens for the whole batch), and an aligned cache's keys stay within
    the slots an ALiBi table has."""
    model = build()
    ids = prompt(5, rows=8, seed=3)
    mask = torch.ones_like(ids)
    mask[::2, :2] = 0  # left padding on every other row
    settings = dict(attention_mask=mask, max_new_tokens=32 - ids.shape[1], do_sample=False, pad_token_id=0)
    expected = copy.deepcopy(model).generate(ids * mask, **settings)
    out = hf_sjd.enable(model).generate(ids * mask, custom_generate=strategy, jacobi_window=8,
                                        return_dict_in_generate=True, **settings)
    assert torch.equal(out.sequences, expected)
    assert int(out.stats.row_forward_passes.min()) < expected.shape[1] - ids.shape[1]  # rows ahead of others


def mask_positioned_opt():
    """OPT, given no position_ids, counts its attention mask (GPT-2 counts cache slots)."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    return sharpened(OPTForCausalLM(OPTConfig(vocab_size=256, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                              num_attention_heads=4, max_position_embeddings=64,
                                              word_embed_proj_dim=64, init_std=0.3, pad_token_id=0, bos_token_id=1,
                                              eos_token_id=None)))


@pytest.mark.parametrize("build", [learned_gpt2, mask_positioned_opt])
@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
def test_a_padded_negative_prompt_takes_the_positions_transformers_gives_it(strategy, build):
    """transformers' CFG runs the negative prompt without position_ids: GPT-2 then places it by cache slot (its
    padding counted), OPT by its mask. A model of absolute positions reads them (the unconditional rows took them from
    the mask, then from the slots for every model: other tokens on the padded row of each in turn)."""
    model = build()
    ids, negative = prompt(6, rows=2, seed=3), prompt(4, rows=2, seed=4)
    negative_mask = torch.ones_like(negative)
    negative_mask[1, :2] = 0  # negative prompts of 4 and 2 tokens, left-padded
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, guidance_scale=2.0,
                    negative_prompt_ids=negative * negative_mask, negative_prompt_attention_mask=negative_mask)
    expected = copy.deepcopy(model).generate(ids, **settings)
    out = hf_sjd.enable(model).generate(ids, custom_generate=strategy, jacobi_window=4, **settings)
    assert torch.equal(out, expected)


def test_whisper_decoder_reads_its_own_position_table_size():
    """WhisperConfig names its table max_target_positions: the calibration's dummy prefix and the probe stay within
    it, so the default "auto" decodes a call that ends 6 positions before the table's end."""
    torch.manual_seed(0)
    model = WhisperForCausalLM(WhisperConfig(**ENCODER_DECODER_SIZES, max_target_positions=448)).eval()
    model.generation_config.eos_token_id = None
    assert support.position_limit(model) == 448
    ids, settings = prompt(430), dict(do_sample=False, max_new_tokens=12, pad_token_id=0)
    expected = model.generate(ids, **settings)
    enabled = hf_sjd.enable(model)
    for window in (4, "auto"):
        assert torch.equal(enabled.generate(ids, custom_generate="sjd", jacobi_window=window, **settings), expected)


def test_a_lockstep_model_under_guidance_needs_a_negative_prompt_of_the_prompts_length():
    """Pegasus takes positions from cache slots: the forward's second (unconditional) row, padded to the prompt's
    length, would see other positions than transformers' unbatched CFG gives it; the same length is exact."""
    torch.manual_seed(0)
    model = sharpened(PegasusForCausalLM(PegasusConfig(**ENCODER_DECODER_SIZES, max_position_embeddings=512,
                                                       init_std=0.1)))
    ids = prompt(9)
    settings = dict(do_sample=False, max_new_tokens=20, pad_token_id=0, guidance_scale=3.0)
    same_length = prompt(9, seed=5)
    expected = model.generate(ids, negative_prompt_ids=same_length, **settings)
    enabled = hf_sjd.enable(model)
    got = enabled.generate(ids, negative_prompt_ids=same_length, custom_generate="sjd", jacobi_window=4, **settings)
    assert torch.equal(got, expected)
    for length in (3, 14):
        with pytest.raises(UnsupportedModelError, match="negative_prompt_ids .* of the prompt's own length"):
            enabled.generate(ids, negative_prompt_ids=prompt(length, seed=5), custom_generate="sjd",
                             jacobi_window=4, **settings)


def test_a_right_padded_row_gets_its_first_token_from_the_prompt_alone():
    """A row padded on the right for at least a sliding window: its last slot's query sees no real key, and eager
    attention then spreads it over every key of the forward. The prefill carries no drafts after such a row, so
    its first token is transformers' whatever the window."""
    torch.manual_seed(0)
    model = sharpened(Qwen2ForCausalLM(Qwen2Config(**SIZES, use_sliding_window=True, sliding_window=8,
                                                   max_window_layers=1, attn_implementation="eager")))
    ids, mask = prompt(14, rows=2), torch.ones(2, 14, dtype=torch.long)
    mask[1, 1:] = 0  # one real token, then 13 pads
    ids = ids * mask
    settings = dict(attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers warns about right padding
        expected = model.generate(ids, **settings)
        enabled = hf_sjd.enable(model)
        for window in (4, 15):
            assert torch.equal(enabled.generate(ids, custom_generate="sjd", jacobi_window=window, **settings),
                               expected), window
