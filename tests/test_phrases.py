"""PhraseLibrary (SJD-PV, arXiv:2603.06666): BPE against a pure-Python reference, counts, sub-libraries,
save/load/push round trips, compatibility and input errors, and the shipped reference library."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import hf_sjd.phrases as phrases_module
from hf_sjd import PhraseLibrary
from hf_sjd.phrases import METADATA_FILE, PHRASES_FILE, _code_point_base, _train_bpe


# --------------------------------------------------------------------------- reference BPE
def reference_bpe(words: list[list[int]], codebook_size: int, num_merges: int, min_frequency: int = 2):
    """Textbook BPE, written for clarity. Returns (merges as (left id, right id), phrases in id order).

    Symbols: code c has id c, a new symbol the next free id (a symbol whose code sequence already exists
    keeps its id). Each step recounts adjacent pairs (overlapping: "aaa" holds the pair (a, a) twice),
    merges the most frequent pair -- ties go to the smallest (left id, right id), which is the rule of
    tokenizers' BpeTrainer (its priority queue orders equal counts by ascending pair) -- and replaces the
    pair left to right. Stops at codebook_size + num_merges symbols or when no pair reaches min_frequency.
    """
    word_counts = Counter(tuple(w) for w in words)
    segmentation = {w: list(w) for w in word_counts}
    expansion = {c: (c,) for c in range(codebook_size)}
    ids = {(c,): c for c in range(codebook_size)}
    merges = []
    while len(ids) < codebook_size + num_merges:
        pair_counts = Counter()
        for word, n in word_counts.items():
            symbols = segmentation[word]
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] += n
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        if pair_counts[best] < max(1, min_frequency):
            break
        left, right = best
        new = ids.setdefault(expansion[left] + expansion[right], len(ids))
        expansion[new] = expansion[left] + expansion[right]
        merges.append(best)
        for word in word_counts:
            symbols, out, i = segmentation[word], [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                    out.append(new)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            segmentation[word] = out
    return merges, [list(expansion[i]) for i in range(codebook_size, len(ids))], segmentation


def trainer_bpe(words: list[list[int]], codebook_size: int, num_merges: int, min_frequency: int = 2):
    """The library's tokenizers-backed trainer on the same words."""
    import numpy as np

    base = _code_point_base(codebook_size)
    flat = np.concatenate([np.asarray(w, dtype=np.int64) for w in words])
    stops = np.cumsum([len(w) for w in words])
    text = (flat + base).astype("<u4").tobytes().decode("utf-32-le")
    merges, strings = _train_bpe(text, stops - np.array([len(w) for w in words]), stops, codebook_size, base,
                                 num_merges, min_frequency, show_progress=False)
    return merges, [[ord(ch) - base for ch in s] for s in strings]


