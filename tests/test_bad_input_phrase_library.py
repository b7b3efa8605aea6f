"""Hostile or corrupt phrase libraries: a ValueError on load that names the field, never a late crash."""

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from hf_sjd import PhraseLibrary
from hf_sjd.phrases import METADATA_FILE, PHRASES_FILE


def write_raw(folder: Path, codes, lengths, counts, dtype=torch.int32, **metadata) -> None:
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({"phrases": torch.as_tensor(codes, dtype=torch.int32), "lengths": torch.as_tensor(lengths, dtype=dtype),
               "counts": torch.as_tensor(counts, dtype=torch.long)}, folder / PHRASES_FILE)
    (folder / METADATA_FILE).write_text(json.dumps({"format": "hf_sjd.phrase_library", "format_version": 1,
                                                    "codebook_size": 4, **metadata}))


def test_lengths_whose_int64_sum_wraps_around_are_refused(tmp_path):
    lengths = [2**62, 2**62, 2**62, 2**62 + 2]  # int64 sum: 2 (mod 2^64), the number of codes
    assert int(torch.tensor(lengths).sum()) == 2
    write_raw(tmp_path / "lib", [0, 1], lengths, [1] * 4, dtype=torch.long)
    with pytest.raises(ValueError, match=f"do not split into lengths summing to {sum(lengths)}"):
        PhraseLibrary.from_pretrained(tmp_path / "lib")
    with pytest.raises(ValueError, match=f"sum\\(lengths\\) = {sum(lengths)}"):
        PhraseLibrary(torch.tensor([0, 1]), torch.tensor(lengths), torch.ones(4))


def test_deeply_nested_metadata_is_a_value_error(tmp_path):
    write_raw(tmp_path / "lib", [0, 1], [2], [1])
    (tmp_path / "lib" / METADATA_FILE).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=f"cannot read phrase library metadata .*{METADATA_FILE}: nested too deeply"):
        PhraseLibrary.from_pretrained(tmp_path / "lib")
    (tmp_path / "lib" / METADATA_FILE).write_text('{"format": ' + "{\"a\": " * 100_000 + "1" + "}" * 100_001)
    with pytest.raises(ValueError, match="nested too deeply"):
        PhraseLibrary.from_pretrained(tmp_path / "lib")


@pytest.mark.parametrize("field, value, allowed", [
    ("num_merges", "lots", "an integer >= 1"),
    ("num_merges", 0, "an integer >= 1"),
    ("num_merges", True, "an integer >= 1"),
    ("num_merges", 2.0, "an integer >= 1"),
    ("codebook_size", "512", "an integer in \\[1, "),
    ("codebook_size", -1, "an integer in \\[1, "),
    ("codebook_size", 2**40, "an integer in \\[1, "),
    ("fingerprint", 5, "a string or null"),
    ("row_length", 0, "an integer >= 1 or null"),
    ("grid", [16], "a list of two integers >= 1"),
    ("grid", "16x16", "a list of two integers >= 1"),
    ("min_frequency", -2, "an integer >= 1"),
    ("num_phrases", "1", "an integer >= 0"),
    ("source", ["coco"], "a JSON object or null"),
    ("corpus", {"tokens": -5}, "a JSON object of integers >= 0"),
    ("phrases_sha256", 12, "a SHA-256 hex digest"),
    ("build_seconds", "fast", "a number >= 0"),
])
def test_metadata_of_the_wrong_type_or_range_names_the_field(tmp_path, field, value, allowed):
    write_raw(tmp_path / "lib", [0, 1], [2], [1], **{field: value})
    with pytest.raises(ValueError, match=f"field '{field}' must be {allowed}"):
        PhraseLibrary.from_pretrained(tmp_path / "lib")


