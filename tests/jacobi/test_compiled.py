"""``jacobi_compile=True`` fuses the loop's tensor steps with torch.compile and changes no token.

The compiled steps are the eager functions traced by dynamo and fused by inductor; their random numbers come
from torch's generator (``fallback_random``), so a seeded compiled call must return exactly the eager call's
sequences. Equality on the toy model at the exactness test's settings carries its chi-square result over to
the compiled path. Compilation costs ~15-30 s per strategy on CPU, so the suite compiles one: sjd with CFG
(``python -m benchmarks loop-cost --modes eager,compiled`` runs sjd, mc-sjd and sjd-pv compiled on the reference
model; its counting of compiled steps is tested in tests/benchmarks/test_loop_cost.py).
"""

import pytest
import torch

from toy import COND, NULL, toy_model

from hf_sjd.jacobi import loop


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


def test_compiled_sparse_steps_sample_the_eager_tokens():
    """The sparse path compiled (forced on the toy's small vocabulary): its residuals look q up at p's support ids
    by ``searchsorted``, which the compiled step hands a fresh buffer (``token_probs``)."""
    model = toy_model()
    settings = dict(custom_generate="sjd", do_sample=True, top_k=2, jacobi_sparse=True)
    eager, eager_stats = generate(model, False, **settings)
    compiled, _ = generate(model, True, **settings)
    assert torch.equal(eager, compiled)
    assert eager_stats.num_recovered > 0  # rejections: residuals were formed, compiled


def test_only_the_plans_widths_run_compiled(monkeypatch):
    """The steps specialise on the window's width: the shrunk windows of a call's last iterations run eager, so a
    call compiles once per width of its plan, not once per width it passes through (torch.compile stands in as a
    recorder here; the test above runs the real one)."""
    widths = {"verify": set(), "redraft": set()}

    def recording_compile(step, **kwargs):
        def run(*args, **kw):
            kind = "verify" if step.__name__ == "_verify_step" else "redraft"
            widths[kind].add(args[0].shape[1] if kind == "verify" else args[3].shape[0])
            return step(*args, **kw)
        return run

    monkeypatch.setattr(torch, "compile", recording_compile)
    model = toy_model()
    torch.manual_seed(0)
    out = model.generate(torch.full((4, 1), COND), max_new_tokens=9, jacobi_window=3, jacobi_compile=True,
                         custom_generate="sjd", do_sample=True, top_k=3, return_dict_in_generate=True)
    assert widths == {"verify": {3}, "redraft": {3}}
    assert out.sequences.shape[1] == 10  # the call ran to the end, through its shrunk last windows


def test_a_step_this_torch_cannot_compile_runs_eagerly(monkeypatch):
    """Where inductor refuses a step (torch 2.11 on CUDA did: docs/results/gpu/README.md), the call warns once per
    step, naming the compiler's error, and returns the eager call's tokens; a later call does not try again
    (torch.compile stands in as a compiler that fails)."""
    compiles = []

    def failing_compile(step, **kwargs):
        def run(*args, **kw):
            compiles.append(step.__name__)
            raise torch._dynamo.exc.BackendCompilerFailed(lambda *a: None, NotImplementedError("View"), None)
        return run

    model = toy_model()
    settings = dict(custom_generate="mc-sjd", do_sample=True, top_k=3)
    eager, _ = generate(model, False, **settings)
    monkeypatch.setattr(torch, "compile", failing_compile)
    monkeypatch.setattr(loop, "_UNCOMPILABLE", set())  # this process's record, restored after the test
    with pytest.warns(RuntimeWarning, match="could not compile") as warned:
        fallen_back, _ = generate(model, True, **settings)
    assert torch.equal(eager, fallen_back)
    assert sorted(compiles) == ["_redraft_step", "_verify_step"]  # each tried once, then eager for the call
    assert len([w for w in warned if "could not compile" in str(w.message)]) == 2
    assert all("NotImplementedError: View" in str(w.message) for w in warned if "could not compile" in str(w.message))
    again, _ = generate(model, True, **settings)  # no compile tried, no warning
    assert torch.equal(eager, again) and len(compiles) == 2


def test_a_step_past_dynamos_recompile_limit_says_so_and_runs_eagerly(monkeypatch):
    """Each configuration a process decodes (strategy, batch, greedy or sampled) recompiles the steps; past dynamo's
    recompile_limit they would run eagerly without a word: the call asks dynamo to raise there, and warns (a stand-in
    compiler raises as dynamo does once the limit is hit, only where asked to)."""
    flags = []

    def limited_compile(step, **kwargs):
        def run(*args, **kw):
            flags.append(torch._dynamo.config.fail_on_recompile_limit_hit)
            if torch._dynamo.config.fail_on_recompile_limit_hit:
                raise torch._dynamo.exc.FailOnRecompileLimitHit("recompile_limit reached")
            return step(*args, **kw)
        return run

    model = toy_model()
    settings = dict(custom_generate="sjd", do_sample=True, top_k=3)
    eager, _ = generate(model, False, **settings)
    monkeypatch.setattr(torch, "compile", limited_compile)
    monkeypatch.setattr(loop, "_UNCOMPILABLE", set())
    with pytest.warns(RuntimeWarning, match="FailOnRecompileLimitHit: recompile_limit reached"):
        fallen_back, _ = generate(model, True, **settings)
    assert torch.equal(eager, fallen_back) and flags == [True, True]  # each step tried once, then eager
    assert not torch._dynamo.config.fail_on_recompile_limit_hit  # the flag is the call's, not the process's
