"""What ``generate`` does with input transformers accepts or refuses clearly (issue 33, items 1, 2, 7): the same
thing, or a refusal before any forward that names the argument; never a deep crash or a silent wrong result."""

import pytest
import torch
from transformers import LogitsProcessor

from toy import COND, NULL, no_forward, toy_model

STRATEGIES = ["sjd", "mc-sjd", "sjd-vp", "gsd"]


@pytest.fixture(scope="module")
def model():
    return toy_model()


class NothingAllowedFrom(LogitsProcessor):
    """Every score ``value`` (-inf or NaN) once the row holds ``start`` generated tokens or more."""

    def __init__(self, start: int, value: float = float("-inf")) -> None:
        self.start, self.value = start, value

    def __call__(self, input_ids, scores):
        late = (input_ids.shape[1] - 1 >= self.start)  # one prompt token
        return torch.full_like(scores, self.value) if late else scores


@pytest.mark.parametrize("value", [float("-inf"), float("nan")], ids=["inf", "nan"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_position_with_nothing_allowed_is_refused_where_transformers_refuses(model, strategy, value):
    """Sampling: transformers raises at the first position without a distribution; so does every strategy, naming
    the position and the processors, instead of committing tokens drawn from nothing. (Block verification would
    accept drafts against NaN targets: those count as committed tokens of an undefined position too.)"""
    processor = NothingAllowedFrom(7, value)
    prompt = torch.full((3, 1), COND)
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        model.generate(prompt, do_sample=True, top_k=3, max_new_tokens=20, logits_processor=[processor])
    with pytest.raises(ValueError, match=r"no token allowed at generated position 7 of row \d .*NothingAllowedFrom"):
        model.generate(prompt, do_sample=True, top_k=3, max_new_tokens=20, logits_processor=[processor],
                       custom_generate=strategy, jacobi_window=4)


def test_nothing_allowed_from_the_start_by_transformers_own_processors(model):
    """``suppress_tokens`` / ``bad_words_ids`` covering the whole vocabulary: refused at position 0."""
    everything = list(range(6))
    for knobs in ({"suppress_tokens": everything}, {"bad_words_ids": [[t] for t in everything]}):
        with pytest.raises(ValueError, match="no token allowed at generated position 0 of row 0"):
            model.generate(torch.full((1, 1), COND), do_sample=True, top_k=3, max_new_tokens=5,
                           custom_generate="sjd", draft_token_ids=everything, **knobs)


def test_greedy_with_nothing_allowed_still_matches_transformers(model):
    """Greedy decoding takes the argmax, which transformers does without complaint: so does every strategy."""
    processor = NothingAllowedFrom(3)
    prompt = torch.full((2, 1), COND)
    expected = model.generate(prompt, do_sample=False, max_new_tokens=8, logits_processor=[processor])
    for strategy in STRATEGIES:
        knobs = {"vp_growth_steps": 2} if strategy == "sjd-vp" else {}  # (N = 3 never fires at window 3: refused)
        got = model.generate(prompt, do_sample=False, max_new_tokens=8, logits_processor=[processor],
                             custom_generate=strategy, jacobi_window=3, **knobs)
        assert torch.equal(got, expected), strategy


def test_int32_prompts_work_as_in_transformers(model):
    prompt = torch.full((2, 1), COND)
    torch.manual_seed(0)
    long = model.generate(prompt, do_sample=True, top_k=3, max_new_tokens=9, custom_generate="mc-sjd")
    torch.manual_seed(0)
    short = model.generate(prompt.int(), do_sample=True, top_k=3, max_new_tokens=9, custom_generate="mc-sjd",
                           attention_mask=torch.ones(2, 1, dtype=torch.int32))
    assert short.dtype == torch.int64 and torch.equal(short, long)


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int8])
def test_other_id_dtypes_are_refused_before_any_forward(model, dtype):
    with no_forward(model), pytest.raises(TypeError, match=rf"input_ids must hold integer token ids of dtype "
                                                          rf"torch.int64 or torch.int32 .*got dtype {dtype}"):
        model.generate(torch.full((1, 1), COND, dtype=dtype), do_sample=True, max_new_tokens=3,
                       custom_generate="sjd")


def test_a_negative_prompt_per_prompt_is_expanded_with_num_return_sequences(model):
    """Two prompts, ``num_return_sequences=2``: transformers expands the prompts to 4 rows; their negative prompts
    (one each) are expanded alike, as if the user had repeated both."""
    prompts, negatives = torch.tensor([[COND], [COND]]), torch.tensor([[NULL], [COND]])
    common = dict(do_sample=True, top_k=3, max_new_tokens=6, custom_generate="sjd", guidance_scale=3.0)
    torch.manual_seed(0)
    expanded = model.generate(prompts, negative_prompt_ids=negatives, num_return_sequences=2, **common)
    torch.manual_seed(0)
    repeated = model.generate(prompts.repeat_interleave(2, 0), negative_prompt_ids=negatives.repeat_interleave(2, 0),
                              **common)
    assert expanded.shape == (4, 7) and torch.equal(expanded, repeated)


@pytest.mark.parametrize("knob, value", [("prompt_lookup_num_tokens", 3), ("assistant_model", "self")])
def test_another_drafter_with_a_strategy_is_refused_before_any_forward(model, knob, value):
    value = model if value == "self" else value
    with no_forward(model), pytest.raises(ValueError, match=rf"{knob}= selects transformers' assisted decoding"):
        model.generate(torch.full((1, 1), COND), do_sample=True, max_new_tokens=3, custom_generate="sjd",
                       **{knob: value})