@pytest.mark.parametrize("codes, lengths, counts, metadata, pattern", [
    ([0, 7], [2], [1], {}, "holds code 7, outside \\[0, codebook_size=4\\)"),
    ([0, 1, 2, 3], [2, 2], [1, 1], {"num_merges": 1}, "num_merges=1, fewer than the 2 phrases"),
    ([0, 1], [2], [-1], {}, "counts holds -1"),
])
def test_sizes_inconsistent_with_the_metadata_are_refused(tmp_path, codes, lengths, counts, metadata, pattern):
    write_raw(tmp_path / "lib", codes, lengths, counts, **metadata)
    with pytest.raises(ValueError, match=pattern):
        PhraseLibrary.from_pretrained(tmp_path / "lib")


def test_a_saved_library_passes_its_own_schema(tmp_path):
    corpus = torch.tensor([[1, 2, 3, 1, 2, 3, 0, 0], [1, 2, 3, 4, 1, 2, 3, 0]])
    library = PhraseLibrary.from_token_sequences(corpus, num_merges=2, codebook_size=5, grid=(2, 4), row_length=4,
                                                 source="me/images", extra_metadata={"build": {"command": "x"}})
    library.save_pretrained(tmp_path / "lib")
    library.first(1).save_pretrained(tmp_path / "first")
    assert PhraseLibrary.from_pretrained(tmp_path / "lib").phrase_list() == library.phrase_list()
    assert PhraseLibrary.from_pretrained(tmp_path / "first").phrase_list() == library.first(1).phrase_list()


def test_a_reader_racing_saves_sees_one_whole_save(tmp_path):
    """One thread re-saves the folder with alternating libraries while readers load it: every load is one of
    the two whole libraries, never 'two files from different saves' (bounded: 2 s, 3 readers)."""
    corpus = torch.randint(0, 16, (32, 16), generator=torch.Generator().manual_seed(0))
    libraries = [PhraseLibrary.from_token_sequences(corpus, num_merges=m, codebook_size=16) for m in (6, 9)]
    expected = [library.phrase_list() for library in libraries]
    folder = tmp_path / "lib"
    libraries[0].save_pretrained(folder)
    stop, errors, seen = threading.Event(), [], [0, 0]

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            libraries[i % 2].save_pretrained(folder)

    def reader():
        while not stop.is_set():
            try:
                phrases = PhraseLibrary.from_pretrained(folder).phrase_list()
            except Exception as error:  # noqa: BLE001  anything at all is a failure of the invariant
                errors.append(repr(error))
                continue
            if phrases not in expected:
                errors.append("a library that is neither save")
            else:
                seen[expected.index(phrases)] += 1

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == [], f"{len(errors)} of {len(errors) + sum(seen)} loads failed, e.g. {errors[:3]}"
    assert min(seen) > 0  # both saves were seen: the race did happen


# --------------------------------------------------------------------------- sizes the tools can hold
def small_corpus() -> torch.Tensor:
    return torch.randint(0, 16, (12, 32), generator=torch.Generator().manual_seed(0))  # [N, L]


def test_the_trainer_is_asked_for_no_more_merges_than_the_corpus_can_make(monkeypatch):
    """tokenizers' BpeTrainer reserves its whole vocabulary up front (10^9 merges abort the process): it is
    asked for at most tokens - words merges, which gives the same library (each merge removes a symbol)."""
    import hf_sjd.phrases as phrases_module

    corpus, asked = small_corpus(), []
    real = phrases_module._train_bpe

    def spy(text, starts, stops, codebook_size, base, num_merges, *args):
        asked.append(num_merges)
        return real(text, starts, stops, codebook_size, base, num_merges, *args)

    monkeypatch.setattr(phrases_module, "_train_bpe", spy)
    most = phrases_module.MAX_NUM_MERGES
    whole = PhraseLibrary.from_token_sequences(corpus, num_merges=most, codebook_size=16, min_frequency=1)
    rows = PhraseLibrary.from_token_sequences(corpus, num_merges=most, codebook_size=16, min_frequency=1, row_length=8)
    assert asked == [12 * 32 - 12, 12 * 32 - 12 * 4]
    assert whole.num_merges == most and whole.metadata["merges_applied"] == len(whole) <= asked[0]
    exact = PhraseLibrary.from_token_sequences(corpus, num_merges=asked[0], codebook_size=16, min_frequency=1)
    assert whole.phrase_list() == exact.phrase_list() and torch.equal(whole.counts, exact.counts)
    assert rows.max_length <= 8


