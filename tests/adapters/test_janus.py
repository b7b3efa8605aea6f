"""Janus adapter: generation-head window forward, greedy == Janus.generate(generation_mode="image"), CFG rows."""

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import ClassifierFreeGuidanceLogitsProcessor

from adapter_models import JANUS_BOI, FirstScores, JANUS_CODES, JANUS_SIDE, tiny_janus
from toy import no_forward

NUM_NEW = JANUS_SIDE ** 2


@pytest.fixture(scope="module")
def model():
    return tiny_janus()


def test_detected_with_vq_vocabulary(model):
    adapter = model.sjd_adapter
    assert adapter.family == "janus" and adapter.vocab_size == JANUS_CODES
    assert torch.equal(adapter.draft_token_ids, torch.arange(JANUS_CODES))
    assert adapter.grid_width == JANUS_SIDE and adapter.structural_tokens(torch.arange(4)[None]) is None
    codebook = model.model.vqmodel.quantize.embedding.weight
    torch.testing.assert_close(adapter.latent_embeddings, torch.nn.functional.normalize(codebook, dim=-1))
    assert len(adapter.tokenizer_fingerprint) == 16


@torch.no_grad()
def test_window_forward_with_cache_matches_full_forward(model):
    """First forward [text prompt, L codes] (text embeddings, then generation embeddings); later forwards codes only."""
    adapter, prompt = model.sjd_adapter, torch.tensor([[1, 7, 8, 9, JANUS_BOI]])

    def full(codes):  # what Janus.generate computes step by step, in one forward
        embeds = torch.cat([model.get_input_embeddings()(prompt),
                            model.prepare_embeddings_for_image_generation(codes)], 1)
        return model.model.generation_head(model.model.language_model(inputs_embeds=embeds).last_hidden_state)

    drafts = torch.tensor([[3, 1, 4, 1]])
    cache = DynamicCache()
    ids = torch.cat([prompt, drafts], 1)
    got = adapter.window_logits(model, ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None], cache, num_logits=5)
    torch.testing.assert_close(got, full(drafts)[:, -5:])
    cache.crop(-2)  # keep 2 drafts, commit a token, draft 3 more
    step = torch.tensor([[7, 2, 6, 0]])
    codes = torch.cat([drafts[:, :2], step], 1)
    n = prompt.shape[1] + codes.shape[1]
    got = adapter.window_logits(model, step, torch.ones(1, n, dtype=torch.long), torch.arange(n - 4, n)[None], cache,
                                num_logits=4)
    torch.testing.assert_close(got, full(codes)[:, -4:])


@pytest.mark.parametrize("window", [1, 5, 16])
def test_greedy_equals_janus_image_generate(model, window):
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_mode="image", do_sample=False,
                              guidance_scale=2.0)
    got = model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=2.0, jacobi_window=window)
    assert torch.equal(got[:, prompt.shape[1]:], expected) and torch.equal(got[:, :prompt.shape[1]], prompt)


def test_janus_own_decode_takes_the_codes_after_the_prompt(model):
    """A Jacobi call returns the prompt then the codes (decoder-only ``generate``'s layout), ``Janus.generate`` the
    codes alone: the last ``NUM_NEW`` tokens are what Janus's own ``decode_image_tokens`` takes (docs/models-usage)."""
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_mode="image", do_sample=False,
                              guidance_scale=2.0)
    got = model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=2.0, jacobi_window=5)
    assert got.shape[1] == prompt.shape[1] + NUM_NEW and expected.shape[1] == NUM_NEW
    with torch.no_grad():
        torch.testing.assert_close(model.decode_image_tokens(got[:, -NUM_NEW:]), model.decode_image_tokens(expected))


def test_without_guidance_the_window_changes_no_token(model):
    """guidance_scale=1 runs one row per image (Janus.generate itself fails there in transformers 5.x, so the
    reference is our window-1 run: one token per forward, the model's own greedy chain)."""
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI], [1, 3, 5, 9, JANUS_BOI]])
    one, five = (model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=1.0,
                                jacobi_window=window, return_dict_in_generate=True) for window in (1, 5))
    assert torch.equal(one.sequences, five.sequences) and one.sequences.shape[1] == prompt.shape[1] + NUM_NEW
    assert five.stats.num_forward_passes < one.stats.num_forward_passes  # the window did accept drafts


