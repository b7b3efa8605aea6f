"""Lumina-mGPT / Chameleon adapter: lm_head logits (Chameleon's forward masks image tokens), greedy == Lumina-mGPT's
own constrained AR loop (with its image-start-triggered CFG), structure, VQGAN decoder loading."""

import pytest
import torch
from transformers import DynamicCache, LogitsProcessorList

from adapter_models import FirstScores, guided
from adapter_models import (CHAM_CODES, CHAM_EOL, CHAM_EOSS, CHAM_IMAGE0, CHAM_SIZE0, CHAM_START, lumina_greedy,
                            tiny_chameleon)
from hf_sjd.adapters.chameleon_vqgan import VQGANDecoder
from toy import no_forward

IMAGE = torch.arange(CHAM_IMAGE0, CHAM_IMAGE0 + CHAM_CODES)
H, W = 4, 6  # 64 x 96 px: size tokens 2 and 3, 2 codes per size unit
NUM_NEW = H * (W + 1) + 1


@pytest.fixture(scope="module")
def model():
    return tiny_chameleon()


def prompt_for(model, text=(30, 31, 32), height=64, width=96):
    return torch.tensor([[1, *text, *model.sjd_adapter.image_header(height, width)]])


def test_detected_with_header_and_vocabulary(model):
    adapter = model.sjd_adapter
    assert adapter.family == "lumina-mgpt"
    assert adapter.image_header(64, 96) == [CHAM_START, CHAM_SIZE0 + 2, CHAM_SIZE0 + 3]
    assert torch.equal(adapter.draft_token_ids, IMAGE)
    assert adapter.latent_embeddings.shape == (CHAM_CODES, 8) and len(adapter.tokenizer_fingerprint) == 16
    grid = adapter.grid_from_prompt(prompt_for(model))
    assert (grid.height, grid.width, grid.num_tokens) == (H, W, NUM_NEW)


@torch.no_grad()
def test_window_forward_with_cache_matches_full_forward(model):
    adapter, prompt = model.sjd_adapter, prompt_for(model)
    full = lambda ids: model.lm_head(model.model(input_ids=ids).last_hidden_state)  # noqa: E731
    drafts = IMAGE[torch.tensor([[3, 1, 4, 1, 5]])]
    ids = torch.cat([prompt, drafts], 1)
    cache = DynamicCache()
    got = adapter.window_logits(model, ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None], cache, num_logits=6)
    torch.testing.assert_close(got[..., IMAGE], full(ids)[:, -6:, IMAGE])
    # transformers' forward masks exactly the tokens an image needs, which is why the adapter uses lm_head
    assert (model(input_ids=ids).logits[..., IMAGE] == torch.finfo(torch.float32).min).all()
    cache.crop(-3)
    step = IMAGE[torch.tensor([[7, 2, 6, 0]])]
    seq = torch.cat([ids[:, :-3], step], 1)
    got = adapter.window_logits(model, step, torch.ones_like(seq), torch.arange(seq.shape[1] - 4, seq.shape[1])[None],
                                cache, num_logits=4)
    torch.testing.assert_close(got[..., IMAGE], full(seq)[:, -4:, IMAGE])


@pytest.mark.parametrize("guidance_scale", [None, 3.0])
def test_greedy_equals_lumina_constrained_loop(model, guidance_scale):
    prompt = prompt_for(model)
    expected = lumina_greedy(model, prompt, NUM_NEW, guidance_scale=guidance_scale)
    for window in (1, 6, 16):
        got = model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=guidance_scale,
                             jacobi_window=window)
        assert torch.equal(got, expected), window


def test_cfg_masks_the_prompt_out(model):
    """Unconditional branch = the image header alone (Lumina-mGPT's image-start-triggered CFG)."""
    prompt = prompt_for(model)
    recorder = FirstScores()
    model.generate(prompt, do_sample=False, custom_generate="sjd", guidance_scale=3.0,
                   logits_processor=LogitsProcessorList([recorder]))
    with torch.no_grad():
        def last(ids):
            return model.lm_head(model.model(input_ids=ids).last_hidden_state[:, -1])
        c, u = last(prompt), last(prompt[:, -3:])
    torch.testing.assert_close(recorder.scores[:, IMAGE], guided(c, u, 3.0)[:, IMAGE])