def random_corpus(seed: int) -> tuple[list[list[int]], int, int]:
    rng = random.Random(seed)
    codebook_size = rng.choice([2, 3, 5, 16, 64])
    kind = seed % 3
    if kind == 0:  # i.i.d. codes, many ties
        words = [[rng.randrange(codebook_size) for _ in range(rng.randint(1, 24))] for _ in range(rng.randint(1, 30))]
    elif kind == 1:  # runs of repeated codes (flat image regions): overlapping pairs
        words = [[(i // rng.randint(1, 5)) % codebook_size for i in range(rng.randint(2, 32))] for _ in range(20)]
    else:  # noisy shifts of one motif (textures)
        motif = [rng.randrange(codebook_size) for _ in range(7)]
        words = [[motif[(j + k) % 7] if rng.random() < 0.85 else rng.randrange(codebook_size) for j in range(16)]
                 for k in range(rng.randint(2, 25))]
    return words, codebook_size, rng.randint(1, 80)


@pytest.mark.parametrize("seed", range(24))
def test_trainer_merges_equal_reference_bpe(seed):
    words, codebook_size, num_merges = random_corpus(seed)
    ref_merges, ref_phrases, _ = reference_bpe(words, codebook_size, num_merges)
    merges, phrases = trainer_bpe(words, codebook_size, num_merges)
    assert merges == ref_merges  # same pairs in the same order, ties included
    assert phrases == ref_phrases
    assert len(ref_merges) > 0 or seed % 3 == 0


def test_library_phrases_equal_reference_bpe_with_rows():
    rng = random.Random(7)
    images = [[rng.choice([0, 0, 1, 2, 3]) for _ in range(32)] for _ in range(40)]  # 40 images, 4x8 grid
    library = PhraseLibrary.from_token_sequences(images, num_merges=30, row_length=8, codebook_size=4)
    rows = [image[r:r + 8] for image in images for r in range(0, 32, 8)]
    _, ref_phrases, _ = reference_bpe(rows, 4, 30)
    assert library.phrase_list() == ref_phrases
    assert len(library) == 30 and library.max_length <= 8  # no phrase crosses a row end
    whole = PhraseLibrary.from_token_sequences(images, num_merges=30, codebook_size=4)
    assert whole.phrase_list() == reference_bpe(images, 4, 30)[1]


def test_expansion_round_trip():
    """Each merged symbol expands to its parts' expansions, and expanding a BPE segmentation with the
    library's tensors gives back the corpus."""
    words, codebook_size, _ = random_corpus(4)
    library = PhraseLibrary.from_token_sequences(words, num_merges=40, codebook_size=codebook_size)
    merges, _, segmentation = reference_bpe(words, codebook_size, 40)
    table = library.phrase_list()

    def expand(symbol: int) -> list[int]:
        return [symbol] if symbol < codebook_size else table[symbol - codebook_size]

    for k, (left, right) in enumerate(merges):
        assert table[k] == expand(left) + expand(right)
    for word in words:
        assert [c for s in segmentation[tuple(word)] for c in expand(s)] == word
    padded = library.phrases
    assert padded.dtype == torch.long and (padded[:, :2] >= 0).all()
    assert torch.equal((padded >= 0).sum(1), library.lengths)
    assert ((padded == -1) == (torch.arange(padded.shape[1]) >= library.lengths[:, None])).all()


def test_counts_hand_made():
    # [1, 2] and [1, 2, 3] occur 4 times; counts are overlapping: [0, 0] is 1 + 3 (a run of four zeros)
    # and [5, 5] is 3 (a run of four fives), although BPE segments those runs into 2 symbols each.
    corpus = [[1, 2, 3, 1, 2, 3, 0, 0], [1, 2, 3, 4, 1, 2, 3, 0], [5, 5, 5, 5, 0, 0, 0, 0]]
    library = PhraseLibrary.from_token_sequences(corpus, num_merges=4, codebook_size=6)
    assert library.phrase_list() == [[0, 0], [1, 2], [1, 2, 3], [5, 5]]  # (0, 0) wins the 4-way tie at 4
    assert library.counts.tolist() == [4, 4, 4, 3]
    # With rows of 2, nothing crosses a row end: [2, 0] occurs 3 times in the sequences but only twice
    # inside a row (the third straddles the rows [1, 2] | [0, 0]); [1, 2] only straddles rows.
    corpus = [[0, 1, 2, 0], [0, 1, 2, 0], [1, 2, 0, 0]]
    rows = PhraseLibrary.from_token_sequences(corpus, num_merges=2, row_length=2, codebook_size=3)
    assert dict(zip(map(tuple, rows.phrase_list()), rows.counts.tolist())) == {(0, 1): 2, (2, 0): 2}
    whole = PhraseLibrary.from_token_sequences(corpus, num_merges=2, codebook_size=3)
    assert whole.phrase_list() == [[1, 2], [1, 2, 0]] and whole.counts.tolist() == [3, 3]


def test_counts_equal_brute_force():
    words, codebook_size, _ = random_corpus(5)
    library = PhraseLibrary.from_token_sequences(words, num_merges=60, codebook_size=codebook_size)

    def occurrences(phrase: list[int]) -> int:
        n = len(phrase)
        return sum(w[i:i + n] == phrase for w in words for i in range(len(w) - n + 1))

    assert library.counts.tolist() == [occurrences(p) for p in library.phrase_list()]
    assert (library.counts >= 2).all()


def test_first_equals_smaller_build():
    rng = random.Random(3)
    corpus = torch.tensor([[rng.choice([0, 1, 1, 2, 3, 4, 5]) for _ in range(64)] for _ in range(30)])
    full = PhraseLibrary.from_token_sequences(corpus, num_merges=120, codebook_size=6, fingerprint="abc")
    for m in (1, 17, 120):
        small = PhraseLibrary.from_token_sequences(corpus, num_merges=m, codebook_size=6, fingerprint="abc")
        sub = full.first(m)
        for name in ("phrases", "lengths", "counts"):
            assert torch.equal(getattr(sub, name), getattr(small, name)), (m, name)
        assert sub.num_merges == m and sub.fingerprint == "abc"
        assert sub.metadata["merges_applied"] == small.metadata["merges_applied"] == len(small), m
    with pytest.raises(ValueError, match=r"num_merges must be in \[1, 120\]"):
        full.first(121)
    with pytest.raises(ValueError, match="num_merges"):
        full.first(0)


def test_large_codebooks_use_private_use_plane():
    for codebook_size in (16384, 20993, 32768, 2 ** 17):
        top = codebook_size - 1
        corpus = [[top, 0, top, 0, 7], [top, 0, top, 0, 7]]
        library = PhraseLibrary.from_token_sequences(corpus, num_merges=3, codebook_size=codebook_size)
        assert library.phrase_list()[0] == [top, 0]
        assert [top, 0, top, 0, 7] in library.phrase_list()
    assert _code_point_base(20992) == 0x4E00 and _code_point_base(20993) == 0xF0000


def small_library(**kwargs) -> PhraseLibrary:
    generator = torch.Generator().manual_seed(1)
    corpus = torch.randint(0, 4, (20, 16), generator=generator)
    return PhraseLibrary.from_token_sequences(corpus, num_merges=12, codebook_size=4, fingerprint="f00d",
                                              source={"dataset": "org/images", "split": "train"}, grid=(4, 4),
                                              **kwargs)


def assert_same(a: PhraseLibrary, b: PhraseLibrary) -> None:
    for name in ("phrases", "lengths", "counts"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype == torch.long and torch.equal(x, y)
    strip = lambda m: {k: v for k, v in m.items() if k != "loaded_from"}  # noqa: E731
    assert strip(a.metadata) == strip(b.metadata)


def test_save_load_round_trip(tmp_path):
    library = small_library()
    library.save_pretrained(tmp_path / "lib")
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["README.md", METADATA_FILE, PHRASES_FILE]
    loaded = PhraseLibrary.from_pretrained(tmp_path / "lib", fingerprint="f00d", codebook_size=4)
    assert_same(library, loaded)
    meta = json.loads((tmp_path / "lib" / METADATA_FILE).read_text())
    import hf_sjd

    assert meta["codebook_size"] == 4 and meta["fingerprint"] == "f00d" and meta["num_merges"] == 12
    assert meta["hf_sjd_version"] == hf_sjd.__version__ and meta["format_version"] == 1
    assert meta["source"] == {"dataset": "org/images", "split": "train"} and meta["grid"] == [4, 4]
    assert meta["row_length"] is None and meta["corpus"]["tokens"] == 320
    from huggingface_hub import ModelCard

    card = ModelCard.load(tmp_path / "lib" / "README.md")
    assert card.data.library_name == "hf_sjd" and "phrase-library" in card.data.tags
    assert card.data.datasets == ["org/images"] and "2603.06666" in card.text
    # Saving again over it replaces the files in place and leaves no temporary folder.
    library.first(5).save_pretrained(tmp_path / "lib")
    assert len(PhraseLibrary.from_pretrained(tmp_path / "lib")) == 5
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["README.md", METADATA_FILE, PHRASES_FILE]


def test_the_model_cards_usage_runs_on_its_library(tmp_path):
    """Each line of the card's usage example runs on the library it describes (a small one included)."""
    import re

    from huggingface_hub import ModelCard

    empty = PhraseLibrary(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                          torch.zeros(0, dtype=torch.long))
    for library in (small_library(), small_library().first(1), empty):
        library.save_pretrained(tmp_path / "lib")
        usage = ModelCard.load(tmp_path / "lib" / "README.md").text.split("## Usage")[1]
        calls = re.findall(r"^(library\.[^\n#]+?)\s*(?:#|$)", usage, flags=re.M)
        assert any(".first(" in call for call in calls) == (library.num_merges > 0), usage
        for call in calls:
            eval(call, {"library": library})  # noqa: S307: the card's own example


def test_a_model_without_a_fingerprint_warns_that_the_librarys_cannot_be_checked(tmp_path):
    """A model that records no VQ tokenizer fingerprint cannot check a library's: SJD-PV warns, as it does for a
    library that records none (the mirror case), rather than accepting any library silently."""
    import warnings
    from types import SimpleNamespace

    from hf_sjd.phrases import resolve_library

    library = small_library()
    library.save_pretrained(tmp_path / "lib")
    unknown = SimpleNamespace(tokenizer_fingerprint=None, default_phrase_library=None)
    for given in (library, str(tmp_path / "lib")):
        with pytest.warns(UserWarning, match="the model records no VQ tokenizer fingerprint.*'f00d'"):
            assert resolve_library(given, unknown).phrase_list() == library.phrase_list()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resolve_library(given, unknown, ignore_fingerprint=True)
            resolve_library(given, SimpleNamespace(tokenizer_fingerprint="f00d", default_phrase_library=None))


def test_constructor_checks_layout():
    with pytest.raises(ValueError, match="followed by -1 padding"):
        PhraseLibrary(torch.tensor([[-1, 3, 4]]), torch.tensor([2]), torch.tensor([5]))
    with pytest.raises(ValueError, match="followed by -1 padding"):
        PhraseLibrary(torch.tensor([[3, 4, -2]]), torch.tensor([2]), torch.tensor([5]))
    with pytest.raises(ValueError, match="expected phrases"):
        PhraseLibrary(torch.tensor([[1, 2]]), torch.tensor([2, 2]), torch.tensor([5]))
    assert PhraseLibrary(torch.tensor([[3, 4, -1]]), torch.tensor([2]), torch.tensor([5])).phrase_list() == [[3, 4]]


def test_to_device_and_repr():
    library = small_library().to("cpu")
    assert library.device == torch.device("cpu") and "PhraseLibrary(phrases=12" in repr(library)


def test_failed_save_leaves_nothing_partial(tmp_path, monkeypatch):
    library = small_library()
    old = library.first(3)
    old.save_pretrained(tmp_path / "lib")
    before = {p.name: p.read_bytes() for p in (tmp_path / "lib").iterdir()}

    def broken_card(self, *args, **kwargs):  # fails after phrases.safetensors was written to the temp folder
        raise OSError("disk full")

    monkeypatch.setattr(PhraseLibrary, "generate_model_card", broken_card)
    with pytest.raises(OSError, match="disk full"):
        library.save_pretrained(tmp_path / "lib")
    assert {p.name: p.read_bytes() for p in (tmp_path / "lib").iterdir()} == before  # old library intact
    with pytest.raises(OSError, match="disk full"):
        library.save_pretrained(tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()  # a first save that fails leaves not even an empty folder


def test_fingerprint_mismatch(tmp_path):
    small_library().save_pretrained(tmp_path / "lib")
    with pytest.raises(ValueError) as error:
        PhraseLibrary.from_pretrained(tmp_path / "lib", fingerprint="beef")
    message = str(error.value)
    assert "'f00d'" in message and "'beef'" in message and "ignore_fingerprint=True" in message
    assert PhraseLibrary.from_pretrained(tmp_path / "lib", fingerprint="beef", ignore_fingerprint=True).fingerprint == "f00d"
    with pytest.raises(ValueError, match="codebook_size=4.*codebook_size is 8"):
        PhraseLibrary.from_pretrained(tmp_path / "lib", codebook_size=8)
    with pytest.raises(ValueError, match="do not fit"):
        PhraseLibrary.from_pretrained(tmp_path / "lib", codebook_size=2, ignore_fingerprint=True)
    # the tokenizer's own fingerprint with another size: the size was inferred (max code + 1); codes that fit pass
    assert PhraseLibrary.from_pretrained(tmp_path / "lib", fingerprint="f00d", codebook_size=8).codebook_size == 4
    with pytest.raises(ValueError, match="do not fit"):
        PhraseLibrary.from_pretrained(tmp_path / "lib", fingerprint="f00d", codebook_size=2)


def test_corrupt_or_missing_files(tmp_path):
    small_library().save_pretrained(tmp_path / "lib")
    tensors = tmp_path / "lib" / PHRASES_FILE
    good = tensors.read_bytes()
    tensors.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(ValueError, match=f"cannot read phrase library tensors .*{PHRASES_FILE}"):
        PhraseLibrary.from_pretrained(tmp_path / "lib")
    tensors.write_bytes(good)
    (tmp_path / "lib" / METADATA_FILE).write_text("{ truncated")
    with pytest.raises(ValueError, match=f"cannot read phrase library metadata .*{METADATA_FILE}"):
        PhraseLibrary.from_pretrained(tmp_path / "lib")
    (tmp_path / "lib" / METADATA_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=METADATA_FILE):
        PhraseLibrary.from_pretrained(tmp_path / "lib")
    (tmp_path / "other").mkdir()
    small_library().first(2).save_pretrained(tmp_path / "other")
    (tmp_path / "lib" / METADATA_FILE).write_bytes((tmp_path / "other" / METADATA_FILE).read_bytes())
    with pytest.raises(ValueError, match="different saves"):
        PhraseLibrary.from_pretrained(tmp_path / "lib")


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(sequences=[]), ValueError, r"sequences is empty"),
    (dict(sequences=torch.zeros(0, 4, dtype=torch.long)), ValueError, r"sequences is empty"),
    (dict(sequences=[[1, 2], []]), ValueError, r"sequences\[1\] is empty"),
    (dict(sequences=[[1, 2], [3, 600]], codebook_size=512), ValueError,
     r"sequences\[1\] contains id 600 outside the allowed range \[0, 512\)"),
    (dict(sequences=[[1, -1]]), ValueError, r"sequences\[0\] contains id -1 outside the allowed range \[0, "),
    (dict(sequences=[[0.5, 1.0]]), TypeError, r"sequences\[0\] has dtype float64; VQ codes must be integers"),
    (dict(sequences=torch.rand(2, 4)), TypeError, r"sequences has dtype float32; VQ codes must be integers"),
    (dict(sequences=[[[1, 2]]]), ValueError, r"sequences\[0\] has shape \(1, 2\); each sequence must be 1-D"),
    (dict(sequences="1234"), TypeError, r"sequences must be an iterable"),
    (dict(num_merges=0), ValueError, r"num_merges must be an integer >= 1 and <= 53687091, got 0"),
    (dict(num_merges=2.5), TypeError, r"num_merges must be an integer >= 1 and <= 53687091, got 2.5"),
    (dict(num_merges="8000"), TypeError, r"num_merges must be an integer >= 1"),
    # the sizes the tools can hold: a Rust abort (10^9 merges), an OverflowError (10^20), a wrapped int32
    (dict(num_merges=10**9), ValueError, r"num_merges must be an integer >= 1 and <= 53687091, got 1000000000"),
    (dict(num_merges=10**20), ValueError, r"num_merges must be an integer >= 1 and <= 53687091, got 10{20}"),
    (dict(row_length=0), ValueError, r"row_length must be None or an integer >= 1 and <= 2147483647, got 0"),
    (dict(row_length=10**20), ValueError, r"row_length must be None or an integer >= 1 and <= 2147483647"),
    (dict(row_length=3), ValueError, r"sequences\[0\] has length 4, not a multiple of row_length=3"),
    (dict(codebook_size=2 ** 17 + 1), ValueError, r"codebook_size must be <= 131072"),
    (dict(min_frequency=0), ValueError, r"min_frequency must be an integer >= 1"),
    (dict(min_frequency=2**64), ValueError, r"min_frequency must be an integer >= 1 and <= 2147483647"),
    (dict(grid=(16, 2**40)), ValueError, r"grid must be an integer >= 1 and <= 2147483647"),
    (dict(grid="16x16"), TypeError, r"grid must be None or two integers \(rows, cols\)"),
    (dict(grid=(2, 3)), ValueError, r"sequences\[0\] has length 4, not the 2 x 3 = 6 codes of grid=\(2, 3\)"),
    # a uint64 id past int64 would wrap to a negative id
    (dict(sequences=[np.array([1, 2**64 - 1], dtype=np.uint64)]), ValueError,
     r"sequences\[0\] contains id 18446744073709551615 outside the allowed range \[0, 131072\)"),
    (dict(sequences=np.array([[1, 2**63]], dtype=np.uint64)), ValueError,
     r"sequences contains id 9223372036854775808 outside the allowed range"),
    (dict(extra_metadata={"codebook_size": 7}), ValueError, r"extra_metadata may not set \['codebook_size'\]"),
    (dict(extra_metadata={"when": object()}), TypeError, r"extra_metadata must be plain JSON"),
    (dict(extra_metadata={"x": float("nan")}), TypeError, r"extra_metadata must be plain JSON"),
    (dict(source={"dataset": Path("x")}), TypeError, r"source must be plain JSON"),
])
def test_bad_inputs_fail_before_training(kwargs, error, pattern, monkeypatch):
    def no_training(*args, **kw):
        raise AssertionError("training started before the inputs were validated")

    monkeypatch.setattr(phrases_module, "_train_bpe", no_training)
    arguments = {"sequences": [[1, 2, 1, 2]], "num_merges": 4, **kwargs}
    with pytest.raises(error, match=pattern):
        PhraseLibrary.from_token_sequences(**arguments)


def test_push_to_hub_round_trip(tmp_path, monkeypatch):
    """No Hub-compatible server installs from PyPI here (hf-local-hub's wheel lacks its Go server), so only
    HfApi's network calls (create_repo, README validation, create_commit) are faked: the commit's files land
    in a Hub-cache snapshot that the real ``hf_hub_download`` then resolves."""
    import huggingface_hub
    from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl

    cache, commits = tmp_path / "hub-cache", []
    sha = "0123456789abcdef0123456789abcdef01234567"

    def create_repo(self, repo_id, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, **kwargs):
        files = {op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations}
        commits.append((repo_id, files))
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(sha)
        for name, data in files.items():
            (repo / "snapshots" / sha).mkdir(parents=True, exist_ok=True)
            (repo / "snapshots" / sha / name).write_bytes(data)
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/{sha}", commit_message="m",
                          commit_description="", oid=sha)

    def validate_yaml(self, content, **kwargs):  # the Hub's README metadata check: parse it locally instead
        ModelCard(content)

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)  # the plain create_commit path
    monkeypatch.setattr(HfApi, "_validate_yaml", validate_yaml)
    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    library = small_library()
    url = library.push_to_hub("someone/phrases", token="hf_fake")
    assert sha in str(url)
    [(repo_id, files)] = commits
    assert repo_id == "someone/phrases" and sorted(files) == ["README.md", METADATA_FILE, PHRASES_FILE]
    library.save_pretrained(tmp_path / "local")
    assert files[PHRASES_FILE] == (tmp_path / "local" / PHRASES_FILE).read_bytes()
    assert files[METADATA_FILE] == (tmp_path / "local" / METADATA_FILE).read_bytes()
    loaded = PhraseLibrary.from_pretrained("someone/phrases", revision="main", cache_dir=cache, local_files_only=True,
                                           fingerprint="f00d")
    assert_same(library, loaded)


