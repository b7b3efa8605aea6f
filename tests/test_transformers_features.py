"""What transformers' ``generate`` does with its own arguments, a Jacobi strategy does too, token for token (greedy):
stopping criteria judged after every token, stop strings, CFG with a processor that reads a score's sign, the
streamer on the plain hand-off, ``use_cache=False``.

The model is the reference model's weights as a plain decoder-only LM (no image layout): its drafts are accepted, so
commits span several tokens and a stop can fall inside one.
"""

from pathlib import Path

import pytest
import torch
from transformers import (GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast, StoppingCriteria,
                          StoppingCriteriaList)
from transformers.generation.streamers import BaseStreamer

import hf_sjd
from hf_sjd.reference import ar_config

REPO_ROOT = Path(__file__).resolve().parents[1]  # a Hub recipe (custom_generate/)
PROMPTS = torch.tensor([[512], [515]])
STOP_TOKEN = 475  # a token of the first prompt's greedy continuation (checked below)


@pytest.fixture(scope="module")
def text_model(reference):
    config = ar_config()
    for name in ("image_token_range", "image_grid", "null_condition_token_id", "condition_token_ids"):
        if hasattr(config, name):
            delattr(config, name)
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(reference.model.state_dict())
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 529, None
    return hf_sjd.enable(model)


def both(model, prompt, strategy, seed=0, **kwargs):
    """(transformers' own greedy generate, the strategy's) with the same arguments."""
    vanilla = model.generate(prompt, do_sample=False, **kwargs)
    torch.manual_seed(seed)  # the first window's random drafts decide where commits end
    return vanilla, model.generate(prompt, custom_generate=strategy, jacobi_window=8, do_sample=False, **kwargs)


class StopAfter(StoppingCriteria):
    """Stops a row after ``STOP_TOKEN`` (first prompt) or once it has ``late`` new tokens (second prompt)."""

    def __init__(self, late: int) -> None:
        self.late = late

    def __call__(self, input_ids, scores, **kwargs):
        first = input_ids[:, 0] == PROMPTS[0, 0]
        return torch.where(first, input_ids[:, -1] == STOP_TOKEN, torch.tensor(input_ids.shape[1] > self.late))


@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_stopping_criterion_stops_at_the_token_it_fires_on(text_model, strategy, seed):
    vanilla, out = both(text_model, PROMPTS[:1], strategy, seed, max_new_tokens=120,
                        stopping_criteria=StoppingCriteriaList([StopAfter(late=0)]))
    assert vanilla[0, -1] == STOP_TOKEN and vanilla.shape[1] < 60  # it fires early, inside a commit
    assert torch.equal(out, vanilla)


@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
@pytest.mark.parametrize("eos", [None, 528])
def test_rows_that_stop_apart_end_as_in_transformers(text_model, strategy, eos):
    """Without an EOS id transformers samples a stopped row on until every row has stopped (all end at that step);
    with one it pads a stopped row. The first row stops early; the second after 40 tokens."""
    text_model.generation_config.eos_token_id = eos
    try:
        for seed in range(3):
            vanilla, out = both(text_model, PROMPTS, strategy, seed, max_new_tokens=120, return_dict_in_generate=True,
                                stopping_criteria=StoppingCriteriaList([StopAfter(late=41)]))
            assert torch.equal(out.sequences, vanilla.sequences)
            stats = out.stats
            assert stats.num_new_tokens.tolist() == [vanilla.sequences.shape[1] - 1] * 2 or eos is not None
            assert stats.commit_map.forward.shape[1] == int(stats.num_new_tokens.max())
            assert sum(stats.commit_map.counts().values()) == int(stats.num_new_tokens.sum())
    finally:
        text_model.generation_config.eos_token_id = None
    if eos is not None:
        assert (vanilla.sequences[0] == text_model.generation_config.pad_token_id).any()


