"""The package as a user gets it: from the Hub repo, built into a wheel, installed without ``-e``.

One module-scoped fixture does what the README's install line says, against a local Hub over real HTTP
(``tests/hub_server.py``): the repository root is pushed to it as the Hub repo, ``hf download <repo>
--local-dir src`` fetches it, ``pip wheel src`` builds the wheel and ``pip install --no-deps --target fresh``
installs it. Every check then runs in a subprocess whose cwd is outside the checkout and whose
``PYTHONPATH`` is only the fresh target (dependencies come from site-packages), so the editable checkout
cannot stand in for a missing module or data file.

Invariant: the wheel holds exactly the checkout's ``hf_sjd/`` files (every module, every shipped weight and
phrase-library file) and nothing of the research harness (``benchmarks/``, uploaded with the repository root but
kept out of the wheel), and the installed copy runs the main job, ``hf-sjd bench`` and the Hub recipe on its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_sjd.compat import MAX_TRANSFORMERS, MIN_TRANSFORMERS
from hub_server import LocalHub, hub_env

REPO_ROOT = Path(__file__).resolve().parents[1]
HUB_REPO = "hf-sjd/sjd"
# What the Hub repo holds of the repository root: the package sources + build files, the recipe, the card, and
# the research harness (so the build, not the upload, is what keeps it out of the wheel).
HUB_FILES = ["README.md", "LICENSE", "setup.cfg", "pyproject.toml", "MANIFEST.in", "hf_sjd/**", "custom_generate/**",
             "benchmarks/**"]
IGNORED = ["**/__pycache__/**", "**/*.pyc", "*.egg-info/**"]


def run(args: list[str], env: dict, cwd: Path, timeout: int = 600) -> str:
    result = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, args))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result.stdout


def checkout_package_files() -> set[str]:
    """Every file under the checkout's hf_sjd/ (modules and data), as wheel paths."""
    return {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "hf_sjd").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("packaging")
    with LocalHub(root / "hub") as hub:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=hub.url, token="hf_local_test_token")
        api.create_repo(HUB_REPO)
        api.upload_folder(repo_id=HUB_REPO, folder_path=REPO_ROOT, allow_patterns=HUB_FILES, ignore_patterns=IGNORED,
                          commit_message="the repository root as a Hub repo")
        env = hub_env(hub, root / "hf-home")
        env.pop("PYTHONPATH", None)
        # The README's install line: hf download <repo> --local-dir hf_sjd-src && pip install ./hf_sjd-src
        # (pip wheel + pip install of the wheel is the same build, split so the wheel can be inspected;
        # --no-build-isolation: build with the installed setuptools, no index needed).
        run([sys.executable, "-m", "huggingface_hub.cli.hf", "download", HUB_REPO, "--local-dir", str(root / "src")],
            env, root)
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(root / "src"),
             "-w", str(root / "wheels")], env, root)
        wheel = next((root / "wheels").glob("hf_sjd-*.whl"))
        target = root / "fresh"
        run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target),
             str(wheel)], env, root)
        env["PYTHONPATH"] = str(target)
        work = root / "work"  # cwd of every check: outside the checkout
        work.mkdir()
        yield SimpleNamespace(hub=hub, wheel=wheel, target=target, env=env, work=work, src=root / "src")
        assert hub.unknown_routes == []


def python(installed, code: str) -> str:
    return run([sys.executable, "-c", code], installed.env, installed.work)


def test_wheel_ships_exactly_the_package_files_of_the_checkout(installed):
    names = {n for n in zipfile.ZipFile(installed.wheel).namelist() if n.startswith("hf_sjd/")}
    expected = checkout_package_files()
    assert names == expected, f"missing from the wheel: {sorted(expected - names)}; extra: {sorted(names - expected)}"
    assert {"hf_sjd/jacobi/__init__.py", "hf_sjd/reference/weights/ar/phrases/phrases.safetensors"} <= names
    everything = zipfile.ZipFile(installed.wheel).namelist()
    assert not any(".egg-info" in n or "__pycache__" in n for n in everything)
    assert (installed.src / "benchmarks" / "suites.py").is_file()  # in the source the wheel was built from ...
    assert not any(n.startswith("benchmarks/") or "/benchmarks/" in n for n in everything)  # ... not in the wheel
    assert any(".dist-info/" in n and n.endswith("LICENSE") for n in everything)  # the Apache-2.0 text


def test_installed_package_imports_every_module_from_the_fresh_target(installed):
    out = python(installed, """
import importlib, json, pkgutil
import hf_sjd
modules = ["hf_sjd"] + [m.name for m in pkgutil.walk_packages(hf_sjd.__path__, "hf_sjd.")]
modules = [m for m in modules if not m.endswith("__main__")]  # runs the CLI: the main-job test runs it
files = {name: importlib.import_module(name).__file__ for name in modules}
from hf_sjd import reference
ref = reference.load()
hf_sjd.enable(ref.model)
print(json.dumps({"files": files, "library": ref.model.sjd_adapter.default_phrase_library}))
""")
    result = json.loads(out.strip().splitlines()[-1])
    expected = {".".join(Path(p).with_suffix("").parts).removesuffix(".__init__")
                for p in checkout_package_files() if p.endswith(".py") and not p.endswith("__main__.py")}
    assert set(result["files"]) == expected
    target = str(installed.target.resolve())
    assert all(str(Path(f).resolve()).startswith(target) for f in result["files"].values()), result["files"]
    # The reference model's default phrase library is the installed copy's ar/phrases/ folder.
    assert Path(result["library"]).resolve() == installed.target.resolve() / "hf_sjd/reference/weights/ar/phrases"