def test_shipped_reference_library_matches_reference_tokenizer():
    from hf_sjd import reference

    ref = reference.load()
    library = PhraseLibrary.from_pretrained(reference.weights_dir() / "ar" / "phrases", fingerprint=ref.vq.fingerprint(),
                                            codebook_size=ref.vq.codebook_size)
    meta = library.metadata
    assert len(library) == meta["num_merges"] == 8000 and meta["grid"] == [16, 16]
    assert meta["source"]["dataset"] == "reference" and "build_phrase_library.py" in meta["build"]["command"]
    assert int(library.phrases.max()) < 512 and (library.counts >= 2).all()
    # Its phrases occur in the reference model's own token statistics: the most frequent phrase of the
    # library appears in freshly tokenized training crops.
    from hf_sjd.reference.data import make_dataset

    images, _ = make_dataset(4, seed=2)
    codes = ref.vq.encode(images).flatten(1)  # [64, 256]
    top = library.phrases[library.counts.argmax(), :library.lengths[library.counts.argmax()]]
    windows = codes.unfold(1, len(top), 1)  # [64, 256 - L + 1, L]
    assert (windows == top).all(-1).any()


# --------------------------------------------------------------------------- whole-artifact saves, ragged loads
def _library_of(seed: int, num_merges: int = 5) -> PhraseLibrary:
    corpus = torch.randint(0, 4, (20, 16), generator=torch.Generator().manual_seed(seed))
    return PhraseLibrary.from_token_sequences(corpus, num_merges=num_merges, codebook_size=4,
                                              fingerprint=f"fp{seed}")