@pytest.mark.parametrize("eos", [None, 528])
def test_plain_decoding_counts_a_stopped_rows_tokens_as_the_window_loop_does(text_model, eos):
    """Plain decoding (transformers' own loop) counts what the rows hold: without an EOS id a stopped row's later
    tokens are real ones, as the window loop counts them; with one, a row ends at its stop."""
    text_model.generation_config.eos_token_id = eos
    try:
        counts = [text_model.generate(PROMPTS, custom_generate="sjd", do_sample=False, max_new_tokens=120,
                                      jacobi_window=window, return_dict_in_generate=True,
                                      stopping_criteria=StoppingCriteriaList([StopAfter(late=41)])).stats.num_new_tokens
                  for window in (0, 8)]
    finally:
        text_model.generation_config.eos_token_id = None
    assert torch.equal(counts[0], counts[1]) and (counts[0][0] < counts[0][1]) == (eos is not None)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """Token i is one character (``tokenizers``, in memory); ids 0-5 are "abcdef", which transformers' stop-string
    criterion tokenizes to find how each token reads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {("abcdef"[i] if i < 6 else chr(0x4E00 + i)): i for i in range(530)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.Split("", "isolated"), decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
def test_stop_strings_with_a_tokenizer(text_model, strategy):
    vanilla, out = both(text_model, PROMPTS[:1], strategy, max_new_tokens=120, stop_strings=[chr(0x4E00 + STOP_TOKEN)],
                        tokenizer=char_tokenizer())
    assert vanilla.shape[1] < 60 and torch.equal(out, vanilla)
    with pytest.raises(ValueError, match="stop_strings= needs the model's tokenizer"):
        text_model.generate(PROMPTS[:1], custom_generate=strategy, max_new_tokens=5, stop_strings=["x"])
    with pytest.raises(ValueError, match="token_healing"):
        text_model.generate(PROMPTS[:1], custom_generate=strategy, max_new_tokens=5, token_healing=True)



def test_stop_strings_saved_with_the_model_under_a_generation_config(text_model):
    """Stop strings on ``model.generation_config``, a GenerationConfig passed and ``tokenizer=``: stopped where
    transformers stops (they reach the call through transformers' merge)."""
    settings = dict(do_sample=False, max_new_tokens=120, pad_token_id=529)
    text_model.generation_config.stop_strings = [chr(0x4E00 + STOP_TOKEN)]
    try:
        vanilla = text_model.generate(PROMPTS[:1], generation_config=GenerationConfig(**settings),
                                      tokenizer=char_tokenizer())
        out = text_model.generate(PROMPTS[:1], generation_config=GenerationConfig(**settings),
                                  tokenizer=char_tokenizer(), custom_generate="sjd", jacobi_window=8)
    finally:
        text_model.generation_config.stop_strings = None
    assert vanilla.shape[1] < 60 and torch.equal(out, vanilla)


def test_transformers_unbatched_guidance_processor_is_refused_for_the_batched_one(text_model):
    """transformers' UnbatchedClassifierFreeGuidanceLogitsProcessor runs the model on a cache of its own, one token a
    call: refused before any forward, naming guidance_scale= (batched into the window, the same tokens)."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor

    processor = UnbatchedClassifierFreeGuidanceLogitsProcessor(3.0, text_model, unconditional_ids=torch.tensor([[528]]))
    forwards = []
    hook = text_model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(ValueError, match=r"UnbatchedClassifierFreeGuidanceLogitsProcessor .* guidance_scale="):
            text_model.generate(PROMPTS[:1], do_sample=False, max_new_tokens=8, custom_generate="sjd",
                                logits_processor=LogitsProcessorList([processor]))
    finally:
        hook.remove()
    assert not forwards


@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
@pytest.mark.parametrize("processors", [{"repetition_penalty": 1.3}, {"exponential_decay_length_penalty": (2, 1.5)},
                                        {"no_repeat_ngram_size": 2}])
def test_cfg_guides_as_transformers_under_every_processor(text_model, strategy, processors):
    """transformers guides log-softmaxed scores; a repetition penalty reads their sign, so raw logits would not do."""
    text_model.generation_config.eos_token_id = 528  # (the length penalty needs one)
    try:
        vanilla, out = both(text_model, PROMPTS[:1], strategy, max_new_tokens=60, guidance_scale=3.0,
                            negative_prompt_ids=torch.tensor([[528]]), **processors)
    finally:
        text_model.generation_config.eos_token_id = None
    assert torch.equal(out, vanilla)


def test_streamer_is_fed_when_the_call_decodes_plainly(text_model):
    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks, self.ends = [], 0

        def put(self, value):
            self.chunks.append(value.flatten().tolist())

        def end(self):
            self.ends += 1

    streamer = Collect()
    out = text_model.generate(PROMPTS[:1], custom_generate="sjd", jacobi_window=0, do_sample=False,
                              max_new_tokens=12, streamer=streamer)
    assert streamer.ends == 1 and sum(streamer.chunks, []) == out[0].tolist()


def test_a_cache_passed_holds_what_transformers_leaves_after_an_eos_inside_a_commit(text_model):
    """An EOS accepted inside a window is fed with the window; transformers never feeds the last token: the cache
    after the call holds the sequence but its last token, as transformers' does (it kept the EOS's entries too)."""
    from transformers import DynamicCache

    kwargs = dict(do_sample=False, max_new_tokens=40, eos_token_id=252)
    vanilla_cache, cache = DynamicCache(config=text_model.config), DynamicCache(config=text_model.config)
    vanilla = text_model.generate(PROMPTS[:1], cache=vanilla_cache, **kwargs)
    torch.manual_seed(0)
    out = text_model.generate(PROMPTS[:1], custom_generate="sjd", jacobi_window=8, cache=cache,
                              return_dict_in_generate=True, **kwargs)
    assert torch.equal(out.sequences, vanilla) and vanilla[0, -1] == 252 and vanilla.shape[1] < 41
    assert out.stats.num_forward_passes < vanilla.shape[1] - 1  # a commit of several tokens: the EOS inside one
    assert cache.get_seq_length() == vanilla_cache.get_seq_length() == vanilla.shape[1] - 1
    assert torch.equal(text_model.generate(vanilla, cache=cache, **{**kwargs, "max_new_tokens": 5}),
                       text_model.generate(vanilla, **{**kwargs, "max_new_tokens": 5}))


def test_top_k_0_is_no_top_k_as_in_transformers(text_model):
    """A model whose generation_config says top_k=0 (transformers adds no top-k warper) decodes with every strategy;
    greedy, the same tokens."""
    config = GenerationConfig(do_sample=False, top_k=0, top_p=0.9, max_new_tokens=20, pad_token_id=529)
    for strategy in ("sjd", "mc-sjd"):
        vanilla, out = both(text_model, PROMPTS, strategy, generation_config=config)
        assert torch.equal(out, vanilla), strategy
    torch.manual_seed(0)
    sampled = text_model.generate(PROMPTS, custom_generate="sjd", generation_config=config, do_sample=True,
                                  jacobi_window=4, return_dict_in_generate=True)
    assert sampled.sequences.shape == (2, 21) and sampled.stats.jacobi_window == 4


@pytest.mark.parametrize("setting, saved, given", [("num_beams", 2, 1), ("prompt_lookup_num_tokens", 3, None)])
def test_a_keyword_overrides_a_saved_setting_that_selects_another_decoding(text_model, monkeypatch, setting, saved,
                                                                          given):
    """A checkpoint's saved ``num_beams=2`` (or prompt lookup) overridden by the call's keyword: transformers decodes
    greedily, and so does the strategy."""
    monkeypatch.setattr(text_model.generation_config, setting, saved)
    vanilla, out = both(text_model, PROMPTS, "sjd", max_new_tokens=12, **{setting: given})
    assert torch.equal(out, vanilla)


def test_use_cache_false_gives_the_same_tokens(text_model):
    vanilla, out = both(text_model, PROMPTS, "sjd", max_new_tokens=20, use_cache=False)
    assert torch.equal(out, vanilla)
    out = text_model.generate(PROMPTS[:1], custom_generate="sjd", do_sample=False, max_new_tokens=8, use_cache=False,
                              return_dict_in_generate=True)
    assert out.cache is None  # as transformers: the cache a window needs is the call's own


@pytest.mark.parametrize("criterion", ["shorter", "longer", "eos", "other eos"])
def test_a_users_own_length_or_eos_criterion_ends_the_call_where_transformers_ends_it(text_model, criterion):
    """A ``MaxLengthCriteria`` / ``EosTokenCriteria`` of the user's replaces transformers' own (it says so), sooner or
    later than the config's max_new_tokens / EOS: the loop ends there too (it ran on to, or stopped at, the config's)."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    stop, settings = {"shorter": (MaxLengthCriteria(PROMPTS.shape[1] + 9), {"max_new_tokens": 120}),
                      "longer": (MaxLengthCriteria(PROMPTS.shape[1] + 40), {"max_new_tokens": 20}),
                      "eos": (EosTokenCriteria(STOP_TOKEN), {"max_new_tokens": 120}),
                      "other eos": (EosTokenCriteria(448), {"max_new_tokens": 40, "eos_token_id": STOP_TOKEN}),
                      }[criterion]
    vanilla, out = both(text_model, PROMPTS[:1], "sjd", stopping_criteria=StoppingCriteriaList([stop]), **settings)
    assert vanilla.shape[1] < 60 and torch.equal(out, vanilla)
    if criterion == "longer":  # past the config's max_new_tokens
        assert vanilla.shape[1] == 41
    if criterion == "other eos":  # on past the config's EOS, to the criterion's
        assert vanilla[0, -1] == 448 and STOP_TOKEN in vanilla[0, 1:-1].tolist()


