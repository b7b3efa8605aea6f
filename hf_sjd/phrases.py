"""The SJD-PV phrase library (arXiv:2603.06666): frequent runs of VQ image codes, mined offline with BPE.

Byte-pair encoding over tokenized images merges the most frequent adjacent pair M times (M = 8k in the paper);
each merged symbol expands into the code run it stands for. :mod:`hf_sjd.jacobi.verify.phrase` verifies drafted
runs that match a phrase jointly; this module builds, stores and loads the library. BPE runs in the Rust trainer
of HF ``tokenizers``, each code one Unicode character (``c`` -> ``chr(base + c)``), so a merged token's string
*is* its expansion.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import ModelCard, ModelCardData, ModelHubMixin, hf_hub_download

from .checks import check_float, check_int
from .files import atomic_folder, check_not_special, looks_local

PAPER_URL = "https://arxiv.org/abs/2603.06666"
PHRASES_FILE = "phrases.safetensors"
METADATA_FILE = "phrase_library.json"
CARD_FILE = "README.md"
FORMAT = "hf_sjd.phrase_library"
FORMAT_VERSION = 1
COUNTS_DEFINITION = ("number of (possibly overlapping) occurrences of the phrase's code sequence inside one "
                     "BPE word (one grid row if row_length is set, else one whole sequence) of the corpus")

# Code -> character: CJK Unified Ideographs (U+4E00..U+9FFF) for codebooks up to 20992 codes, else the
# supplementary private-use planes (U+F0000..U+10FFFF, up to 2^17 codes). Both are contiguous, so code order is
# the trainer's alphabet order (it sorts by code point).
_CJK_BASE, _CJK_SIZE = 0x4E00, 0x9FFF - 0x4E00 + 1
_PUA_BASE, _PUA_SIZE = 0xF0000, 0x10FFFF - 0xF0000 + 1
MAX_CODEBOOK_SIZE = _PUA_SIZE

# What the tools can hold, checked with exact Python integers before any work:
MAX_FILE_BYTES = 1 << 30  # a phrases.safetensors from_pretrained reads (an 8000-merge library is ~100 kB)
MAX_METADATA_BYTES = 16 << 20  # a phrase_library.json from_pretrained reads
# Seconds one Hub request of a push may wait to connect or for the next byte (huggingface_hub sets no limit on
# uploads; the Hub answers a small commit in seconds).
PUSH_TIMEOUT = 60.0
# tokenizers' BpeTrainer counts pairs in i32 (trainer.rs: `count as i32`); a pair occurs fewer times than the
# corpus has codes, so up to 2^31 - 1 codes no count wraps (a wrapped count is silently dropped).
MAX_CORPUS_TOKENS = 2**31 - 1
# A phrase takes at least 20 bytes of phrases.safetensors (two int32 codes, an int32 length, an int64 count):
# a library of more merges could never be read back.
MAX_NUM_MERGES = MAX_FILE_BYTES // (2 * 4 + 4 + 8)


def _code_point_base(codebook_size: int) -> int:
    return _CJK_BASE if codebook_size <= _CJK_SIZE else _PUA_BASE


def _as_code_array(index: int, sequence: Any) -> np.ndarray:
    """One sequence -> 1-D int64 array, with errors that name ``sequences[index]``."""
    if isinstance(sequence, torch.Tensor):
        sequence = sequence.detach().cpu().numpy()
    elif isinstance(sequence, (str, bytes)):
        raise TypeError(f"sequences[{index}] is a {type(sequence).__name__}; expected a 1-D sequence of integer VQ "
                        "codes")
    array = np.asarray(sequence)
    if array.ndim != 1:
        raise ValueError(f"sequences[{index}] has shape {tuple(array.shape)}; each sequence must be 1-D "
                         "(flatten image grids in raster order)")
    if array.size == 0:
        raise ValueError(f"sequences[{index}] is empty; every sequence needs at least one VQ code")
    return _as_int64(array, f"sequences[{index}]")


def _as_int64(array: np.ndarray, name: str) -> np.ndarray:
    """``array`` as int64, refusing what is not an integer id or does not fit one (a uint64 id >= 2**63 would wrap
    to a negative one)."""
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} has dtype {array.dtype}; VQ codes must be integers")
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} contains id {int(array.max())} outside the allowed range [0, {MAX_CODEBOOK_SIZE}) "
                         "(the maximum supported codebook size)")
    return array.astype(np.int64, copy=False)


def _read_corpus(sequences: Any) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate all sequences: (codes [T] int64, sequence lengths [N] int64)."""
    if isinstance(sequences, (torch.Tensor, np.ndarray)) and sequences.ndim == 2:  # [N, L]: no copy if int64
        array = sequences.detach().cpu().numpy() if isinstance(sequences, torch.Tensor) else sequences
        if array.shape[0] == 0 or array.shape[1] == 0:
            raise ValueError(f"sequences is empty (shape {tuple(array.shape)}); need at least one non-empty sequence")
        return (_as_int64(array, "sequences").reshape(-1),
                np.full(array.shape[0], array.shape[1], dtype=np.int64))
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Iterable):
        raise TypeError(f"sequences must be an iterable of 1-D integer sequences, got {type(sequences).__name__}")
    arrays = [_as_code_array(i, s) for i, s in enumerate(sequences)]
    if not arrays:
        raise ValueError("sequences is empty; need at least one sequence of VQ codes")
    return np.concatenate(arrays), np.array([len(a) for a in arrays], dtype=np.int64)


def _check_range(codes: np.ndarray, lengths: np.ndarray, codebook_size: int | None) -> int:
    """Validate ids against ``[0, codebook_size)`` (inferred as max + 1 when None); returns the codebook size."""
    low, high = int(codes.min()), int(codes.max())
    limit = codebook_size if codebook_size is not None else MAX_CODEBOOK_SIZE
    if low < 0 or high >= limit:
        bad = int(np.flatnonzero((codes < 0) | (codes >= limit))[0])
        sequence = int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
        where = "codebook_size" if codebook_size is not None else "the maximum supported codebook size"
        raise ValueError(f"sequences[{sequence}] contains id {int(codes[bad])} outside the allowed range "
                         f"[0, {limit}) ({where})")
    return codebook_size if codebook_size is not None else high + 1