def test_a_corpus_beyond_the_trainers_pair_counters_is_refused_before_training(monkeypatch):
    """BpeTrainer counts pairs in i32: a corpus of more codes could wrap a count (2^31 codes do not fit a test,
    so the bound is lowered)."""
    import hf_sjd.phrases as phrases_module

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(phrases_module, "_train_bpe", no_training)
    monkeypatch.setattr(phrases_module, "MAX_CORPUS_TOKENS", 12 * 32 - 1)
    with pytest.raises(ValueError, match=r"sequences hold 384 codes; .*32-bit signed integers, so a corpus holds at "
                                         r"most 383 codes"):
        PhraseLibrary.from_token_sequences(small_corpus(), num_merges=4, codebook_size=16)


@pytest.mark.parametrize("codes, metadata, pattern", [
    ([2**32 + 1, 1], {}, r"phrases hold code 4294967297; codes must be < 131072"),  # int32 on disk: would load as 1
    ([2**31, 1], {}, r"phrases hold code 2147483648; codes must be < 131072"),
    ([9, 1], {"codebook_size": 4}, r"phrases hold code 9; codes must be < codebook_size=4"),
])
def test_the_constructor_refuses_codes_that_a_save_would_change(codes, metadata, pattern):
    with pytest.raises(ValueError, match=pattern):
        PhraseLibrary(torch.tensor(codes), torch.tensor([2]), torch.tensor([1]), metadata)
    with pytest.raises(ValueError, match=r"counts must be >= 0, got -3"):
        PhraseLibrary(torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([-3]))


def test_a_save_refuses_what_from_pretrained_could_not_read_back(tmp_path, monkeypatch):
    """The save checks the loader's limits (exact byte counts) before anything is written or pushed: a library
    the saver accepts, the loader reads; one byte more is refused with what to do, and nothing is on disk."""
    import hf_sjd.phrases as phrases_module
    from huggingface_hub import HfApi

    library = PhraseLibrary.from_token_sequences(small_corpus(), num_merges=20, codebook_size=16)
    tensor_bytes = 4 * library.codes.numel() + 12 * len(library)
    monkeypatch.setattr(phrases_module, "MAX_FILE_BYTES", (1 << 16) + tensor_bytes)
    library.save_pretrained(tmp_path / "fits")
    assert PhraseLibrary.from_pretrained(tmp_path / "fits").phrase_list() == library.phrase_list()

    def no_request(*args, **kwargs):
        raise AssertionError("a Hub request was made")

    monkeypatch.setattr(HfApi, "create_repo", no_request)
    monkeypatch.setattr(phrases_module, "MAX_FILE_BYTES", (1 << 16) + tensor_bytes - 1)
    pattern = (f"this library's 20 phrases \\({library.codes.numel()} codes\\) need {tensor_bytes} bytes in "
               f"{PHRASES_FILE}; from_pretrained reads at most {(1 << 16) + tensor_bytes - 1}: save fewer merges")
    with pytest.raises(ValueError, match=pattern):
        library.save_pretrained(tmp_path / "too-big")
    with pytest.raises(ValueError, match=pattern):
        library.push_to_hub("me/too-big", token="hf_x")
    assert not (tmp_path / "too-big").exists()

    monkeypatch.setattr(phrases_module, "MAX_FILE_BYTES", 1 << 30)
    monkeypatch.setattr(phrases_module, "MAX_METADATA_BYTES", 4096)
    wordy = PhraseLibrary.from_token_sequences(small_corpus(), num_merges=2, codebook_size=16,
                                               extra_metadata={"notes": "x" * 5000})
    with pytest.raises(ValueError, match=r"metadata is \d+ bytes of JSON; from_pretrained reads at most 4096 bytes "
                                         r"of phrase_library.json: keep less in extra_metadata"):
        wordy.save_pretrained(tmp_path / "wordy")
    assert not (tmp_path / "wordy").exists()
    with pytest.raises(TypeError, match="takes no config"):
        library.save_pretrained(tmp_path / "config", config={"a": 1})