def test_too_many_phrase_merges_name_the_knob(reference):
    with pytest.raises(ValueError, match=r"pv_num_merges must be in \[1, 8000\]"):
        reference.model.generate(reference.prompt_ids(["coffee"]), custom_generate="sjd-pv", pv_num_merges=10**9)


def test_the_recipe_reads_sjd_method_from_a_generation_config(text_model):
    """``sjd_method`` is a knob like the others: a keyword, else the GenerationConfig's (passed, else the model's)."""
    plain = LlamaForCausalLM(text_model.config).eval()
    plain.load_state_dict(text_model.state_dict())
    settings = dict(do_sample=True, top_k=10, max_new_tokens=40, jacobi_window=6, return_dict_in_generate=True)

    def run(**kwargs):
        torch.manual_seed(1)
        return plain.generate(PROMPTS[:1], custom_generate=str(REPO_ROOT), trust_remote_code=True, **kwargs)

    by_keyword = {method: run(sjd_method=method, **settings) for method in ("sjd", "mc-sjd")}
    assert not torch.equal(by_keyword["sjd"].sequences, by_keyword["mc-sjd"].sequences)
    from_config = run(generation_config=GenerationConfig(sjd_method="mc-sjd", pad_token_id=529, **settings))
    assert torch.equal(from_config.sequences, by_keyword["mc-sjd"].sequences)
    plain.generation_config.sjd_method = "mc-sjd"
    assert torch.equal(run(**settings).sequences, by_keyword["mc-sjd"].sequences)
    # a GenerationConfig passed without sjd_method: the model's, as transformers merges a user's config over it
    assert torch.equal(run(generation_config=GenerationConfig(pad_token_id=529, **settings)).sequences,
                       by_keyword["mc-sjd"].sequences)


