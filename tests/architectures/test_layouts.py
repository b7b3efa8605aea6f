"""How Jacobi decoding meets attention that depends on cache slots (issue 32, items 2-5): the probe that picks the
cache layout, a model that must pass (GPT-Neo with a local layer: the aligned layout) and one that must be
refused in a batch (Marian: positions from the cache length), masks of exactly the key length, and an image
family's model used for text."""

import sys
from pathlib import Path

import pytest
import torch

import hf_sjd
from hf_sjd.adapters import CausalLMAdapter, UnsupportedModelError, support

from . import matrix, zoo


def tiny(model_type: str, variant: str = ""):
    return zoo.build(zoo.Entry(model_type, zoo.causal_lm_classes()[model_type], variant))


def decode(model, check: str) -> torch.Tensor:
    with torch.no_grad():
        return matrix.jacobi(model, check)


def greedy(model, batch: str) -> torch.Tensor:
    with torch.no_grad():
        return matrix.reference(model, batch)[0]


def test_the_probe_tells_the_layouts_apart():
    """Positions from ``position_ids``: ragged; a local window the probe's gap passes: aligned; positions from the
    cache length: neither (one prompt at a time only); bidirectional attention: refused. Given no position_ids, most
    place tokens by cache slot; OPT counts its mask."""
    llama, neo, marian, bert = tiny("llama"), tiny("gpt_neo", "window"), tiny("marian"), tiny("bert")
    assert support.probe(llama) == support.Probe(causal=True, ragged=True, aligned=True, tree=True,
                                                 slot_positions=True)
    assert support.layout(llama, batch=3) == "ragged"
    assert support.probe(neo) == support.Probe(causal=True, ragged=False, aligned=True, tree=True,
                                               slot_positions=True)
    assert support.layout(neo, batch=3) == "aligned"
    assert support.layout(tiny("mistral", "window"), batch=3) == "aligned"  # read from the config
    assert support.probe(marian) == support.Probe(causal=True, ragged=False, aligned=False, tree=False,
                                                  slot_positions=True)
    assert not support.probe(tiny("opt")).slot_positions
    assert support.layout(marian, batch=1) == "lockstep"
    with pytest.raises(UnsupportedModelError, match=r"\(positions from the cache length\).*batch size 1"):
        support.layout(marian, batch=3)
    with pytest.raises(UnsupportedModelError, match=r"\(attention is not causal\).*is_decoder=True"):
        support.layout(bert, batch=1)


def test_a_local_attention_layer_is_exact_in_the_aligned_layout_and_wrong_in_the_ragged_one(monkeypatch):
    """GPT-Neo's local layers mask by slot distance inside the attention module. In the ragged layout a row that
    committed fewer tokens has a gap before its window, so its window covers other tokens than in transformers'
    decoding (the silent wrong tokens of issue 32); the aligned layout keeps its tokens contiguous. (The ragged
    batch is where rows commit different amounts every forward.)"""
    model = hf_sjd.enable(tiny("gpt_neo", "window"))
    for batch in ("plain", "ragged"):
        expected = greedy(model, batch)
        for check in [f"enabled:{strategy}:{window}:{batch}" for strategy in ("sjd", "mc-sjd") for window in (4, 8)]:
            assert torch.equal(decode(model, check), expected), check
    monkeypatch.setattr(support, "layout", lambda *_: "ragged")  # what the cache did before
    assert not torch.equal(decode(model, "enabled:sjd:4:ragged"), greedy(model, "ragged"))


def test_positions_from_the_cache_length_are_refused_in_a_batch_and_exact_one_prompt_at_a_time():
    """Marian's decoder computes positions from the cache length, so a row behind another in the batch would see
    other positions: refused before any decoding forward. One prompt at a time every row is the batch, and the
    tokens are transformers'."""
    model = hf_sjd.enable(tiny("marian"))
    prompt, mask = matrix.prompt_batch()
    with matrix.counting_forwards(model) as forwards, torch.no_grad():
        with pytest.raises(UnsupportedModelError, match="positions from the cache length"):
            model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=8, custom_generate="sjd")
    assert not forwards
    for row in range(len(prompt)):
        alone = prompt[row:row + 1, mask[row].bool()]
        with torch.no_grad():
            expected = model.generate(alone, do_sample=False, max_new_tokens=16)
            for strategy, window in (("sjd", 4), ("mc-sjd", 8)):
                got = model.generate(alone, do_sample=False, max_new_tokens=16, custom_generate=strategy,
                                     jacobi_window=window)
                assert torch.equal(got, expected)


