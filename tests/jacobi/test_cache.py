"""The ragged cache stays consistent with an uncached forward after many per-row rollbacks."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from hf_sjd.adapters.support import full_attention_layers
from hf_sjd.jacobi.cache import RaggedCache, prompt_positions, tree_visibility


@pytest.mark.parametrize("mask", [
    [[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]],  # left padding
    [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 1, 1]],  # right and inner padding (as transformers positions them)
])
def test_logits_after_ragged_rollbacks_equal_uncached_forward(mask):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    mask = torch.tensor(mask)
    prompt = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [12, 9, 10, 11]]) * mask
    committed = [prompt[r].tolist() for r in range(3)]
    ragged = RaggedCache(DynamicCache(config=config), mask)
    uncached = prompt
    with torch.no_grad():
        for _ in range(6):
            drafts = torch.randint(1, 32, (3, 5))
            ids = torch.cat([uncached, drafts], dim=1)
            width = ids.shape[1]
            model(input_ids=ids, attention_mask=ragged.attention_mask(width),
                  position_ids=ragged.position_ids(width), cache=ragged.cache, use_cache=True)
            accepted = torch.randint(0, 6, (3,))  # rows keep different numbers of drafts
            kept = uncached.shape[1] + accepted
            new_valid = ragged.plan(kept)
            before = [layer.keys.clone() for layer in ragged.cache.layers]
            valid_before, start = ragged.valid.clone(), ragged.num_slots - width
            ragged.commit(new_valid, width, lowest_valid=int(valid_before.min()), max_valid=int(new_valid.max()))
            for layer, old in zip(ragged.cache.layers, before):  # only the appended slots moved, and only down
                for r in range(3):
                    untouched = old[r, :, : int(valid_before[r])]
                    assert torch.equal(layer.keys[r, :, : int(valid_before[r])], untouched)
                    moved = layer.keys[r, :, int(valid_before[r]): int(new_valid[r])]
                    assert torch.equal(moved, old[r, :, start: start + int(kept[r])])
            for r in range(3):
                committed[r] += drafts[r, : accepted[r]].tolist()
            nxt = torch.randint(1, 32, (3, 1))  # the next uncached token (a recovered token)
            for r in range(3):
                committed[r].append(int(nxt[r]))
            uncached = nxt
        logits = model(input_ids=uncached, attention_mask=ragged.attention_mask(1), position_ids=ragged.position_ids(1),
                       cache=ragged.cache, use_cache=True).logits[:, -1]
        assert ragged.cache.get_seq_length() <= max(len(c) for c in committed) + 2
        for r in range(3):  # the same tokens, mask and positions in one uncached forward
            ids = torch.tensor([committed[r]])
            full_mask = torch.cat([mask[r], torch.ones(ids.shape[1] - 4, dtype=torch.long)])[None]
            positions = torch.cat([(mask[r].cumsum(0) - 1).clamp_min(0) * mask[r],
                                   ((mask[r].cumsum(0) - 1).clamp_min(0) * mask[r])[-1] + 1
                                   + torch.arange(ids.shape[1] - 4)])[None]
            full = model(input_ids=ids, attention_mask=full_mask, position_ids=positions).logits[0, -1]
            torch.testing.assert_close(logits[r], full, atol=1e-4, rtol=1e-4)


def reference_mask(prompt_mask: torch.Tensor, valid: torch.Tensor, num_slots: int, num_new: int) -> torch.Tensor:
    """The definition: a cached slot is usable below the row's valid count unless it is prompt padding."""
    usable = torch.arange(num_slots) < valid[:, None]
    usable[:, : prompt_mask.shape[1]] &= prompt_mask.bool()
    return torch.cat([usable.long(), torch.ones(len(valid), num_new, dtype=torch.long)], dim=1)


