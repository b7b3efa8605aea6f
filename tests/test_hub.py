"""Hub I/O over real HTTP: a local Hub server (``tests/hub_server.py``), nothing in huggingface_hub patched.

``huggingface_hub`` reads ``HF_ENDPOINT`` once, at import, and this test process imported it long ago; so
what must go through the library's default endpoint (``PhraseLibrary.push_to_hub`` / ``from_pretrained``,
transformers' ``from_pretrained`` and ``custom_generate=<repo id>``) runs in a subprocess whose environment
points ``HF_ENDPOINT`` at the server (and ``HF_HOME`` at a fresh cache). The test process talks to the same
server through ``HfApi(endpoint=hub.url)`` and reads its storage directly to check what was pushed.

Invariants: each pushed revision (branch, tag, commit) loads its own contents; a library pulled from the Hub
drives ``sjd-pv`` exactly as the same library in memory; the build script's push stores exactly what it saved;
the reference model finds its default library in its own repo / folder wherever it lives. (The
``custom_generate`` recipe loaded from the Hub is tested on the installed wheel: tests/test_packaging.py.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hub_server import LocalHub, hub_env

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_local_test_token"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with LocalHub(tmp_path_factory.mktemp("hub")) as hub:
        yield hub
        assert hub.unknown_routes == []


@pytest.fixture
def env(hub, tmp_path):
    return hub_env(hub, tmp_path / "hf-home")


def run_python(code: str, env: dict, cwd: Path) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line last. Assertions inside fail the test."""
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"subprocess failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_phrase_library_push_revisions_and_sjd_pv_from_the_hub(hub, env, tmp_path):
    out = run_python("""
import json, torch, hf_sjd
from huggingface_hub import HfApi
from hf_sjd import PhraseLibrary, reference

ref = reference.load()
hf_sjd.enable(ref.model)
shipped = PhraseLibrary.from_pretrained(ref.model.sjd_adapter.default_phrase_library)
v1, v2 = shipped.first(200), shipped.first(400)
repo = "me/phrases"
first = v1.push_to_hub(repo)                       # creates the repo, pushes to main
api = HfApi()
first_commit = api.model_info(repo).sha
api.create_tag(repo, tag="v1")
api.create_branch(repo, branch="v2")
v2.push_to_hub(repo, branch="v2")
fp = ref.model.sjd_adapter.tokenizer_fingerprint
loaded = {rev: PhraseLibrary.from_pretrained(repo, revision=rev, fingerprint=fp)
          for rev in (None, "v1", "v2", first_commit)}
assert {rev: len(lib) for rev, lib in loaded.items()} == {None: 200, "v1": 200, "v2": 400, first_commit: 200}
assert loaded["v2"].phrase_list() == v2.phrase_list() and loaded[None].phrase_list() == v1.phrase_list()
assert torch.equal(loaded["v2"].counts, v2.counts)

prompt = ref.prompt_ids(["coffee"])
def run(library):
    torch.manual_seed(0)
    return ref.model.generate(prompt, custom_generate="sjd-pv", phrase_library=library, do_sample=True, top_k=100,
                              max_new_tokens=256, return_dict_in_generate=True)
from_hub, in_memory = run(repo), run(v1)
assert from_hub.sequences.shape == (1, 257)
assert torch.equal(from_hub.sequences, in_memory.sequences)
assert from_hub.stats.num_forward_passes == in_memory.stats.num_forward_passes
v1.save_pretrained("v1-local")
print(json.dumps({"first_commit": first_commit, "forwards": from_hub.stats.num_forward_passes}))
""", env, tmp_path)
    # What the server stores is byte for byte what save_pretrained writes.
    stored = hub.files("me/phrases", out["first_commit"])
    for name in ("phrases.safetensors", "phrase_library.json", "README.md"):
        assert stored[name] == (tmp_path / "v1-local" / name).read_bytes(), name
    assert set(hub.files("me/phrases", "v2")) == set(stored)
    assert out["forwards"] < 256


def test_a_hub_library_over_the_loaders_limit_is_refused_before_its_download(hub, env, tmp_path):
    """from_pretrained reads at most MAX_FILE_BYTES: a larger phrases.safetensors on the Hub is refused from its
    HEAD (size), never downloaded (the limit is lowered to what this small library exceeds)."""
    out = run_python("""
import json, torch
import hf_sjd.phrases as phrases
from hf_sjd import PhraseLibrary

library = PhraseLibrary.from_token_sequences(torch.randint(0, 16, (8, 32), generator=torch.Generator().manual_seed(0)),
                                             num_merges=8, codebook_size=16)
library.push_to_hub("me/big-phrases")
phrases.MAX_FILE_BYTES = 300
try:
    PhraseLibrary.from_pretrained("me/big-phrases")
except ValueError as error:
    message = str(error)
print(json.dumps({"error": message}))
""", env, tmp_path)
    assert re.fullmatch(r"phrase library 'me/big-phrases': its phrases\.safetensors is \d+ bytes on the Hub; "
                        r"from_pretrained reads at most 300, so it is not downloaded", out["error"]), out["error"]
    downloads = [path for method, path, status in hub.requests
                 if method == "GET" and path.startswith("/me/big-phrases/resolve/")]
    assert downloads == []