@pytest.mark.parametrize("model_type, variant, knobs", [
    ("llama", "", {}),
    ("llama", "", {"jacobi_siblings": 2}),  # the tree forward's 4D mask
    ("bloom", "", {}),  # ALiBi from the whole mask
    ("gpt_neo", "window", {}),  # the aligned layout
    ("gemma2", "window", {}),  # sliding and full layers, the sliding ones turned full by the loop
])
def test_every_mask_the_loop_builds_has_exactly_the_key_length(model_type, variant, knobs):
    """Before each forward (the probe's and the loop's) the mask's key axis is the cached slots plus the fed
    tokens: a wider mask crashed ALiBi models and was sliced silently by the others."""
    model = hf_sjd.enable(tiny(model_type, variant))
    widths = []

    def check(module, args, kwargs):
        mask, cache, ids = kwargs["attention_mask"], kwargs["cache"], kwargs["input_ids"]
        widths.append((mask.shape[-1], cache.get_seq_length() + ids.shape[1]))
        if mask.ndim == 4:
            assert mask.shape[-2] == ids.shape[1]

    prompt, mask = matrix.prompt_batch()
    handle = model.register_forward_pre_hook(check, with_kwargs=True)
    try:
        with torch.no_grad():
            model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=12, custom_generate="sjd",
                           jacobi_window=4, **knobs)
    finally:
        handle.remove()
    assert len(widths) > 2 and all(got == expected for got, expected in widths), widths


@pytest.mark.parametrize("model_type", ["gpt_neo", "mistral"])
def test_siblings_are_refused_where_attention_depends_on_slots(model_type):
    """A tree forward's siblings sit at slots that are not their positions, and its 4D mask replaces the window
    masks: ``jacobi_siblings`` is refused for a model with a window, before any decoding forward."""
    model = hf_sjd.enable(tiny(model_type, "window"))
    prompt, mask = matrix.prompt_batch()
    with matrix.counting_forwards(model) as forwards, torch.no_grad():
        with pytest.raises(UnsupportedModelError, match=r"jacobi_siblings.*set jacobi_siblings=0"):
            model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=8, custom_generate="sjd",
                           jacobi_siblings=2)
    assert not forwards


@pytest.mark.parametrize("model_type, variant", [("bloom", ""), ("falcon", "alibi")])
def test_no_siblings_where_attention_builds_its_biases_from_the_2d_mask(model_type, variant):
    """ALiBi biases built from a 2D mask cannot take a tree forward's 4D mask (the forward crashed): the probe's
    tree forward sees it, ``"auto"`` picks no siblings (``mc-sjd`` at window 4, whose cells include siblings, stays
    identical) and ``jacobi_siblings=2`` is refused before any decoding forward."""
    model = tiny(model_type, variant)
    assert not support.probe(model).tree and support.probe(tiny("llama")).tree
    model = hf_sjd.enable(model)
    for batch in ("plain", "ragged"):
        assert torch.equal(decode(model, f"enabled:mc-sjd:4:{batch}"), greedy(model, batch))
    prompt, mask = matrix.prompt_batch()
    with matrix.counting_forwards(model) as forwards, torch.no_grad():
        with pytest.raises(UnsupportedModelError, match=r"\(jacobi_siblings with attention that takes no 4D mask\)"
                                                        r".*set jacobi_siblings=0"):
            model.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=8, custom_generate="sjd",
                           jacobi_siblings=2)
    assert not forwards


