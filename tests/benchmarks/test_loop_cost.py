"""``benchmarks/loop_cost.py``: the counters count what they claim, restore what they patch, and the command writes
its report (json + markdown) or refuses bad input before any work."""

import dataclasses
import json

import pytest
import torch

from benchmarks import loop_cost
from benchmarks.loop_cost import CostCounter, ForwardScopes, Settings, StopRun

PATCHED = tuple(loop_cost.PYTHON_SYNCS)


def counted(fn, simulate_device=True):
    with CostCounter(simulate_device=simulate_device) as counter:
        counter.enter_scope("test")
        fn()
        counter.enter_scope(None)
    return counter.tallies.get("test", loop_cost.Tally())


def kinds(tally) -> dict:
    out = {}
    for (kind, _site), n in tally.syncs.items():
        out[kind] = out.get(kind, 0) + n
    return out


def test_known_syncs_and_ops_are_counted_exactly():
    x = torch.arange(12.0)

    def fn():
        x.sum().item()  # sum: 1 op; item: 1 sync (its _local_scalar_dense is not counted again)
        x[3].item()  # select: a view, no op; 1 sync
        int(x[0])  # 1 sync
        mask = x > 4  # 1 op
        x[mask]  # bool-mask index: 1 op, 1 sync
        mask.nonzero()  # 1 op, 1 sync
        torch.multinomial(x + 1, 2)  # add + multinomial: 2 ops, 1 sync
        if mask.any():  # any: 1 op; bool(): 1 sync
            pass
        x.view(3, 4).t().unsqueeze(0).expand(2, -1, -1)  # views only

    tally = counted(fn)
    assert kinds(tally) == {"Tensor.item": 2, "int(tensor)": 1, "aten.index (bool mask)": 1, "aten.nonzero": 1,
                            "aten.multinomial": 1, "bool(tensor)": 1}
    assert dict(tally.ops) == {"sum": 1, "gt": 1, "index": 1, "nonzero": 1, "add": 1, "multinomial": 1, "any": 1}
    assert set(tally.no_kernel) == {"select", "view", "t", "unsqueeze", "expand"}
    sites = {site for _kind, site in tally.syncs}
    assert all(site.startswith("tests/benchmarks/test_loop_cost.py:") for site in sites) and len(sites) == 7


def test_host_copies_are_one_sync_and_what_follows_is_host_work():
    x = torch.arange(6)

    def fn():
        host = x.cpu()  # 1 sync; a fresh copy, as on a GPU
        assert host is not x
        int(host[0])  # host tensor: no sync
        (host + 1).tolist()  # host op, no sync
        x.tolist()  # device tensor: 1 sync
        x.to("cpu")  # 1 sync
        x.to(x.device)  # a cast to the tensor's own device: no sync, no op

    tally = counted(fn)
    assert kinds(tally) == {"Tensor.cpu": 1, "Tensor.tolist": 1, "Tensor.to(cpu)": 1}
    assert tally.host_ops["add"] == 1 and "add" not in tally.ops


def test_real_device_mode_only_counts_non_cpu_tensors():
    x = torch.arange(6.0)
    tally = counted(lambda: (x.sum().item(), x.nonzero(), x.cpu()), simulate_device=False)
    assert kinds(tally) == {}  # CPU tensors are host tensors when the measured model is on the CPU of a GPU run
    assert sum(tally.host_ops.values()) == 2


def test_patched_methods_are_restored_after_the_context_even_on_error():
    before = {name: torch.Tensor.__dict__.get(name) for name in PATCHED}
    originals = {name: getattr(torch.Tensor, name) for name in PATCHED}
    compile_before = torch.compile
    with pytest.raises(RuntimeError, match="boom"):
        with CostCounter(simulate_device=True) as counter:
            counter.enter_scope("x")
            assert torch.Tensor.__dict__.get("item") is not None  # patched inside
            raise RuntimeError("boom")
    assert {name: torch.Tensor.__dict__.get(name) for name in PATCHED} == before
    assert all(getattr(torch.Tensor, name) is originals[name] for name in PATCHED)
    assert torch.compile is compile_before  # wrapped while counting, so compiled steps are counted by profile
    assert torch.utils._python_dispatch._get_current_dispatch_mode() is None
    assert int(torch.tensor(3)) == 3 and bool(torch.tensor(True)) and torch.tensor(2.5).item() == 2.5


