import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)  # timings and scheduling swing wildly otherwise on 2 cores
# HF_SJD_TEST_DEVICE=cuda: the tests' tensors and models on that device (torch's default device), so `pytest -m
# device` runs the exactness tests on its kernels (benchmarks/gpu_check.sh). Unset: the CPU, as CI runs.
if os.environ.get("HF_SJD_TEST_DEVICE"):
    torch.set_default_device(os.environ["HF_SJD_TEST_DEVICE"])
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research harness (benchmarks/, not in the wheel) is imported from the checkout
    sys.path.insert(0, str(ROOT))


def pytest_report_header(config):
    return f"hf_sjd: tests' tensors on {torch.get_default_device()} (HF_SJD_TEST_DEVICE)"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def load_script():
    """``load_script("name")``: the module ``scripts/name.py`` (scripts are not a package)."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def reference():
    """The shipped reference model, enabled for Jacobi strategies (loaded once for the whole session)."""
    import hf_sjd
    from hf_sjd.reference import load

    ref = load()
    hf_sjd.enable(ref.model)
    return ref


# "auto" windows are picked from forward timings, which differ from run to run: the suite refuses timing (the
# calibration tests allow it where they test it), so every seeded run is reproducible.
os.environ["HF_SJD_CALIBRATE"] = "0"


def exponential_race(probs, noise=None):
    """The sampler before issue 34: ``torch.multinomial``'s one-sample draw, argmax p / E with E ~ Exp(1) per token."""
    from hf_sjd.jacobi.distributions import SparseProbs

    if noise is not None:
        return (probs / noise).argmax(-1)
    if isinstance(probs, SparseProbs):
        winner = (probs.probs / torch.empty_like(probs.probs).exponential_()).argmax(-1, keepdim=True)
        return probs.ids.gather(-1, winner).squeeze(-1)
    return (probs / torch.empty_like(probs).exponential_()).argmax(-1)


@pytest.fixture
def recorded_sampler(monkeypatch):
    """:func:`exponential_race` in place of ``sample`` in every hf_sjd module that imported it."""
    from hf_sjd.jacobi import distributions

    users = [module for name, module in list(sys.modules.items())
             if name.startswith("hf_sjd") and getattr(module, "sample", None) is distributions.sample]
    assert len(users) >= 3  # the loop, the drafter, the fresh drafts (and distributions itself)
    for module in users:
        monkeypatch.setattr(module, "sample", exponential_race)
