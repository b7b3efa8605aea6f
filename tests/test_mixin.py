"""The public API: enable(), named strategies in generate(), knobs, bad input, the custom_generate/ folder."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (AutoModelForCausalLM, GenerationConfig, LlamaForCausalLM, LogitsProcessor,
                          LogitsProcessorList, SynthIDTextWatermarkingConfig, SynthIDTextWatermarkLogitsProcessor)
from transformers.generation.streamers import BaseStreamer

import hf_sjd
from toy import tiny_llama

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(40)


PROMPT = torch.tensor([[3, 4, 5]])


def test_enable_returns_same_object_with_cached_subclass(model):
    other = LlamaForCausalLM(model.config)
    assert hf_sjd.enable(other) is other
    assert type(other) is type(model)  # one cached subclass per model class
    assert isinstance(other, hf_sjd.SJDGenerationMixin) and isinstance(other, LlamaForCausalLM)
    assert hf_sjd.enable(other) is other and type(other) is type(model)  # idempotent


def test_output_dict_and_stats(model):
    out = model.generate(PROMPT, custom_generate="sjd", do_sample=True, top_k=10, max_new_tokens=12,
                         jacobi_window=4, return_dict_in_generate=True)
    stats = out.stats
    assert out.sequences.shape == (1, 15)
    assert stats.num_new_tokens.tolist() == [12]
    assert 1 <= stats.num_forward_passes <= 12
    assert stats.step_compression == pytest.approx(12 / stats.num_forward_passes)
    assert int((stats.tokens_per_forward * torch.arange(len(stats.tokens_per_forward))).sum()) == 12
    assert stats.num_accepted + stats.num_recovered + stats.num_bonus == 12
    assert 0 < stats.model_seconds <= stats.seconds


@pytest.mark.parametrize("window", [4, 0])  # the Jacobi loop; plain decoding (transformers' own sampling loop)
def test_decodes_in_inference_mode_and_returns_ordinary_tensors(model, window):
    """The call runs its forwards in inference mode; what it returns may be edited in place and trained on (an
    inference tensor refuses both outside inference mode)."""
    modes = []
    handle = model.register_forward_pre_hook(lambda module, args: modes.append(torch.is_inference_mode_enabled()))
    try:
        out = model.generate(PROMPT, custom_generate="sjd", do_sample=True, top_k=10, max_new_tokens=6,
                             jacobi_window=window, return_dict_in_generate=True)
    finally:
        handle.remove()
    assert modes and all(modes)
    tensors = [out.sequences, out.stats.num_new_tokens, out.stats.row_forward_passes, out.stats.commit_map.kind]
    assert not any(tensor.is_inference() for tensor in tensors)
    sequences = out.sequences
    sequences[:, -1] = 0  # in place
    with torch.enable_grad():
        model(sequences).logits.sum().backward()  # saved for backward by the embedding
    assert model.get_input_embeddings().weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_a_disk_offloaded_model_trains_after_generating(model, tmp_path):
    """accelerate loads an offloaded layer's weights inside each forward, here in inference mode: a training step
    after generating still runs (its forward loads them again, outside it)."""
    model.save_pretrained(tmp_path / "model")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.norm": "cpu", "lm_head": "cpu",
                  "model.rotary_emb": "cpu", **{f"model.layers.{i}": "cpu"
                                                 for i in range(1, model.config.num_hidden_layers)}}
    offloaded = hf_sjd.enable(AutoModelForCausalLM.from_pretrained(tmp_path / "model", device_map=device_map,
                                                                   offload_folder=tmp_path / "offload"))
    sequences = offloaded.generate(PROMPT, custom_generate="sjd", do_sample=True, top_k=10, max_new_tokens=6,
                                   jacobi_window=3)
    with torch.enable_grad():
        offloaded(sequences).logits.sum().backward()
    assert offloaded.get_input_embeddings().weight.grad is not None


def test_plain_tensor_without_return_dict(model):
    out = model.generate(PROMPT, custom_generate="sjd", do_sample=True, top_k=10, max_new_tokens=5)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 8)


def test_deterministic_given_seed(model):
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(model.generate(PROMPT, custom_generate="sjd", do_sample=True, top_k=10, max_new_tokens=20))
    assert torch.equal(runs[0], runs[1])


def test_siblings_at_window_0_are_none_and_decoding_is_plain(model):
    """Siblings are of the first draft: at window 0 there is none, so the call is plain decoding (transformers' own
    sampling loop, the same tokens as without siblings) and its stats say 0."""
    runs = []
    for siblings in (0, 2):
        torch.manual_seed(5)
        runs.append(model.generate(PROMPT, custom_generate="sjd", do_sample=True, top_k=10, max_new_tokens=12,
                                   jacobi_window=0, jacobi_siblings=siblings, return_dict_in_generate=True))
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert (runs[1].stats.jacobi_window, runs[1].stats.jacobi_siblings) == (0, 0)


def test_knobs_from_generation_config(model):
    config = GenerationConfig(jacobi_window=1, do_sample=False, max_new_tokens=10)
    out = model.generate(PROMPT, generation_config=config, custom_generate="sjd", return_dict_in_generate=True)
    assert len(out.stats.tokens_per_forward) == 3  # histogram bins 0..window+1: the window came from the config
    assert torch.equal(out.sequences, model.generate(PROMPT, do_sample=False, max_new_tokens=10))


def test_streamer_receives_committed_tokens(model):
    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks, self.shapes, self.ended = [], [], 0

        def put(self, value):
            self.chunks.append(value.flatten().tolist())
            self.shapes.append(tuple(value.shape))

        def end(self):
            self.ended += 1

    streamer = Collect()
    out = model.generate(PROMPT, custom_generate="sjd", do_sample=True, top_k=5, max_new_tokens=15,
                         streamer=streamer, return_dict_in_generate=True)
    assert streamer.ended == 1 and out.stats.num_forward_passes < 15  # commits of several tokens
    assert streamer.chunks[0] == PROMPT[0].tolist()
    assert sum(streamer.chunks[1:], []) == out.sequences[0, 3:].tolist()
    assert set(streamer.shapes[1:]) == {(1,)}  # one token per put, as transformers' loop (a streamer may .item())


def test_other_custom_generate_values_go_to_transformers(model):
    def my_decoding(model, input_ids, logits_processor, stopping_criteria, generation_config, **kwargs):
        return "called"

    assert model.generate(PROMPT, custom_generate=my_decoding, max_new_tokens=2) == "called"
    # no custom_generate: plain transformers generate
    assert model.generate(PROMPT, do_sample=False, max_new_tokens=4).shape == (1, 7)


def test_custom_generate_folder_as_local_path(model):
    plain = LlamaForCausalLM(model.config)
    plain.load_state_dict(model.state_dict())
    plain.eval()
    expected = model.generate(PROMPT, do_sample=False, max_new_tokens=10)
    out = plain.generate(PROMPT, custom_generate=str(REPO_ROOT), trust_remote_code=True, sjd_method="mc-sjd",
                         do_sample=False, max_new_tokens=10, jacobi_window=3, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert out.stats.num_forward_passes <= 10


@pytest.mark.parametrize("kwargs, message", [
    ({"custom_generate": "no-such-strategy"}, "registered strategies: .*mc-sjd.*sjd"),
    ({"custom_generate": "sjd", "jacobi_window": -1}, "jacobi_window must be an integer >= 0"),
    ({"custom_generate": "sjd", "draft_token_ids": []}, "draft_token_ids is empty"),
    ({"custom_generate": "sjd", "draft_token_ids": [1, 40]}, r"must lie in \[0, 40\)"),
    ({"custom_generate": "sjd", "top_k": -1, "do_sample": True}, "top_k must be an integer >= 0"),
    ({"custom_generate": "sjd", "synced_gpus": True}, "synced_gpus=True: processes that share a model's weights"),
    ({"custom_generate": "sjd", "num_beams": 2}, "num_beams > 1 is not supported"),
    ({"custom_generate": "sjd", "draft_init": "row-above-dist"}, "needs the token-grid width"),
    ({"custom_generate": "sjd", "draft_init": "zeros"}, "allowed values: 'random', 'last-target', 'row-above-dist', 'auto'"),
    ({"custom_generate": "sjd", "draft_coupling": "strong"}, "allowed values: 'independent', 'maximal'"),
    ({"custom_generate": "sjd", "cache_implementation": "static"}, "cannot be rolled back"),
    ({"custom_generate": "sjd", "prefill_chunk_size": 4}, "prefill_chunk_size=4: a Jacobi call prefills the prompt"),
    ({"custom_generate": "sjd", "guidance_scale": 3.0}, "needs an unconditional prompt"),
    ({"custom_generate": "sjd", "output_scores": True}, "output_scores=True is not supported"),
])
def test_bad_input_fails_before_any_forward(model, kwargs, message):
    calls = []
    handle = model.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match=message):
            model.generate(PROMPT, max_new_tokens=5, **kwargs)
    finally:
        handle.remove()
    assert not calls


def test_synced_gpus_that_transformers_would_set_is_refused(model, monkeypatch):
    """transformers sets synced_gpus itself under DeepSpeed ZeRO-3 or FSDP over several processes, and hands a custom
    decoding method no such argument: the strategy resolves it as transformers does, and refuses it."""
    import transformers.generation.utils as generation

    monkeypatch.setattr(generation, "_get_torch_distributed_world_size", lambda: 2)
    monkeypatch.setattr(generation, "is_fsdp_managed_module", lambda module: module is model)
    with pytest.raises(ValueError, match="synced_gpus=True"):
        model.generate(PROMPT, max_new_tokens=5, custom_generate="sjd")
    assert model.generate(PROMPT, max_new_tokens=5, custom_generate="sjd", synced_gpus=False).shape == (1, 8)


def test_uncroppable_cache_is_rejected(model):
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=32)
    with pytest.raises(ValueError, match="needs a transformers DynamicCache"):
        model.generate(PROMPT, max_new_tokens=5, custom_generate="sjd", cache=cache)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"guidance_scale": float("nan")}, ValueError, "guidance_scale must be None or a finite number >= 0.0, got nan"),
    ({"guidance_scale": float("inf")}, ValueError, "guidance_scale must be None or a finite number >= 0.0, got inf"),
    ({"guidance_scale": "3"}, TypeError, "guidance_scale must be None or a finite number >= 0.0, got '3'"),
    ({"guidance_scale": True}, TypeError, "guidance_scale must be None or a finite number"),
    ({"guidance_scale": -1.0}, ValueError, "guidance_scale must be None or a finite number >= 0.0, got -1.0"),
    ({"jacobi_window": 2.0}, TypeError, "jacobi_window must be an integer >= 0, got 2.0"),
    ({"jacobi_window": True}, TypeError, "jacobi_window must be an integer >= 0, got True"),
    ({"grid_width": 0}, ValueError, "grid_width must be None or an integer >= 1, got 0"),
    ({"draft_token_ids": [1.5, 2.0]}, TypeError, "draft_token_ids must hold integer token ids"),
    ({"draft_token_ids": "abc"}, TypeError, "draft_token_ids must be a sequence or tensor of integer token ids"),
    ({"top_k": 2.5, "do_sample": True}, ValueError, "top_k must be an integer >= 0 (0 or None: no top-k), got 2.5"),
])
def test_wrongly_typed_or_non_finite_knobs_fail_before_any_forward(model, kwargs, error, message):
    calls = []
    handle = model.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(error, match=re.escape(message)):
            model.generate(PROMPT, max_new_tokens=5, custom_generate="sjd", **kwargs)
    finally:
        handle.remove()
    assert not calls


def test_numpy_values_are_accepted_as_python_ones(model):
    """A numpy scalar as a number, a numpy array of ids as the list or tensor of them."""
    torch.manual_seed(0)
    plain = model.generate(PROMPT, do_sample=True, top_k=5, max_new_tokens=8, custom_generate="sjd", jacobi_window=3,
                           draft_token_ids=[1, 2, 3, 4])
    torch.manual_seed(0)
    numpy_knobs = model.generate(PROMPT, do_sample=True, top_k=5, max_new_tokens=8, custom_generate="sjd",
                                 jacobi_window=np.int64(3), draft_token_ids=np.array([1, 2, 3, 4]))
    assert torch.equal(plain, numpy_knobs)


@pytest.mark.parametrize("prompt, mask, message", [
    (torch.zeros(1, 0, dtype=torch.long), None, "at least one prompt token per row"),
    (torch.tensor([[3, 4], [5, 6]]), torch.tensor([[1, 1], [0, 0]]), r"masks out every token of row\(s\) \[1\]"),
])
def test_empty_prompts_fail_before_any_forward(model, prompt, mask, message):
    calls = []
    handle = model.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match=message):
            model.generate(prompt, attention_mask=mask, max_new_tokens=5, custom_generate="sjd")
    finally:
        handle.remove()
    assert not calls


def test_memory_follows_the_usable_window_not_the_requested_one(model, monkeypatch):
    """jacobi_window=10**9 would ask for 8 GB of counters (and sjd-vp for a 10**9-slot history): everything is
    sized by the window the run can use, max_new_tokens - 1."""
    from hf_sjd.jacobi.priors import VerificationPredictionPrior

    windows = []
    original = VerificationPredictionPrior.from_config.__func__
    monkeypatch.setattr(VerificationPredictionPrior, "from_config",
                        classmethod(lambda cls, config, *a: windows.append(config.jacobi_window)
                                    or original(cls, config, *a)))
    out = model.generate(PROMPT, do_sample=True, top_k=5, max_new_tokens=6, custom_generate="sjd-vp",
                         jacobi_window=10**9, return_dict_in_generate=True)
    assert out.sequences.shape == (1, 9)
    assert windows == [5]
    assert out.stats.tokens_per_forward.numel() == 5 + 2


def test_misspelt_generation_config_knob_is_refused(model):
    config = GenerationConfig(jacobi_windw=4, do_sample=False, max_new_tokens=5)
    with pytest.raises(ValueError, match="'jacobi_windw' is not an hf_sjd knob; did you mean 'jacobi_window'"):
        model.generate(PROMPT, generation_config=config, custom_generate="sjd")
    config = GenerationConfig(vp_strenght=2.0, do_sample=False, max_new_tokens=5)
    with pytest.raises(ValueError, match="'vp_strenght' is not an hf_sjd knob"):
        model.generate(PROMPT, generation_config=config, custom_generate="sjd-vp")
    config = GenerationConfig(my_own_setting=1, do_sample=False, max_new_tokens=5)  # not knob-like: left alone
    assert model.generate(PROMPT, generation_config=config, custom_generate="sjd").shape == (1, 8)


def test_knobs_on_the_models_generation_config_survive_save_and_load(tmp_path):
    from hf_sjd.reference import load

    reference = load()
    hf_sjd.enable(reference.model)
    reference.model.generation_config.jacobi_window = 1
    reference.model.generation_config.draft_coupling = "independent"
    reference.model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    reloaded = hf_sjd.enable(AutoModelForCausalLM.from_pretrained(tmp_path))
    assert isinstance(reloaded, LlamaForCausalLM)
    assert reloaded.generation_config.jacobi_window == 1
    assert reloaded.generation_config.draft_coupling == "independent"
    out = reloaded.generate(torch.tensor([[514]]), do_sample=False, custom_generate="mc-sjd",
                            return_dict_in_generate=True)
    assert out.stats.tokens_per_forward.numel() == 1 + 2  # the saved window of 1 is what ran


def test_registered_strategy_on_a_model_that_was_not_enabled_says_to_enable_it():
    plain = LlamaForCausalLM(tiny_llama(40).config).eval()
    with pytest.raises(ValueError, match=r"was not enabled: call `model = hf_sjd.enable\(model\)`"):
        plain.generate(PROMPT, max_new_tokens=3, custom_generate="sjd")


def test_unsupported_model_is_refused_before_its_class_changes():
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32)
    bart = BartForConditionalGeneration(config)
    with pytest.raises(ValueError, match="is not supported: Jacobi decoding needs a decoder-only model"):
        hf_sjd.enable(bart)
    assert type(bart) is BartForConditionalGeneration and not hasattr(bart, "sjd_adapter")


def test_token_buffer_follows_what_is_generated_not_max_new_tokens(model):
    """A text model may be given a huge max_new_tokens as a bound (EOS ends it): nothing is sized by it."""
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=40)
    eos = int(plain[0, 3 + 30])
    expected = model.generate(PROMPT, do_sample=False, max_new_tokens=40, eos_token_id=eos)
    got = model.generate(PROMPT, do_sample=False, max_new_tokens=10**12, eos_token_id=eos, custom_generate="sjd",
                         jacobi_window=4)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(inputs_embeds=torch.zeros(1, 3, 16)), ValueError, "runs on the prompt's token ids (input_ids)"),
    (dict(input_ids=PROMPT, inputs_embeds=torch.zeros(1, 3, 16)), ValueError, "(alone or beside input_ids)"),
    (dict(input_ids=PROMPT, force_words_ids=[[5]]), ValueError,
     "force_words_ids=[[5]] selects transformers' constrained_beam_search"),
    (dict(input_ids=PROMPT, penalty_alpha=0.6, top_k=4), ValueError, "selects transformers' contrastive_search"),
    (dict(input_ids=PROMPT, dola_layers="high"), ValueError, "dola_layers='high' selects transformers' dola"),
    (dict(input_ids=PROMPT, watermarking_config=SynthIDTextWatermarkingConfig(keys=[654, 400, 836], ngram_len=2)),
     ValueError, "SynthID watermarking (watermarking_config="),
    (dict(input_ids=PROMPT, logits_processor=LogitsProcessorList([SynthIDTextWatermarkLogitsProcessor(
        ngram_len=2, keys=[654, 400, 836], sampling_table_size=2**16, sampling_table_seed=0, context_history_size=1024,
        device="cpu")])), ValueError, "SynthID watermarking (watermarking_config="),
    (dict(input_ids=torch.tensor([[3.0, 4.0]])), TypeError, "input_ids must hold integer token ids"),
    (dict(input_ids=torch.tensor([[3, 400]])), ValueError, "input_ids must lie in [0, 40)"),
    (dict(input_ids=PROMPT, attention_mask=torch.ones(1, 5)), ValueError,
     "the attention mask of input_ids has shape (1, 5); it must match (1, 3)"),
    (dict(input_ids=PROMPT, guidance_scale=2.0, negative_prompt_ids=torch.tensor([[1.0, 2.0]])), TypeError,
     "negative_prompt_ids must hold integer token ids"),
    (dict(input_ids=PROMPT, guidance_scale=2.0, negative_prompt_ids=torch.tensor([[100]])), ValueError,
     "negative_prompt_ids must lie in [0, 40)"),
    (dict(input_ids=PROMPT, guidance_scale=2.0, negative_prompt_ids=torch.tensor([[1], [2], [3]])), ValueError,
     "negative_prompt_ids has 3 rows; expected 1 (shared by every prompt) or one per prompt (1)"),
    (dict(input_ids=PROMPT, guidance_scale=2.0, negative_prompt_ids=torch.tensor([[1, 2]]),
          negative_prompt_attention_mask=torch.ones(1, 5)), ValueError, "the attention mask of negative_prompt_ids"),
    (dict(input_ids=PROMPT, do_sample=True, top_p=float("nan")), ValueError, "top_p must be None or a finite number"),
    (dict(input_ids=PROMPT, do_sample=True, temperature=float("inf")), ValueError, "temperature must be None or a finite"),
])
def test_bad_prompts_and_sampling_settings_fail_before_any_forward(model, kwargs, error, message):
    """A NaN top_p would silently disable the warper (its comparisons are all False); token ids outside the
    vocabulary or of a float dtype would fail deep inside the forward."""
    calls = []
    handle = model.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(error, match=re.escape(message)):
            model.generate(max_new_tokens=5, custom_generate="sjd", **kwargs)
    finally:
        handle.remove()
    assert not calls


def test_an_enabled_model_pickles_and_its_copy_generates_the_same(model):
    """The enabled class shares its model class's name (what save_pretrained records), so pickle rebuilds it from
    that class (``torch.save`` of the whole model, spawned worker processes)."""
    import io
    import pickle

    copy = pickle.loads(pickle.dumps(model))
    assert type(copy) is type(model) and copy.sjd_adapter.model is copy
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer, weights_only=False)) is type(model)
    kwargs = dict(custom_generate="sjd", do_sample=True, top_k=5, max_new_tokens=12)
    torch.manual_seed(0)
    expected = model.generate(PROMPT, **kwargs)
    torch.manual_seed(0)
    assert torch.equal(copy.generate(PROMPT, **kwargs), expected)


def test_a_compiled_wrapper_is_refused_naming_what_to_compile():
    with pytest.raises(ValueError, match=r"not torch.compile's wrapper.*model.forward = torch.compile"):
        hf_sjd.enable(torch.compile(tiny_llama(40)))


def test_training_mode_with_dropout_is_refused(model):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, attention_dropout=0.1)
    dropping = hf_sjd.enable(LlamaForCausalLM(config).train())
    with pytest.raises(ValueError, match=r"training mode with dropout \(config.attention_dropout=0.1\).*model.eval"):
        dropping.generate(PROMPT, custom_generate="sjd", max_new_tokens=4)
    dropping.eval().generate(PROMPT, custom_generate="sjd", max_new_tokens=4)  # eval mode: fine
    model.train()  # no dropout anywhere: training mode changes nothing
    try:
        model.generate(PROMPT, custom_generate="sjd", max_new_tokens=4)
    finally:
        model.eval()


def test_the_models_own_defaults_are_checked_beside_a_users_generation_config(model):
    """transformers fills a passed GenerationConfig's unset fields from model.generation_config: a default there
    that selects another decoding method is refused as if it were passed."""
    model.generation_config.dola_layers = "high"
    try:
        for kwargs in ({}, {"generation_config": GenerationConfig(max_new_tokens=5)}):
            with pytest.raises(ValueError, match="^dola_layers='high' selects transformers' dola_generation"):
                model.generate(PROMPT, max_new_tokens=5, custom_generate="sjd", **kwargs)
    finally:
        model.generation_config.dola_layers = None


def test_two_threads_on_one_model_each_get_their_own_call():
    """A service calls one enabled model from several threads: their first calls meet in the layout probe (one runs
    it, the other waits and reads it), and a plain decoding call counts only its own thread's forwards."""
    import concurrent.futures
    import threading

    model = tiny_llama(40, seed=3)  # not probed yet
    start = threading.Barrier(2)

    class Together(LogitsProcessor):  # both calls are inside their loops at once
        def __call__(self, input_ids, scores):
            if input_ids.shape[1] == PROMPT.shape[1] + 1:
                start.wait(timeout=60)
            return scores

    def call(window):
        if window:
            start.wait(timeout=60)
        out = model.generate(PROMPT, custom_generate="sjd", jacobi_window=window, do_sample=False, max_new_tokens=24,
                             logits_processor=LogitsProcessorList([] if window else [Together()]),
                             return_dict_in_generate=True)
        return out.stats.num_forward_passes

    for window in (4, 0):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            forwards = list(pool.map(call, (window, window)))
        if not window:
            assert forwards == [24, 24]


