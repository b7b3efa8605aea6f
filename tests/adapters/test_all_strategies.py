"""Every registered strategy runs on every image-model family with sampling + CFG and fills the right grid;
detection, fingerprints and the token-grid layout."""

import pytest
import torch
from transformers import GenerationConfig

import hf_sjd
from adapter_models import (CHAM_EOL, CHAM_EOSS, EMU3_EOF, EMU3_EOI, EMU3_EOL, JANUS_BOI, JANUS_CODES, JANUS_SIDE,
                            emu3_prompt, tiny_chameleon, tiny_emu3, tiny_janus)
from hf_sjd.adapters import TokenGrid


@pytest.fixture(scope="module")
def families():
    """name -> (model, prompt [2, P], check(new tokens [2, n]))."""
    emu3, janus, lumina = tiny_emu3(), tiny_janus(), tiny_chameleon()
    lumina_prompt = torch.tensor([[1, 30, 31, *lumina.sjd_adapter.image_header(64, 64)]])

    def emu3_check(new):  # 2 x 3 grid
        assert new.shape[1] == 2 * 4 + 3
        assert (new[:, [3, 7]] == EMU3_EOL).all() and (new[:, -3:] == torch.tensor([EMU3_EOF, EMU3_EOI, 2])).all()
        assert torch.isin(new[:, [0, 1, 2, 4, 5, 6]], emu3.sjd_adapter.draft_token_ids).all()

    def janus_check(new):
        assert new.shape[1] == JANUS_SIDE ** 2 and int(new.max()) < JANUS_CODES

    def lumina_check(new):  # 4 x 4 grid
        assert new.shape[1] == 4 * 5 + 1
        assert (new[:, 4:20:5] == CHAM_EOL).all() and (new[:, -1] == CHAM_EOSS).all()
        assert torch.isin(new[:, :20].reshape(-1, 4, 5)[:, :, :4], lumina.sjd_adapter.draft_token_ids).all()

    return {"emu3": (emu3, emu3_prompt(2, 3).repeat(2, 1), emu3_check),
            "janus": (janus, torch.tensor([[1, 7, 8, JANUS_BOI]]).repeat(2, 1), janus_check),
            "lumina-mgpt": (lumina, lumina_prompt.repeat(2, 1), lumina_check)}


def phrase_library_for(adapter):
    """A small phrase library over random code sequences, keyed by the adapter's codebook fingerprint."""
    from hf_sjd.phrases import PhraseLibrary

    num_codes = adapter.draft_token_ids.numel()
    corpus = torch.randint(0, 4, (64, 16), generator=torch.Generator().manual_seed(0))  # repetitive: phrases exist
    return PhraseLibrary.from_token_sequences(corpus, num_merges=20, codebook_size=num_codes,
                                              fingerprint=adapter.tokenizer_fingerprint)


def needs(strategy, knob: str) -> bool:
    return knob in hf_sjd.SJDConfig.resolve(strategy.preset, None, {}).knob_names()


@pytest.mark.parametrize("family", ["emu3", "janus", "lumina-mgpt"])
def test_every_registered_strategy_with_sampling_and_cfg(families, family):
    model, prompt, check = families[family]
    adapter = model.sjd_adapter
    assert adapter.family == family
    assert adapter.latent_embeddings.shape[0] == adapter.draft_token_ids.numel()  # LANTERN/GSD use these
    library = None
    for name, strategy in sorted(hf_sjd.STRATEGIES.items()):  # others register more while this runs: skip none
        kwargs = {}
        if needs(strategy, "phrase_library"):  # phrase verification (SJD-PV) needs a library for this codebook
            library = library or phrase_library_for(adapter)
            kwargs["phrase_library"] = library
        torch.manual_seed(0)
        out = model.generate(prompt, do_sample=True, top_k=6, guidance_scale=3.0, custom_generate=name,
                             jacobi_window=4, return_dict_in_generate=True, **kwargs)
        new = out.sequences[:, prompt.shape[1]:]
        check(new)
        assert out.stats.num_new_tokens.tolist() == [new.shape[1]] * 2, name
    # every combination of components is one knob away from a named strategy (the names 1.0 deleted among them)
    library = library or phrase_library_for(adapter)
    for name, knobs in COMPOSITIONS:
        torch.manual_seed(0)
        knobs = {"phrase_library": library, **knobs} if name == "sjd-pv" else knobs
        out = model.generate(prompt, do_sample=True, top_k=6, guidance_scale=3.0, custom_generate=name,
                             jacobi_window=4, **knobs)
        check(out[:, prompt.shape[1]:])
    # grid-aware drafting uses the adapter's grid width (row stride incl. end-of-line tokens)
    out = model.generate(prompt, do_sample=True, top_k=6, custom_generate="mc-sjd", draft_init="row-above-dist")
    check(out[:, prompt.shape[1]:])