def test_a_library_from_the_constructor_saves_what_from_pretrained_reads(tmp_path, monkeypatch):
    """``PhraseLibrary(phrases, lengths, counts[, metadata])``: a save writes the current format and checks the
    metadata as the loader does, so it loads back, or the save is refused naming the field, nothing written or
    pushed."""
    from huggingface_hub import HfApi

    def make(metadata=None):
        return PhraseLibrary(torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([2, 2, 2]), torch.tensor([5, 4, 3]),
                             metadata)

    with pytest.raises(ValueError, match="extra_metadata: field 'build' must be a JSON object or null"):
        PhraseLibrary.from_token_sequences(torch.tensor([[1, 2, 1, 2]]), num_merges=1, codebook_size=4,
                                           extra_metadata={"build": "hf-sjd build-phrases ..."})
    make().save_pretrained(tmp_path / "plain")
    assert PhraseLibrary.from_pretrained(tmp_path / "plain").phrase_list() == [[1, 2], [3, 4], [5, 6]]

    def no_request(*args, **kwargs):
        raise AssertionError("a Hub request was made")

    monkeypatch.setattr(HfApi, "create_repo", no_request)
    for metadata, pattern in (({"fingerprint": 123}, "field 'fingerprint' must be a string or null, got 123"),
                              ({"num_merges": 1}, "num_merges=1, fewer than the 3 phrases")):
        with pytest.raises(ValueError, match=pattern):
            make(metadata).save_pretrained(tmp_path / "bad")
        with pytest.raises(ValueError, match=pattern):
            make(metadata).push_to_hub("me/bad", token="hf_x")
        assert not (tmp_path / "bad").exists()


def test_save_into_a_folder_whose_parent_is_read_only_says_why(tmp_path, monkeypatch):
    """The library folder is built next to its destination and swapped in whole, so the parent must be
    writable even when the folder itself is: the error says so (not a raw error about a hidden folder), and a
    first save leaves no empty folder behind. (Tests run as root: the refusal is simulated.)"""
    import re

    import hf_sjd.files as files

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    library = PhraseLibrary.from_token_sequences(small_corpus(), num_merges=4, codebook_size=16)
    (tmp_path / "ro" / "lib").mkdir(parents=True)
    monkeypatch.setattr(files.tempfile, "mkdtemp", refuse)
    for target in (tmp_path / "ro" / "lib", tmp_path / "ro" / "new"):
        with pytest.raises(PermissionError, match=f"cannot write {re.escape(str(target))}: it is replaced as a whole "
                                                  f"by a new folder built next to it, and its parent folder "
                                                  f"{re.escape(str(tmp_path / 'ro'))} is not writable"):
            library.save_pretrained(target)
    assert sorted(p.name for p in (tmp_path / "ro").iterdir()) == ["lib"]  # no empty "new" folder
    assert not any((tmp_path / "ro" / "lib").iterdir())