class Doubler(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1  # 2 ops inside the forward


def test_forward_hooks_split_inside_from_outside_and_stop_the_run():
    model = Doubler()
    counter = CostCounter(simulate_device=True, dispatch_in_forward=True)
    with counter, ForwardScopes(model, on_scope=counter.enter_scope, stop_at=2) as scopes:
        x = torch.ones(3)
        with pytest.raises(StopRun):
            for _ in range(3):
                x = model(x).neg()  # neg: 1 op outside, in the gap after each forward
                x.sum().item()
        counter.enter_scope(None)
    assert len(scopes.calls) == 3 and scopes.forwards.count == 2  # the third one was stopped before it ran
    for i in (0, 1):
        assert dict(counter.tallies[("forward", i)].ops) == {"mul": 1, "add": 1}
        assert dict(counter.tallies[("gap", i)].ops) == {"neg": 1, "sum": 1}
        assert kinds(counter.tallies[("gap", i)]) == {"Tensor.item": 1}
    (span,) = scopes.span.durations()  # forward 0's end to forward 2's start: holds forward 1 and two gaps
    assert span >= scopes.forwards.durations()[1] >= 0


def test_paused_forward_still_counts_python_reads():
    class Reader(torch.nn.Module):
        def forward(self, x):
            return x * float(x.max())

    model = Reader()
    counter = CostCounter(simulate_device=True, dispatch_in_forward=False)
    with counter, ForwardScopes(model, on_scope=counter.enter_scope):
        model(torch.ones(2))
        torch.ones(2).sum()
        counter.enter_scope(None)
    forward, gap = counter.tallies[("forward", 0)], counter.tallies[("gap", 0)]
    assert kinds(forward) == {"float(tensor)": 1} and not forward.ops  # aten ops not seen while paused
    assert dict(gap.ops) == {"ones": 1, "sum": 1}


@pytest.fixture(scope="module")
def dummy():
    return loop_cost.dummy_subject(1024, max_new_tokens=40)


@pytest.mark.parametrize("method,guidance", [("sjd", 3.0), ("ar", 3.0), ("sjd-pv", 1.0)])
def test_counting_changes_nothing_the_loop_returns(dummy, method, guidance):
    settings = Settings(iterations=3)
    plain = loop_cost._generate(dummy, method, 2, guidance, settings)
    with CostCounter(simulate_device=True) as counter, ForwardScopes(dummy.model, on_scope=counter.enter_scope):
        again = loop_cost._generate(dummy, method, 2, guidance, settings)
        counter.enter_scope(None)
    assert torch.equal(plain, again)


def test_measure_on_a_dummy_vocabulary(dummy):
    settings = Settings(iterations=3, repeats=2, warmup=0)
    sjd = loop_cost.measure(dummy, "sjd", 2, 3.0, settings)
    again = loop_cost.measure(dummy, "sjd", 2, 3.0, settings)
    for key in ("syncs_per_iter", "ops_per_iter", "no_kernel_ops_per_iter", "step_compression", "top_syncs"):
        assert sjd[key] == again[key]  # seeded: the same path, the same counts
    assert sjd["vocab_size"] == 1024 and sjd["iterations"] == 3 and sjd["ops_per_iter"] > 0
    assert 1 <= sjd["step_compression"] <= 17
    assert sjd["syncs_per_token"] == pytest.approx(sjd["syncs_per_iter"] / sjd["step_compression"])
    assert sum(n for _site, n in sjd["top_syncs"]) <= sjd["syncs_per_iter"] + 1e-9
    ms = sjd["outside_ms_per_iter"]
    assert len(ms["runs"]) == 2 and 0 < ms["best"] <= ms["median"] and sjd["forward_ms_per_iter"]["best"] > 0
    ar = loop_cost.measure(dummy, "ar", 2, 3.0, settings)
    assert ar["forwards_per_step"] == 2 and ar["step_compression"] == 1.0 and ar["ops_per_iter"] > 0


def test_siblings_are_measured_and_labelled(dummy):
    """``--siblings``: the Jacobi runs carry them (more ops per iteration, the same 2 syncs), ``ar`` ignores it."""
    plain = loop_cost.measure(dummy, "mc-sjd", 2, 3.0, Settings(iterations=3, repeats=1, warmup=0))
    tree = loop_cost.measure(dummy, "mc-sjd", 2, 3.0, Settings(iterations=3, repeats=1, warmup=0, siblings=3))
    assert tree["siblings"] == 3 and loop_cost._label(tree) == "mc-sjd + 3 siblings"
    assert tree["syncs_per_iter"] == plain["syncs_per_iter"] and tree["ops_per_iter"] > plain["ops_per_iter"]


def test_verifier_is_measured_and_labelled(dummy):
    """``--verifier``: the Jacobi runs use it (block verification: the same 2 syncs, more ops than token by token)."""
    settings = Settings(iterations=3, repeats=1, warmup=0)
    token = loop_cost.measure(dummy, "sjd", 2, 3.0, dataclasses.replace(settings, verifier="speculative"))
    block = loop_cost.measure(dummy, "sjd", 2, 3.0, dataclasses.replace(settings, verifier="block"))
    assert block["verifier"] == "block" and loop_cost._label(block) == "sjd, verifier=block"
    assert block["syncs_per_iter"] == token["syncs_per_iter"] and block["ops_per_iter"] > token["ops_per_iter"]
    assert any(line.startswith("| sjd, verifier=block | 2 | 3 |") for line in loop_cost._scaling_table([block]))


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    out_json, out_md = tmp_path / "r" / "loop_cost.json", tmp_path / "r" / "loop_cost.md"
    argv = ["--methods", "ar,sjd-pv", "--batch-sizes", "1", "--guidance-scales", "3", "--vocab-sizes", "600",
            "--iterations", "2", "--repeats", "1", "--warmup", "0", "--max-new-tokens", "40",
            "--json", str(out_json), "--markdown", str(out_md)]
    assert loop_cost.main(argv) == 0
    report = json.loads(out_json.read_text())
    assert [(c["model"], c["method"]) for c in report["cases"]] == [
        ("reference", "ar"), ("reference", "sjd-pv"), ("dummy-V600", "ar"), ("dummy-V600", "sjd-pv")]
    assert report["command"].startswith("python -m benchmarks loop-cost --methods ar,sjd-pv")
    assert not report["cases"][0]["random_weights"] and report["cases"][2]["random_weights"]
    text = out_md.read_text()
    assert report["command"] in text and "NOT acceleration claims" in text
    assert "| sjd-pv | 1 | 3 |" in text and "ms/iter V=600" in text
    assert text.strip() in capsys.readouterr().out
    assert not [p for p in out_json.parent.iterdir() if p.name.startswith(".")]  # no temp files left


@pytest.mark.parametrize("argv,flag", [
    (["--methods", "ar,beam"], "--methods"),
    (["--methods", ""], "--methods"),
    (["--vocab-sizes", "1"], "--vocab-sizes"),
    (["--vocab-sizes", "530,x"], "--vocab-sizes"),
    (["--batch-sizes", "0"], "--batch-sizes"),
    (["--batch-sizes", "-2"], "--batch-sizes"),
    (["--guidance-scales", "-1"], "--guidance-scales"),
    (["--iterations", "1"], "--iterations"),
    (["--siblings", "-1"], "--siblings"),
    (["--sibling-drafts", "3"], "unrecognized arguments: --sibling-drafts"),  # a deleted knob
    (["--verifier", "blocky"], "--verifier"),
    (["--device", "tpu"], "--device"),
])
def test_bad_input_exits_2_naming_the_argument(argv, flag, capsys, tmp_path):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exit_info:
        loop_cost.main([*argv, "--json", str(out)])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err
    assert not out.exists()


def test_compiled_functions_are_counted_from_their_profile(monkeypatch):
    """While counting, what ``torch.compile`` returns runs with the dispatch mode paused (under one it would run
    the eager code) and its launches come from a profile: fused kernels and fallback ops; the eager code next to
    it is counted by the dispatch mode as usual, and the compiled function returns what the eager one does."""
    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = (x * 2).softmax(-1)  # fused: one kernel with the argmax
        return scores.argmax(-1), torch.topk(scores, 2).indices  # topk: an aten fallback

    monkeypatch.setattr(torch._inductor.config.cpp, "enable_kernel_profile", True)  # as count_case sets it
    torch.compile(step, dynamic=True)(torch.randn(4, 8))  # compiled once, uncounted, as count_case does
    x = torch.randn(5, 8)
    with CostCounter(simulate_device=True) as counter:
        compiled = torch.compile(step, dynamic=True)  # what a decoder does when generate builds it
        counter.enter_scope("gap")
        result = compiled(x)
        eager = step(x)
        counter.enter_scope(None)
    ops = counter.tallies["gap"].ops
    assert ops["inductor kernel"] >= 1 and ops["topk (compiled graph)"] == 1
    assert ops["topk"] == 1 and ops["_softmax"] == 1  # the eager call
    assert all(torch.equal(a, b) for a, b in zip(result, eager))