VP = {"draft_prior": "verification-prediction"}
COMPOSITIONS = [  # what mc-lantern, mc-gsd, mc-sjd-vp, lantern-vp, gsd-vp, mc-sjd-pv, lantern-pv, gsd-pv, sjd-vp-pv
    ("lantern", {"draft_coupling": "maximal"}), ("gsd", {"draft_coupling": "maximal"}),  # and lantern-vp-pv were
    ("sjd-vp", {"draft_coupling": "maximal"}), ("lantern", VP), ("gsd", VP),
    ("sjd-pv", {"draft_coupling": "maximal"}), ("sjd-pv", {"pv_base_verifier": "lantern"}),
    ("sjd-pv", {"pv_base_verifier": "gsd"}), ("sjd-pv", VP), ("sjd-pv", {**VP, "pv_base_verifier": "lantern"}),
    ("sjd", {"verifier": "block", "draft_init": "last-target"}),  # (block with a coupling that keeps drafts: refused)
    ("sjd", {"draft_coupling": "gumbel", "draft_init": "last-target"}),
]


def test_unsupported_model_class_names_the_families():
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2))
    with pytest.raises(ValueError) as error:
        hf_sjd.enable(model)
    message = str(error.value)
    for family in ("emu3", "janus", "lumina-mgpt", "llamagen", "ADAPTERS"):
        assert family in message


def test_llamagen_fingerprint_from_config():
    from toy import tiny_llama

    model = tiny_llama(20)
    model.config.image_token_range = [0, 16]
    model.config.vq_fingerprint = "0123456789abcdef"
    assert hf_sjd.enable(model).sjd_adapter.family == "llamagen"
    assert model.sjd_adapter.tokenizer_fingerprint == "0123456789abcdef"
    del model.config.vq_fingerprint
    assert model.sjd_adapter.tokenizer_fingerprint is None


