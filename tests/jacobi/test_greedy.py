"""Greedy Jacobi decoding reproduces transformers' greedy generate token for token."""

import pytest
import torch

from toy import tiny_llama

pytestmark = pytest.mark.device  # on a GPU too (tests/conftest.py)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(48, num_key_value_heads=2)


@pytest.mark.parametrize("window", [1, 3, 16])
def test_greedy_matches_transformers_batch_1(model, window):
    prompt = torch.tensor([[5, 6, 7, 8]])
    expected = model.generate(prompt, do_sample=False, max_new_tokens=30)
    got = model.generate(prompt, do_sample=False, max_new_tokens=30, custom_generate="sjd", jacobi_window=window)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
def test_greedy_matches_transformers_left_padded_batch(model, strategy):
    prompt = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 11, 12, 13]])
    mask = (torch.arange(4)[None] >= torch.tensor([[2], [0], [1]])).long()
    expected = model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=25)
    out = model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=25, custom_generate=strategy,
                         jacobi_window=5, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert out.stats.num_new_tokens.tolist() == [25, 25, 25]


def test_max_new_tokens_smaller_than_window(model):
    prompt = torch.tensor([[3, 4]])
    for max_new in (1, 2, 5):
        expected = model.generate(prompt, do_sample=False, max_new_tokens=max_new)
        got = model.generate(prompt, do_sample=False, max_new_tokens=max_new, custom_generate="sjd", jacobi_window=16)
        assert torch.equal(got, expected)


def test_eos_stops_each_row_exactly(model):
    prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    reference = model.generate(prompt, do_sample=False, max_new_tokens=20)
    eos = int(reference[0, 4 + 6])  # the 7th new token of row 0 becomes EOS
    expected = model.generate(prompt, do_sample=False, max_new_tokens=20, eos_token_id=eos, pad_token_id=0)
    got = model.generate(prompt, do_sample=False, max_new_tokens=20, eos_token_id=eos, pad_token_id=0,
                         custom_generate="sjd", jacobi_window=4)
    assert torch.equal(got, expected)
    assert (got[0, 4 + 7:] == 0).all()  # padded after EOS, as transformers does


def test_row_forward_passes_count_each_rows_own_forwards():
    """A row that hits EOS early leaves the batch: its forward count is smaller than the batch's."""
    model = tiny_llama(vocab_size=40)
    prompt = torch.tensor([[5, 6, 7], [8, 9, 10]])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=12)
    eos = int(plain[0, 5])  # row 0 emits this token at its 3rd new position
    out = model.generate(prompt, do_sample=False, max_new_tokens=12, custom_generate="sjd", jacobi_window=1,
                         eos_token_id=eos, return_dict_in_generate=True)
    stats = out.stats
    assert int(stats.row_forward_passes.max()) == stats.num_forward_passes
    finished_early = stats.num_new_tokens < 12
    assert finished_early.any()
    assert (stats.row_forward_passes[finished_early] < stats.num_forward_passes).all()
    # window 1 commits one or two tokens per forward
    assert (stats.row_forward_passes * 2 >= stats.num_new_tokens).all()
    assert (stats.row_forward_passes <= stats.num_new_tokens).all()
    assert torch.allclose(stats.row_step_compression, stats.num_new_tokens / stats.row_forward_passes)


@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
def test_greedy_matches_transformers_with_right_and_inner_padding(model, strategy):
    """Any padding side decodes as transformers' own generate does (its greedy output is the reference)."""
    prompt = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 10], [11, 0, 12, 13], [0, 14, 15, 0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 1, 0]])
    expected = model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=20)
    got = model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=20, custom_generate=strategy,
                         jacobi_window=4)
    assert torch.equal(got, expected)


def test_greedy_matches_transformers_under_length_and_history_processors_in_a_ragged_batch(model):
    """Rows commit different amounts per iteration; every processor still sees each row's own prefix, so
    length-dependent (min_new_tokens) and history-dependent (repetition penalty, no-repeat n-grams)
    processors give transformers' greedy output exactly."""
    prompt = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 11, 12, 13], [3, 2, 1, 4]])
    mask = (prompt != 0).long()
    plain = model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=24)
    eos = int(plain[1, 4 + 3])  # a token row 1 emits early: EOS must be held back until min_new_tokens
    settings = dict(attention_mask=mask, do_sample=False, max_new_tokens=24, eos_token_id=eos, pad_token_id=0,
                    min_new_tokens=9, repetition_penalty=1.3, no_repeat_ngram_size=3)
    expected = model.generate(prompt, **settings)
    out = model.generate(prompt, **settings, custom_generate="sjd", jacobi_window=5, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert len(set(out.stats.num_new_tokens.tolist())) > 1 or out.stats.tokens_per_forward[2:].sum() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_guided_greedy_in_half_precision_matches_transformers(dtype):
    """transformers guides with the unconditional log-softmax taken in the model's dtype (its CFG processor runs that
    forward itself): the loop does the same arithmetic (it took it in float32, and near-ties flipped, at window 0
    too). The negative prompt has the prompt's length: a padded one's batched forward rounds otherwise in half
    precision than transformers' separate unconditional forward. Windows in float16 only: bfloat16 rounds a
    window's forward unlike a one-token one (design.md)."""
    model = tiny_llama(512).to(dtype)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)  # flat laws: many near-ties for the rounding to flip
    torch.manual_seed(0)
    prompts, negative = torch.randint(1, 512, (64, 5)), torch.randint(1, 512, (64, 5))
    kwargs = dict(do_sample=False, max_new_tokens=6, guidance_scale=3.0, negative_prompt_ids=negative)
    expected = model.generate(prompts, **kwargs)
    for window in (0, 4) if dtype == torch.float16 else (0,):
        assert torch.equal(model.generate(prompts, custom_generate="sjd", jacobi_window=window, **kwargs), expected)
