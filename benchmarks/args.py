"""Flags of ``python -m benchmarks SUITE`` and their checks (all before any work), prompt data sets.

Every flag is checked (type, finiteness, range) before the model loads; the checks that need the model
(``--top-k`` against its drafted image tokens, ``--phrase-library`` against its tokenizer fingerprint) run
right after loading it, before any generation. Bad input exits with status 2 and a message naming the flag.
Flags left unset take the suite's defaults (:attr:`~.suites.Suite.defaults`), then the values below.

``--methods`` and ``--images-per-prompt`` mean the same in every suite: the rows of those methods only, and
images per prompt and seed. (``hf-sjd bench``'s ``--num-images``, images per method in total, is refused here
with a message saying which flag this is.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hf_sjd.checks import check_choice, check_float, check_int
from hf_sjd.files import check_output_folder

from .generation import PROMPT_LOOKUP
from .suites import SUITES

#: fall-backs for the flags a suite may set (None in the parser, so "not given" is visible)
FALLBACKS = {"images_per_prompt": 1, "batch_size": 8, "seeds": "0"}


class _NumImages(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("--num-images is hf-sjd bench's (images per method in total); the study suites count "
                     "--images-per-prompt (images per prompt and seed, every suite alike)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every study suite."""
    parser.add_argument("suite", help=f"which study: {', '.join(SUITES)}")
    parser.add_argument("--sections", default=None,
                        help="comma-separated sections of the suite to run (default: all; see results.md)")
    parser.add_argument("--methods", default=None,
                        help=f"comma-separated: run only the rows of these methods ('ar', a registered strategy or "
                             f"'{PROMPT_LOOKUP}'), in every suite; default: every row")
    parser.add_argument("--prompts", default=None,
                        help="'all' (default: the reference classes; for another --model as text, 'a photo of a "
                             "coffee', ...) or a comma list")
    parser.add_argument("--prompt-dataset", default=None,
                        help="datasets id, save_to_disk folder or csv/json/jsonl/parquet file with the prompts")
    parser.add_argument("--prompt-column", default="prompt", help="column of --prompt-dataset holding the prompts")
    parser.add_argument("--prompt-split", default="train", help="split of --prompt-dataset")
    parser.add_argument("--max-prompts", type=int, default=None, help="keep the first N prompts")
    parser.add_argument("--images-per-prompt", type=int, default=None,
                        help="images per prompt and seed (suite default)")
    parser.add_argument("--num-images", nargs="?", action=_NumImages, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=None, help="rows per generate call (suite default)")
    parser.add_argument("--seeds", default=None, help="comma-separated; every row runs once per seed (suite default)")
    parser.add_argument("--out", type=Path, required=True, help="output folder (must be empty, or --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a non-empty --out as a whole (its old contents are deleted)")
    parser.add_argument("--top-k", type=int, default=100, help="in [1, the model's drafted image tokens]")
    parser.add_argument("--guidance-scale", type=float, default=1.0, help="CFG of the rows that do not set their own")
    parser.add_argument("--window", type=int, default=16, help="Jacobi window of the rows that do not set their own")
    parser.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--phrase-library", default=None,
                        help="phrase library (folder or Hub id) for the rows with a phrase_library knob that do not "
                             "set their own (default: the model's own)")
    parser.add_argument("--ablation-corpus-images", type=int, default=4000,
                        help="pv suite: reference training crops tokenized for the merges-ablation library")
    parser.add_argument("--library-tokens", type=int, default=10_000_000, help="library suite: corpus size")
    parser.add_argument("--library-merges", type=int, default=8000, help="library suite: BPE merges")
    parser.add_argument("--model", default=None,
                        help="folder laid out like the shipped reference weights (default: them), or a folder / Hub "
                             "id of a supported checkpoint (Emu3, Janus, Chameleon / Lumina-mGPT, LlamaGen-style) "
                             "with its processor or tokenizer")
    parser.add_argument("--image-size", type=int, default=None,
                        help="side in px of the generated images of a --model checkpoint (default: the family's: "
                             "Emu3 its processor's area, Janus its VQ grid, Lumina-mGPT the processor's crop size)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads per process (>= 1; default: torch's choice)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even where CUDA is available")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def known_methods() -> list[str]:
    from hf_sjd.sampling import registered_methods

    return [*registered_methods(), PROMPT_LOOKUP]