def test_mask_positions_and_moves_follow_their_definitions_through_commits_and_row_selection():
    """A cache without a model (keys and values of different head sizes, as some attention variants have):
    per-row commits of random lengths, guidance-style copies sharing one ``kept``, rows leaving."""
    torch.manual_seed(0)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [1, 0, 1], [1, 1, 1], [0, 0, 1], [1, 1, 0]])  # 2 copies of 3 rows
    ragged, decode_rows, prompt_mask = RaggedCache(DynamicCache(), mask), 3, mask
    for step in range(30):
        # the prefill feeds the prompt and more drafts than the slot codes' first capacity; later forwards 1 + 4
        uncached, drafts = (3, 600) if step == 0 else (1, 4)
        width = uncached + drafts
        rows = len(prompt_mask)
        offset = prompt_positions(prompt_mask)[:, -1] + 1 - prompt_mask.shape[1]
        valid_before, num_slots = ragged.valid.clone(), ragged.num_slots
        if num_slots:
            assert torch.equal(ragged.attention_mask(width), reference_mask(prompt_mask, valid_before, num_slots, width))
            assert torch.equal(ragged.position_ids(width), (offset + valid_before)[:, None] + torch.arange(width))
        for layer in range(2):
            ragged.cache.update(torch.randn(rows, 2, width, 4), torch.randn(rows, 2, width, 6), layer)
        before = [(layer.keys.clone(), layer.values.clone()) for layer in ragged.cache.layers]
        kept = uncached + torch.randint(0, drafts + 1, (decode_rows,))  # one count per decode row, both copies
        new_valid = ragged.plan(kept)
        assert torch.equal(new_valid, valid_before + kept.repeat(2))
        ragged.commit(new_valid, width, lowest_valid=int(valid_before.min()), max_valid=int(new_valid.max()))
        start = num_slots
        assert ragged.num_slots == int(new_valid.max())
        for layer, old in zip(ragged.cache.layers, before):
            for now, then in zip((layer.keys, layer.values), old):
                for r in range(rows):
                    low, high = int(valid_before[r]), int(new_valid[r])
                    assert torch.equal(now[r, :, :low], then[r, :, :low])  # the valid prefix is untouched
                    assert torch.equal(now[r, :, low:high], then[r, :, start: start + high - low])  # moved down
        if step in (10, 20):  # decode row 1 leaves (both its copies), then decode row 0
            keep = torch.tensor([0, 2]) if step == 10 else torch.tensor([1])
            model_rows = torch.cat([keep, keep + decode_rows])
            ragged.select_rows(model_rows, max_valid=int(ragged.valid[model_rows].max()))
            decode_rows, prompt_mask = len(keep), prompt_mask[model_rows]
            assert ragged.num_slots == int(ragged.valid.max())


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_forward_equals_separate_forwards_and_an_accepted_sibling_continues_its_row(attention):
    """``jacobi_siblings``' tree forward ``[u, d_1..d_L, s_1..s_m]``: the drafts' logits are those of ``[u, d]``,
    each sibling's those of ``[u, s_i]`` (it sees the prefix and itself only, at d_1's position), and after
    :meth:`RaggedCache.promote` a row that accepted a sibling goes on as if it had been fed ``[u, s_i]``."""
    import copy

    from hf_sjd.adapters.base import CausalLMAdapter
    from toy import window_forward

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    config._attn_implementation = attention
    model = LlamaForCausalLM(config).eval()
    adapter = CausalLMAdapter(model)
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])  # ragged, left padded
    prompt = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [12, 9, 10, 11]]) * mask
    ragged = RaggedCache(DynamicCache(config=config), mask)

    def forward(cache, ids, siblings=0):
        return window_forward(adapter, cache, ids, siblings)

    with torch.no_grad():
        forward(ragged, prompt)
        ragged.commit(ragged.plan(torch.tensor([4, 4, 4])), 4, lowest_valid=0, max_valid=4)
        u, drafts, siblings = torch.randint(1, 32, (3, 1)), torch.randint(1, 32, (3, 3)), torch.randint(1, 32, (3, 2))
        before = copy.deepcopy(ragged)
        tree = forward(ragged, torch.cat([u, drafts, siblings], dim=1), siblings=2)  # [3, 6, V]
        plain = forward(copy.deepcopy(before), torch.cat([u, drafts], dim=1))
        torch.testing.assert_close(tree[:, :4], plain, rtol=1e-4, atol=1e-5)
        for i in range(2):
            alone = forward(copy.deepcopy(before), torch.cat([u, siblings[:, i:i + 1]], dim=1))
            torch.testing.assert_close(tree[:, 4 + i], alone[:, 1], rtol=1e-4, atol=1e-5)

        chosen = torch.tensor([1, -1, 0])  # row 0 accepted sibling 1, row 1 its first draft, row 2 sibling 0
        ragged.promote(torch.where(chosen >= 0, 4 + chosen, 1), 6)
        ragged.commit(ragged.plan(torch.tensor([2, 2, 2])), 6, lowest_valid=4, max_valid=6)
        first = torch.where(chosen >= 0, siblings.gather(1, chosen.clamp_min(0)[:, None]).squeeze(1), drafts[:, 0])
        after = torch.randint(1, 32, (3, 1))
        expected = forward(copy.deepcopy(before), torch.cat([u, first[:, None], after], dim=1))[:, -1]
        torch.testing.assert_close(forward(ragged, after)[:, -1], expected, rtol=1e-4, atol=1e-5)


