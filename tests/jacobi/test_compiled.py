"""``jacobi_compile=True`` fuses the loop's tensor steps with torch.compile and changes no token.

The compiled steps are the eager functions traced by dynamo and fused by inductor; their random numbers come
from torch's generator (``fallback_random``), so a seeded compiled call must return exactly the eager call's
sequences. Equality on the toy model at the exactness test's settings carries its chi-square result over to
the compiled path. Compilation costs ~15-30 s per strategy on CPU, so the suite compiles one: sjd with CFG
(``hf-sjd loop-cost --modes eager,compiled`` runs sjd, mc-sjd and sjd-pv compiled on the reference model).
"""

import torch

from hf_sjd.jacobi.compiled import CompiledStep
from hf_sjd.loop_cost import CostCounter
from toy import COND, NULL, toy_model


def generate(model, compile_steps: bool, **kwargs):
    torch.manual_seed(3)
    prompts = torch.full((512, 1), COND)
    out = model.generate(prompts, max_new_tokens=5, jacobi_window=3, jacobi_compile=compile_steps,
                         return_dict_in_generate=True, **kwargs)
    return out.sequences, out.stats


def test_compiled_steps_sample_the_eager_tokens():
    model = toy_model()
    guided = {"guidance_scale": 3.0, "negative_prompt_ids": torch.full((512, 1), NULL)}
    settings = dict(custom_generate="sjd", do_sample=True, top_k=3, **guided)
    eager, eager_stats = generate(model, False, **settings)
    compiled, compiled_stats = generate(model, True, **settings)
    assert torch.equal(eager, compiled)
    assert compiled_stats.num_forward_passes == eager_stats.num_forward_passes
    assert eager_stats.num_accepted > 0  # drafts were verified and accepted, so verification ran compiled
    assert len(set(map(tuple, compiled.tolist()))) > 20  # and it sampled (many distinct sequences)


def test_loop_cost_counts_the_kernels_of_a_compiled_step():
    """Under a dispatch mode torch.compile would run the eager code, so the counter runs a ``CompiledStep``
    with the mode paused and counts its fused kernels and fallback ops from a profile instead."""
    torch._inductor.config.cpp.enable_kernel_profile = True

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = (x * 2).softmax(-1)  # fused: one kernel with the argmax
        return scores.argmax(-1), torch.topk(scores, 2).indices  # topk: an aten fallback

    compiled = CompiledStep(step)
    compiled(torch.randn(4, 8))  # compile outside the counter
    with CostCounter(simulate_device=True) as counter:
        counter.enter_scope("gap")
        compiled(torch.randn(5, 8))
        eager = step(torch.randn(5, 8))
    ops = counter.tallies["gap"].ops
    assert ops["inductor kernel"] >= 1 and ops["topk (compiled graph)"] == 1
    assert ops["topk"] == 1 and ops["_softmax"] == 1  # the eager call, counted by the dispatch mode as usual
    assert eager[1].shape == (5, 2)