def test_llamagen_fingerprint_from_the_vq_folder_where_the_config_records_none(tmp_path):
    """A checkpoint laid out as <root>/ar + <root>/vq whose config records no ``vq_fingerprint``: the tokenizer
    next to it gives it, so phrase libraries are checked (a library of another tokenizer refused) rather than
    accepted with a warning."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    from hf_sjd import reference

    shutil.copytree(reference.weights_dir() / "ar", tmp_path / "ar")
    shutil.copytree(reference.weights_dir() / "vq", tmp_path / "vq")
    config = json.loads((tmp_path / "ar" / "config.json").read_text())
    recorded = config.pop("vq_fingerprint")
    (tmp_path / "ar" / "config.json").write_text(json.dumps(config))
    model = hf_sjd.enable(AutoModelForCausalLM.from_pretrained(tmp_path / "ar"))
    ref = reference.load()
    assert model.sjd_adapter.tokenizer_fingerprint == recorded == ref.vq.fingerprint()
    library = hf_sjd.PhraseLibrary.from_pretrained(tmp_path / "ar" / "phrases")
    other = hf_sjd.PhraseLibrary(library.codes, library.lengths, library.counts,
                                 {**library.metadata, "fingerprint": "0123456789abcdef"})
    with pytest.raises(ValueError, match="built for VQ tokenizer fingerprint '0123456789abcdef'"):
        model.generate(ref.prompt_ids(["coffee"]), custom_generate="sjd-pv", phrase_library=other, do_sample=True)
    # a vq/ folder hf_sjd cannot read is no fingerprint (a warning), and never read where nothing needs it
    shutil.copytree(tmp_path / "ar", tmp_path / "foreign" / "ar")
    (tmp_path / "foreign" / "vq").mkdir()
    (tmp_path / "foreign" / "vq" / "config.json").write_text(json.dumps({"_class_name": "VQModel"}))
    foreign = hf_sjd.enable(AutoModelForCausalLM.from_pretrained(tmp_path / "foreign" / "ar"))
    assert foreign.sjd_adapter.tokenizer_fingerprint is None
    out = foreign.generate(ref.prompt_ids(["coffee"]), custom_generate="sjd-pv", phrase_library=other,
                           pv_ignore_fingerprint=True, do_sample=True)
    assert out.shape == (1, 257)
    from hf_sjd.reference.data import make_dataset, to_pil

    images = to_pil(make_dataset(1, seed=3)[0][:2])
    assert torch.equal(foreign.sjd_adapter.encode_images(images, vq_tokenizer=ref.vq),
                       model.sjd_adapter.encode_images(images))


def test_token_grid_layout():
    grid = TokenGrid(2, 3, end_of_line=9, trailer=(7, 8))
    assert (grid.row_stride, grid.num_tokens) == (4, 10)
    forced = grid.structural_tokens(torch.arange(12)[None])
    assert forced.tolist() == [[-1, -1, -1, 9, -1, -1, -1, 9, 7, 8, -1, -1]]
    assert TokenGrid(2, 3).structural_tokens(torch.arange(6)[None]) is None
    tokens = torch.tensor([[1, 2, 3, 9, 4, 5, 6, 9, 7, 8]])
    assert grid.code_tokens(tokens).tolist() == [[[1, 2, 3], [4, 5, 6]]]
    kwargs = {}
    grid.resolve_max_new_tokens("x", kwargs, None, 5)
    assert kwargs == {"max_new_tokens": 10}
    with pytest.raises(ValueError, match="max_new_tokens=10"):
        grid.resolve_max_new_tokens("x", {"max_length": 9}, None, 5)
    # a user's GenerationConfig takes the length itself: transformers warns where a config comes with length keywords
    kwargs, config = {}, GenerationConfig(max_length=15)
    grid.resolve_max_new_tokens("x", kwargs, config, 5)
    assert kwargs == {} and (config.max_new_tokens, config.max_length) == (10, None)
    for length in (12, 20):  # a config's length is the user's (20 too: transformers' fallback)...
        with pytest.raises(ValueError, match=f"max_length - prompt length = {length - 5}"):
            grid.resolve_max_new_tokens("x", {}, GenerationConfig(max_length=length), 5)
    model_config = GenerationConfig(max_length=12, max_new_tokens=7)
    for copied in (GenerationConfig(max_length=12), GenerationConfig(max_new_tokens=7)):  # ...not the model's own
        grid.resolve_max_new_tokens("x", {}, copied, 5, model_config)
        assert (copied.max_new_tokens, copied.max_length) == (10, None)
    with pytest.raises(ValueError, match="max_new_tokens = 8"):
        grid.resolve_max_new_tokens("x", {}, GenerationConfig(max_new_tokens=8), 5, model_config)
    with pytest.raises(ValueError, match="max_new_tokens = 7"):  # a keyword is always the user's
        grid.resolve_max_new_tokens("x", {"max_new_tokens": 7}, None, 5, model_config)
    merged = GenerationConfig(max_length=20)  # transformers' fallback, where its defaults were merged in (Janus)
    grid.resolve_max_new_tokens("x", {}, merged, 5, model_config, merged=True)
    assert (merged.max_new_tokens, merged.max_length) == (10, None)


@pytest.mark.parametrize("family", ["emu3", "janus", "lumina-mgpt"])
def test_siblings_on_every_family(families, family):
    """``jacobi_siblings`` on each family: through the adapter's forward, a tree forward gives the drafts the
    logits of ``[u, d]`` and each sibling those of ``[u, s_i]``; sampled + CFG generation with siblings fills the
    grid and accepts siblings."""
    import copy

    from transformers import DynamicCache

    from hf_sjd.jacobi.cache import RaggedCache
    from toy import window_forward

    model, prompt, check = families[family]
    adapter = model.sjd_adapter
    codes = adapter.draft_token_ids
    ragged = RaggedCache(DynamicCache(), torch.ones_like(prompt))

    def forward(cache, ids, siblings=0, num_logits=None):
        return window_forward(adapter, cache, ids, siblings, num_logits)

    torch.manual_seed(0)
    with torch.no_grad():
        forward(ragged, prompt, num_logits=1)
        ragged.commit(ragged.plan(torch.full((2,), prompt.shape[1])), prompt.shape[1], lowest_valid=0,
                      max_valid=prompt.shape[1])
        u, drafts, siblings = (codes[torch.randint(0, codes.numel(), (2, n))] for n in (1, 3, 2))
        before = copy.deepcopy(ragged)
        tree = forward(ragged, torch.cat([u, drafts, siblings], dim=1), siblings=2)
        plain = forward(copy.deepcopy(before), torch.cat([u, drafts], dim=1))
        torch.testing.assert_close(tree[:, :4], plain, rtol=1e-4, atol=1e-4)
        for i in range(2):
            alone = forward(copy.deepcopy(before), torch.cat([u, siblings[:, i:i + 1]], dim=1))
            torch.testing.assert_close(tree[:, 4 + i], alone[:, 1], rtol=1e-4, atol=1e-4)
    accepted = 0
    for seed in range(8):  # random tiny models accept few drafts: a sibling every few calls
        torch.manual_seed(seed)
        out = model.generate(prompt, do_sample=True, top_k=6, guidance_scale=3.0, custom_generate="mc-sjd",
                             jacobi_window=4, jacobi_siblings=3, return_dict_in_generate=True)
        check(out.sequences[:, prompt.shape[1]:])
        accepted += out.stats.num_siblings_accepted
    assert accepted > 0


def test_cost_model_reads_every_family_shape(families):
    """The ``"auto"`` pick's roofline reads the decoder's layers and KV width from each family's (nested) text
    config, and every parameter (the VQ and vision towers too); on CPU the mc-sjd preset runs window 16 without
    siblings on every family."""
    from hf_sjd.jacobi.cost_model import ModelShape

    for name, (model, prompt, _) in families.items():
        text = model.config.get_text_config()
        shape = ModelShape.of(model)
        assert shape.layers == text.num_hidden_layers and shape.params == sum(p.numel() for p in model.parameters())
        assert shape.kv_width == text.num_key_value_heads * (text.hidden_size // text.num_attention_heads), name
        torch.manual_seed(0)
        out = model.generate(prompt, do_sample=True, top_k=5, custom_generate="mc-sjd", guidance_scale=2.0,
                             return_dict_in_generate=True)
        num_new = out.sequences.shape[1] - prompt.shape[1]  # the adapter's grid (max_new_tokens filled in)
        assert (out.stats.jacobi_window, out.stats.jacobi_siblings) == (min(16, num_new - 1), 0), name