def test_a_hybrid_cache_implementation_is_read_as_transformers_reads_it():
    """Gemma 2/3 checkpoints ship ``cache_implementation="hybrid"``, which transformers reads as unset (a
    DynamicCache): a strategy decodes them too, transformers' tokens (they were refused: "cannot be rolled back")."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                                           pad_token_id=0, bos_token_id=1, eos_token_id=None)).eval()
    model.generation_config.cache_implementation = "hybrid"
    prompt = torch.randint(2, 64, (2, 5))
    vanilla = model.generate(prompt, do_sample=False, max_new_tokens=12)
    out = hf_sjd.enable(model).generate(prompt, do_sample=False, max_new_tokens=12, custom_generate="sjd",
                                        jacobi_window=4)
    assert torch.equal(out, vanilla)


def test_disk_offloaded_input_embeddings_decode_as_transformers_does(model, tmp_path):
    """accelerate keeps a disk-offloaded module's weights on ``meta``: the probe and the calibration put their inputs
    where its hook runs it (they took the weight's device: refused as a forward that cannot take a window)."""
    model.save_pretrained(tmp_path / "model")
    device_map = {"model.embed_tokens": "disk", "model.norm": "cpu", "lm_head": "cpu", "model.rotary_emb": "cpu",
                  **{f"model.layers.{i}": "cpu" for i in range(model.config.num_hidden_layers)}}
    offloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", device_map=device_map,
                                                     offload_folder=tmp_path / "offload").eval()
    assert offloaded.get_input_embeddings().weight.device.type == "meta"
    vanilla = offloaded.generate(PROMPT, do_sample=False, max_new_tokens=10)
    out = hf_sjd.enable(offloaded).generate(PROMPT, do_sample=False, max_new_tokens=10, custom_generate="sjd",
                                            jacobi_window=3)
    assert torch.equal(out, vanilla)
