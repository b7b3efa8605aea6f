"""Tokens fixed by the model's layout (adapter ``structural_tokens``) land exactly where the layout says."""

import torch

from hf_sjd.adapters.base import CausalLMAdapter
from toy import COND, tiny_llama, toy_model

END_OF_ROW, ROW = 3, 4  # every 4th generated token is the toy's "end of line"


class EveryFourthToken(CausalLMAdapter):
    def structural_tokens(self, positions):
        return torch.where(positions % ROW == ROW - 1, torch.full_like(positions, END_OF_ROW), -1)


def test_structural_tokens_forced_when_sampling():
    model = toy_model()
    model.sjd_adapter = EveryFourthToken(model)
    torch.manual_seed(0)
    out = model.generate(torch.full((64, 1), COND), do_sample=True, top_k=3, max_new_tokens=12,
                         custom_generate="mc-sjd", jacobi_window=5, return_dict_in_generate=True)
    new = out.sequences[:, 1:]
    assert (new[:, ROW - 1::ROW] == END_OF_ROW).all()
    # elsewhere the model's own distribution decides, so the structural token is not everywhere
    free = torch.ones(12, dtype=torch.bool)
    free[ROW - 1::ROW] = False
    assert (new[:, free] != END_OF_ROW).any()


def test_structural_tokens_greedy_equals_forced_ar():
    """Greedy SJD with forced structure == greedy AR with the same tokens forced by a logits processor."""
    from transformers import LogitsProcessor, LogitsProcessorList

    model = tiny_llama(vocab_size=40)
    prompt = torch.tensor([[5, 6, 7]])

    class Force(LogitsProcessor):
        def __call__(self, input_ids, scores):
            if (input_ids.shape[1] - prompt.shape[1]) % ROW == ROW - 1:
                scores = torch.full_like(scores, -float("inf"))
                scores[:, END_OF_ROW] = 0
            return scores

    expected = model.generate(prompt, do_sample=False, max_new_tokens=13, logits_processor=LogitsProcessorList([Force()]))
    model.sjd_adapter = EveryFourthToken(model)
    got = model.generate(prompt, do_sample=False, max_new_tokens=13, custom_generate="sjd", jacobi_window=6)
    assert torch.equal(got, expected)