def test_prefill_and_later_masks_have_exactly_the_key_length():
    """Every 2D mask is ``[rows, cached slots + appended]`` (the prefill's was P columns too wide: models that build
    a bias from the whole mask, ALiBi, crashed), and the tree mask's key axis is the same length."""
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    for aligned in (False, True):
        ragged = RaggedCache(DynamicCache(), mask)
        ragged.aligned = aligned
        assert ragged.attention_mask(3 + 4).shape == (2, 7)  # the prefill: prompt + 4 drafts
        for layer in range(2):
            ragged.cache.update(torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4), layer)
        ragged.commit(ragged.plan(torch.tensor([4, 6])), 7, lowest_valid=0, max_valid=6)
        assert ragged.attention_mask(5).shape == (2, ragged.num_slots + 5)
        assert ragged.tree_attention_mask(5, 2).shape == (2, 1, 5, ragged.num_slots + 5)


@pytest.mark.parametrize("aligned", [False, True])
def test_tree_mask_is_the_row_mask_and_the_tree_over_every_slot(aligned):
    """The tree mask, built from a cached [W, W] block, is the 2D row mask and-ed with :func:`tree_visibility` over
    all slots (cached ones included), for several (W, m) in turn and after rows leave."""
    ragged = RaggedCache(DynamicCache(), torch.tensor([[0, 1, 1], [1, 1, 1], [1, 1, 0]]))
    ragged.aligned = aligned
    for layer in range(2):
        ragged.cache.update(torch.randn(3, 2, 7, 4), torch.randn(3, 2, 7, 4), layer)
    ragged.commit(ragged.plan(torch.tensor([4, 6, 1])), 7, lowest_valid=0, max_valid=6)
    for width, siblings in [(5, 2), (9, 3), (5, 2), (4, 1)]:
        if width == 4:
            ragged.select_rows(torch.tensor([0, 2]), max_valid=ragged.num_slots)
        sees = tree_visibility(torch.arange(ragged.num_slots + width), ragged.num_slots, siblings)
        expected = ragged.attention_mask(width).bool()[:, None, None, :] & sees[None, None]
        assert torch.equal(ragged.tree_attention_mask(width, siblings), expected)