def _substring_counts(codes: np.ndarray, word_end: np.ndarray, phrase_codes: np.ndarray, lengths: np.ndarray,
                      codebook_size: int) -> np.ndarray:
    """Overlapping occurrences of every phrase inside a word, in one vectorised walk over a phrase trie.

    ``codes`` [T]; ``word_end`` [T] the end (exclusive) of the word holding each position; ``phrase_codes``
    [sum(lengths)] the phrases' codes concatenated; ``lengths`` [P]. Hand-written: no library in use counts a
    fixed pattern set in an int array, and the walk costs far less than P separate scans.
    """
    num_phrases, max_len = len(lengths), int(lengths.max()) if len(lengths) else 0
    starts = np.cumsum(lengths) - lengths  # [P] where each phrase begins in phrase_codes
    node = np.zeros(num_phrases, dtype=np.int64)  # [P] trie node of each phrase's prefix; 0 = root
    keys, children, terminal_nodes, terminal_phrases = [], [], [], []
    next_node = 1
    for depth in range(max_len):
        alive = np.flatnonzero(lengths > depth)
        edge = node[alive] * codebook_size + phrase_codes[starts[alive] + depth]  # (parent, code) in one int64
        unique, inverse = np.unique(edge, return_inverse=True)
        child = next_node + np.arange(len(unique))
        next_node += len(unique)
        keys.append(unique)
        children.append(child)
        node[alive] = child[inverse]
        ends = lengths[alive] == depth + 1
        terminal_nodes.append(node[alive][ends])
        terminal_phrases.append(alive[ends])
    keys, children = np.concatenate(keys), np.concatenate(children)
    order = np.argsort(keys)
    keys, children = keys[order], children[order]
    terminal = np.full(next_node, -1, dtype=np.int64)  # node -> phrase index (phrases are distinct)
    terminal[np.concatenate(terminal_nodes)] = np.concatenate(terminal_phrases)

    counts = np.zeros(num_phrases, dtype=np.int64)
    start = np.arange(len(codes), dtype=np.int64)  # [A] live match starts
    state = np.zeros(len(codes), dtype=np.int64)  # [A] trie node matched so far
    for depth in range(max_len):
        inside = start + depth < word_end[start]
        start, state = start[inside], state[inside]
        edge = state * codebook_size + codes[start + depth]
        slot = np.minimum(np.searchsorted(keys, edge), len(keys) - 1)
        hit = keys[slot] == edge
        start, state = start[hit], children[slot[hit]]
        matched = terminal[state]
        counts += np.bincount(matched[matched >= 0], minlength=num_phrases)
        if len(start) == 0:
            break
    return counts


