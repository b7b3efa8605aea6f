"""Emu3 adapter: window forward, greedy == the docs' constrained generate, structure, CFG, decoding."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache, LogitsProcessorList
from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor

from adapter_models import FirstScores, guided
from adapter_models import (EMU3_BOI, EMU3_CODES, EMU3_EOF, EMU3_EOI, EMU3_EOL, EMU3_VISUAL0, emu3_prompt,
                            emu3_prefix_allowed_tokens_fn, tiny_emu3)
from toy import no_forward

H, W = 3, 4
NUM_NEW = H * (W + 1) + 3
VISUAL = torch.arange(EMU3_VISUAL0, EMU3_VISUAL0 + EMU3_CODES)


@pytest.fixture(scope="module")
def model():
    return tiny_emu3()


def test_detected_with_vocabulary_layout(model):
    adapter = model.sjd_adapter
    assert adapter.family == "emu3"
    assert torch.equal(adapter.draft_token_ids, VISUAL)
    assert adapter.latent_embeddings.shape == (EMU3_CODES, 4)
    assert torch.equal(adapter.latent_embeddings[3], model.model.vqmodel.quantize.embedding.weight[3])
    fingerprint = adapter.tokenizer_fingerprint
    assert len(fingerprint) == 16 and fingerprint == tiny_emu3().sjd_adapter.tokenizer_fingerprint  # stable
    assert fingerprint != tiny_emu3(seed=1).sjd_adapter.tokenizer_fingerprint
    assert adapter.grid_from_prompt(emu3_prompt(12, 34)) == (12, 34)


@torch.no_grad()
def test_window_forward_with_cache_matches_full_forward(model):
    adapter, prompt = model.sjd_adapter, emu3_prompt(H, W)
    drafts = VISUAL[torch.tensor([[3, 1, 4, 1, 5]])]
    cache = DynamicCache()
    ids = torch.cat([prompt, drafts], 1)
    n = ids.shape[1]
    got = adapter.window_logits(model, ids, torch.ones_like(ids), torch.arange(n)[None], cache, num_logits=6)
    full = model(input_ids=ids).logits[:, -6:]
    torch.testing.assert_close(got[..., VISUAL], full[..., VISUAL])
    assert (adapter.restrict_logits(got)[..., EMU3_EOL] == torch.finfo(got.dtype).min).all()  # non-visual ids
    # keep 2 drafts, then a window [committed token, 3 new drafts]
    cache.crop(-3)  # drop the last 3 drafts
    step = torch.cat([VISUAL[torch.tensor([[7]])], VISUAL[torch.tensor([[2, 6, 0]])]], 1)
    seq = torch.cat([ids[:, : prompt.shape[1] + 2], step], 1)
    got = adapter.window_logits(model, step, torch.ones_like(seq), torch.arange(seq.shape[1] - 4, seq.shape[1])[None],
                                cache, num_logits=4)
    torch.testing.assert_close(got[..., VISUAL], model(input_ids=seq).logits[:, -4:][..., VISUAL])


@pytest.mark.parametrize("window", [1, 4, 16])
def test_greedy_equals_docs_constrained_generate(model, window):
    prompt = emu3_prompt(H, W)
    expected = model.generate(prompt, do_sample=False, max_new_tokens=NUM_NEW,
                              prefix_allowed_tokens_fn=emu3_prefix_allowed_tokens_fn(H, W))
    got = model.generate(prompt, do_sample=False, custom_generate="sjd", jacobi_window=window)
    assert torch.equal(got, expected)


def test_docs_prefix_fn_also_accepted(model):
    """Passing the docs' prefix_allowed_tokens_fn as well changes nothing (it applies per window position)."""
    prompt = emu3_prompt(H, W)
    plain = model.generate(prompt, do_sample=False, custom_generate="sjd", jacobi_window=5)
    constrained = model.generate(prompt, do_sample=False, custom_generate="sjd", jacobi_window=5,
                                 prefix_allowed_tokens_fn=emu3_prefix_allowed_tokens_fn(H, W))
    assert torch.equal(plain, constrained)


def test_greedy_left_padded_batch_with_image_sizes(model):
    short, long = emu3_prompt(2, 3, text=(30,)), emu3_prompt(2, 3, text=(30, 31, 32, 33))
    pad = long.shape[1] - short.shape[1]
    prompt = torch.cat([torch.nn.functional.pad(short, (pad, 0)), long])
    mask = torch.ones_like(prompt)
    mask[0, :pad] = 0
    expected = model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=2 * (3 + 1) + 3,
                              prefix_allowed_tokens_fn=emu3_prefix_allowed_tokens_fn(2, 3))
    got = model.generate(input_ids=prompt, attention_mask=mask, image_sizes=[[2, 3], [2, 3]], do_sample=False,
                         custom_generate="mc-sjd", jacobi_window=3)
    assert torch.equal(got, expected)