def test_a_save_killed_midway_leaves_the_old_library_and_the_next_save_cleans_up(tmp_path):
    """A real kill (``os._exit`` in a forked child) after the new tensors and metadata are written: the old
    library still loads unchanged, and the killed save's temporary folder is gone after the next save."""
    import os

    old, new = _library_of(1), _library_of(2)
    old.save_pretrained(tmp_path / "lib")
    before = {p.name: p.read_bytes() for p in (tmp_path / "lib").iterdir()}
    pid = os.fork()
    if pid == 0:  # child: die the moment the model card is written, after phrases.safetensors and the json
        try:
            PhraseLibrary.generate_model_card = lambda *a, **k: os._exit(0)
            new.save_pretrained(tmp_path / "lib")
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    assert {p.name: p.read_bytes() for p in (tmp_path / "lib").iterdir()} == before
    assert_same(old, PhraseLibrary.from_pretrained(tmp_path / "lib"))
    assert any(p.name != "lib" for p in tmp_path.iterdir())  # the killed save's temporary folder
    new.save_pretrained(tmp_path / "lib")
    assert [p.name for p in tmp_path.iterdir()] == ["lib"]
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["README.md", METADATA_FILE, PHRASES_FILE]
    assert_same(new, PhraseLibrary.from_pretrained(tmp_path / "lib"))