def test_structural_tokens_under_sampling(model):
    prompt = torch.cat([prompt_for(model, text=(30, 31)), prompt_for(model, text=(33, 34))]).repeat(3, 1)
    torch.manual_seed(0)
    out = model.generate(prompt, do_sample=True, top_k=8, custom_generate="sjd", guidance_scale=3.0, jacobi_window=5,
                         return_dict_in_generate=True)
    new = out.sequences[:, prompt.shape[1]:]
    assert new.shape == (6, NUM_NEW)
    rows = new[:, :-1].reshape(6, H, W + 1)
    assert (rows[:, :, W] == CHAM_EOL).all() and torch.isin(rows[:, :, :W], IMAGE).all()
    assert (new[:, -1] == CHAM_EOSS).all()


def test_decode_needs_a_vqgan_checkpoint(model, tmp_path):
    prompt = prompt_for(model)
    out = model.generate(prompt, do_sample=True, top_k=5, custom_generate="sjd")
    with pytest.raises(ValueError, match="no image decoder.*vq_decoder_path"):
        model.sjd_adapter.decode_images(out)
    # a taming-layout Lightning checkpoint of a random VQGAN with the model's vq_config
    torch.manual_seed(0)
    decoder = VQGANDecoder(model.config.vq_config)
    state = {k: v for k, v in decoder.state_dict().items() if not k.startswith("quantize.")}  # codebook from encoder
    torch.save({"state_dict": {**state, "encoder.conv_in.weight": torch.zeros(1)}}, tmp_path / "vqgan.ckpt")
    images = model.sjd_adapter.decode_images(out, vq_decoder_path=tmp_path / "vqgan.ckpt")
    scale = 2 ** (len(model.config.vq_config.channel_multiplier) - 1)  # 16 with Chameleon's [1, 1, 2, 2, 4]
    assert len(images) == 1 and images[0].size == (scale * W, scale * H)
    torch.save({"state_dict": {"decoder.conv_in.weight": torch.zeros(1)}}, tmp_path / "bad.ckpt")
    with pytest.raises((ValueError, RuntimeError)):
        model.sjd_adapter.load_vq_decoder(tmp_path / "bad.ckpt")


def test_prompt_without_header_or_wrong_length_raises_before_any_forward(model):
    with no_forward(model.model):
        with pytest.raises(ValueError, match="image_header"):
            model.generate(torch.tensor([[1, 30, 31, 32]]), custom_generate="sjd")
        with pytest.raises(ValueError, match=f"max_new_tokens={NUM_NEW}"):
            model.generate(prompt_for(model), custom_generate="sjd", max_new_tokens=10)
        with pytest.raises(ValueError, match="multiples of 32"):
            model.sjd_adapter.image_header(70, 64)
        header = model.sjd_adapter.image_header
        mixed = torch.tensor([[1, 30, *header(64, 96)], [1, 31, *header(96, 64)]])  # 4x6 and 6x4 codes of 16 px
        with pytest.raises(ValueError, match=r"same grid size; got \[\(4, 6\), \(6, 4\)\]"):
            model.generate(mixed, custom_generate="sjd")


def test_generated_tokens_reads_the_last_header_or_the_bare_grid_and_a_size_of_zero_is_refused():
    from adapter_models import CHAM_SIZE0, CHAM_START, tiny_chameleon

    model = tiny_chameleon()
    adapter = model.sjd_adapter
    with pytest.raises(ValueError, match="an image prompt ends with the header"):
        adapter.grid_from_prompt(torch.tensor([[1, 30, CHAM_START, CHAM_SIZE0, CHAM_SIZE0 + 2]]))  # 0 px high
    # an earlier header of another size inside the prompt: the image follows the last one
    prompt = torch.tensor([[1, *adapter.image_header(32, 32), 30, *adapter.image_header(96, 64)]])  # taller than wide
    sequences = model.generate(prompt, do_sample=False, custom_generate="sjd", jacobi_window=4)
    tokens, grid = adapter.generated_tokens(sequences)
    expected = adapter.grid_from_prompt(prompt)
    assert (grid.height, grid.width) == (expected.height, expected.width)
    assert torch.equal(tokens, sequences[:, prompt.shape[1]:prompt.shape[1] + grid.num_tokens])
    bare, bare_grid = adapter.generated_tokens(sequences[:, prompt.shape[1]:])  # no header: width from the first EOL
    assert (bare_grid.height, bare_grid.width) == (expected.height, expected.width) and torch.equal(bare, tokens)
