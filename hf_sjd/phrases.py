"""Phrase library for SJD-PV: frequent runs of VQ image codes, mined offline with BPE.

"Speculative Jacobi Decoding with Phrase Verification for Autoregressive Image Generation"
(arXiv:2603.06666) observes that image semantics live in runs of consecutive tokens, not in single
tokens. Offline it builds a library of frequent token *phrases* with byte-pair encoding over tokenized
images: repeatedly merge the most frequent adjacent symbol pair (M merges, M = 8k in the paper), then
expand every merged symbol recursively into the code sequence it stands for. At decode time a drafted
window that matches a phrase is verified jointly (``log R = sum_k log p(v_k) - log q(v_k)``); that
verifier lives elsewhere. This module builds, stores and loads the library artifact.

BPE runs in the Rust trainer of Hugging Face ``tokenizers``; each image code is one Unicode character
(code ``c`` -> ``chr(base + c)``), so a merged token's string *is* its recursive expansion.
"""

from __future__ import annotations

import json
import operator
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import ModelCard, ModelCardData, ModelHubMixin, hf_hub_download

PAPER_URL = "https://arxiv.org/abs/2603.06666"
PHRASES_FILE = "phrases.safetensors"
METADATA_FILE = "phrase_library.json"
CARD_FILE = "README.md"
FORMAT = "hf_sjd.phrase_library"
FORMAT_VERSION = 1
COUNTS_DEFINITION = ("number of (possibly overlapping) occurrences of the phrase's code sequence inside one "
                     "BPE word (one grid row if row_length is set, else one whole sequence) of the corpus")

# Code -> character maps. CJK Unified Ideographs (U+4E00..U+9FFF) hold codebooks up to 20992 codes
# (LlamaGen 16384, Janus 16384); larger ones (Emu3 32768, up to 2^17) use the supplementary private-use
# planes U+F0000..U+10FFFF. Both ranges are contiguous, so code order == character order == the
# trainer's alphabet id order (it sorts its alphabet by code point).
_CJK_BASE, _CJK_SIZE = 0x4E00, 0x9FFF - 0x4E00 + 1
_PUA_BASE, _PUA_SIZE = 0xF0000, 0x10FFFF - 0xF0000 + 1
MAX_CODEBOOK_SIZE = _PUA_SIZE


def _code_point_base(codebook_size: int) -> int:
    return _CJK_BASE if codebook_size <= _CJK_SIZE else _PUA_BASE


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> int | None:
    """``operator.index`` accepts int / numpy ints / 0-d int tensors and rejects floats, bools and strings."""
    if value is None and allow_none:
        return None
    allowed = f"{'None or ' if allow_none else ''}an integer >= {minimum}"
    if isinstance(value, bool):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})") from None
    if value < minimum:
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def _as_code_array(index: int, sequence: Any) -> np.ndarray:
    """One sequence -> 1-D int64 array, with errors that name ``sequences[index]``."""
    if isinstance(sequence, torch.Tensor):
        sequence = sequence.detach().cpu().numpy()
    elif isinstance(sequence, (str, bytes)):
        raise TypeError(f"sequences[{index}] is a {type(sequence).__name__}; expected a 1-D sequence of integer VQ codes")
    array = np.asarray(sequence)
    if array.ndim != 1:
        raise ValueError(f"sequences[{index}] has shape {tuple(array.shape)}; each sequence must be 1-D "
                         "(flatten image grids in raster order)")
    if array.size == 0:
        raise ValueError(f"sequences[{index}] is empty; every sequence needs at least one VQ code")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"sequences[{index}] has dtype {array.dtype}; VQ codes must be integers")
    return array.astype(np.int64, copy=False)