def test_files_of_two_saves_are_refused_on_load(tmp_path):
    first, second = _library_of(1), _library_of(2)
    assert len(first) == len(second) and first.phrase_list() != second.phrase_list()
    first.save_pretrained(tmp_path / "a")
    second.save_pretrained(tmp_path / "b")
    (tmp_path / "a" / PHRASES_FILE).write_bytes((tmp_path / "b" / PHRASES_FILE).read_bytes())
    with pytest.raises(ValueError, match="different saves"):
        PhraseLibrary.from_pretrained(tmp_path / "a")


def test_save_refuses_a_folder_holding_other_files(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds files that are not part of a phrase library \(config.json\)"):
        small_library().save_pretrained(tmp_path / "model")
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["config.json"]


def _write_raw(folder: Path, codes, lengths, counts, **metadata) -> None:
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({"phrases": torch.as_tensor(codes, dtype=torch.int32), "lengths": torch.as_tensor(lengths, dtype=torch.int32),
               "counts": torch.as_tensor(counts, dtype=torch.long)}, folder / PHRASES_FILE)
    (folder / METADATA_FILE).write_text(json.dumps({"format": "hf_sjd.phrase_library", "format_version": 1,
                                                    "codebook_size": 4, **metadata}))


def test_one_long_phrase_is_loaded_and_verified_ragged(tmp_path, monkeypatch):
    """8000 phrases, one of 50k codes (a 260 kB file): padding to the longest would ask for 3.2 GB. Nothing
    allocated while loading and indexing may exceed a few times the file's codes."""
    from hf_sjd.jacobi.verify.phrase import PhraseIndex

    long_run = torch.arange(50_000) % 4
    short = torch.tensor([[0, 1], [2, 3]]).repeat(4000, 1)[:7999].flatten()  # 7999 phrases [0, 1], [2, 3], ...
    codes = torch.cat([short, long_run])
    lengths = torch.tensor([2] * 7999 + [50_000])
    _write_raw(tmp_path / "lib", codes, lengths, torch.ones(8000))
    limit = 8 * codes.numel()
    real_full, real_where = torch.full, torch.where

    def bounded(real):
        def call(*args, **kwargs):
            out = real(*args, **kwargs)
            assert out.numel() <= limit, f"allocated {out.numel()} entries"
            return out
        return call

    def full(size, *args, **kwargs):  # refuse before allocating
        assert torch.Size(size).numel() <= limit, f"asked for {torch.Size(size).numel()} entries"
        return real_full(size, *args, **kwargs)

    monkeypatch.setattr(torch, "full", full)
    monkeypatch.setattr(torch, "where", bounded(real_where))
    library = PhraseLibrary.from_pretrained(tmp_path / "lib")
    assert len(library) == 8000 and library.max_length == 50_000 and torch.equal(library.codes, codes)
    assert library.phrase_list()[-1] == long_run.tolist()
    index = PhraseIndex.from_library(library, torch.arange(4), vocab_size=4)
    drafts = torch.tensor([[0, 1, 2, 3]])
    probs = torch.full((1, 4, 4), 0.25)
    length, phrase = index.longest_matches(drafts, probs, tau=0.1, exact=True)
    assert length.tolist() == [[2, 0, 2, 0]] and phrase.tolist() == [[0, 0, 1, 0]]


@pytest.mark.parametrize("lengths, codes, pattern", [
    ([2, -3], [0, 1], "every phrase has >= 2 codes"),
    ([2, 4], [0, 1, 2], "do not split into lengths summing to 6"),
    ([2**30, 2**30], [0, 1], "do not split into lengths summing to"),
])
def test_inconsistent_sizes_are_refused_before_allocating(tmp_path, lengths, codes, pattern):
    _write_raw(tmp_path / "lib", codes, lengths, [1] * len(lengths))
    with pytest.raises(ValueError, match=pattern):
        PhraseLibrary.from_pretrained(tmp_path / "lib")


def test_ragged_constructor_and_padded_view():
    library = PhraseLibrary(torch.tensor([3, 4, 1, 2, 0]), torch.tensor([2, 3]), torch.tensor([5, 4]))
    assert library.phrase_list() == [[3, 4], [1, 2, 0]] and library.starts.tolist() == [0, 2]
    assert library.phrases.tolist() == [[3, 4, -1], [1, 2, 0]]
    with pytest.raises(ValueError, match="sum\\(lengths\\) = 5 codes"):
        PhraseLibrary(torch.tensor([3, 4, 1]), torch.tensor([2, 3]), torch.tensor([5, 4]))


# --------------------------------------------------------------------------- Hub look-ups that cannot succeed
@pytest.mark.parametrize("name", ["./missing", "../missing/lib", "~/missing-hf-sjd-lib", "/missing/lib", ".hidden/lib"])
def test_missing_local_paths_say_no_such_folder(name):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        PhraseLibrary.from_pretrained(name)


def test_unreachable_endpoint_fails_in_seconds_naming_the_repo(tmp_path, monkeypatch):
    """An endpoint on a closed loopback port: huggingface_hub alone retries for ~23 s."""
    import socket
    import time

    from huggingface_hub import constants

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"phrase library 'nope/lib': cannot reach http://127.0.0.1.*"
                                              r"Check the connection.*pass a local folder"):
        PhraseLibrary.from_pretrained("nope/lib", cache_dir=tmp_path / "cache")
    assert time.perf_counter() - start < 10  # a guard against the retry loop, not a speed target