@pytest.mark.parametrize("mask", [
    [[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]],  # left padding
    [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 1, 1]],  # right and inner padding
])
def test_aligned_layout_keeps_each_row_contiguous_and_right_aligned(mask):
    """The aligned layout (models that measure distances in slots): after commits of different lengths and a row
    leaving, each row's logical slots are contiguous and end at the last cached slot, the mask shows exactly its
    usable ones there, and a sliding-window model's logits equal an uncached forward of the row alone."""
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, sliding_window=4)
    model = MistralForCausalLM(config).eval()
    mask = torch.tensor(mask)
    prompt = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [12, 9, 10, 11]]) * mask
    committed = [prompt[r].tolist() for r in range(3)]
    ragged = RaggedCache(full_attention_layers(DynamicCache(config=config)), mask)
    ragged.aligned = True
    rows, uncached = [0, 1, 2], prompt
    with torch.no_grad():
        for step in range(6):
            drafts = torch.randint(1, 32, (len(rows), 5))
            ids = torch.cat([uncached, drafts], dim=1)
            width = ids.shape[1]
            model(input_ids=ids, attention_mask=ragged.attention_mask(width), position_ids=ragged.position_ids(width),
                  cache=ragged.cache, use_cache=True)
            accepted = torch.randint(0, 6, (len(rows),))
            valid = ragged.plan(uncached.shape[1] + accepted)
            ragged.commit(valid, width, lowest_valid=int(ragged.valid.min()), max_valid=int(valid.max()))
            for i, r in enumerate(rows):
                committed[r] += drafts[i, : accepted[i]].tolist()
            if step == 3:  # the middle row leaves
                keep = torch.tensor([0, 2])
                ragged.select_rows(keep, max_valid=int(ragged.valid[keep].max()))
                rows, accepted = [0, 2], accepted[keep]
            nxt = torch.randint(1, 32, (len(rows), 1))
            for i, r in enumerate(rows):
                committed[r].append(int(nxt[i]))
            uncached = nxt
        assert ragged.num_slots == int(ragged.valid.max())
        usable = ragged.attention_mask(1)[:, :-1]  # [rows, slots]
        for i, r in enumerate(rows):
            start = ragged.num_slots - int(ragged.valid[i])  # the row's first logical slot
            expected = torch.cat([torch.zeros(start, dtype=torch.long), mask[r],
                                  torch.ones(int(ragged.valid[i]) - 4, dtype=torch.long)])
            assert torch.equal(usable[i], expected)
        logits = model(input_ids=uncached, attention_mask=ragged.attention_mask(1),
                       position_ids=ragged.position_ids(1), cache=ragged.cache, use_cache=True).logits[:, -1]
        for i, r in enumerate(rows):
            ids = torch.tensor([committed[r]])
            full_mask = torch.cat([mask[r], torch.ones(ids.shape[1] - 4, dtype=torch.long)])[None]
            positions = (prompt_positions(full_mask[:, :4]))
            positions = torch.cat([positions, positions[:, -1:] + 1 + torch.arange(ids.shape[1] - 4)], dim=1)
            full = model(input_ids=ids, attention_mask=full_mask, position_ids=positions).logits[0, -1]
            torch.testing.assert_close(logits[i], full, atol=1e-4, rtol=1e-4)


def test_sparse_attention_indexer_keys_and_shared_layers_move_with_the_keys():
    """A ``DynamicIndexedLayer``'s indexer keys ``[rows, slots, dim]`` and positions ``[dims, rows, slots]`` move
    and are cut with its keys (both layouts); a ``DummyLayer`` (a layer that reads another's cache) holds none."""
    from transformers.cache_utils import DummyLayer, DynamicIndexedLayer

    torch.manual_seed(0)
    for aligned in (False, True):
        cache = DynamicCache()
        cache.layers = [DynamicIndexedLayer(), DummyLayer()]
        ragged = RaggedCache(cache, torch.ones(2, 2, dtype=torch.long))
        ragged.aligned = aligned
        layer = cache.layers[0]
        for width, kept in ((6, [3, 5]), (4, [2, 1])):
            keys = torch.randn(2, 1, width, 3)
            layer.update(keys, keys.clone())
            layer.update_indexer(keys[:, 0].clone())  # each slot's indexer key is its main key, for the check
            code = keys[:, 0, :, 0].mul(1000).long()[None]  # [1, rows, width]: and its position a code of it
            layer.indexer_position_ids = code if layer.indexer_position_ids is None else torch.cat(
                [layer.indexer_position_ids, code], dim=-1)
            valid = ragged.plan(torch.tensor(kept))
            ragged.commit(valid, width, lowest_valid=int(ragged.valid.min()), max_valid=int(valid.max()))
            assert torch.equal(layer.indexer_keys, layer.keys[:, 0])
            assert torch.equal(layer.indexer_position_ids[0], layer.keys[:, 0, :, 0].mul(1000).long())
        assert cache.layers[1].keys is None and layer.indexer_keys.shape[1] == ragged.num_slots
