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