def test_offline_lookup_fails_naming_the_repo_and_what_to_do(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets at import
    with pytest.raises(FileNotFoundError, match=r"'nope/lib' is not a local folder .*HF_HUB_OFFLINE=1.*check the id"
                                                r".*set HF_HUB_OFFLINE=0"):
        PhraseLibrary.from_pretrained("nope/lib", cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match=r"local_files_only=True.*pass local_files_only=False"):
        PhraseLibrary.from_pretrained("nope/lib", cache_dir=tmp_path / "cache", local_files_only=True)
    with pytest.raises(ValueError, match="neither an existing folder nor a valid Hub repo id"):
        PhraseLibrary.from_pretrained("not a repo", cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("length", [3, 5])
def test_a_sequence_longer_or_shorter_than_the_grid_is_refused(length):
    from hf_sjd.phrases import PhraseLibrary

    with pytest.raises(ValueError, match=f"has length {length}, not the 2 x 2"):
        PhraseLibrary.from_token_sequences([[0, 1, 0, 1, 0][:length]] * 3, num_merges=2, grid=(2, 2))


def test_a_code_equal_to_the_models_codebook_size_does_not_fit_even_when_ignoring_the_fingerprint():
    from hf_sjd.phrases import PhraseLibrary

    library = PhraseLibrary.from_token_sequences([[3, 4, 3, 4, 3, 4]] * 3, num_merges=1, codebook_size=5)
    library.check_compatible(codebook_size=5, ignore_fingerprint=True)
    with pytest.raises(ValueError, match="do not fit"):
        library.check_compatible(codebook_size=4, ignore_fingerprint=True)


def test_first_records_the_merges_of_the_library_it_was_cut_from():
    from hf_sjd.phrases import PhraseLibrary

    library = PhraseLibrary.from_token_sequences([[0, 1, 2, 0, 1, 2, 0, 1, 2, 3]] * 4, num_merges=3)
    cut = library.first(1)
    assert (cut.num_merges, cut.metadata["first_of_merges"]) == (1, library.num_merges) and library.num_merges == 3


def test_an_id_equal_to_the_codebook_size_is_refused():
    from hf_sjd.phrases import PhraseLibrary

    with pytest.raises(ValueError):
        PhraseLibrary.from_token_sequences([[0, 1, 4, 0, 1, 4]] * 3, num_merges=1, codebook_size=4)