def test_a_generation_config_passed_is_merged_over_the_models_own(text_model):
    """transformers fills what a passed GenerationConfig leaves unset from ``model.generation_config`` (its knobs
    too): a Jacobi call reads the same merge, so a guidance scale saved with the model guides it inside the window
    (the same tokens as vanilla, no forward of transformers' own CFG) and a saved knob is used."""
    negative = torch.tensor([[528]])
    settings = dict(do_sample=False, max_new_tokens=24, pad_token_id=529, return_dict_in_generate=True)
    text_model.generation_config.guidance_scale, text_model.generation_config.jacobi_window = 3.0, 5
    try:
        vanilla = text_model.generate(PROMPTS[:1], generation_config=GenerationConfig(**settings),
                                      negative_prompt_ids=negative).sequences
        assert not torch.equal(vanilla, text_model.generate(PROMPTS[:1], guidance_scale=1.0, **settings).sequences)
        forwards = []
        hook = text_model.register_forward_pre_hook(lambda *_: forwards.append(1))
        try:
            out = text_model.generate(PROMPTS[:1], generation_config=GenerationConfig(**settings),
                                      negative_prompt_ids=negative, custom_generate="sjd")
        finally:
            hook.remove()
    finally:
        text_model.generation_config.guidance_scale = None
        del text_model.generation_config.jacobi_window
    assert torch.equal(out.sequences, vanilla)
    assert out.stats.jacobi_window == 5 and len(forwards) == out.stats.num_forward_passes