def test_build_phrase_library_script_pushes_to_the_hub(hub, env, tmp_path):
    from hf_sjd.reference.data import make_dataset, to_pil

    images = tmp_path / "images"
    images.mkdir()
    crops, _ = make_dataset(1, seed=7)  # [16, 3, 64, 64]
    for i, image in enumerate(to_pil(crops[:6])):
        image.save(images / f"{i}.png")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "build_phrase_library.py"), "--dataset", str(images),
         "--merges", "30", "--out", str(tmp_path / "lib"), "--push-to-hub", "me/built-phrases", "--no-progress",
         "--threads", "1"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    stored = hub.files("me/built-phrases")
    for name in ("phrases.safetensors", "phrase_library.json", "README.md"):
        assert stored[name] == (tmp_path / "lib" / name).read_bytes(), name
    metadata = json.loads(stored["phrase_library.json"])
    assert metadata["corpus"]["sequences"] == 6 and metadata["num_merges"] == 30
    card = stored["README.md"].decode()
    assert card.startswith("---\n") and "library_name: hf_sjd" in card


def upload_reference_model(hub, repo_id: str, ignore: tuple = ()) -> None:
    from huggingface_hub import HfApi

    from hf_sjd import reference

    api = HfApi(endpoint=hub.url, token=TOKEN)
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=reference.weights_dir() / "ar",
                      ignore_patterns=["**/__pycache__/**", *ignore])


def test_reference_model_from_the_hub_finds_its_default_library(hub, env, tmp_path):
    """The reference model pushed as one folder and pulled with ``from_pretrained(repo_id)`` runs ``sjd-pv``
    with its default library (fetched from its own repo's ``phrases/``, fingerprint check on) exactly as the
    shipped model does. (The ``custom_generate`` recipe from the Hub: tests/test_packaging.py, on the
    installed wheel.)"""
    upload_reference_model(hub, "me/sjd-reference")
    upload_reference_model(hub, "me/no-phrases", ignore=["phrases/*"])
    out = run_python("""
import json, torch, hf_sjd
from transformers import LlamaForCausalLM
from hf_sjd import reference

ref = reference.load()  # fp32, as the pulled copy below
hf_sjd.enable(ref.model)
pulled = hf_sjd.enable(LlamaForCausalLM.from_pretrained("me/sjd-reference", dtype=torch.float32).eval())
library = pulled.sjd_adapter.default_phrase_library
prompt = ref.prompt_ids(["coffee"])
def run(model):
    torch.manual_seed(0)
    return model.generate(prompt, custom_generate="sjd-pv", do_sample=True, top_k=100, max_new_tokens=256)
assert torch.equal(run(pulled), run(ref.model))
bare = hf_sjd.enable(LlamaForCausalLM.from_pretrained("me/no-phrases", dtype=torch.float32))
try:
    run(bare)
except FileNotFoundError as error:
    message = str(error)
print(json.dumps({"library": library, "error": message}))
""", env, tmp_path)
    library = Path(out["library"])
    assert library.name == "phrases" and str(tmp_path / "hf-home") in str(library)
    assert sorted(p.name for p in library.iterdir()) == ["README.md", "phrase_library.json", "phrases.safetensors"]
    assert out["error"].startswith("the model's config names phrase_library='phrases', a subfolder of its Hub repo "
                                   "me/no-phrases, but the repo has no phrases/ folder")
    resolved = {path for method, path, status in hub.requests if status == 200 and "/resolve/" in path}
    assert any(p.startswith("/me/sjd-reference/resolve/") and p.endswith("/phrases/phrases.safetensors")
               for p in resolved)


def test_reference_model_copied_elsewhere_uses_the_copy_of_its_library(tmp_path):
    import hf_sjd
    from transformers import LlamaForCausalLM

    from hf_sjd import reference

    shutil.copytree(reference.weights_dir() / "ar", tmp_path / "ar")
    model = hf_sjd.enable(LlamaForCausalLM.from_pretrained(tmp_path / "ar", dtype=torch.float32).eval())
    assert Path(model.sjd_adapter.default_phrase_library) == (tmp_path / "ar" / "phrases").resolve()
    out = model.generate(torch.tensor([[514]]), custom_generate="sjd-pv", do_sample=True, top_k=100,
                         max_new_tokens=256, return_dict_in_generate=True)  # fingerprint check on
    assert out.sequences.shape == (1, 257) and out.stats.num_forward_passes < 256

    shutil.rmtree(tmp_path / "ar" / "phrases")
    with pytest.raises(FileNotFoundError, match=r"phrase_library='phrases', a subfolder of the model's folder, but "
                                                r".*phrases does not exist"):
        model.generate(torch.tensor([[514]]), custom_generate="sjd-pv", do_sample=True, top_k=100, max_new_tokens=256)