def load_prompt_dataset(name: str, column: str, split: str) -> list[str]:
    """Prompts from a ``datasets`` source; raises ``ValueError`` with a one-line reason."""
    import datasets

    from hf_sjd.files import looks_local

    path = Path(name).expanduser()
    if looks_local(name) or path.exists():
        if not path.exists():  # never fall through to a Hub lookup for what is clearly a local path
            raise ValueError(f"no such file or folder: {name}")
        if path.is_dir():
            data = datasets.load_from_disk(str(path))
        else:
            kind = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}.get(path.suffix)
            if kind is None:
                raise ValueError(f"unsupported file type {path.suffix!r} (csv, json, jsonl or parquet)")
            data = datasets.load_dataset(kind, data_files=str(path), split="train")
    else:
        data = datasets.load_dataset(name, split=split)
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ValueError(f"no split {split!r}; splits: {', '.join(data)}")
        data = data[split]
    if column not in data.column_names:
        raise ValueError(f"no column {column!r}; columns: {', '.join(data.column_names)}")
    return [str(p) for p in data[column]]


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """Check every input before any work; exits 2 (``parser.error``) naming the argument. Returns
    ``(suite, sections, prompts, seeds)`` and fills the suite's defaults into ``args``. ``prompts`` is None
    for a ``--model`` checkpoint without ``--prompts``: its defaults are known once it is loaded."""
    from hf_sjd.bench.subjects import is_reference_layout
    from hf_sjd.reference import CLASS_NAMES

    from .suites import suite_rows, with_methods

    def check(function, name: str, value, **bounds):
        try:
            return function(name, value, **bounds)
        except (TypeError, ValueError) as error:
            parser.error(str(error))

    check(check_choice, "--suite", args.suite, allowed=tuple(SUITES))
    suite = SUITES[args.suite]
    reference = is_reference_layout(args.model)
    if suite.needs_reference and not reference:
        parser.error(f"suite {suite.name} needs the reference layout's VQ tokenizer and classifier (it builds "
                     f"phrase libraries from reference crops); --model {args.model!r} is not laid out like the "
                     "shipped weights (ar/, vq/, classifier/)")
    check(check_int, "--image-size", args.image_size, minimum=1, allow_none=True)
    if args.image_size is not None and reference:
        parser.error("--image-size applies to a --model checkpoint; the reference layout generates 64 px only")
    names = suite.section_names()
    if args.sections is None:
        sections = list(suite.sections)
    else:
        wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in names]
        if not wanted or unknown:
            parser.error(f"--sections: unknown section(s) {unknown or [args.sections]} of suite {suite.name}; "
                         f"its sections: {', '.join(names) or 'none (it only measures)'}")
        sections = [s for s in suite.sections if s.name in wanted]
    if args.methods is not None:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        known = known_methods()
        unknown = [m for m in methods if m not in known]
        if not methods or unknown:
            parser.error(f"--methods: unknown method(s) {unknown or [args.methods]}; registered: {', '.join(known)}")
        if len(set(methods)) != len(methods):
            parser.error(f"--methods: duplicate method in {args.methods!r}")
        present = {r.method for s in sections for r in s.rows}
        missing = [m for m in methods if m not in present]
        if missing:
            chosen = ", ".join(s.name for s in sections) or "no sections"
            parser.error(f"--methods: no row of suite {suite.name} ({chosen}) runs {', '.join(missing)}; its "
                         f"methods there: {', '.join(sorted(present)) or 'none'}")
        sections = with_methods(sections, methods)
    for key, fallback in FALLBACKS.items():
        if getattr(args, key) is None:
            setattr(args, key, suite.defaults.get(key, fallback))
    check(check_int, "--images-per-prompt", args.images_per_prompt, minimum=1)
    check(check_int, "--batch-size", args.batch_size, minimum=1)
    try:
        seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds must be distinct integers, got {args.seeds!r}")
    for seed in seeds:
        check(check_int, "--seeds", seed, minimum=0, maximum=2**63 - 1)
    check(check_int, "--top-k", args.top_k, minimum=1)  # the upper bound needs the model: check_model_args
    check(check_int, "--window", args.window, minimum=1)  # a huge window is fine: generate clamps it
    check(check_float, "--guidance-scale", args.guidance_scale, minimum=0.0)
    rows = suite_rows(sections)
    if not reference:
        needing = sorted({s.name for s in sections for r in s.rows
                          if any(isinstance(v, str) and v.startswith("@") for _, v in r.knobs)})
        if needing:
            parser.error(f"suite {suite.name} --sections {','.join(needing)} needs the reference layout (its "
                         f"rows build libraries from tokenized reference crops); --model {args.model!r} is not "
                         "laid out like the shipped weights: choose other --sections")
    if any(r.method == PROMPT_LOOKUP and r.guidance_scale is None for r in rows) and args.guidance_scale != 1.0:
        parser.error(f"--guidance-scale {args.guidance_scale:g}: {PROMPT_LOOKUP} supports only 1 (no CFG)")
    check(check_int, "--prompt-lookup-tokens", args.prompt_lookup_tokens, minimum=1)
    check(check_int, "--threads", args.threads, minimum=1, allow_none=True)
    check(check_int, "--max-prompts", args.max_prompts, minimum=1, allow_none=True)
    check(check_int, "--ablation-corpus-images", args.ablation_corpus_images, minimum=16)
    check(check_int, "--library-tokens", args.library_tokens, minimum=256)
    check(check_int, "--library-merges", args.library_merges, minimum=1)
    if args.phrase_library is not None:
        from hf_sjd.sampling import verifiers_of

        if not any("phrase" in verifiers_of(r.method, dict(r.knobs)) for r in rows):
            parser.error(f"--phrase-library is read only by phrase-verification strategies; no row of suite "
                         f"{suite.name} ({', '.join(s.name for s in sections) or 'no sections'}) uses it")

    if args.prompt_dataset is not None:
        if args.prompts is not None:
            parser.error("--prompts and --prompt-dataset are exclusive")
        try:
            prompts = load_prompt_dataset(args.prompt_dataset, args.prompt_column, args.prompt_split)
        except Exception as error:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ...)
            parser.error(f"--prompt-dataset: cannot load prompts from {args.prompt_dataset!r}: {error}")
        source = f"--prompt-dataset {args.prompt_dataset!r}"
    elif not reference and (args.prompts or "all") == "all":
        prompts, source = None, "--prompts"  # the model's own defaults, after loading (subjects.default_prompts)
    else:
        text = args.prompts or "all"
        prompts = list(CLASS_NAMES) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
        source = "--prompts"
        repeated = sorted({p for p in prompts if prompts.count(p) > 1})
        if repeated:
            parser.error(f"--prompts: {', '.join(map(repr, repeated))} named more than once; name each prompt once "
                         "(--images-per-prompt sets the images per prompt)")
    if prompts is None:  # resolved after loading the model
        check_out(parser, args.out, args.overwrite)
        return suite, sections, None, seeds
    prompts = prompts[:args.max_prompts]
    if not prompts:
        parser.error(f"{source}: no prompts")
    unknown = sorted({p for p in prompts if p not in CLASS_NAMES}) if reference else []
    if unknown:
        shown = ", ".join(repr(p) for p in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        parser.error(f"{source}: unknown prompt(s) {shown}; the reference model knows only: {', '.join(CLASS_NAMES)}")

    check_out(parser, args.out, args.overwrite)
    return suite, sections, prompts, seeds


def check_out(parser: argparse.ArgumentParser, out: Path, overwrite: bool) -> None:
    """``--out``: :func:`hf_sjd.files.check_output_folder` (a new or empty folder, or an earlier run's with
    ``--overwrite``; never the root, home or current folder)."""
    try:
        check_output_folder(out, overwrite)
    except ValueError as error:
        parser.error(str(error))


def check_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace, reference):
    """The checks that need the loaded model, before any generation: ``--top-k`` in [1, its drafted image
    tokens]; ``--phrase-library`` loads and matches its tokenizer fingerprint. Returns the library or None."""
    codes = reference.draft_token_ids.numel()
    if not 1 <= args.top_k <= codes:
        parser.error(f"--top-k must be in [1, {codes}] (the model's drafted image tokens), got {args.top_k}")
    if args.phrase_library is None:
        return None
    from hf_sjd.phrases import PhraseLibrary

    adapter = getattr(reference.model, "sjd_adapter", None)
    vq = getattr(reference, "vq", None)  # None for a --model checkpoint: its adapter knows its codebook
    fingerprint = getattr(adapter, "tokenizer_fingerprint", None) or (vq.fingerprint() if vq is not None else None)
    try:
        return PhraseLibrary.from_pretrained(args.phrase_library, fingerprint=fingerprint,
                                             codebook_size=vq.codebook_size if vq is not None else codes)
    except (OSError, ValueError) as error:
        parser.error(f"--phrase-library {args.phrase_library!r}: {error}")