def _read_corpus(sequences: Any) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate all sequences: (codes [T] int64, sequence lengths [N] int64)."""
    if isinstance(sequences, (torch.Tensor, np.ndarray)) and sequences.ndim == 2:
        # Fast path for a [N, L] batch of equal-length sequences (the usual tokenized-image corpus).
        array = sequences.detach().cpu().numpy() if isinstance(sequences, torch.Tensor) else sequences
        if array.shape[0] == 0 or array.shape[1] == 0:
            raise ValueError(f"sequences is empty (shape {tuple(array.shape)}); need at least one non-empty sequence")
        if not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"sequences has dtype {array.dtype}; VQ codes must be integers")
        return array.astype(np.int64).reshape(-1), np.full(array.shape[0], array.shape[1], dtype=np.int64)
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


def _substring_counts(codes: np.ndarray, word_end: np.ndarray, phrases: np.ndarray, lengths: np.ndarray,
                      codebook_size: int) -> np.ndarray:
    """Overlapping occurrences of every phrase inside a word, in one vectorised pass over a phrase trie.

    ``codes`` [T]; ``word_end`` [T] = end index (exclusive) of the word holding each position;
    ``phrases`` [P, L] padded with -1; ``lengths`` [P]. Hand-written because no library in use counts
    a fixed pattern set in an int array; a trie walk costs O(sum over depths of live prefixes), far below
    P separate scans.
    """
    num_phrases, max_len = phrases.shape
    node = np.zeros(num_phrases, dtype=np.int64)  # [P] trie node of each phrase's prefix; 0 = root
    keys, children, terminal_nodes, terminal_phrases = [], [], [], []
    next_node = 1
    for depth in range(max_len):
        alive = np.flatnonzero(lengths > depth)
        edge = node[alive] * codebook_size + phrases[alive, depth]  # (parent, code) packed in one int64
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
    """Library of frequent VQ-code phrases (SJD-PV, arXiv:2603.06666), as padded tensors for a verifier.

    Phrase ``i`` is the code run ``phrases[i, :lengths[i]]`` (length >= 2); phrases are stored in BPE merge
    order, so ``first(M)`` is exactly the library M merges would have built. ``counts[i]`` is the
    phrase's corpus frequency: the number of (possibly overlapping) occurrences of its code sequence
    inside one BPE word of the corpus -- a segmentation-free statistic, so it does not depend on how many
    merges are kept.

    Tensors (on ``device``): ``phrases`` LongTensor [P, max_len] padded with -1, ``lengths`` [P],
    ``counts`` [P].

    >>> import torch
    >>> from hf_sjd import PhraseLibrary
    >>> corpus = torch.tensor([[1, 2, 3, 1, 2, 3, 0, 0], [1, 2, 3, 4, 1, 2, 3, 0]])
    >>> lib = PhraseLibrary.from_token_sequences(corpus, num_merges=2, codebook_size=5)
    >>> lib.phrase_list(), lib.counts.tolist()
    ([[1, 2], [1, 2, 3]], [4, 4])
    >>> lib.first(1).phrase_list()
    [[1, 2]]
    >>> # lib.save_pretrained("dir"); PhraseLibrary.from_pretrained("dir", fingerprint=vq.fingerprint())
    """

    def __init__(self, phrases: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor,
                 metadata: dict | None = None) -> None:
        phrases, lengths, counts = (torch.as_tensor(t).long() for t in (phrases, lengths, counts))
        if phrases.ndim != 2 or lengths.shape != (phrases.shape[0],) or counts.shape != lengths.shape:
            raise ValueError(f"expected phrases [P, max_len], lengths [P], counts [P]; got "
                             f"{tuple(phrases.shape)}, {tuple(lengths.shape)}, {tuple(counts.shape)}")
        in_phrase = torch.arange(phrases.shape[1], device=phrases.device) < lengths[:, None].to(phrases.device)
        if not torch.equal(phrases >= 0, in_phrase) or not torch.equal(phrases[~in_phrase], torch.full_like(
                phrases[~in_phrase], -1)) or (lengths < 2).any():
            raise ValueError("phrase i must be phrases[i, :lengths[i]] (codes >= 0, length >= 2) followed by -1 padding")
        self.phrases, self.lengths, self.counts = phrases, lengths, counts
        self._metadata = dict(metadata or {})
        self._metadata["num_phrases"] = len(lengths)
        # The mixin would serialise __init__ args into config.json; the metadata goes to phrase_library.json.
        self._hub_mixin_config = None

    # ------------------------------------------------------------------ properties
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
        return self.phrases.shape[1]

    @property
    def device(self) -> torch.device:
        return self.phrases.device

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def __repr__(self) -> str:
        mean = float(self.lengths.float().mean()) if len(self) else 0.0
        return (f"PhraseLibrary(phrases={len(self)}, merges={self.num_merges}, mean_length={mean:.2f}, "
                f"max_length={self.max_length}, codebook_size={self.codebook_size}, "
                f"fingerprint={self.fingerprint!r}, device={self.device})")

    def phrase_list(self) -> list[list[int]]:
        """Phrases as Python lists of codes, in merge order."""
        return [row[:n].tolist() for row, n in zip(self.phrases.cpu(), self.lengths.tolist())]

    def to(self, device: str | torch.device) -> PhraseLibrary:
        """Move the tensors (in place, like ``nn.Module.to``) and return ``self``."""
        self.phrases, self.lengths, self.counts = (t.to(device) for t in (self.phrases, self.lengths, self.counts))
        return self

    def first(self, num_merges: int) -> PhraseLibrary:
        """The sub-library of the first ``num_merges`` merges (merge-count ablations without rebuilding).

        Identical to building with ``num_merges`` on the same corpus: BPE is greedy, so a shorter run is
        a prefix of a longer one, and counts do not depend on the number of merges.
        """
        num_merges = _check_int("num_merges", num_merges, 1)
        if num_merges > self.num_merges:
            raise ValueError(f"num_merges must be in [1, {self.num_merges}] (this library's merges), got {num_merges}")
        keep = min(num_merges, len(self))
        lengths = self.lengths[:keep]
        width = int(lengths.max()) if keep else 0
        metadata = {**self._metadata, "num_merges": num_merges, "first_of_merges": self.num_merges}
        return PhraseLibrary(self.phrases[:keep, :width].clone(), lengths.clone(), self.counts[:keep].clone(), metadata)

    def check_compatible(self, fingerprint: str | None = None, codebook_size: int | None = None, *,
                         ignore_fingerprint: bool = False) -> None:
        """Raise ``ValueError`` unless this library was built for the VQ tokenizer described by the arguments.

        ``ignore_fingerprint=True`` accepts a fingerprint mismatch (and a codebook-size mismatch whose
        codes still fit); codes outside ``[0, codebook_size)`` are never accepted.
        """
        name = self._metadata.get("loaded_from", "this phrase library")
        if fingerprint is not None and not ignore_fingerprint:
            if self.fingerprint is None:
                warnings.warn(f"{name} records no tokenizer fingerprint; cannot check it against {fingerprint!r}",
                              stacklevel=2)
            elif self.fingerprint != fingerprint:
                raise ValueError(
                    f"{name} was built for VQ tokenizer fingerprint {self.fingerprint!r}, but the model's tokenizer "
                    f"has fingerprint {fingerprint!r}: its phrases are codes of a different codebook. Rebuild the "
                    "library for this model (scripts/build_phrase_library.py --model ...) or pass "
                    "ignore_fingerprint=True to use it anyway.")
        if codebook_size is not None and self.codebook_size is not None and codebook_size != self.codebook_size:
            fits = len(self) == 0 or int(self.phrases.max()) < codebook_size
            if not (ignore_fingerprint and fits):
                raise ValueError(f"{name} was built for codebook_size={self.codebook_size}, but the model's "
                                 f"codebook_size is {codebook_size}"
                                 + ("; pass ignore_fingerprint=True to use it anyway" if fits else
                                    "; its codes do not fit in the model's codebook"))

    # ------------------------------------------------------------------ building
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
                no phrase crosses a grid-row boundary; ``None`` (default) keeps one word per sequence, as
                plain BPE over the raster sequence does (the paper's setting; raster decoding drafts
                windows that run across row ends too). On the reference model, rows of 16 gave the same
                phrase count and length but matched fewer held-out raster windows (67.3% vs 68.0% of
                positions); see scripts/build_phrase_library.py.
            codebook_size: ids must lie in ``[0, codebook_size)``; inferred as ``max id + 1`` when None.
            fingerprint: tokenizer fingerprint stored for ``check_compatible`` (e.g. ``vq.fingerprint()``).
            source: dataset id or dict (dataset, split, revision, ...) stored in the metadata.
            grid: (rows, cols) of the token grid, stored in the metadata.
            min_frequency: a pair must occur at least this often to be merged (2: a phrase seen once is
                not a statistic).
            show_progress: show the trainer's progress bars.
            extra_metadata: more JSON-able fields for ``metadata`` (e.g. the build command).

        Merge rule (the trainer's, reproduced by the reference BPE in tests/test_phrases.py): merge the
        pair with the highest count of adjacent (overlapping) occurrences, ties broken by the smallest
        (left id, right id) where code c has id c and the k-th new symbol id codebook_size + k; occurrences
        are replaced left to right.
        """
        start = time.perf_counter()
        num_merges = _check_int("num_merges", num_merges, 1)
        row_length = _check_int("row_length", row_length, 1, allow_none=True)
        codebook_size = _check_int("codebook_size", codebook_size, 1, allow_none=True)
        min_frequency = _check_int("min_frequency", min_frequency, 1)
        if codebook_size is not None and codebook_size > MAX_CODEBOOK_SIZE:
            raise ValueError(f"codebook_size must be <= {MAX_CODEBOOK_SIZE}, got {codebook_size}")
        if grid is not None:
            grid = tuple(_check_int("grid", g, 1) for g in grid)
        source = _normalise_source(source)

        codes, seq_lengths = _read_corpus(sequences)  # [T], [N]
        codebook_size = _check_range(codes, seq_lengths, codebook_size)
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
        # One UTF-32 decode turns the whole corpus into characters; words are slices of it.
        text = (codes + base).astype("<u4").tobytes().decode("utf-32-le")
        merges, phrase_strings = _train_bpe(text, word_starts, word_stops, codebook_size, base, num_merges,
                                            min_frequency, show_progress)

        phrase_lengths = np.array([len(s) for s in phrase_strings], dtype=np.int64)  # [P]
        width = int(phrase_lengths.max()) if len(phrase_strings) else 0
        table = np.full((len(phrase_strings), width), -1, dtype=np.int64)  # [P, max_len]
        if len(phrase_strings):
            flat = np.frombuffer("".join(phrase_strings).encode("utf-32-le"), dtype="<u4").astype(np.int64) - base
            rows = np.repeat(np.arange(len(phrase_strings)), phrase_lengths)
            cols = np.arange(len(flat)) - np.repeat(np.cumsum(phrase_lengths) - phrase_lengths, phrase_lengths)
            table[rows, cols] = flat
            counts = _substring_counts(codes, np.repeat(word_stops, word_lengths), table, phrase_lengths,
                                       codebook_size)
        else:
            counts = np.zeros(0, dtype=np.int64)

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
            **dict(extra_metadata or {}),
        }
        return cls(torch.from_numpy(table), torch.from_numpy(phrase_lengths), torch.from_numpy(counts), metadata)

    # ------------------------------------------------------------------ Hub / disk
    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        data = ModelCardData(**self._hub_mixin_info.model_card_data.to_dict())
        source = self._metadata.get("source") or {}
        dataset = source.get("dataset")
        if isinstance(dataset, str) and dataset.count("/") == 1 and not os.path.exists(dataset):
            data.datasets = [dataset]  # a Hub dataset id; local paths are not linked
        lengths = self.lengths.float()
        stats = {
            "phrases": len(self), "merges": self.num_merges,
            "mean phrase length": f"{float(lengths.mean()):.2f}" if len(self) else "-",
            "max phrase length": self.max_length, "codebook size": self.codebook_size,
            "tokenizer fingerprint": f"`{self.fingerprint}`", "row length": self._metadata.get("row_length"),
            "grid": self._metadata.get("grid"), "corpus tokens": (self._metadata.get("corpus") or {}).get("tokens"),
            "source": json.dumps(source) if source else None,
        }
        table = "\n".join(f"| {k} | {v} |" for k, v in stats.items())
        command = (self._metadata.get("build") or {}).get("command")
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
library.phrases  # LongTensor [num_phrases, max_len], padded with -1
library.first(4000)  # the first 4000 merges only
```
"""
        return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")

    def _save_pretrained(self, save_directory: Path) -> None:
        """Write the three files into a temporary folder first, then move each into place: a save that
        fails part-way leaves any previous library in ``save_directory`` untouched and no partial file."""
        save_directory = Path(save_directory)
        from safetensors.torch import save_file

        tmp = Path(tempfile.mkdtemp(prefix=".phrase-library-", dir=save_directory))
        try:
            # On disk the phrases are ragged: their codes concatenated (int32, codes < 2^17), split by
            # `lengths`. A padded [P, max_len] table is mostly padding (one 64-code run pads 8000 rows).
            # One safetensors metadata key only: the header's key order is not deterministic otherwise.
            save_file({"phrases": self.phrases[self.phrases >= 0].to(torch.int32).cpu().contiguous(),
                       "lengths": self.lengths.to(torch.int32).cpu().contiguous(),
                       "counts": self.counts.cpu().contiguous()},
                      tmp / PHRASES_FILE, metadata={"format": f"{FORMAT} v{FORMAT_VERSION}: phrases = concatenated "
                                                              "codes of all phrases, split by lengths"})
            metadata = {k: v for k, v in self._metadata.items() if k != "loaded_from"}
            (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            self.generate_model_card().save(tmp / CARD_FILE)
            for name in (PHRASES_FILE, METADATA_FILE, CARD_FILE):
                os.chmod(tmp / name, 0o644)  # files in a mkdtemp folder may be created 0600
                os.replace(tmp / name, save_directory / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, revision: str | None = None,
                        fingerprint: str | None = None, codebook_size: int | None = None,
                        ignore_fingerprint: bool = False, cache_dir: str | Path | None = None,
                        force_download: bool = False, local_files_only: bool = False,
                        token: str | bool | None = None) -> PhraseLibrary:
        """Load a library from a folder or a Hub repo (``revision``: branch, tag or commit).

        Pass the model's tokenizer ``fingerprint`` (and ``codebook_size``) to refuse a library built for
        another tokenizer (``ValueError``; ``ignore_fingerprint=True`` overrides).
        """
        # ModelHubMixin.from_pretrained only adds config.json handling (this artifact has none, and it
        # would warn about the missing file), so go straight to the mixin's _from_pretrained hook.
        return cls._from_pretrained(model_id=str(pretrained_model_name_or_path), revision=revision,
                                    cache_dir=cache_dir, force_download=force_download,
                                    local_files_only=local_files_only, token=token, fingerprint=fingerprint,
                                    codebook_size=codebook_size, ignore_fingerprint=ignore_fingerprint)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None, cache_dir: str | Path | None,
                         force_download: bool, local_files_only: bool, token: str | bool | None,
                         fingerprint: str | None = None, codebook_size: int | None = None,
                         ignore_fingerprint: bool = False, **kwargs: Any) -> PhraseLibrary:
        if os.path.isdir(model_id):
            paths = [Path(model_id) / name for name in (PHRASES_FILE, METADATA_FILE)]
            for path in paths:
                if not path.is_file():
                    raise FileNotFoundError(f"{path} not found: {model_id} is not a phrase library folder "
                                            f"(expected {PHRASES_FILE} and {METADATA_FILE})")
        else:
            paths = [Path(hf_hub_download(repo_id=model_id, filename=name, revision=revision, cache_dir=cache_dir,
                                          force_download=force_download, local_files_only=local_files_only,
                                          token=token))
                     for name in (PHRASES_FILE, METADATA_FILE)]
        tensors_path, metadata_path = paths
        try:
            metadata = json.loads(metadata_path.read_text(encoding="utf-8"))
            if not isinstance(metadata, dict):
                raise ValueError("top level is not a JSON object")
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ValueError(f"cannot read phrase library metadata {metadata_path}: {error}") from error
        if metadata.get("format") != FORMAT or not isinstance(metadata.get("format_version"), int) \
                or metadata["format_version"] > FORMAT_VERSION:
            raise ValueError(f"{metadata_path} is not a phrase library this hf_sjd can read (format "
                             f"{metadata.get('format')!r} version {metadata.get('format_version')!r}; "
                             f"supported: {FORMAT!r} <= {FORMAT_VERSION})")
        try:
            from safetensors.torch import load_file

            tensors = load_file(str(tensors_path))
            flat, lengths, counts = tensors["phrases"].long(), tensors["lengths"].long(), tensors["counts"]
            if flat.ndim != 1 or lengths.ndim != 1 or int(lengths.sum()) != flat.numel():
                raise ValueError(f"{flat.numel()} concatenated codes do not split into lengths summing to "
                                 f"{int(lengths.sum())}")
        except Exception as error:  # safetensors raises its own (Rust) error types for corrupt headers
            raise ValueError(f"cannot read phrase library tensors {tensors_path}: {error}") from error
        width = int(lengths.max()) if len(lengths) else 0
        phrases = torch.full((len(lengths), width), -1, dtype=torch.long)  # [P, max_len]
        phrases[torch.arange(width) < lengths[:, None]] = flat
        try:
            library = cls(phrases, lengths, counts, {**metadata, "loaded_from": model_id})
        except ValueError as error:
            raise ValueError(f"inconsistent phrase library tensors in {tensors_path}: {error}") from error
        if metadata.get("num_phrases") not in (None, len(library)):
            raise ValueError(f"{metadata_path} says num_phrases={metadata['num_phrases']} but {tensors_path} holds "
                             f"{len(library)}: the two files come from different saves")
        library.check_compatible(fingerprint, codebook_size, ignore_fingerprint=ignore_fingerprint)
        return library


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


__all__ = ["COUNTS_DEFINITION", "METADATA_FILE", "PHRASES_FILE", "PhraseLibrary"]
