"""The ragged cache stays consistent with an uncached forward after many per-row rollbacks."""

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from hf_sjd.jacobi.cache import RaggedCache


import pytest


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
            aligned, new_valid = ragged.plan(kept, width)
            before = [layer.keys.clone() for layer in ragged.cache.layers]
            valid_before, start = ragged.valid.clone(), ragged.num_slots - width
            ragged.commit(kept, width, aligned=bool(aligned), max_valid=int(new_valid.max()))
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