def test_plain_decoding_counts_each_rows_own_tokens(text_model):
    """Where a call decodes plainly (window 0, or "auto" picking no drafts) its rows end where transformers' stopping
    criteria stopped them, not at the padded width, and the commit map holds one bonus token per forward, as the
    loop's window-0 iterations log them."""
    vanilla = text_model.generate(PROMPTS, do_sample=False, max_new_tokens=40, eos_token_id=STOP_TOKEN)
    ends = [int((row[1:] == STOP_TOKEN).nonzero()[0]) + 1 if (row[1:] == STOP_TOKEN).any() else 40
            for row in vanilla]
    assert ends[0] < 40 == ends[1]  # the first row stops early, the second runs to max_new_tokens
    stats = {}
    for window in (0, 1):
        out = text_model.generate(PROMPTS, do_sample=False, max_new_tokens=40, eos_token_id=STOP_TOKEN,
                                  custom_generate="sjd", jacobi_window=window, return_dict_in_generate=True)
        assert torch.equal(out.sequences, vanilla)
        assert out.stats.num_new_tokens.tolist() == ends, window
        assert [int((row >= 0).sum()) for row in out.stats.commit_map.kind] == ends, window
        stats[window] = out.stats
    plain = stats[0]
    assert plain.row_forward_passes.tolist() == ends and plain.num_bonus == sum(ends)
    assert plain.commit_map.forward[0, : ends[0]].tolist() == list(range(ends[0]))


def test_a_prefix_constraint_allowing_other_tokens_per_row_drafts_from_their_union(text_model):
    """Random drafts cover the tokens some row allows (a draft a row forbids has p = 0 there and is rejected)."""
    def allowed(batch_id, input_ids):
        return list(range(0, 200)) if batch_id == 0 else list(range(200, 400))

    vanilla, out = both(text_model, PROMPTS, "sjd", max_new_tokens=12, prefix_allowed_tokens_fn=allowed)
    assert torch.equal(out, vanilla)


def test_phrase_codes_on_a_text_model_are_its_token_ids_whatever_the_processors(text_model):
    """A library of a text model's token sequences: code c is token c, also where this call's processors forbid
    some tokens at the first position (they must not renumber the codes)."""
    corpus = text_model.generate(PROMPTS.repeat(8, 1), do_sample=True, top_k=3, max_new_tokens=64)[:, 1:]
    library = hf_sjd.PhraseLibrary.from_token_sequences(corpus, num_merges=50,
                                                        codebook_size=text_model.config.vocab_size)
    runs = {}
    for processors in ({}, {"suppress_tokens": [0]}, {"min_new_tokens": 4, "eos_token_id": 0}):
        torch.manual_seed(0)
        out = text_model.generate(PROMPTS[:1], custom_generate="sjd-pv", phrase_library=library, do_sample=True,
                                  top_k=3, max_new_tokens=64, jacobi_window=8, return_dict_in_generate=True,
                                  **processors)
        sequence, runs_of = out.sequences[0, 1:], out.stats.commit_map.phrase_runs
        for _, first, length, phrase in runs_of.tolist():  # every jointly accepted run is its library phrase
            assert sequence[first:first + length].tolist() == library.phrase_list()[phrase][:length]
        runs[str(processors)] = len(runs_of)
    assert min(runs.values()) > 0, runs


@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
def test_a_cache_passed_is_left_to_continue_from(text_model, strategy):
    """``cache=`` as transformers fills it for a later call to continue from: one row holds its tokens' entries in
    order, also where the call stopped inside a commit (entries of drafts accepted past the stop cut off); a batch's
    cache, whose rows left as they finished, is emptied instead (``out.cache`` None), so continuing recomputes."""
    from transformers import DynamicCache

    def turns(prompt, **kwargs):
        cache = DynamicCache(config=text_model.config)
        out = text_model.generate(prompt, do_sample=False, max_new_tokens=60, eos_token_id=STOP_TOKEN, cache=cache,
                                  return_dict_in_generate=True, **kwargs)
        assert not any(t.is_inference() for layer in cache.layers for t in (layer.keys, layer.values)
                       if t is not None)  # ordinary tensors, the caller's to edit
        follow_up = torch.cat([out.sequences, torch.tensor([[520, 3, 77]]).expand(prompt.shape[0], -1)], dim=1)
        settings = dict(do_sample=False, max_new_tokens=4, output_logits=True, return_dict_in_generate=True)
        fresh = text_model.generate(follow_up, **settings)
        continued = text_model.generate(follow_up, cache=cache, **settings)
        assert torch.equal(continued.sequences, fresh.sequences)
        torch.testing.assert_close(torch.stack(continued.logits), torch.stack(fresh.logits), rtol=1e-4, atol=1e-4)
        return out, cache

    out, cache = turns(PROMPTS[:1], custom_generate=strategy, jacobi_window=8)
    assert out.sequences[0, -1] == STOP_TOKEN and out.cache is cache  # stopped at EOS, inside a commit
    out, cache = turns(PROMPTS, custom_generate=strategy, jacobi_window=8)
    assert out.cache is None
    out, cache = turns(PROMPTS[:1], custom_generate=strategy, jacobi_window=0)  # transformers' own loop ran
    assert out.cache is cache and "sjd_layout" not in vars(cache)
    cache = DynamicCache(config=text_model.config)
    with pytest.raises(ValueError, match="leave no token allowed"):  # refused inside the loop, the cache prepared
        text_model.generate(PROMPTS[:1], do_sample=True, max_new_tokens=8, cache=cache, custom_generate=strategy,
                            jacobi_window=8, suppress_tokens=list(range(text_model.config.vocab_size)))
    assert "sjd_layout" not in vars(cache)