# --------------------------------------------------------------------------- a Hub that never answers
def silent_endpoint():
    """A loopback socket that accepts connections (the kernel completes the handshake) and never answers."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server, f"http://127.0.0.1:{server.getsockname()[1]}"


def test_push_to_a_hub_that_never_answers_times_out_naming_the_endpoint(monkeypatch):
    """huggingface_hub sets no timeout on uploads: without one this push waits for good. It runs in a thread
    so that a hang fails the test instead of stopping the suite."""
    from huggingface_hub import constants

    server, endpoint = silent_endpoint()
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    library = PhraseLibrary.from_token_sequences(small_corpus(), num_merges=4, codebook_size=16)
    outcome = []

    def push():
        try:
            library.push_to_hub("me/phrases", token="hf_x", timeout=0.5)
        except Exception as error:  # noqa: BLE001  the outcome is checked below
            outcome.append(error)

    with server:
        thread = threading.Thread(target=push, daemon=True)
        thread.start()
        thread.join(timeout=60)  # with 0.5 s per request and huggingface_hub's retries: seconds
        assert not thread.is_alive(), "push_to_hub still waiting on an endpoint that never answers"
    [error] = outcome
    assert isinstance(error, TimeoutError)
    assert str(error).startswith(f"pushing the phrase library to me/phrases: the Hub at {endpoint} did not answer "
                                 "within 0.5 s (ReadTimeout)")


@pytest.mark.parametrize("timeout, error, pattern", [
    (0, ValueError, r"timeout must be None or a finite number > 0.0, got 0.0"),
    (float("inf"), ValueError, r"timeout must be None or a finite number > 0.0, got inf"),
    ("10", TypeError, r"timeout must be None or a finite number > 0.0, got '10'"),
])
def test_push_timeout_is_checked_before_any_request(timeout, error, pattern, monkeypatch):
    from huggingface_hub import HfApi

    def no_request(*args, **kwargs):
        raise AssertionError("a Hub request was made")

    monkeypatch.setattr(HfApi, "create_repo", no_request)
    library = PhraseLibrary.from_token_sequences(small_corpus(), num_merges=4, codebook_size=16)
    with pytest.raises(error, match=pattern):
        library.push_to_hub("me/phrases", token="hf_x", timeout=timeout)


def test_the_corpus_is_not_copied_on_its_way_to_the_trainer():
    """The builder's corpus is one [N, h*w] int64 array (650 MB for 10k Emu3 images): it is read in place, and
    the trainer's text is decoded straight from one uint32 buffer (the int64 sum and its bytes copy are gone)."""
    import numpy as np

    from hf_sjd.phrases import _read_corpus

    corpus = np.arange(24, dtype=np.int64).reshape(3, 8)
    codes, lengths = _read_corpus(corpus)
    assert np.shares_memory(codes, corpus) and lengths.tolist() == [8, 8, 8]
    assert not np.shares_memory(_read_corpus(corpus.astype(np.int32))[0], corpus)  # other dtypes: one copy
    library = PhraseLibrary.from_token_sequences(corpus % 4, num_merges=3, codebook_size=4)
    assert library.phrase_list() == PhraseLibrary.from_token_sequences((corpus % 4).tolist(), num_merges=3,
                                                                       codebook_size=4).phrase_list()


@pytest.mark.parametrize("where", [".", "..", "~"])
def test_a_save_never_replaces_the_current_folder_or_above(where, tmp_path, monkeypatch):
    """A save replaces its folder as a whole: save_pretrained(".") from inside a library folder swapped the
    folder the process (and its shell) stood in for a new one, leaving them in a deleted folder."""
    import os

    library = PhraseLibrary.from_token_sequences(small_corpus(), num_merges=4, codebook_size=16)
    library.save_pretrained(tmp_path / "home" / "work" / "lib")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "home" / "work" / "lib")
    before = os.stat(".").st_ino
    what = {".": "the current folder", "..": "a folder above the current folder", "~": "the home folder"}[where]
    with pytest.raises(ValueError, match=f"save_directory '{where}' is {what}"):
        library.save_pretrained(where)
    assert os.stat(".").st_ino == before and os.getcwd() == str(tmp_path / "home" / "work" / "lib")
    assert PhraseLibrary.from_pretrained(".").phrase_list() == library.phrase_list()