@pytest.mark.parametrize("padding", ["left", "right"])
def test_greedy_padded_batch(model, padding):
    """Janus.generate passes no position_ids, so a prompt's padding counts positions (on the right, the codes
    follow it); the window numbers every slot as it does."""
    short, full = [1, 7, 8, JANUS_BOI], [1, 9, 10, 11, 12, JANUS_BOI]
    rows = [[0, 0, *short], full] if padding == "left" else [[*short, 0, 0], full]
    prompt, mask = torch.tensor(rows), (torch.tensor(rows) != 0).long()
    for guidance_scale in (4.0, None):
        settings = dict(attention_mask=mask, generation_mode="image", do_sample=False, guidance_scale=guidance_scale)
        expected = model.generate(prompt, **settings)
        for strategy in ("sjd", "mc-sjd"):
            got = model.generate(prompt, **settings, custom_generate=strategy, jacobi_window=4)
            assert torch.equal(got[:, prompt.shape[1]:], expected), (guidance_scale, strategy)


def test_cfg_rows_wired_as_janus_generate(model, monkeypatch):
    """Unconditional rows: prompt with everything but BOS/BOI padded; guided scores = Janus's CFG processor's (the
    loop's are read where it hands them to the processors: a processor of the user's is refused for Janus)."""
    from hf_sjd.jacobi import loop

    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    theirs, ours = FirstScores(), []
    model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_mode="image", do_sample=False,
                   guidance_scale=3.0, logits_processor=LogitsProcessorList([theirs]))  # sees [cond; uncond] rows
    process_window = loop.process_window

    def record(processors, logits, *args, **kwargs):
        ours.append(logits[:, 0].clone())
        return process_window(processors, logits, *args, **kwargs)

    monkeypatch.setattr(loop, "process_window", record)
    model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=3.0)
    torch.testing.assert_close(ours[0], ClassifierFreeGuidanceLogitsProcessor(3.0)(prompt, theirs.scores))
    bound = model.sjd_adapter.prepare_generation(prompt, {})
    uncond, mask = bound.unconditional_prompt(prompt, torch.ones_like(prompt))
    assert uncond.tolist() == [[1, 0, 0, 0, JANUS_BOI]] and mask.all()


def test_without_a_guidance_scale_it_guides_as_janus_generate_does(model):
    """Janus.generate guides at 5 where nothing sets guidance_scale; so does a Jacobi call."""
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    assert model.generation_config.guidance_scale is None
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_mode="image", do_sample=False)
    got = model.generate(prompt, do_sample=False, custom_generate="sjd", jacobi_window=4)
    assert torch.equal(got[:, prompt.shape[1]:], expected)
    assert torch.equal(model.generate(prompt, torch.ones_like(prompt), generation_mode="image", do_sample=False),
                       expected)  # Janus.generate's own second positional argument, the attention mask, still binds


def test_through_the_hub_recipe_it_guides_at_the_callers_scale(model):
    """Janus.generate's text path, which a custom_generate recipe is reached through, folds guidance_scale into its
    generation config and passes guidance_scale=None on: the caller's 2 still guides, not Janus's default 5."""
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    janus = {scale: model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_mode="image",
                                   do_sample=False, guidance_scale=scale) for scale in (2.0, 5.0)}
    assert not torch.equal(janus[2.0], janus[5.0])
    got = model.generate(prompt, custom_generate=str(Path(__file__).resolve().parents[2]), trust_remote_code=True,
                         jacobi_window=4, do_sample=False, guidance_scale=2.0)
    assert torch.equal(got[:, prompt.shape[1]:], janus[2.0])


def test_a_length_the_caller_chose_is_refused_where_nothing_merged_defaults_in(model):
    """Called by strategy name, Janus's text path does not run: a config's max_length (20 too, transformers'
    fallback) is the caller's, refused as the keyword is."""
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    with no_forward(model), pytest.raises(ValueError, match="max_length - prompt length = 15"):
        model.generate(prompt, custom_generate="sjd", generation_config=GenerationConfig(max_length=20))


def test_through_the_hub_recipe_a_checkpoints_own_length_is_not_the_callers(model, monkeypatch):
    """Janus.generate's text path merges the checkpoint's generation_config (here a saved max_new_tokens) into the
    config a recipe gets: that is no length the caller chose, and one image is decoded."""
    monkeypatch.setattr(model.generation_config, "max_new_tokens", 100)
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    got = model.generate(prompt, custom_generate=str(Path(__file__).resolve().parents[2]), trust_remote_code=True,
                         jacobi_window=4, do_sample=False)
    assert got.shape[1] - prompt.shape[1] == NUM_NEW