def test_cfg_matches_transformers_unbatched_cfg(model):
    """Negative prompt as in the Emu3 docs: guided first-position scores and greedy tokens equal transformers'."""
    prompt, negative = emu3_prompt(H, W), torch.tensor([[1, 33, 34, 35, 36]])
    recorder = FirstScores()
    got = model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=3.0, jacobi_window=5,
                         negative_prompt_ids=negative, logits_processor=LogitsProcessorList([recorder]))
    with torch.no_grad():
        cond = model(input_ids=prompt).logits[:, -1]
        theirs = UnbatchedClassifierFreeGuidanceLogitsProcessor(3.0, model, unconditional_ids=negative)(prompt, cond)
    torch.testing.assert_close(recorder.scores[:, VISUAL].log_softmax(-1), theirs[:, VISUAL].log_softmax(-1))
    expected = model.generate(prompt, do_sample=False, max_new_tokens=NUM_NEW, guidance_scale=3.0,
                              negative_prompt_ids=negative,
                              prefix_allowed_tokens_fn=emu3_prefix_allowed_tokens_fn(H, W))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("strategy", ["sjd", "mc-sjd"])
def test_cfg_with_a_repetition_penalty_matches_the_docs_recipe(model, strategy):
    """A repetition penalty reads each guided score's sign: transformers guides log-probabilities over the whole
    vocabulary, then the docs' prefix constraint keeps the visual tokens; the loop does both in that order."""
    prompt, negative = emu3_prompt(H, W), torch.tensor([[1, 33, 34, 35, 36]])
    expected = model.generate(prompt, do_sample=False, max_new_tokens=NUM_NEW, guidance_scale=3.0,
                              negative_prompt_ids=negative, repetition_penalty=1.5,
                              prefix_allowed_tokens_fn=emu3_prefix_allowed_tokens_fn(H, W))
    got = model.generate(prompt, do_sample=False, custom_generate=strategy, guidance_scale=3.0, jacobi_window=5,
                         negative_prompt_ids=negative, repetition_penalty=1.5)
    assert torch.equal(got, expected)


def test_default_unconditional_prompt_is_bos_plus_image_header(model):
    prompt = emu3_prompt(H, W)
    uncond, mask = model.sjd_adapter.unconditional_prompt(prompt, torch.ones_like(prompt))
    header = prompt[:, (prompt[0] == EMU3_BOI).nonzero()[-1].item():]
    assert torch.equal(uncond, torch.cat([torch.tensor([[1]]), header], 1)) and mask.all()
    recorder = FirstScores()
    model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=2.0,
                   logits_processor=LogitsProcessorList([recorder]))
    with torch.no_grad():
        c, u = model(input_ids=prompt).logits[:, -1], model(input_ids=uncond).logits[:, -1]
    torch.testing.assert_close(recorder.scores[:, VISUAL], guided(c, u, 2.0)[:, VISUAL])


def test_structural_tokens_under_sampling(model):
    prompt = emu3_prompt(H, W).repeat(6, 1)
    torch.manual_seed(1)
    out = model.generate(prompt, do_sample=True, top_k=8, custom_generate="mc-sjd", guidance_scale=3.0,
                         jacobi_window=6, return_dict_in_generate=True)
    new = out.sequences[:, prompt.shape[1]:]
    assert new.shape == (6, NUM_NEW) and out.stats.num_new_tokens.tolist() == [NUM_NEW] * 6
    grid = new[:, : H * (W + 1)].reshape(6, H, W + 1)
    assert (grid[:, :, W] == EMU3_EOL).all()
    assert torch.isin(grid[:, :, :W], VISUAL).all()
    assert (new[:, -3:] == torch.tensor([EMU3_EOF, EMU3_EOI, 2])).all()
    assert len(set(map(tuple, grid[:, :, :W].reshape(6, -1).tolist()))) > 1  # sampled, not constant


def test_decode_images_from_sequences_or_generated_tokens(model):
    prompt = emu3_prompt(H, W)
    out = model.generate(prompt, do_sample=True, top_k=5, custom_generate="sjd")
    images = model.sjd_adapter.decode_images(out)
    assert len(images) == 1 and images[0].size == (2 * W, 2 * H) and images[0].mode == "RGB"
    again = model.sjd_adapter.decode_images(out[:, prompt.shape[1]:])  # width read from the first end-of-line
    assert (np.asarray(again[0]) == np.asarray(images[0])).all()