def test_model_inputs_a_window_forward_would_drop_are_refused_before_any_forward():
    """Inputs of the model's forward other than token ids (a VLM's pixel_values, GPT-2's token_type_ids) change
    transformers' tokens; a window forward feeds ids, mask and positions only, so it decoded without them."""
    from transformers import (CLIPVisionConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration)

    import hf_sjd

    torch.manual_seed(0)
    gpt2 = hf_sjd.enable(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                                    pad_token_id=0)).eval())
    ids = torch.tensor([[5, 6, 7]])
    with no_forward(gpt2), pytest.raises(ValueError, match="token_type_ids: a Jacobi strategy's window forwards"):
        gpt2.generate(ids, token_type_ids=torch.ones_like(ids), max_new_tokens=4, custom_generate="sjd")
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=16, patch_size=8, projection_dim=32)
    text = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, pad_token_id=0)
    llava = hf_sjd.enable(LlavaForConditionalGeneration(LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=250, vision_feature_layer=-1,
        vision_feature_select_strategy="full")).eval())
    ids = torch.tensor([[5, 6] + [250] * 5 + [7]])
    with no_forward(llava), pytest.raises(ValueError, match="pixel_values: a Jacobi strategy's window forwards"):
        llava.generate(ids, pixel_values=torch.randn(1, 3, 16, 16), max_new_tokens=4, custom_generate="mc-sjd")
    assert torch.equal(llava.generate(ids, max_new_tokens=4, custom_generate="mc-sjd", do_sample=False),
                       llava.generate(ids, max_new_tokens=4, do_sample=False))  # text alone: decoded as transformers


def test_a_cache_prefilled_with_one_token_is_refused():
    from transformers import DynamicCache
    from toy import tiny_llama

    model = tiny_llama(64)
    cache = DynamicCache(config=model.config)
    model(torch.tensor([[5]]), cache=cache, use_cache=True)  # one slot
    with pytest.raises(ValueError, match="empty cache"):
        model.generate(torch.tensor([[5, 6, 7]]), custom_generate="sjd", jacobi_window=4, do_sample=False,
                       max_new_tokens=6, cache=cache)


def test_a_streamer_with_num_return_sequences_is_refused():
    """Batch 1 but num_return_sequences=2 decodes two rows: the streamer would see row 0 only."""
    from transformers.generation.streamers import BaseStreamer
    from toy import tiny_llama

    class Collect(BaseStreamer):
        def put(self, value):
            pass

        def end(self):
            pass

    with pytest.raises(ValueError, match="streamer= needs batch size 1"):
        tiny_llama(64).generate(torch.tensor([[5, 6, 7]]), custom_generate="sjd", jacobi_window=4, do_sample=True,
                                num_return_sequences=2, max_new_tokens=6, streamer=Collect())


@pytest.mark.parametrize("name", ["output_scores", "output_logits", "output_attentions", "output_hidden_states"])
def test_each_unsupported_output_is_refused(name):
    from toy import tiny_llama

    with pytest.raises(ValueError, match=f"{name}=True is not supported"):
        tiny_llama(64).generate(torch.tensor([[5, 6, 7]]), custom_generate="sjd", jacobi_window=4, do_sample=False,
                                max_new_tokens=6, return_dict_in_generate=True, **{name: True})


def test_a_negative_prompt_of_neither_one_row_nor_one_per_prompt_is_refused():
    from toy import tiny_llama

    with pytest.raises(ValueError, match="negative_prompt_ids has 2 rows"):
        tiny_llama(64).generate(torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]]), custom_generate="sjd",
                                jacobi_window=4, do_sample=False, max_new_tokens=6, guidance_scale=2.0,
                                negative_prompt_ids=torch.tensor([[1, 2, 3], [4, 5, 6]]))


@pytest.mark.parametrize("where", ["input_ids", "negative_prompt_ids"])
def test_a_token_id_equal_to_the_vocabulary_size_is_refused(where):
    from toy import tiny_llama

    ids = {"input_ids": torch.tensor([[5, 6, 7]]), "negative_prompt_ids": torch.tensor([[1, 2, 3]])}
    ids[where] = torch.tensor([[5, 6, 64]])
    with pytest.raises(ValueError, match=rf"{where} must lie in \[0, 64\)"):
        tiny_llama(64).generate(ids["input_ids"], negative_prompt_ids=ids["negative_prompt_ids"], guidance_scale=2.0,
                                custom_generate="sjd", jacobi_window=4, do_sample=False, max_new_tokens=6)


def test_position_ids_are_refused():
    """The window forwards take positions from the mask: position_ids= would be dropped silently."""
    from toy import tiny_llama

    with pytest.raises(ValueError, match="^position_ids: a Jacobi strategy's window forwards"):
        tiny_llama(64).generate(torch.tensor([[5, 6, 7]]), custom_generate="sjd", jacobi_window=4, do_sample=False,
                                max_new_tokens=6, position_ids=torch.arange(3)[None] + 40)


def test_prefill_chunk_size_in_a_generation_config_is_refused():
    from transformers import GenerationConfig
    from toy import tiny_llama

    config = GenerationConfig(do_sample=False, max_new_tokens=6, prefill_chunk_size=2)
    with pytest.raises(ValueError, match="prefill_chunk_size=2"):
        tiny_llama(64).generate(torch.tensor([[5, 6, 7]]), generation_config=config, custom_generate="sjd",
                                jacobi_window=4)