@pytest.mark.parametrize("kwargs", [{"repetition_penalty": 1.5}, {"no_repeat_ngram_size": 2},
                                    {"suppress_tokens": [3]}, {"logits_processor": LogitsProcessorList([FirstScores()])}])
def test_processors_janus_applies_before_guidance_are_refused(model, kwargs):
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    with no_forward(model), pytest.raises(ValueError, match="Janus: .* cannot run exactly"):
        model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=3.0, **kwargs)


def test_sampling_fills_the_grid_and_decodes(model):
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]]).repeat(4, 1)
    torch.manual_seed(0)
    out = model.generate(prompt, do_sample=True, top_k=10, custom_generate="mc-sjd", guidance_scale=5.0,
                         return_dict_in_generate=True)
    codes = out.sequences[:, prompt.shape[1]:]
    # EOS (id 2 here) is a valid code in image mode: the full grid is always written
    assert codes.shape == (4, NUM_NEW) and out.stats.num_new_tokens.tolist() == [NUM_NEW] * 4
    assert int(codes.max()) < JANUS_CODES
    images = model.sjd_adapter.decode_images(out.sequences)
    assert len(images) == 4 and images[0].size == (2 * JANUS_SIDE, 2 * JANUS_SIDE)


def test_bad_requests_raise_before_any_forward(model):
    prompt = torch.tensor([[1, 7, JANUS_BOI]])
    with no_forward(model.model.language_model):
        with pytest.raises(ValueError, match=f"max_new_tokens={NUM_NEW}"):
            model.generate(prompt, custom_generate="sjd", max_new_tokens=NUM_NEW + 1)
        with pytest.raises(ValueError, match="generation_mode='image'"):
            model.generate(prompt, custom_generate="sjd", generation_mode="text")
        pad = model.generation_config.pad_token_id, model.config.get_text_config().pad_token_id
        model.generation_config.pad_token_id = model.config.get_text_config().pad_token_id = None
        try:
            with pytest.raises(ValueError, match="classifier-free guidance needs a pad_token_id"):
                model.generate(prompt, custom_generate="sjd", guidance_scale=3.0)
        finally:
            model.generation_config.pad_token_id, model.config.get_text_config().pad_token_id = pad


def test_guided_greedy_in_bfloat16_equals_janus_generate():
    """Janus.generate guides, processes and softmaxes its head's scores in their dtype: so does the loop (it
    guided in float32, and near-ties flipped). Against its generate on a dynamic cache (its default static cache
    rounds otherwise in bfloat16). At window 0: bfloat16 rounds a window's forward unlike a one-token one."""
    model = tiny_janus().to(torch.bfloat16)
    with torch.no_grad():
        for parameter in model.model.generation_head.parameters():
            parameter.mul_(0.5)  # flatter laws: near-ties for the rounding to flip
    torch.manual_seed(0)
    prompts = torch.cat([torch.ones(32, 1, dtype=torch.long), torch.randint(6, 60, (32, 3)),
                         torch.full((32, 1), JANUS_BOI)], dim=1)
    expected = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_mode="image",
                              do_sample=False, guidance_scale=5.0, cache=DynamicCache())
    got = model.generate(prompts, do_sample=False, custom_generate="sjd", guidance_scale=5.0,
                         jacobi_window=0)
    assert torch.equal(got[:, prompts.shape[1]:], expected)


def test_decoding_a_sequence_decodes_its_codes_after_the_prompt():
    """decode_images takes sequences (prompt + codes) or bare codes: the same images either way."""
    import numpy as np
    from adapter_models import JANUS_BOI, tiny_janus

    model = tiny_janus()
    prompt = torch.tensor([[1, 7, 8, 9, JANUS_BOI]])
    torch.manual_seed(0)
    sequences = model.generate(prompt, do_sample=True, top_k=10, custom_generate="sjd", guidance_scale=2.0)
    from_sequences = model.sjd_adapter.decode_images(sequences)
    from_codes = model.sjd_adapter.decode_images(sequences[:, prompt.shape[1]:])
    assert np.array_equal(np.asarray(from_sequences[0]), np.asarray(from_codes[0]))