def test_installed_package_runs_its_bench_without_the_harness(installed):
    """``hf-sjd bench`` needs nothing of benchmarks/ (not importable from the fresh install) and finds the shipped
    classifier for its quality columns."""
    out_dir = installed.work / "bench"
    run([sys.executable, "-m", "hf_sjd", "bench", "--methods", "ar,sjd", "--num-images", "1", "--threads", "1",
         "--quiet", "--out", str(out_dir)], installed.env, installed.work)
    rows = json.loads((out_dir / "results.json").read_text())["methods"]
    assert list(rows) == ["ar", "sjd"] and all(r["num_images"] == 1 and r["class_accuracy"] is not None
                                               for r in rows.values())
    missing = python(installed, "import importlib.util; print(importlib.util.find_spec('benchmarks') is None)")
    assert missing.strip().splitlines()[-1] == "True"


def test_installed_package_runs_the_main_job_with_sjd_pv(installed):
    out_dir = installed.work / "out"
    run([sys.executable, "-m", "hf_sjd", "generate", "coffee", "--num-images", "1", "--method", "sjd-pv",
         "--batch-size", "1", "--out", str(out_dir)], installed.env, installed.work)
    assert (out_dir / "sjd-pv" / "coffee-0.png").is_file()
    stats = json.loads((out_dir / "stats.json").read_text())
    assert "sjd-pv" in json.dumps(stats)


def test_hub_recipe_runs_from_the_hub_and_from_a_local_path_with_the_installed_package(installed):
    """transformers loads custom_generate/ from the Hub repo (requirements checked against the installed
    wheel's metadata) and from the downloaded folder; both equal the enabled model's own strategy."""
    out = python(installed, f"""
import json, torch, hf_sjd
from hf_sjd import reference
assert hf_sjd.__file__.startswith({str(installed.target)!r}), hf_sjd.__file__
ref = reference.load()
prompt = ref.prompt_ids(["coffee"])
def run(model, **kwargs):
    torch.manual_seed(0)
    return model.generate(prompt, do_sample=True, top_k=100, max_new_tokens=256, jacobi_window=8, **kwargs)
from_hub = run(ref.model, custom_generate={HUB_REPO!r}, trust_remote_code=True, sjd_method="sjd")
from_path = run(ref.model, custom_generate={str(installed.src)!r}, trust_remote_code=True, sjd_method="sjd")
hf_sjd.enable(ref.model)
named = run(ref.model, custom_generate="sjd")
assert from_hub.shape == (1, 257) and torch.equal(from_hub, from_path) and torch.equal(from_hub, named)
try:
    run(ref.model, custom_generate={HUB_REPO!r}, trust_remote_code=True, sjd_method="sjd-fast")
except ValueError as error:
    print(json.dumps({{"error": str(error)}}))
""")
    assert "sjd_method='sjd-fast' is not supported; allowed values:" in out and "'mc-sjd'" in out
    resolves = [path for method, path, status in installed.hub.requests if "/resolve/" in path and status == 200]
    assert any(path.endswith("/custom_generate/generate.py") for path in resolves)
    assert any(path.endswith("/custom_generate/requirements.txt") for path in resolves)


def test_recipe_requirements_are_parsed_as_written():
    """transformers reads one ``name<op>version`` per line and ignores anything after it (``>=5.24,<6``
    would silently drop ``<6``): every requirement line must be exactly one specifier, and all of them
    must hold in this environment (the check transformers runs before loading generate.py)."""
    import importlib.metadata

    from packaging.version import Version
    from transformers.dynamic_module_utils import check_python_requirements
    from transformers.utils.import_utils import split_package_version

    lines = [line.strip() for line in (REPO_ROOT / "custom_generate" / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    specs = [split_package_version(line) for line in lines]
    assert ["".join(spec) for spec in specs] == lines
    assert {name for name, _, _ in specs} >= {"hf_sjd", "transformers", "torch"}
    assert ("transformers", "<", MAX_TRANSFORMERS) in specs and ("transformers", ">=", MIN_TRANSFORMERS) in specs
    assert Version(importlib.metadata.version("transformers")) < Version("6")
    check_python_requirements(str(REPO_ROOT), requirements_file="custom_generate/requirements.txt")


def test_root_readme_is_a_custom_generate_model_card():
    from huggingface_hub import ModelCard

    card = ModelCard((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert card.data.library_name == "transformers"
    assert "custom_generate" in card.data.tags
    assert (REPO_ROOT / "custom_generate" / "generate.py").is_file()
    assert "## Install" in card.text and "## From the Hub" in card.text