def test_a_length_cap_above_the_image_is_the_docs_call_and_below_it_is_refused(model):
    """The transformers docs' call caps ``max_new_tokens=50_000``: vanilla stops at the layout's EOS, so the image
    is the same call. A cap below the image, or above it where the EOS does not stop generation (another
    ``eos_token_id``), would not end where the image does: refused before any forward."""
    prompt = emu3_prompt(H, W)
    torch.manual_seed(0)
    capped = model.generate(prompt, do_sample=True, top_k=5, custom_generate="sjd", max_new_tokens=50_000)
    torch.manual_seed(0)
    assert torch.equal(capped, model.generate(prompt, do_sample=True, top_k=5, custom_generate="sjd"))
    assert capped.shape[1] == prompt.shape[1] + NUM_NEW
    with no_forward(model.model):
        with pytest.raises(ValueError, match=f"max_new_tokens={NUM_NEW} or more"):
            model.generate(prompt, custom_generate="sjd", max_new_tokens=NUM_NEW - 1)
        with pytest.raises(ValueError, match=f"max_new_tokens={NUM_NEW}\\.$"):
            model.generate(prompt, custom_generate="sjd", max_new_tokens=50_000, eos_token_id=EMU3_EOL)
        with pytest.raises(ValueError, match="image header"):
            model.generate(torch.tensor([[1, 30, 31]]), custom_generate="sjd")
        with pytest.raises(ValueError, match="same grid size"):
            model.generate(torch.cat([emu3_prompt(2, 3), emu3_prompt(3, 2)]), custom_generate="sjd")
    # a user's EosTokenCriteria replaces the config's EOS criterion: it decides, as in transformers' loop
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import EosTokenCriteria

    eos = model.sjd_adapter._eos
    torch.manual_seed(0)
    criteria = StoppingCriteriaList([EosTokenCriteria(eos)])
    by_criterion = model.generate(prompt, do_sample=True, top_k=5, custom_generate="sjd", max_new_tokens=50_000,
                                  eos_token_id=EMU3_EOL, stopping_criteria=criteria)
    assert torch.equal(by_criterion, capped)
    with no_forward(model.model), pytest.raises(ValueError, match=f"max_new_tokens={NUM_NEW}\\.$"):
        model.generate(prompt, custom_generate="sjd", max_new_tokens=50_000,
                       stopping_criteria=StoppingCriteriaList([EosTokenCriteria(EMU3_EOL)]))

    class LoggingEos(EosTokenCriteria):  # a subclass is added beside the config's EOS criterion, not instead of it
        pass

    torch.manual_seed(0)
    beside = model.generate(prompt, do_sample=True, top_k=5, custom_generate="sjd", max_new_tokens=50_000,
                            stopping_criteria=StoppingCriteriaList([LoggingEos(0)]))  # (0: never generated)
    assert torch.equal(beside, capped)


def test_grid_sizes_are_checked_against_the_header_before_any_forward(model):
    """The model is conditioned on the prompt's H*W header: image_sizes that disagree with it, a grid of no rows or
    columns, and fractional sizes are refused naming them."""
    with no_forward(model.model):
        with pytest.raises(ValueError, match=r"image_sizes=\[\[3, 2\]\] disagrees with the prompt's image header 2\*3"):
            model.generate(emu3_prompt(2, 3), image_sizes=[[3, 2]], custom_generate="sjd")
        for prompt in (emu3_prompt(0, 3), emu3_prompt(2, 0)):
            with pytest.raises(ValueError, match="the image grid must be at least 1 x 1"):
                model.generate(prompt, custom_generate="sjd")
        with pytest.raises(ValueError, match="image_sizes must hold integer"):
            model.generate(emu3_prompt(2, 3), image_sizes=[[2.7, 3]], custom_generate="sjd")
    assert model.generate(emu3_prompt(2, 3), image_sizes=[[2, 3]], do_sample=False, custom_generate="sjd").shape[1] \
        == model.generate(emu3_prompt(2, 3), do_sample=False, custom_generate="sjd").shape[1]


def test_decoded_pixels_are_the_image_processors_postprocess(model):
    """decode_images clips and truncates to uint8, as the processor's postprocess (the docs' recipe) does."""
    from transformers import Emu3ImageProcessor

    processor, prompt = Emu3ImageProcessor(), emu3_prompt(3, 4)
    torch.manual_seed(0)
    out = model.generate(prompt, do_sample=True, top_k=8, custom_generate="sjd")
    ours = np.asarray(model.sjd_adapter.decode_images(out, image_processor=processor)[0])
    with torch.no_grad():
        pixels = model.decode_image_tokens(image_tokens=out[:, prompt.shape[1]:], height=3, width=4)
    docs = np.asarray(processor.postprocess(list(pixels.float()), return_tensors="pt")["pixel_values"])
    docs = docs[0] if docs.ndim == 4 else docs
    assert (ours == docs.transpose(1, 2, 0)).all()


def test_a_vq_code_without_an_image_token_is_refused():
    from adapter_models import tiny_emu3
    from hf_sjd.adapters.base import detect_adapter
    adapter = detect_adapter(tiny_emu3())
    with pytest.raises(ValueError, match="has no image token"):
        adapter._code_indices(torch.tensor([int(adapter._code_table[0].max()) + 1]))