def test_a_guided_call_hands_back_no_cache():
    """With guidance the cache holds the unconditional rows too, not transformers' layout: it is emptied and
    ``out.cache`` is None, also at batch 1 (``mixin._as_transformers_leaves``)."""
    from transformers import DynamicCache
    from toy import tiny_llama

    model = tiny_llama(64)
    cache = DynamicCache(config=model.config)
    out = model.generate(torch.tensor([[5, 6, 7]]), custom_generate="sjd", jacobi_window=4, do_sample=False,
                         max_new_tokens=8, guidance_scale=2.0, negative_prompt_ids=torch.tensor([[1, 2, 3]]),
                         cache=cache, return_dict_in_generate=True)
    assert out.cache is None and cache.get_seq_length() == 0


def test_the_shorter_of_two_max_length_criteria_ends_the_call():
    """transformers keeps both of a user's MaxLengthCriteria (the first replaces its own) and stops at the shorter."""
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import MaxLengthCriteria
    from toy import tiny_llama

    model = tiny_llama(64)
    kwargs = dict(do_sample=False, max_new_tokens=30,
                  stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(20), MaxLengthCriteria(12)]))
    vanilla = model.generate(torch.tensor([[5, 6, 7]]), **kwargs)
    out = model.generate(torch.tensor([[5, 6, 7]]), custom_generate="sjd", jacobi_window=4, **kwargs)
    assert vanilla.shape[1] == 12 and torch.equal(out, vanilla)


def test_a_criterion_carrying_an_eos_id_pads_a_stopped_row_as_transformers_does():
    """transformers' has_eos_stopping_criteria is hasattr(criterion, "eos_token_id"), not EosTokenCriteria alone."""
    from transformers import StoppingCriteria, StoppingCriteriaList
    from toy import tiny_llama

    class StopAt(StoppingCriteria):
        eos_token_id = torch.tensor([63])

        def __call__(self, input_ids, scores, **kwargs):
            first = input_ids[:, 0] == 5  # each row judged on its own tokens
            return torch.where(first, torch.tensor(input_ids.shape[1] > 5), torch.tensor(input_ids.shape[1] > 9))

    model = tiny_llama(64)
    prompt = torch.tensor([[5, 6, 7], [8, 9, 10]])
    kwargs = dict(do_sample=False, max_new_tokens=12, stopping_criteria=StoppingCriteriaList([StopAt()]))
    vanilla = model.generate(prompt, **kwargs)
    assert (vanilla[0, 6:] == model.generation_config.pad_token_id).all()  # row 0 stopped, then padded
    assert torch.equal(model.generate(prompt, custom_generate="sjd", jacobi_window=4, **kwargs), vanilla)


def test_the_window_loop_streams_exactly_the_sequence_then_ends():
    """transformers' streamer contract: the prompt, then each committed token once, then end()."""
    from transformers.generation.streamers import BaseStreamer
    from toy import tiny_llama

    class Collect(BaseStreamer):
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, value):
            assert not self.ended
            self.puts.append(value.flatten())

        def end(self):
            self.ended = True

    streamer = Collect()
    torch.manual_seed(0)
    out = tiny_llama(64).generate(torch.tensor([[5, 6, 7]]), custom_generate="sjd", jacobi_window=4, do_sample=False,
                                  max_new_tokens=10, streamer=streamer)
    assert torch.equal(torch.cat(streamer.puts), out[0]) and streamer.ended
