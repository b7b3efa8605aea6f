"""The research harness of hf_sjd: the study suites behind ``docs/results/``, loop-cost counting, GPU latency.

Not part of the wheel (as vLLM keeps its benchmarks): run it from a checkout of the repository, with hf_sjd
installed; it uses hf_sjd's public API only, and hf-sjd bench's own plumbing (``hf_sjd.sampling``,
``hf_sjd.bench.subjects``, ``hf_sjd.quality``). ``hf-sjd bench`` (in the package) is the quick paired table for
your own model; these are the long studies.

    python -m benchmarks core --out docs/results/core --overwrite          # every method, batch x CFG
    python -m benchmarks verifiers|vp|pv|library|frontier --out DIR [--sections a,b] [--seeds 0,1]
    python -m benchmarks core --methods ar,sjd,prompt-lookup --sections methods --prompts coffee,cat --out DIR
    accelerate launch --multi_gpu --num_processes 2 -m benchmarks SUITE ... [--cpu]   # same flags, work sharded
    python -m benchmarks loop-cost --methods ar,sjd,mc-sjd,sjd-pv --markdown loop_cost.md   (:mod:`.loop_cost`)
    python -m benchmarks.gpu_latency --shape 7b --auto-check                                 (:mod:`.gpu_latency`)
    bash benchmarks/gpu_check.sh          # the device checks as one prepared run
    bash benchmarks/run_bench.sh          # every suite into docs/results/

Suites (:mod:`.suites`, data: rows of (method, knobs) grouped into sections):

    core       every method and composition (speed, memory, FD-ref, class accuracy, loglik, TV); batch 1/8 x CFG
    verifiers  SJD vs LANTERN vs GSD with quality proxies; LANTERN's (k, delta) sweep
    vp         SJD-VP: strategies, (N, strength, beta) sweep, bounded variants, windows, the growth
               statistic (a probe), the prior's cost (a probe), a confirmation section for fresh --seeds
    pv         SJD-PV: strategies, tau / matching / merges ablations, the phrase verifier's cost (a probe)
    library    phrase-library build speed (no generation; needs the reference layout's VQ)
    frontier   MC-SJD's fresh drafts and Gumbel coupling at window 16, compression vs window 8-64, batch 8 vs
               1, quality vs ar, siblings and their law, block verification, the roofline forward-cost model
               (a model, not a measurement) and the cells it picks; confirmation: rerun with --seeds 1000

``--methods`` (the rows of those methods only) and ``--images-per-prompt`` (images per prompt and seed) mean
the same in every suite. Package layout: :mod:`.args` (flags, prompt data sets, checks), :mod:`.generation`
(batches, the one seeding scheme, peak memory, prompt lookup, per-image scores), :mod:`.probes` (context managers
that plug instruments into the public registries and leave nothing registered), :mod:`.summaries` (metrics, the
one standard-error helper, paired differences, FD-ref), :mod:`.measurements` (what is not generation),
:mod:`.reports` (markdown, CSV, plots, the one histogram formatter), :mod:`.driver` (the run). What ``--model``
loads is the package's own (:mod:`hf_sjd.bench.subjects`), and so is the one generate call
(:func:`hf_sjd.sampling.generate_images`).

Methods: ``ar`` (transformers' ``generate(do_sample=True)``), every registered Jacobi strategy
(``hf_sjd.STRATEGIES``; a row pins ``jacobi_window`` and ``jacobi_siblings=0`` unless it sets them), and
``prompt-lookup`` (transformers' prompt-lookup decoding, ``prompt_lookup_num_tokens``; batch size 1 only, so it
runs one image at a time; exact with sampling; its unbatched CFG does not follow multi-token verification, so it
refuses ``--guidance-scale`` other than 1).

Prompts: the reference classes (``--prompts all`` or a comma list), or a column of a ``datasets`` data set
(``--prompt-dataset ID_OR_PATH --prompt-column prompt``). ``--model``: a folder laid out like the shipped
reference weights (without ``classifier/`` the FD-ref and class-accuracy columns are left out and ``library``
refuses to run), or a folder / Hub id of any checkpoint an adapter supports (text prompts, default the reference
classes as ``"a photo of a coffee"``; the reference-only columns are left out; ``ar`` rows refuse Lumina-mGPT,
``prompt-lookup`` rows run on LlamaGen-style models only).

Seeding and pairing: work items are ``(prompt, image index)`` pairs (index-major), cut into batches; a batch
is seeded from ``(seed, its items)`` only (:func:`.generation.batch_seed`), so every row sees the same seed
for the same images and ``--num_processes`` changes no sample.

Outputs in ``--out``, all of one run together (``hf_sjd.files.atomic_folder``; ``--out`` is checked first by
``hf_sjd.files.check_output_folder``):

* ``results.json``::

    {"schema_version": 3, "suite": str, "title": str, "description": str, "command": str, "seconds": float,
     "config": {"suite", "sections", "prompts", "prompt_source", "images_per_prompt", "batch_size", "seeds",
                "top_k", "guidance_scale", "window", "prompt_lookup_num_tokens", "phrase_library", "model",
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
         "window": int | "auto" | null, "batch_size": int | null,  # null: the run's --window / --batch-size
         "base": row key | null, "probe": str | null,
         "per_seed": {seed (str): {metric: float | null, "num_images", "num_new_tokens", "num_forward_passes",
                                   "num_calls", "model_calls": int, "tokens_per_forward": [int] | null}},
         "mean": {metric: float | null}, "se": {metric: float | null},   # across seeds; se null for 1 seed
         "totals": {"num_images", "num_new_tokens", "num_forward_passes", "model_calls": int},
         "tokens_per_forward": [int] | null,                              # summed over seeds
         "vs_base": {"mean", "se", "n"} | null, "d_loglik": {"mean", "se", "n"} | null}},
     "measurements": {name: {"title": str, "text": markdown, "data": {...}}}}

  ``metric`` is each key of :data:`~.summaries.METRICS` (null where it does not apply). A row key is readable:
  ``method[/gCFG][/wWINDOW][/bBATCH][/knob=value...][/probe=NAME]``. Schema 2 (``docs/results/`` before the 1.0
  layout) named ``images_per_prompt`` ``num_images``.
* ``results.csv``: one line per (row, seed), then a ``seed=mean`` and a ``seed=se`` line per row.
* ``results.md``: one table per section (mean ± SE across seeds) with the command and definitions.
* ``scatter.png``, ``tokens_per_forward.png``, ``samples.png``; ``measurements.png`` for ``library``.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` during each batch (weights included); on CPU the
rise of the resident set size over the batch start (a lower bound, Linux only, else null).
"""
