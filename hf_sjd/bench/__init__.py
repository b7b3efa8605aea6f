"""``hf-sjd bench --suite NAME``: every README benchmark table, from one generation path.

    hf-sjd bench --suite core --out docs/results/core --overwrite          # every method, batch x CFG
    hf-sjd bench --suite verifiers|vp|pv|library|frontier --out DIR [--sections a,b] [--seeds 0,1] [--num-images 2]
    hf-sjd bench --suite core --methods ar,sjd,prompt-lookup --sections methods --prompts coffee,cat --out DIR
    accelerate launch --multi_gpu --num_processes 2 -m hf_sjd.bench ... [--cpu]   # same flags, work sharded

Suites (:mod:`.suites`, data: rows of (method, knobs) grouped into sections):

    core       every method (speed, memory, FD-ref, class accuracy, loglik, TV); batch 1/8 x CFG off/on
    verifiers  SJD vs LANTERN vs GSD with quality proxies; LANTERN's (k, delta) sweep
    vp         SJD-VP: strategies, (N, strength, beta) sweep, bounded variants, windows, the growth
               statistic (a probe), the prior's cost (a probe), a confirmation section for fresh --seeds
    pv         SJD-PV: strategies, tau / matching / merges ablations, cost of one matching call
    library    phrase-library build speed (no generation; needs the reference layout's VQ)
    frontier   MC-SJD's fresh drafts and Gumbel coupling at window 16, compression vs window 8-64, batch 8 vs
               1 (batch and per-row compression), quality vs ar, the roofline forward-cost model (a model, not
               a measurement) and the window it picks; confirmation on fresh seeds: rerun with --seeds 1000

Package layout: :mod:`.args` (flags, prompt data sets, checks), :mod:`.generation` (batches, the one seeding
scheme, peak memory, prompt lookup, per-image scores), :mod:`.probes` (context managers that plug
instruments into the registries and leave nothing registered), :mod:`.summaries` (metrics, the one
standard-error helper, paired differences, FD-ref), :mod:`.measurements` (timings that are not generation),
:mod:`.reports` (markdown, CSV, plots, the one histogram formatter), :mod:`.subjects` (what ``--model`` loads:
the reference layout or a supported checkpoint), :mod:`.driver` (the run).

Methods: ``ar`` (transformers' ``generate(do_sample=True)``), every registered Jacobi strategy
(``hf_sjd.STRATEGIES``), and ``prompt-lookup`` (transformers' prompt-lookup decoding,
``prompt_lookup_num_tokens``; batch size 1 only, so it runs one image at a time; exact with sampling; its
unbatched CFG does not follow multi-token verification, so it refuses ``--guidance-scale`` other than 1).

Prompts: the reference classes (``--prompts all`` or a comma list), or a column of a ``datasets`` data set
(``--prompt-dataset ID_OR_PATH --prompt-column prompt``). The reference model only understands its 16 class
names, so other prompts are rejected. ``--model``: a folder laid out like the shipped reference weights
(``ar/``, ``vq/``, optionally ``classifier/`` and ``report.json``); without ``classifier/`` the FD-ref and
class-accuracy columns are left out (``"reference": null``) and ``--suite library`` refuses to run. Or a
folder / Hub id of any checkpoint an adapter supports (:mod:`.subjects`): its family's ``from_pretrained``
and processor / tokenizer, text prompts (default: the reference classes as ``"a photo of a coffee"``, ...)
turned into the family's image prompt by :class:`hf_sjd.prompts.ImagePrompter` (``--image-size`` where the
family has a choice); the reference-only columns are left out and results.md says so; ``--suite library``
and rows built from reference crops refuse to run; ``ar`` rows refuse Lumina-mGPT, ``prompt-lookup`` rows
run on LlamaGen-style models only.

Seeding and pairing: work items are ``(prompt, image index)`` pairs (index-major), cut into batches; a batch
is seeded from ``(seed, its items)`` only (:func:`.generation.batch_seed`), so every row sees the same seed
for the same images and ``--num_processes`` changes no sample. Under ``accelerate launch`` the (row, batch)
work items are split between processes and gathered on the main process.

Outputs in ``--out``, all of one run together (``hf_sjd.files.atomic_folder``: a sibling temporary folder
replaces ``--out`` as a whole, so an interrupted run leaves the previous outputs, or nothing). ``--out`` must
be empty or missing; ``--overwrite`` replaces it.

* ``results.json``::

    {"schema_version": 2, "suite": str, "title": str, "description": str, "command": str, "seconds": float,
     "config": {"suite", "sections", "prompts", "prompt_source", "num_images", "batch_size", "seeds", "top_k",
                "guidance_scale", "window", "prompt_lookup_num_tokens", "phrase_library", "model",
                "model_family" ("reference" or an adapter family), "image_size", "threads", "num_processes",
                "device"},
     "environment": {"torch", "transformers", "peak_memory": what peak_memory_mb measures},
     "metrics": {metric or paired column: description},
     "reference": null | {"classifier_heldout_accuracy": float | null,
                          "fd_ref": {"feature_dim", "real_images", "generated_images_per_seed",
                                     "floor_real": {"per_seed", "mean", "se"}, "floor_vq": {...}},
                          "torchmetrics": str},
     "sections": [{"name", "title", "note", "rows": [row key], "columns": [column key]}],
     "rows": {row key: {
         "method": str, "knobs": {knob: value}, "label": str, "guidance_scale": float,
         "window": int | null, "batch_size": int | null,        # null: the run's --window / --batch-size
         "base": row key | null, "probe": str | null,
         "per_seed": {seed (str): {metric: float | null, "num_images", "num_new_tokens", "num_forward_passes",
                                   "num_calls", "model_calls": int, "tokens_per_forward": [int] | null}},
         "mean": {metric: float | null}, "se": {metric: float | null},   # across seeds; se null for 1 seed
         "totals": {"num_images", "num_new_tokens", "num_forward_passes", "model_calls": int},
         "tokens_per_forward": [int] | null,                              # summed over seeds
         "vs_base": {"mean", "se", "n"} | null, "d_loglik": {"mean", "se", "n"} | null}},
     "measurements": {name: {"title": str, "text": markdown, "data": {...}}}}

  ``metric`` is each key of :data:`~.summaries.METRICS` (null where it does not apply: acceptance of ``ar``,
  FD-ref without the reference classifier, growth columns without the growth probe). ``tokens_per_forward[k]``
  counts (row, forward) pairs that committed ``k`` tokens. A row key is readable:
  ``method[/gCFG][/wWINDOW][/bBATCH][/knob=value...][/probe=NAME]``.
* ``results.csv``: columns ``row, method, knobs, seed`` + metrics + counts + paired columns; one line per
  (row, seed), then a ``seed=mean`` and a ``seed=se`` line per row.
* ``results.md``: one table per section (mean ± SE across seeds) with the command and definitions.
* ``scatter.png`` (step compression vs FD-ref, or vs loglik without the classifier, for the first section),
  ``tokens_per_forward.png``, ``samples.png`` (the first images of the first seed, a row per method);
  ``measurements.png`` for ``library``.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` during each batch (weights included); on CPU the
rise of the resident set size over the batch start (a lower bound, Linux only, else null).
"""

from ..quality import frechet_distance  # moved to hf_sjd.quality; re-exported for existing callers
from .args import add_arguments, check_model_args, check_out, known_methods, load_prompt_dataset, validate
from .driver import SCHEMA_VERSION, build_parser, main, run
from .generation import PROMPT_LOOKUP, batch_seed, make_batches, run_batch
from .summaries import COUNTS, METRICS, PAIRED, mean_se, paired, real_images, reference_features
from .suites import SUITES, Row, Section, Suite

__all__ = ["COUNTS", "METRICS", "PAIRED", "PROMPT_LOOKUP", "SCHEMA_VERSION", "SUITES", "Row", "Section", "Suite",
           "add_arguments", "batch_seed", "build_parser", "check_model_args", "check_out", "frechet_distance", "known_methods",
           "load_prompt_dataset", "main", "make_batches", "mean_se", "paired", "real_images", "reference_features",
           "run", "run_batch", "validate"]
