"""The study-suite driver: validate, load, generate every row of the suite (sharded under ``accelerate launch``),
summarise, measure, and write the outputs as one folder on the main process."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from hf_sjd.files import atomic_folder, atomic_write_bytes
from hf_sjd.quality import ReferenceScorer

from .args import add_arguments, check_model_args, validate
from .generation import NO_PROMPT_LOOKUP, PROMPT_LOOKUP, make_batches, run_batch
from .measurements import MEASUREMENTS, ablation_library
from .reports import markdown, plots, write_csv
from .summaries import METRICS, PAIRED, reference_features, summarize, torchmetrics_note
from .suites import suite_rows

SCHEMA_VERSION = 3


class Resources:
    """The ``"@name"`` knob values of a suite, built on first use: ``merges-M`` (the first M merges of one
    16k-merge library over tokenized reference crops)."""

    def __init__(self, subject, args) -> None:
        self.subject, self.args, self._cache = subject, args, {}

    def __call__(self, name: str):
        if name.startswith("merges-"):
            if "ablation" not in self._cache:
                self._cache["ablation"] = ablation_library(self.subject, self.args.ablation_corpus_images)
            library = self._cache["ablation"][0]
            return library.first(min(int(name.split("-", 1)[1]), library.num_merges))
        raise KeyError(f"unknown bench resource @{name}")


def _load(parser, args, device, rows):
    """``(subject, classifier or None, reference root or None)``; a ``--model`` checkpoint is checked from its
    config and processor (family, methods) before its weights load."""
    from hf_sjd.bench.subjects import check_methods, is_reference_layout, load_checkpoint, load_reference
    from hf_sjd.reference import weights_dir

    if not is_reference_layout(args.model):
        try:
            family, loader = load_checkpoint(args.model, args.image_size)
        except ValueError as error:
            parser.error(str(error))
        methods = {r.method for r in rows}
        reason = check_methods(family, methods)
        if PROMPT_LOOKUP in methods and family in NO_PROMPT_LOOKUP:
            reason = f"the prompt-lookup rows cannot run on {family}: {NO_PROMPT_LOOKUP[family]}"
        if reason:
            parser.error(f"--model {args.model}: {reason}; choose --methods / --sections without them")
        try:
            return loader(), None, None
        except ValueError as error:
            parser.error(str(error))
    subject, classifier = load_reference(parser, args.model, device)
    return subject, classifier, Path(args.model) if args.model else weights_dir()


def _check_phrase_rows(parser, args, subject, rows) -> None:
    """Rows of a phrase-verification strategy need a library: ``--phrase-library`` or the model's own."""
    from hf_sjd.sampling import verifiers_of

    if args.phrase_library is not None:
        return
    try:
        if subject.model.sjd_adapter.default_phrase_library is not None:
            return
    except OSError as error:  # the config names a library folder that is not there
        parser.error(f"--phrase-library: none given, and the model's default cannot be found: {error}")
    methods = sorted({r.method for r in rows if "phrase" in verifiers_of(r.method, dict(r.knobs))
                      and not any(k == "phrase_library" for k, _ in r.knobs)})
    if methods:
        parser.error(f"--phrase-library: rows {', '.join(methods)} verify phrases, and --model {args.model} has no "
                     "default phrase library; pass --phrase-library (build one with hf-sjd build-phrases --model) "
                     "or choose --methods / --sections without them")


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str | None = None) -> int:
    suite, sections, prompts, seeds = validate(parser, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from accelerate import PartialState
    from accelerate.utils import gather_object, parse_flag_from_env
    from tqdm.auto import tqdm

    import hf_sjd

    # PartialState only picks gloo/MULTI_CPU when told cpu=True; without CUDA that is the only choice anyway.
    state = PartialState(cpu=args.cpu or parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.cuda.is_available())
    if state.num_processes == 1 and "MASTER_PORT" in os.environ and "WORLD_SIZE" not in os.environ:
        print("benchmarks: running as ONE process: `accelerate launch --cpu --num_processes N` starts a single "
              "process unless given --mpirun_hostfile; for N CPU processes use `accelerate launch --multi_gpu "
              "--num_processes N -m benchmarks SUITE ... --cpu` (or `torchrun --nproc_per_node N -m benchmarks`)",
              file=sys.stderr)
    device = state.device
    subject, classifier, root = _load(parser, args, device, suite_rows(sections))
    if prompts is None:  # a checkpoint's own default prompts (the reference classes as text)
        prompts = subject.default_prompts()[:args.max_prompts]
    if hasattr(subject, "prompt_inputs"):
        try:  # every prompt builds (a LlamaGen-style model knows only its condition names)
            subject.prompt_inputs(prompts)
        except ValueError as error:
            parser.error(f"--prompts: {error}")
        _check_phrase_rows(parser, args, subject, suite_rows(sections))
    if suite.needs_reference and classifier is None:
        parser.error(f"suite {suite.name} needs the reference layout's VQ tokenizer and classifier; --model "
                     f"{args.model!r} has no classifier/")
    hf_sjd.enable(subject.model)
    library = check_model_args(parser, args, subject)
    if library is not None:
        library.to(device)
    subject.model.to(device)
    if subject.vq is not None:
        subject.vq.to(device)
    settings = SimpleNamespace(top_k=args.top_k, guidance_scale=args.guidance_scale, window=args.window,
                               prompt_lookup_tokens=args.prompt_lookup_tokens, library=library)
    scorer = ReferenceScorer(subject, classifier) if classifier is not None else None
    resources = Resources(subject, args)
    rows = suite_rows(sections)
    start = time.perf_counter()

    # one list of (row, batch) work items; batches depend on the row's batch size only
    work = [(r, batch) for r in rows
            for batch in make_batches(prompts, args.images_per_prompt, r.batch_size or args.batch_size)]
    records = []
    with state.split_between_processes(list(range(len(work)))) as shard:
        progress = tqdm(total=len(seeds) * sum(len(work[i][1]) for i in shard), unit="image",
                        desc=f"bench {suite.name} (process {state.process_index})", disable=args.quiet or not shard,
                        position=state.process_index)
        for seed in seeds:  # seeds outermost, so slow drifts (thermal, other load) hit every row alike
            for index in shard:
                r, batch = work[index]
                progress.set_postfix_str(f"seed {seed} {r.key}"[:60])
                records.append(run_batch(subject, scorer, r, batch, seed, settings, device, resources))
                progress.update(len(batch))
        progress.close()
    records = gather_object(records)
    # Every process tears the process group down before it exits; a worker that exits with gloo still up can
    # abort ("terminate called without an active exception") while the main process is still writing.
    state.destroy_process_group()
    if not state.is_main_process:
        return 0

    reference_stats = None
    if scorer is not None and rows:
        reference_stats = reference_features(scorer, prompts, args.images_per_prompt, seeds)
    classifier_accuracy = None
    report = root / "report.json" if root is not None else None
    if report is not None and report.exists():
        classifier_accuracy = json.loads(report.read_text())["classifier"]["heldout_accuracy"]
    args.library = library

    def guidance_of(r):
        return args.guidance_scale if r.guidance_scale is None else r.guidance_scale

    vocab = getattr(subject, "vocab_size", None) or subject.model.config.vocab_size
    args.summary = summarize(records, rows, seeds, reference_stats, vocab, guidance_of)
    args.prompt_list, args.seed_list = prompts, seeds  # what the measurements run on
    measurements = {name: MEASUREMENTS[name](subject, args) for name in suite.measurements}
    import transformers

    results = {
        "schema_version": SCHEMA_VERSION, "suite": suite.name, "title": suite.title,
        "description": suite.description,
        "command": command or shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]]),
        "config": {"suite": suite.name, "sections": [s.name for s in sections], "prompts": prompts,
                   "prompt_source": (f"dataset {args.prompt_dataset}:{args.prompt_column}" if args.prompt_dataset
                                     else "text prompts" if hasattr(subject, "prompt_inputs")
                                     else "reference classes"),
                   "images_per_prompt": args.images_per_prompt, "batch_size": args.batch_size, "seeds": seeds,
                   "top_k": args.top_k, "guidance_scale": args.guidance_scale, "window": args.window,
                   "prompt_lookup_num_tokens": args.prompt_lookup_tokens, "phrase_library": args.phrase_library,
                   "model": args.model, "model_family": getattr(subject, "family", "reference"),
                   "image_size": args.image_size, "threads": args.threads, "num_processes": state.num_processes,
                   "device": str(device)},
        "environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peak_memory": ("torch.cuda.max_memory_allocated per batch (weights included)"
                                        if device.type == "cuda" else
                                        "CPU: rise of the resident set size over the batch start, sampled every "
                                        "2 ms after malloc_trim (a lower bound; not comparable to CUDA)")},
        "metrics": {k: v[2] for k, v in {**METRICS, **PAIRED}.items()},
        "reference": None if reference_stats is None else {
            "classifier_heldout_accuracy": classifier_accuracy,
            "fd_ref": {k: v for k, v in reference_stats.items() if k != "features"},
            "torchmetrics": torchmetrics_note()},
        "sections": [{"name": s.name, "title": s.title, "note": s.note, "rows": [r.key for r in s.rows],
                      "columns": list(s.columns)} for s in sections],
        "rows": args.summary,
        "measurements": measurements,
        "seconds": time.perf_counter() - start,
    }
    items = [item for batch in make_batches(prompts, args.images_per_prompt, 1) for item in batch]  # index-major
    samples, sample_prompts = {}, [p for p, _ in items[:8]]
    if sections:
        for key in results["sections"][0]["rows"]:  # the first seed's first images, in item order
            parts = sorted((r for r in records if r["row"] == key and r["seed"] == seeds[0]),
                           key=lambda r: items.index(tuple(r["items"][0])))
            tokens = torch.tensor([t for r in parts for t in r["tokens"]][:8], device=device)
            name = results["rows"][key]["method"]
            images = subject.vq.decode(tokens) if subject.vq is not None else subject.decode(tokens)
            if images is not None:  # None: the family ships no image decoder (Lumina-mGPT)
                samples[name if name not in samples else key] = images
    text = markdown(results)
    with atomic_folder(args.out, mark=True) as out:  # all outputs of this run appear together, or none
        atomic_write_bytes(out / "results.json", (json.dumps(results, indent=2) + "\n").encode())
        atomic_write_bytes(out / "results.csv", write_csv(results))
        atomic_write_bytes(out / "results.md", text.encode())
        for name, data in plots(results, samples, sample_prompts).items():
            atomic_write_bytes(out / name, data)
    if not args.quiet:
        print(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __doc__ as doc

    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks SUITE ...`` / ``accelerate launch -m benchmarks SUITE ...``."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    return run(parser, args, command=shlex.join(["python", "-m", "benchmarks", *argv]))