@pytest.mark.parametrize("fails_on, kind, detail", [
    ("any forward", "its forward fails", "a forward of one token with no cache"),
    ("a window after cached tokens", "its forward cannot take a window", "a forward of several tokens after cached"),
    ("a window, or no position_ids", "its forward cannot take a window", "a forward of several tokens after cached"),
])
def test_a_failing_forward_is_refused_with_what_fails(monkeypatch, fails_on, kind, detail):
    """The refusal tells a forward that fails on a window after cached tokens (only Jacobi decoding runs one) from a
    forward that fails on anything (vanilla generate's would too), and carries the error; ``generate`` raises it."""
    import functools

    model = tiny("llama")
    forward = model.forward

    @functools.wraps(forward)  # (the forward's signature: it takes a cache)
    def failing(*args, **kwargs):
        cache = kwargs.get("cache")
        if fails_on == "a window, or no position_ids" and kwargs.get("position_ids") is None:
            raise ValueError("this model needs position_ids")  # (vanilla's loop passes them)
        if fails_on == "any forward" or (cache is not None and cache.get_seq_length() > 0):
            raise RuntimeError("no kernel for this input")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", failing)
    with pytest.raises(UnsupportedModelError, match=rf"\({kind}\): {detail}.*RuntimeError: no kernel for this"):
        hf_sjd.enable(model).generate(torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=4,
                                      custom_generate="sjd", jacobi_window=3)


def test_an_image_family_model_decodes_text_through_the_generic_adapter():
    """Chameleon with a text prompt: the image adapter refuses it and says how to decode text; with the generic
    adapter attached the tokens are transformers' own."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adapters"))
    from adapter_models import tiny_chameleon

    model = tiny_chameleon()
    prompt = torch.tensor([[1, 30, 31, 32, 33], [1, 40, 41, 42, 43]])
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"model.sjd_adapter = hf_sjd.adapters.CausalLMAdapter\(model\)"):
            model.generate(prompt, do_sample=False, max_new_tokens=10, custom_generate="sjd")
        model.sjd_adapter = CausalLMAdapter(model)
        expected = model.generate(prompt, do_sample=False, max_new_tokens=10)
        got = model.generate(prompt, do_sample=False, max_new_tokens=10, custom_generate="sjd", jacobi_window=4)
    assert torch.equal(got, expected)


def test_a_model_whose_config_turns_the_cache_off_still_decodes_with_one():
    """MPT's config says ``use_cache=False``: transformers hands over no cache, and Jacobi decoding makes a
    DynamicCache (the tokens do not depend on it)."""
    model = hf_sjd.enable(tiny("mpt"))
    assert model.config.use_cache is False
    expected = greedy(model, "plain")
    assert torch.equal(decode(model, "enabled:sjd:4:plain"), expected)


def test_the_probe_is_not_seen_by_forward_hooks_and_leaves_them_in_place():
    """The probe's forwards are not the caller's: hooks on the model and its submodules (a forward counter, a
    timer, a "no forward before bad input" check) do not see them, and fire again afterwards."""
    model, calls = tiny("llama"), []
    handles = [model.register_forward_pre_hook(lambda *_: calls.append("model")),
               model.model.layers[0].register_forward_hook(lambda *_: calls.append("layer"))]
    try:
        assert support.probe(model).ragged
        assert calls == []
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6]]))
        assert calls == ["model", "layer"]
    finally:
        for handle in handles:
            handle.remove()


def test_the_probe_sets_hooks_aside_in_its_own_thread_only(monkeypatch):
    """A server's other threads run the model with its hooks while one thread's first Jacobi call probes (they lost
    them: a steering hook's tokens changed), and a hook registered or removed meanwhile stays so (it was undone)."""
    import threading

    model, calls = tiny("llama"), []
    kept = model.register_forward_pre_hook(lambda *_: calls.append("kept"))
    removed = model.register_forward_pre_hook(lambda *_: calls.append("removed"))
    run_probe, added, beside = support._run_probe, [], []

    def probe_beside_another_thread(model):
        if not beside:  # (a probe that fails without hooks runs again with them)
            other = threading.Thread(target=lambda: model(input_ids=torch.tensor([[5, 6]])))
            other.start()
            other.join()
            beside.append(list(calls))
            removed.remove()
            added.append(model.register_forward_pre_hook(lambda *_: calls.append("added")))
        return run_probe(model)

    monkeypatch.setattr(support, "_run_probe", probe_beside_another_thread)
    try:
        with torch.no_grad():
            assert support.probe(model).ragged
            assert beside == [["kept", "removed"]]  # the other thread's forward ran the hooks; the probe's none
            calls.clear()
            model(input_ids=torch.tensor([[5, 6]]))
            assert calls == ["kept", "added"]
            added[0].remove()  # a handle taken meanwhile still removes its hook
            calls.clear()
            model(input_ids=torch.tensor([[5, 6]]))
        assert calls == ["kept"]
    finally:
        for handle in (kept, *added):
            handle.remove()