def _as_json(name: str, value: Any, **kwargs: Any) -> str:
    """``value`` as JSON text (phrase_library.json); ``TypeError`` naming ``name`` unless it is plain JSON."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except (TypeError, ValueError, RecursionError) as error:
        raise TypeError(f"{name} must be plain JSON (dicts, lists, strings, finite numbers, booleans, null): "
                        f"{error}") from None


def _check_extra_metadata(extra_metadata: Mapping | None) -> dict:
    if extra_metadata is None:
        return {}
    if not isinstance(extra_metadata, Mapping):
        raise TypeError(f"extra_metadata must be None or a dict, got {type(extra_metadata).__name__}")
    extra = dict(extra_metadata)
    if not all(isinstance(key, str) for key in extra):
        raise TypeError(f"extra_metadata keys must be strings, got {sorted(map(repr, extra))[:5]}")
    # every field the builder writes itself ("build" is the CLI's extra_metadata)
    taken = sorted((set(_METADATA_SCHEMA) - {"build"} | {"format", "format_version", "loaded_from"}) & set(extra))
    if taken:
        raise ValueError(f"extra_metadata may not set {taken}: the builder writes these fields itself")
    _as_json("extra_metadata", extra)
    _check_metadata(extra, "extra_metadata")  # "build": a JSON object, as the loader asks
    return extra


def _normalise_source(source: Any) -> dict | None:
    if source is None:
        return None
    if isinstance(source, str):
        return {"dataset": source}
    if isinstance(source, Mapping):
        return dict(source)
    raise TypeError(f"source must be None, a dataset id string or a dict, got {type(source).__name__}")


class PhraseLibrary(ModelHubMixin, library_name="hf_sjd", paper_url=PAPER_URL, license="apache-2.0",
                    tags=["hf_sjd", "phrase-library", "sjd-pv", "speculative-decoding", "image-generation",
                          "arxiv:2603.06666"]):
    """Library of frequent VQ-code phrases (SJD-PV, arXiv:2603.06666), stored ragged, in BPE merge order: so
    ``first(M)`` is exactly the library M merges would have built. Tensors (on ``device``):

    ==========  ==================  ===============================================================
    name        shape               meaning
    ==========  ==================  ===============================================================
    ``codes``   [sum(lengths)]      every phrase's codes, concatenated in merge order (LongTensor)
    ``lengths`` [P]                 codes per phrase
    ``starts``  [P]                 where phrase i begins in ``codes`` (``cumsum(lengths) - lengths``)
    ``counts``  [P]                 corpus frequency (:data:`COUNTS_DEFINITION`: independent of the merges kept)
    ``phrases`` [P, max_length]     padded view, -1 after each phrase: built on demand, O(P * longest)
    ==========  ==================  ===============================================================

    >>> import torch
    >>> from hf_sjd import PhraseLibrary
    >>> corpus = torch.tensor([[1, 2, 3, 1, 2, 3, 0, 0], [1, 2, 3, 4, 1, 2, 3, 0]])
    >>> lib = PhraseLibrary.from_token_sequences(corpus, num_merges=2, codebook_size=5)
    >>> lib.phrase_list(), lib.counts.tolist(), lib.codes.tolist()
    ([[1, 2], [1, 2, 3]], [4, 4], [1, 2, 1, 2, 3])
    >>> lib.first(1).phrase_list()
    [[1, 2]]
    >>> # lib.save_pretrained("dir"); PhraseLibrary.from_pretrained("dir", fingerprint=vq.fingerprint())
    """

    def __init__(self, phrases: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor,
                 metadata: dict | None = None) -> None:
        """``phrases``: the concatenated codes ``[sum(lengths)]`` (ragged), or a padded ``[P, max_len]``
        table (-1 after each phrase); ``lengths`` [P] (each >= 2); ``counts`` [P]."""
        phrases, lengths, counts = (torch.as_tensor(t).long() for t in (phrases, lengths, counts))
        if phrases.ndim not in (1, 2) or lengths.ndim != 1 or counts.shape != lengths.shape or (
                phrases.ndim == 2 and phrases.shape[0] != lengths.shape[0]):
            raise ValueError(f"expected phrases [sum(lengths)] or [P, max_len], lengths [P], counts [P]; got "
                             f"{tuple(phrases.shape)}, {tuple(lengths.shape)}, {tuple(counts.shape)}")
        if (lengths < 2).any():
            raise ValueError("every phrase needs length >= 2 (phrase i must be phrases[i, :lengths[i]] followed by "
                             "-1 padding, or lengths[i] codes of the concatenated phrases)")
        if phrases.ndim == 2:
            in_phrase = torch.arange(phrases.shape[1], device=phrases.device) < lengths[:, None].to(phrases.device)
            if not torch.equal(phrases >= 0, in_phrase) or not torch.equal(phrases[~in_phrase], torch.full_like(
                    phrases[~in_phrase], -1)):
                raise ValueError("phrase i must be phrases[i, :lengths[i]] (codes >= 0, length >= 2) followed by "
                                 "-1 padding")
            phrases = phrases[in_phrase]  # row-major: the concatenated codes
        elif sum(lengths.tolist()) != phrases.numel() or (phrases < 0).any():  # exact: an int64 sum can wrap
            raise ValueError(f"concatenated phrases must hold sum(lengths) = {sum(lengths.tolist())} codes >= 0, "
                             f"got {phrases.numel()} codes")
        # Saved as int32: a code beyond the largest codebook would wrap into another code on the way to disk.
        limit = (metadata or {}).get("codebook_size")
        limit = limit if _is_int(limit) and 1 <= limit <= MAX_CODEBOOK_SIZE else MAX_CODEBOOK_SIZE
        if phrases.numel() and int(phrases.max()) >= limit:
            raise ValueError(f"phrases hold code {int(phrases.max())}; codes must be < "
                             f"{'codebook_size=' if limit != MAX_CODEBOOK_SIZE else ''}{limit}")
        if counts.numel() and int(counts.min()) < 0:
            raise ValueError(f"counts must be >= 0, got {int(counts.min())}")
        self.codes, self.lengths, self.counts = phrases, lengths.to(phrases.device), counts.to(phrases.device)
        self._metadata = dict(metadata or {})
        self._metadata["num_phrases"] = len(lengths)
        self._hub_mixin_config = None  # no config.json: the metadata goes to phrase_library.json

    @property
    def starts(self) -> torch.Tensor:
        """[P] offset of each phrase in ``codes``."""
        return self.lengths.cumsum(0) - self.lengths

    @property
    def phrases(self) -> torch.Tensor:
        """[P, max_length], -1 after each phrase (``P * max_length`` entries: prefer ``codes``/``lengths``)."""
        table = torch.full((len(self), self.max_length), -1, dtype=torch.long, device=self.device)
        table[torch.arange(self.max_length, device=self.device) < self.lengths[:, None]] = self.codes
        return table

    @property
    def codebook_size(self) -> int | None:
        return self._metadata.get("codebook_size")

    @property
    def fingerprint(self) -> str | None:
        """Fingerprint of the VQ tokenizer whose codes these are (e.g. ``VQTokenizer.fingerprint()``)."""
        return self._metadata.get("fingerprint")

    @property
    def metadata(self) -> dict:
        return json.loads(json.dumps(self._metadata))  # deep copy: callers cannot mutate the library

    @property
    def num_merges(self) -> int:
        return self._metadata.get("num_merges", len(self))

    @property
    def max_length(self) -> int:
        return int(self.lengths.max()) if len(self) else 0

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def __repr__(self) -> str:
        mean = float(self.lengths.float().mean()) if len(self) else 0.0
        return (f"PhraseLibrary(phrases={len(self)}, merges={self.num_merges}, mean_length={mean:.2f}, "
                f"max_length={self.max_length}, codebook_size={self.codebook_size}, "
                f"fingerprint={self.fingerprint!r}, device={self.device})")

    def phrase_list(self) -> list[list[int]]:
        """Phrases as Python lists of codes, in merge order."""
        return [run.tolist() for run in self.codes.cpu().split(self.lengths.tolist())]

    def to(self, device: str | torch.device) -> PhraseLibrary:
        """Move the tensors (in place, like ``nn.Module.to``) and return ``self``."""
        self.codes, self.lengths, self.counts = (t.to(device) for t in (self.codes, self.lengths, self.counts))
        return self

    def first(self, num_merges: int, name: str = "num_merges") -> PhraseLibrary:
        """The library of the first ``num_merges`` merges: the same as building it (BPE is greedy). ``name``: the
        argument errors name (``pv_num_merges`` for a generate call)."""
        num_merges = check_int(name, num_merges, minimum=1)
        if num_merges > self.num_merges:
            raise ValueError(f"{name} must be in [1, {self.num_merges}] (the merges of this library, "
                             f"{self.metadata.get('loaded_from', 'built in memory')!r}), got {num_merges}")
        keep = min(num_merges, len(self))
        lengths = self.lengths[:keep]
        metadata = {**self._metadata, "num_merges": num_merges, "merges_applied": keep,
                    "first_of_merges": self.num_merges}
        return PhraseLibrary(self.codes[:int(lengths.sum())].clone(), lengths.clone(), self.counts[:keep].clone(),
                             metadata)

    def check_compatible(self, fingerprint: str | None = None, codebook_size: int | None = None, *,
                         ignore_fingerprint: bool = False) -> None:
        """``ValueError`` unless this library was built for the VQ tokenizer described by the arguments (another
        ``codebook_size`` passes with the tokenizer's fingerprint: an inferred size); ``ignore_fingerprint=True``
        accepts a mismatch, but never codes outside ``[0, codebook_size)``."""
        name = self._metadata.get("loaded_from", "this phrase library")
        if fingerprint is not None and not ignore_fingerprint:
            if self.fingerprint is None:
                warnings.warn(f"{name} records no tokenizer fingerprint; cannot check it against {fingerprint!r}",
                              stacklevel=2)
            elif self.fingerprint != fingerprint:
                raise ValueError(
                    f"{name} was built for VQ tokenizer fingerprint {self.fingerprint!r}, but the model's tokenizer "
                    f"has fingerprint {fingerprint!r}: its phrases are codes of a different codebook. Rebuild the "
                    "library for this model (hf-sjd build-phrases --model ...) or pass "
                    "ignore_fingerprint=True to use it anyway.")
        if codebook_size is not None and self.codebook_size is not None and codebook_size != self.codebook_size:
            fits = len(self) == 0 or int(self.codes.max()) < codebook_size
            # the tokenizer's own fingerprint, another size: the size was inferred (from_token_sequences: max + 1)
            same_tokenizer = fingerprint is not None and self.fingerprint == fingerprint
            if not ((ignore_fingerprint or same_tokenizer) and fits):
                raise ValueError(f"{name} was built for codebook_size={self.codebook_size}, but the model's "
                                 f"codebook_size is {codebook_size}"
                                 + ("; pass ignore_fingerprint=True to use it anyway" if fits else
                                    "; its codes do not fit in the model's codebook"))

    @classmethod
    def from_token_sequences(cls, sequences: Iterable[Sequence[int]] | torch.Tensor | np.ndarray,
                             num_merges: int = 8000, row_length: int | None = None,
                             codebook_size: int | None = None, fingerprint: str | None = None,
                             source: str | Mapping | None = None, grid: tuple[int, int] | None = None,
                             min_frequency: int = 2, show_progress: bool = False,
                             extra_metadata: Mapping | None = None) -> PhraseLibrary:
        """Build the library with BPE (HF ``tokenizers``' Rust ``BpeTrainer``) over tokenized images.

        Args:
            sequences: iterable of 1-D integer sequences of VQ codes (lists, arrays, tensors) or one
                ``[N, L]`` tensor/array; images flattened in raster order.
            num_merges: M, the number of BPE merges = phrases (the paper uses 8k). Training stops earlier
                when no pair occurs ``min_frequency`` times.
            row_length: if set, each sequence is split into rows of this length (one BPE word per row), so
                no phrase crosses a grid-row boundary; ``None`` (default, the paper's): one word per sequence
                (raster decoding drafts windows across row ends too).
            codebook_size: ids must lie in ``[0, codebook_size)``; inferred as ``max id + 1`` when None.
            fingerprint: tokenizer fingerprint stored for ``check_compatible`` (e.g. ``vq.fingerprint()``).
            source: dataset id or dict (dataset, split, revision, ...) stored in the metadata.
            grid: (rows, cols) of the token grid, stored in the metadata.
            min_frequency: a pair must occur at least this often to be merged.
            show_progress: show the trainer's progress bars.
            extra_metadata: more JSON-able fields for ``metadata`` (e.g. the build command).

        Merge rule (the trainer's; tests/test_phrases.py reproduces it): the pair with the most adjacent
        occurrences, ties to the smallest (left id, right id), code c having id c and the k-th new symbol
        codebook_size + k; occurrences are replaced left to right.
        """
        start = time.perf_counter()
        num_merges = check_int("num_merges", num_merges, minimum=1, maximum=MAX_NUM_MERGES)
        row_length = check_int("row_length", row_length, minimum=1, maximum=MAX_CORPUS_TOKENS, allow_none=True)
        codebook_size = check_int("codebook_size", codebook_size, minimum=1, allow_none=True)
        # a pair occurs fewer than MAX_CORPUS_TOKENS times, so a larger min_frequency could never merge
        min_frequency = check_int("min_frequency", min_frequency, minimum=1, maximum=MAX_CORPUS_TOKENS)
        if codebook_size is not None and codebook_size > MAX_CODEBOOK_SIZE:
            raise ValueError(f"codebook_size must be <= {MAX_CODEBOOK_SIZE}, got {codebook_size}")
        if grid is not None:
            pair = tuple(grid) if isinstance(grid, Iterable) and not isinstance(grid, (str, bytes)) else ()
            if len(pair) != 2:
                raise TypeError(f"grid must be None or two integers (rows, cols), got {grid!r}")
            grid = tuple(check_int("grid", g, minimum=1, maximum=MAX_CORPUS_TOKENS) for g in pair)
        source = _normalise_source(source)
        extra_metadata = _check_extra_metadata(extra_metadata)
        _as_json("source", source)

        codes, seq_lengths = _read_corpus(sequences)  # [T], [N]
        if len(codes) > MAX_CORPUS_TOKENS:
            raise ValueError(f"sequences hold {len(codes)} codes; the BPE trainer (tokenizers) counts pairs in 32-bit "
                             f"signed integers, so a corpus holds at most {MAX_CORPUS_TOKENS} codes: pass fewer "
                             "sequences")
        codebook_size = _check_range(codes, seq_lengths, codebook_size)
        if grid is not None and (seq_lengths != grid[0] * grid[1]).any():
            bad = int(np.flatnonzero(seq_lengths != grid[0] * grid[1])[0])
            raise ValueError(f"sequences[{bad}] has length {int(seq_lengths[bad])}, not the {grid[0]} x {grid[1]} "
                             f"= {grid[0] * grid[1]} codes of grid={tuple(grid)}")
        if row_length is not None:
            bad = np.flatnonzero(seq_lengths % row_length)
            if len(bad):
                raise ValueError(f"sequences[{int(bad[0])}] has length {int(seq_lengths[bad[0]])}, not a multiple "
                                 f"of row_length={row_length}")
            word_lengths = np.full(len(codes) // row_length, row_length, dtype=np.int64)
        else:
            word_lengths = seq_lengths
        word_stops = np.cumsum(word_lengths)
        word_starts = word_stops - word_lengths

        base = _code_point_base(codebook_size)
        # One UTF-32 decode of [T] uint32 code points turns the corpus into characters; words are slices of it.
        points = codes.astype("<u4")
        points += np.uint32(base)
        text = str(memoryview(points), "utf-32-le")
        del points
        # At most T - words merges can happen; the trainer reserves memory (62-100 bytes per merge) for what it
        # is asked up front, so it is asked for no more.
        possible = min(num_merges, len(codes) - len(word_lengths))
        merges, phrase_strings = _train_bpe(text, word_starts, word_stops, codebook_size, base, possible,
                                            min_frequency, show_progress)

        phrase_lengths = np.array([len(s) for s in phrase_strings], dtype=np.int64)  # [P]
        # [sum(lengths)] the phrases' codes, concatenated (a merged token's string is its expansion)
        flat = np.frombuffer("".join(phrase_strings).encode("utf-32-le"), dtype="<u4").astype(np.int64) - base
        counts = (_substring_counts(codes, np.repeat(word_stops, word_lengths), flat, phrase_lengths, codebook_size)
                  if len(phrase_strings) else np.zeros(0, dtype=np.int64))

        from . import __version__
        import tokenizers

        metadata = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "hf_sjd_version": __version__,
            "paper": PAPER_URL, "codebook_size": codebook_size, "fingerprint": fingerprint,
            "num_merges": num_merges, "merges_applied": len(merges), "row_length": row_length,
            "grid": list(grid) if grid is not None else None, "min_frequency": min_frequency,
            "source": source,
            "corpus": {"sequences": len(seq_lengths), "words": len(word_lengths), "tokens": len(codes)},
            "counts": COUNTS_DEFINITION,
            "trainer": {"library": "tokenizers", "version": tokenizers.__version__},
            "build_seconds": round(time.perf_counter() - start, 2),
            **extra_metadata,
        }
        return cls(torch.from_numpy(flat), torch.from_numpy(phrase_lengths), torch.from_numpy(counts), metadata)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        data = ModelCardData(**self._hub_mixin_info.model_card_data.to_dict())
        source = self._metadata.get("source") or {}
        dataset = source.get("dataset")
        if isinstance(dataset, str) and dataset.count("/") == 1 and not os.path.exists(dataset):
            data.datasets = [dataset]  # a Hub dataset id; local paths are not linked
        stats = {
            "phrases": len(self), "merges": self.num_merges,
            "mean phrase length": f"{float(self.lengths.float().mean()):.2f}" if len(self) else "-",
            "max phrase length": self.max_length, "codebook size": self.codebook_size,
            "tokenizer fingerprint": f"`{self.fingerprint}`", "row length": self._metadata.get("row_length"),
            "grid": self._metadata.get("grid"), "corpus tokens": (self._metadata.get("corpus") or {}).get("tokens"),
            "source": json.dumps(source) if source else None,
        }
        table = "\n".join(f"| {k} | {v} |" for k, v in stats.items())
        command = (self._metadata.get("build") or {}).get("command")
        half = (self.num_merges or 0) // 2 or min(self.num_merges or 0, 1)  # a first(k) the library takes
        body = f"""
# SJD-PV phrase library

Frequent runs of VQ image codes mined with BPE, for phrase verification in speculative Jacobi decoding
([SJD-PV, arXiv:2603.06666]({PAPER_URL})). Built with hf_sjd {self._metadata.get('hf_sjd_version', '')}.

| | |
|---|---|
{table}

`counts` = {COUNTS_DEFINITION}.
{f'''
Built with:

```bash
{command}
```
''' if command else ''}
## Usage

```python
from hf_sjd import PhraseLibrary

library = PhraseLibrary.from_pretrained("<repo or folder>", fingerprint=vq.fingerprint())
library.codes, library.lengths  # every phrase's codes concatenated, and each phrase's length
library.phrase_list()[:5]  # the first five merges, as lists of codes
{f"library.first({half})  # the first {half} merges only{chr(10)}" if half else ""}```
"""
        return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")

    def save_pretrained(self, save_directory: str | Path, *, config: dict | None = None, repo_id: str | None = None,
                        push_to_hub: bool = False, model_card_kwargs: dict | None = None,
                        **push_to_hub_kwargs: Any) -> str | None:
        """Save the library into its own folder, replacing any library there as a whole (``push_to_hub=True``:
        push it too, as ``ModelHubMixin.save_pretrained`` does).

        ``ValueError`` before anything is touched for a folder holding anything else (the save replaces it) and
        for a library ``from_pretrained`` could not read back. The folder appears whole, or not at all."""
        if config is not None:
            raise TypeError("PhraseLibrary.save_pretrained takes no config: the library's metadata is saved in "
                            f"{METADATA_FILE}")
        check_not_special(save_directory, "save_directory")
        save_directory = Path(save_directory).expanduser()
        if save_directory.exists() and not save_directory.is_dir():
            raise NotADirectoryError(f"save_directory {str(save_directory)!r} exists and is not a folder")
        check_no_foreign_files(save_directory, "save_directory")
        self._check_saveable()
        self._save_pretrained(save_directory)  # not the mixin's save_pretrained: it makes the folder first
        if push_to_hub:
            return self.push_to_hub(repo_id or save_directory.name, model_card_kwargs=model_card_kwargs,
                                    **push_to_hub_kwargs)
        return None

    def _metadata_json(self, digest: str) -> str:
        metadata = {**{k: v for k, v in self._metadata.items() if k != "loaded_from"}, "format": FORMAT,
                    "format_version": FORMAT_VERSION, DIGEST_KEY: digest}  # a save writes the current format
        return _as_json("this library's metadata", metadata, indent=2, sort_keys=True) + "\n"

    def _check_saveable(self) -> None:
        """``ValueError`` unless ``from_pretrained`` can read what a save writes (the checks of :meth:`from_files`
        on its metadata, exact sizes), ``TypeError`` for metadata that is not plain JSON: before any file or Hub
        repo is made."""
        text = self._metadata_json("0" * 64)
        metadata = json.loads(text)
        _check_metadata(metadata, "this library's metadata")
        _check_num_merges(metadata, "this library's metadata", len(self))
        tensor_bytes = 4 * self.codes.numel() + (4 + 8) * len(self)  # int32 codes, int32 lengths, int64 counts
        if tensor_bytes > MAX_FILE_BYTES - (1 << 16):  # 64 KiB for the safetensors header
            raise ValueError(f"this library's {len(self)} phrases ({self.codes.numel()} codes) need {tensor_bytes} "
                             f"bytes in {PHRASES_FILE}; from_pretrained reads at most {MAX_FILE_BYTES}: save fewer "
                             "merges (library.first(num_merges))")
        size = len(text.encode("utf-8"))
        if size > MAX_METADATA_BYTES:
            raise ValueError(f"this library's metadata is {size} bytes of JSON; from_pretrained reads at most "
                             f"{MAX_METADATA_BYTES} bytes of {METADATA_FILE}: keep less in extra_metadata / source")

    def push_to_hub(self, repo_id: str, *, timeout: float | None = PUSH_TIMEOUT, **kwargs: Any) -> str:
        """Push the library to a Hub repo (``ModelHubMixin.push_to_hub``'s arguments: ``branch``, ``private``,
        ``token``, ``commit_message``, ...), after the checks of :meth:`save_pretrained`.

        ``timeout``: seconds each request may wait to connect or for the next byte (``None``: for ever), see
        :func:`hf_sjd.hub.bounded_requests`."""
        from .hub import bounded_requests

        timeout = check_float("timeout", timeout, minimum=0.0, low_open=True, allow_none=True)
        self._check_saveable()
        with bounded_requests(timeout, f"pushing the phrase library to {repo_id}"):
            return super().push_to_hub(repo_id, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        """The three files, swapped in whole (:func:`hf_sjd.files.atomic_folder`: a failed save leaves the previous
        library). The metadata records the tensors file's SHA-256: files of two saves are refused on load."""
        from safetensors.torch import save

        # Ragged on disk: all codes concatenated (int32, codes < 2^17), split by `lengths`. One safetensors
        # metadata key only: the header's key order is not deterministic otherwise.
        tensors = save({"phrases": self.codes.to(torch.int32).cpu().contiguous(),
                        "lengths": self.lengths.to(torch.int32).cpu().contiguous(),
                        "counts": self.counts.cpu().contiguous()},
                       metadata={"format": f"{FORMAT} v{FORMAT_VERSION}: phrases = concatenated codes of all "
                                           "phrases, split by lengths"})
        with atomic_folder(save_directory) as tmp:
            (tmp / PHRASES_FILE).write_bytes(tensors)
            (tmp / METADATA_FILE).write_text(self._metadata_json(hashlib.sha256(tensors).hexdigest()),
                                             encoding="utf-8")
            self.generate_model_card().save(tmp / CARD_FILE)
            for name in _ARTIFACT_FILES:
                os.chmod(tmp / name, 0o644)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, revision: str | None = None,
                        fingerprint: str | None = None, codebook_size: int | None = None,
                        ignore_fingerprint: bool = False, cache_dir: str | Path | None = None,
                        force_download: bool = False, local_files_only: bool = False,
                        token: str | bool | None = None) -> PhraseLibrary:
        """Load a library from a folder or a Hub repo (``revision``: branch, tag or commit); files are found as
        :func:`library_files` says. The model's tokenizer ``fingerprint`` (and ``codebook_size``) refuse a library
        built for another tokenizer (``ValueError``; ``ignore_fingerprint=True`` overrides)."""
        # Not ModelHubMixin.from_pretrained: it only adds config.json handling (this artifact has none).
        name = str(pretrained_model_name_or_path)
        library = cls.from_files(*library_files(name, revision=revision, cache_dir=cache_dir,
                                                force_download=force_download, local_files_only=local_files_only,
                                                token=token), name=name)
        library.check_compatible(fingerprint, codebook_size, ignore_fingerprint=ignore_fingerprint)
        return library

    @classmethod
    def from_files(cls, tensors_path: str | Path, metadata_path: str | Path, name: str | None = None
                   ) -> PhraseLibrary:
        """The library stored in these two files (no compatibility check). ``ValueError`` naming the field for
        metadata off its schema; sizes checked with exact integers; one whole save is read (:func:`_read_pair`)."""
        tensors_path, metadata_path = Path(tensors_path), Path(metadata_path)
        tensor_bytes, metadata_bytes = _read_pair(tensors_path, metadata_path)
        try:
            metadata = json.loads(metadata_bytes.decode("utf-8"))
            if not isinstance(metadata, dict):
                raise ValueError("top level is not a JSON object")
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            reason = "nested too deeply" if isinstance(error, RecursionError) else error
            raise ValueError(f"cannot read phrase library metadata {metadata_path}: {reason}") from None
        if metadata.get("format") != FORMAT or not _is_int(metadata.get("format_version")) \
                or metadata["format_version"] > FORMAT_VERSION:
            raise ValueError(f"{metadata_path} is not a phrase library this hf_sjd can read (format "
                             f"{metadata.get('format')!r} version {metadata.get('format_version')!r}; "
                             f"supported: {FORMAT!r} <= {FORMAT_VERSION})")
        _check_metadata(metadata, metadata_path)
        try:
            flat, lengths, counts = _read_tensors(tensor_bytes)
        except Exception as error:  # safetensors raises its own (Rust) error types for corrupt headers
            raise ValueError(f"cannot read phrase library tensors {tensors_path}: {error}") from error
        digest = metadata.pop(DIGEST_KEY, None)
        if digest is not None and digest != hashlib.sha256(tensor_bytes).hexdigest():
            raise ValueError(f"{metadata_path} records {PHRASES_FILE} SHA-256 {str(digest)[:12]}..., but "
                             f"{tensors_path} has another: the two files come from different saves")
        codebook_size = metadata.get("codebook_size")
        if codebook_size is not None and len(flat) and int(flat.max()) >= codebook_size:
            raise ValueError(f"{tensors_path} holds code {int(flat.max())}, outside [0, codebook_size="
                             f"{codebook_size}) recorded in {metadata_path}")
        try:
            library = cls(flat, lengths, counts, {**metadata, "loaded_from": name or str(tensors_path.parent)})
        except ValueError as error:
            raise ValueError(f"inconsistent phrase library tensors in {tensors_path}: {error}") from error
        if metadata.get("num_phrases") not in (None, len(library)):
            raise ValueError(f"{metadata_path} says num_phrases={metadata['num_phrases']} but {tensors_path} holds "
                             f"{len(library)}: the two files come from different saves")
        _check_num_merges(metadata, metadata_path, len(library))
        return library


_ARTIFACT_FILES = (PHRASES_FILE, METADATA_FILE, CARD_FILE)
_OLD_TEMP_PREFIX = ".phrase-library-"  # temporary folders of the per-file writer of hf_sjd <= 0.1
DIGEST_KEY = "phrases_sha256"
_READ_ATTEMPTS = 20  # a folder being swapped by a save is missing for a moment at most


def check_no_foreign_files(folder: Path, flag: str) -> None:
    """``ValueError`` naming ``flag`` when ``folder`` holds anything but a phrase library: a save replaces it."""
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in _ARTIFACT_FILES
                     and not p.name.startswith(_OLD_TEMP_PREFIX)) if folder.is_dir() else []
    if foreign:
        raise ValueError(f"{flag} {folder} holds files that are not part of a phrase library ({', '.join(foreign[:5])}"
                         f"{' ...' if len(foreign) > 5 else ''}); a save replaces the whole folder: pass a new folder "
                         "or an earlier library's")


def _read_bytes(name: str | Path, limit: int, dir_fd: int | None = None) -> bytes:
    """A whole file through one descriptor, refused (``ValueError``) above ``limit`` bytes before reading."""
    with os.fdopen(os.open(name, os.O_RDONLY, dir_fd=dir_fd), "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise ValueError(f"{name} is {size} bytes; a phrase library file is at most {limit}")
        return handle.read()


def _read_pair(tensors_path: Path, metadata_path: Path) -> tuple[bytes, bytes]:
    """Both files' bytes, from one save: files of one folder are opened through one descriptor of it (a save
    swaps the whole folder); if the save deletes the old files meanwhile, read again (bounded)."""
    same_folder = tensors_path.parent == metadata_path.parent and os.open in os.supports_dir_fd
    for attempt in range(_READ_ATTEMPTS):
        try:
            if not same_folder:
                return (_read_bytes(tensors_path, MAX_FILE_BYTES), _read_bytes(metadata_path, MAX_METADATA_BYTES))
            folder = os.open(tensors_path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                metadata = _read_bytes(metadata_path.name, MAX_METADATA_BYTES, dir_fd=folder)
                return _read_bytes(tensors_path.name, MAX_FILE_BYTES, dir_fd=folder), metadata
            finally:
                os.close(folder)
        except FileNotFoundError:
            if attempt == _READ_ATTEMPTS - 1:
                raise
            time.sleep(0.001 * (attempt + 1))
        except OSError as error:
            raise ValueError(f"cannot read phrase library {tensors_path.parent}: {error}") from error


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return _is_int(value) and value >= 0


def _is_positive(value: Any) -> bool:
    return _is_int(value) and value >= 1


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


# Every field the builder writes: (check, allowed values in words, may be null). Other fields (extra_metadata)
# need only be JSON, which they are once parsed.
_METADATA_SCHEMA: dict[str, tuple[Any, str, bool]] = {
    "hf_sjd_version": (_is_str, "a string", False),
    "paper": (_is_str, "a string", False),
    "codebook_size": (lambda v: _is_int(v) and 1 <= v <= MAX_CODEBOOK_SIZE, f"an integer in [1, {MAX_CODEBOOK_SIZE}]",
                      True),
    "fingerprint": (_is_str, "a string", True),
    "num_merges": (_is_positive, "an integer >= 1", False),
    "merges_applied": (_is_count, "an integer >= 0", False),
    "first_of_merges": (_is_positive, "an integer >= 1", False),
    "num_phrases": (_is_count, "an integer >= 0", False),
    "row_length": (_is_positive, "an integer >= 1", True),
    "grid": (lambda v: isinstance(v, list) and len(v) == 2 and all(_is_positive(g) for g in v),
             "a list of two integers >= 1", True),
    "min_frequency": (_is_positive, "an integer >= 1", False),
    "source": (lambda v: isinstance(v, dict), "a JSON object", True),
    "corpus": (lambda v: isinstance(v, dict) and all(_is_count(n) for n in v.values()),
               "a JSON object of integers >= 0", True),
    "counts": (_is_str, "a string", False),
    "trainer": (lambda v: isinstance(v, dict), "a JSON object", True),
    "build": (lambda v: isinstance(v, dict), "a JSON object", True),
    "build_seconds": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
                      "a number >= 0", True),
    DIGEST_KEY: (lambda v: isinstance(v, str) and len(v) == 64, "a SHA-256 hex digest", False),
}


def _check_metadata(metadata: dict, where: str | Path) -> None:
    """``ValueError`` naming the first field whose type or range is not what the builder writes."""
    for key, (check, allowed, nullable) in _METADATA_SCHEMA.items():
        if key not in metadata or (metadata[key] is None and nullable):
            continue
        if not check(metadata[key]):
            value = repr(metadata[key])
            raise ValueError(f"{where}: field {key!r} must be {allowed}{' or null' if nullable else ''}, "
                             f"got {value[:80]}{'...' if len(value) > 80 else ''}")


def _check_num_merges(metadata: dict, where: str | Path, num_phrases: int) -> None:
    """``ValueError`` for a ``num_merges`` below the library's phrases: each phrase is one merge."""
    if metadata.get("num_merges") is not None and metadata["num_merges"] < num_phrases:
        raise ValueError(f"{where} says num_merges={metadata['num_merges']}, fewer than the {num_phrases} phrases "
                         "(each phrase is one merge)")


def _read_tensors(data: bytes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(concatenated codes, lengths, counts) as LongTensors from a tensors file's bytes, every size checked
    with exact (Python) integers: int64 sums of hostile lengths wrap around."""
    from safetensors.torch import load

    tensors = load(data)  # checks the header against the buffer: nothing is allocated beyond the file's size
    missing = {"phrases", "lengths", "counts"} - set(tensors)
    if missing:
        raise ValueError(f"missing tensors {sorted(missing)}")
    flat, lengths, counts = tensors["phrases"], tensors["lengths"], tensors["counts"]
    if flat.ndim != 1 or lengths.ndim != 1 or counts.shape != lengths.shape:
        raise ValueError(f"expected phrases [T], lengths [P], counts [P]; got shapes "
                         f"{ {k: list(t.shape) for k, t in tensors.items()} }")
    for key, tensor in (("phrases", flat), ("lengths", lengths), ("counts", counts)):
        if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype in (torch.bool, torch.uint64):
            raise ValueError(f"{key} has dtype {tensor.dtype}; expected integers of at most 64 bits, signed")
    lengths_list = lengths.tolist()
    if lengths_list and min(lengths_list) < 2:
        raise ValueError(f"a phrase length is {min(lengths_list)}; every phrase has >= 2 codes")
    total = sum(lengths_list)  # exact
    if total != flat.shape[0]:
        raise ValueError(f"{flat.shape[0]} concatenated codes do not split into lengths summing to {total}")
    for key, tensor in (("phrases", flat), ("counts", counts)):
        if len(tensor) and int(tensor.min()) < 0:  # exact: every dtype left fits in int64
            raise ValueError(f"{key} holds {int(tensor.min())}; expected values >= 0")
    return flat.long(), lengths.long(), counts.long()


def library_files(name: str | Path, *, revision: str | None = None, cache_dir: str | Path | None = None,
                  force_download: bool = False, local_files_only: bool = False,
                  token: str | bool | None = None) -> tuple[Path, Path]:
    """``(phrases.safetensors, phrase_library.json)`` of a library folder or Hub repo, resolved locally.

    A name that can only be a path (``./x``, ``/x``, ``~/x``) and does not exist: ``FileNotFoundError``. A Hub
    look-up fails in seconds (:func:`hf_sjd.hub.head`): offline and not cached, ``FileNotFoundError``;
    unreachable and not cached, ``ConnectionError``; a file over the loader's limit is refused before download."""
    from huggingface_hub import is_offline_mode
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    from .hub import head

    text = str(name)
    local = Path(text).expanduser()
    if local.is_dir():
        paths = (local / PHRASES_FILE, local / METADATA_FILE)
        for path in paths:
            if not path.is_file():
                raise FileNotFoundError(f"{path} not found: {text} is not a phrase library folder "
                                        f"(expected {PHRASES_FILE} and {METADATA_FILE})")
        return paths
    if local.exists():
        raise NotADirectoryError(f"phrase library {text!r} is a file; expected a folder holding {PHRASES_FILE} "
                                 f"and {METADATA_FILE}, or a Hub repo id")
    if looks_local(text):
        raise FileNotFoundError(f"no such folder: {text} (phrase library; a Hub repo id looks like 'namespace/name')")
    try:
        validate_repo_id(text)
    except HFValidationError as error:
        raise ValueError(f"phrase library {text!r} is neither an existing folder nor a valid Hub repo id: "
                         f"{error}") from None

    offline = local_files_only or is_offline_mode()
    reason = None
    if not offline:
        for filename, limit in ((PHRASES_FILE, MAX_FILE_BYTES), (METADATA_FILE, MAX_METADATA_BYTES)):
            metadata, reason = head(text, filename, revision=revision, token=token)
            if reason is not None:
                break
            if metadata is not None and metadata.size is not None and metadata.size > limit:
                raise ValueError(f"phrase library {text!r}: its {filename} is {metadata.size} bytes on the Hub; "
                                 f"from_pretrained reads at most {limit}, so it is not downloaded")
    offline = offline or reason is not None
    try:
        return tuple(Path(hf_hub_download(repo_id=text, filename=filename, revision=revision, cache_dir=cache_dir,
                                          force_download=force_download and not offline, local_files_only=offline,
                                          token=token))
                     for filename in (PHRASES_FILE, METADATA_FILE))
    except LocalEntryNotFoundError:
        if reason is not None:
            raise ConnectionError(
                f"phrase library {text!r}: {reason}, and it is not in the Hub cache. Check the connection (and "
                "HF_ENDPOINT), check the repo id, or pass a local folder") from None
        how = "local_files_only=True" if local_files_only else "HF_HUB_OFFLINE=1"
        raise FileNotFoundError(
            f"phrase library {text!r} is not a local folder and is not in the Hub cache, and Hub look-ups are off "
            f"({how}): check the id, or pass a local folder, or "
            f"{'pass local_files_only=False' if local_files_only else 'set HF_HUB_OFFLINE=0'} and check the "
            "connection") from None


def _train_bpe(text: str, word_starts: np.ndarray, word_stops: np.ndarray, codebook_size: int, base: int,
               num_merges: int, min_frequency: int, show_progress: bool) -> tuple[list, list[str]]:
    """Run ``tokenizers``' BpeTrainer; returns (merges as (left id, right id), new token strings in id order)."""
    from tokenizers import Tokenizer, models, trainers

    alphabet = [chr(base + c) for c in range(codebook_size)]
    tokenizer = Tokenizer(models.BPE())  # no normalizer, no pre-tokenizer: one BPE word per input string
    trainer = trainers.BpeTrainer(vocab_size=codebook_size + num_merges, min_frequency=min_frequency,
                                  show_progress=show_progress, special_tokens=[], initial_alphabet=alphabet,
                                  limit_alphabet=codebook_size)
    words = (text[s:e] for s, e in zip(word_starts.tolist(), word_stops.tolist()))
    tokenizer.train_from_iterator(words, trainer=trainer, length=len(word_starts))
    model = json.loads(tokenizer.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    if len(vocab) < codebook_size or any(vocab.get(ch) != c for c, ch in enumerate(alphabet)):
        raise RuntimeError("tokenizers' BPE alphabet does not map code c to id c; the code->character map is broken")
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    phrase_strings = [token for token, _ in by_id[codebook_size:]]
    merges = []
    for pair in model["merges"]:
        left, right = pair if isinstance(pair, (list, tuple)) else pair.split(" ")
        if left + right not in vocab:  # a merged symbol's string is the concatenation of its parts' strings
            raise RuntimeError(f"merge {pair} has no vocabulary entry")
        merges.append((vocab[left], vocab[right]))
    return merges, phrase_strings


def resolve_library(library, adapter, ignore_fingerprint: bool = False) -> PhraseLibrary:
    """``phrase_library=`` (a PhraseLibrary, a folder or a Hub repo id; ``None``: the adapter's default), checked
    against the adapter's tokenizer fingerprint."""
    if library is None:
        library = adapter.default_phrase_library
        if library is None:
            raise ValueError(f"phrase verification needs phrase_library=... (a PhraseLibrary, a folder or a Hub "
                             f"repo id); the {adapter.family!r} adapter has no default library for this model. "
                             f"Build one with `hf-sjd build-phrases --model ...` (or scripts/build_phrase_library.py "
                             f"in a source checkout)")
    fingerprint = None if ignore_fingerprint else adapter.tokenizer_fingerprint
    if isinstance(library, PhraseLibrary):
        library.check_compatible(fingerprint, ignore_fingerprint=ignore_fingerprint)
    else:
        library = _load_library(str(library), fingerprint, ignore_fingerprint)
    if fingerprint is None and library.fingerprint is not None and not ignore_fingerprint:
        warnings.warn(f"the model records no VQ tokenizer fingerprint; cannot check that "
                      f"{library._metadata.get('loaded_from', 'the phrase library')} (built for "
                      f"{library.fingerprint!r}) holds this model's codes", stacklevel=3)
    return library


def _load_library(name: str, fingerprint: str | None, ignore_fingerprint: bool) -> PhraseLibrary:
    """A library folder or Hub repo, read once per version of its files (both files' identity is the cache key:
    a folder rebuilt in place or a Hub revision that moved is read again), checked on every call."""
    paths = library_files(name)
    identity = tuple((os.path.realpath(p), s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)
                     for p, s in ((p, os.stat(p)) for p in paths))
    library = _read_library(paths, identity, name)
    library.check_compatible(fingerprint, ignore_fingerprint=ignore_fingerprint)
    return library


@functools.lru_cache(maxsize=8)
def _read_library(paths: tuple[Path, Path], identity: tuple, name: str) -> PhraseLibrary:
    return PhraseLibrary.from_files(*paths, name=name)  # identity: only part of the cache key


__all__ = ["COUNTS_DEFINITION", "METADATA_FILE", "PHRASES_FILE", "PhraseLibrary", "library_files"]
