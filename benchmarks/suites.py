"""The study suites of ``python -m benchmarks SUITE``: data, not code. A suite is a list of sections; a section is a
list of rows; a row is one (method, knobs) setting.

    Row      method + knobs (+ guidance / window / batch overrides, + the row it is paired with)
    Section  a titled table of rows, the metric columns it shows, an optional note
    Suite    sections + default sizes + the measurements that are not generation (timings of one call)

Every row of a suite runs through the one generation path (:mod:`.generation`) on the same prompts, images
and seeds, so any two rows are a paired comparison; a row named by several sections runs once. Knob values are
JSON scalars, or a resource name ``"@..."`` resolved when the suite runs (``driver.Resources``: truncations
of the merges-ablation library). The VQ latents LANTERN/GSD need are passed by the generation path itself.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from hf_sjd.jacobi.cost_model import ModelShape

#: the model sizes the cost-model measurements price (a roofline of each), and what the cuda-7b probe prices as
MODEL_SIZES = {"1.3B (LlamaGen-XL-like)": ModelShape(1.3e9, 24, 2048),
               "7B (Lumina-mGPT / Janus-Pro-7B / Emu3-like)": ModelShape(7e9, 32, 4096)}
SEVEN_B_SIZE = "7B (Lumina-mGPT / Janus-Pro-7B / Emu3-like)"
SEVEN_B = MODEL_SIZES[SEVEN_B_SIZE]
COST_CONTEXT, COST_ROWS = 1024, (1, 8, 16)  # tokens in the KV cache; forward rows (images, x 2 with CFG)

#: knob names the table labels leave out (they are implied by the method)
QUIET_KNOBS = ("latent_embeddings",)


@dataclass(frozen=True)
class Row:
    """One setting. ``None`` fields take the run's flags (``--guidance-scale``, ``--window``, ``--batch-size``)."""

    method: str
    knobs: tuple[tuple[str, object], ...] = ()
    label: str | None = None  # the table's "knobs" cell; default: the knobs, formatted
    guidance_scale: float | None = None
    window: int | str | None = None  # an int, or "auto" (the cost model's pick, re-picked as rows finish)
    batch_size: int | None = None
    base: "Row | None" = None  # paired differences of step compression are taken against this row
    probe: str | None = None  # a :mod:`.probes` name, active while this row generates

    @property
    def key(self) -> str:
        """Unique, readable id of the setting (the key in ``results.json``)."""
        parts = [self.method]
        parts += [f"g{self.guidance_scale:g}"] if self.guidance_scale is not None else []
        parts += [f"w{self.window}"] if self.window is not None else []
        parts += [f"b{self.batch_size}"] if self.batch_size is not None else []
        parts += [f"{k}={v}" for k, v in self.knobs]
        parts += [f"probe={self.probe}"] if self.probe else []
        return "/".join(parts)

    @property
    def knobs_label(self) -> str:
        if self.label is not None:
            return self.label
        shown = [f"{k}={v}" for k, v in self.knobs if k not in QUIET_KNOBS]
        return ", ".join(shown) or "-"


def row(method: str, base: Row | None = None, label: str | None = None, probe: str | None = None,
        guidance_scale: float | None = None, window: int | str | None = None, batch_size: int | None = None,
        **knobs) -> Row:
    return Row(method, tuple(sorted(knobs.items())), label, guidance_scale, window, batch_size, base, probe)


@dataclass(frozen=True)
class Section:
    name: str  # what --sections selects
    title: str
    rows: tuple[Row, ...]
    columns: tuple[str, ...]  # keys of summaries.COLUMNS
    note: str = ""


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    description: str
    sections: tuple[Section, ...]
    defaults: dict = field(default_factory=dict)  # flag -> value when the flag is not given
    measurements: tuple[str, ...] = ()  # :mod:`.measurements` names, run after the generation
    needs_reference: bool = False  # True: only the reference layout (classifier, VQ) has what it measures

    def section_names(self) -> list[str]:
        return [s.name for s in self.sections]


SPEED = ("nfe_per_call", "step_compression", "vs_base", "acceptance_rate", "seconds_per_image", "loop_overhead",
         "tokens_per_forward")
QUALITY = ("d_loglik", "tv_to_ar", "repeat_rate", "class_accuracy", "fd_ref")
MAXIMAL = {"draft_coupling": "maximal"}  # maximally coupled redrafting (MC-SJD's coupling) on any strategy
VP_PRIOR = {"draft_prior": "verification-prediction"}  # SJD-VP's prior on any strategy


# -- core: every method and the compositions the strategies' knobs make, then batch size x CFG -----------------
def core_rows() -> tuple[Row, ...]:
    """Every strategy, each composition a knob away that once had its own name (mc-sjd-vp, mc-sjd-pv,
    mc-lantern, lantern-pv, mc-gsd, sjd-vp-pv), and transformers' prompt lookup; paired with ``sjd``."""
    sjd = row("sjd")
    return (row("ar"), sjd, row("mc-sjd", base=sjd), row("sjd-vp", base=sjd), row("sjd-vp", base=sjd, **MAXIMAL),
            row("sjd-pv", base=sjd), row("sjd-pv", base=sjd, **MAXIMAL), row("lantern", base=sjd),
            row("lantern", base=sjd, **MAXIMAL), row("sjd-pv", base=sjd, pv_base_verifier="lantern"),
            row("gsd", base=sjd), row("gsd", base=sjd, **MAXIMAL), row("sjd-pv", base=sjd, **VP_PRIOR),
            row("prompt-lookup"))


def _batch_cfg_rows() -> tuple[Row, ...]:
    rows = []
    for batch, guidance in itertools.product((1, 8), (1.0, 3.0)):
        sjd = row("sjd", guidance_scale=guidance, batch_size=batch)
        rows += [row("ar", guidance_scale=guidance, batch_size=batch), sjd,
                 row("mc-sjd", base=sjd, guidance_scale=guidance, batch_size=batch)]
    return tuple(rows)


CORE = Suite(
    "core", "Every method on the same prompts and seeds",
    "Speed (forwards, step compression, acceptance, wall time, loop overhead, peak memory) and quality proxies "
    "(FD-ref, class accuracy, log-likelihood, TV to ar) of every strategy and composition; then batch size x CFG "
    "for ar/SJD/MC-SJD.",
    (Section("methods", "Every method", core_rows(), (
        "nfe_per_call", "step_compression", "vs_base", "acceptance_rate", "seconds_per_image", "loop_overhead",
        "peak_memory_mb", "fd_ref", "class_accuracy", "mean_token_loglik", "tv_to_ar", "tokens_per_forward"),
        "vs sjd: paired difference of step compression to `sjd` (same batches and seeds), ± SE over batches."),
     Section("batch-cfg", "Batch size 1 and 8, CFG off and on (scale 3)", _batch_cfg_rows(),
             ("batch_size", "guidance_scale", "nfe_per_call", "step_compression", "vs_base", "acceptance_rate",
              "seconds_per_image", "loop_overhead", "tokens_per_forward"),
             "vs sjd: mc-sjd minus sjd at the same batch size and CFG (paired).")),
    defaults={"images_per_prompt": 1, "batch_size": 8, "seeds": "0,1"},
)


# -- verifiers: SJD vs LANTERN vs GSD, then LANTERN's (k, delta) -------------------------------------------
LANTERN_SWEEP = ((1, 0.02), (1, 0.05), (2, 0.1), (5, 0.1), (10, 0.1), (10, 1.5), (10, 3.0), (10, 5.0), (50, 10.0))


def lantern_label(k: int, delta: float) -> str:
    return f"k={k}, " + (f"lambda={delta:g} (LANTERN++)" if delta > 1 else f"delta={delta:g}")


def _verifier_rows() -> tuple[Row, ...]:
    sjd = row("sjd")
    return (row("ar"), sjd,
            row("lantern", base=sjd, label="defaults (LANTERN++ k=10, lambda=2)"),
            row("gsd", base=sjd, label="W=7, prob 0.15, dist 0.5, VQ latents"),
            row("gsd", base=sjd, label="W=7, prob 0.15, dist 0.5, model input embeddings", latent_embeddings=None))


VERIFIERS = Suite(
    "verifiers", "Relaxed verifiers (LANTERN, GSD) against exact SJD",
    "Speed next to quality proxies for the lossy verifiers, then a sweep of LANTERN's (k, delta); delta > 1 is "
    "LANTERN++'s lambda.",
    (Section("verifiers", "Verifiers", _verifier_rows(), SPEED + QUALITY),
     Section("lantern-sweep", "LANTERN (k, delta)", tuple(
         row("lantern", base=row("sjd"), label=lantern_label(k, d), lantern_k=k, lantern_delta=d)
         for k, d in LANTERN_SWEEP), SPEED + QUALITY)),
    defaults={"images_per_prompt": 2, "batch_size": 8, "seeds": "0,1"},
)


# -- vp: SJD-VP against its base strategy, sweep, variants, window, growth statistic, cost ----------------------
PAPER_VP = {"vp_growth_steps": 3, "vp_strength": 1.0, "vp_beta": 0.5, "vp_max_gain": None}  # the paper's formula


def _vp_strategy_rows() -> tuple[Row, ...]:
    """Each base strategy, then the same with the prior (``draft_prior``), at the same guidance."""
    rows = []
    for g in (1.0, 3.0):
        sjd, mc = row("sjd", guidance_scale=g), row("sjd", guidance_scale=g, **MAXIMAL)
        lantern, gsd = row("lantern", guidance_scale=g), row("gsd", guidance_scale=g)
        rows += [row("ar", guidance_scale=g), sjd, row("sjd-vp", base=sjd, guidance_scale=g),
                 row("sjd-vp", base=sjd, guidance_scale=g, vp_verify="paper"), mc,
                 row("sjd-vp", base=mc, guidance_scale=g, **MAXIMAL), lantern,
                 row("lantern", base=lantern, guidance_scale=g, **VP_PRIOR),
                 gsd, row("gsd", base=gsd, guidance_scale=g, **VP_PRIOR)]
    return tuple(rows)


def _vp_sweep_rows() -> tuple[Row, ...]:
    rows = []
    for steps, strength, beta in itertools.product((1, 2, 3), (0.5, 1.0, 2.0), (0.3, 0.7)):
        knobs = {"vp_growth_steps": steps, "vp_strength": strength, "vp_beta": beta, "vp_max_gain": None}
        for coupling, g in ({}, 1.0), ({}, 3.0), (MAXIMAL, 1.0):
            rows.append(row("sjd-vp", base=row("sjd", guidance_scale=g, **coupling), guidance_scale=g,
                            **coupling, **knobs))
    return tuple(rows)


def _vp_variant_rows() -> tuple[Row, ...]:
    variants = ({}, {"vp_max_gain": 0.5}, {"vp_max_gain": 1.0}, {"vp_growth_steps": 1, "vp_max_gain": 0.5})
    return tuple(row("sjd-vp", base=row("sjd", guidance_scale=g), guidance_scale=g, **{**PAPER_VP, **v})
                 for v in variants for g in (1.0, 3.0))


def _vp_window_rows() -> tuple[Row, ...]:
    rows = []
    for window in (8, 16, 32):
        sjd, mc = row("sjd", window=window), row("sjd", window=window, **MAXIMAL)
        rows += [sjd, row("sjd-vp", base=sjd, window=window, **PAPER_VP),
                 mc, row("sjd-vp", base=mc, window=window, **PAPER_VP, **MAXIMAL)]
    return tuple(rows)


def _vp_growth_rows() -> tuple[Row, ...]:
    return tuple(row("sjd", probe="growth", guidance_scale=g, label=f"{coupling} redraft, N={steps}",
                     draft_prior="bench-vp-probe", verifier="bench-growth-probe", vp_strength=0.0,
                     vp_growth_steps=steps, **({} if coupling == "independent" else MAXIMAL))
                 for coupling, g, steps in itertools.product(("independent", "maximal"), (1.0, 3.0), (1, 2, 3)))


def _vp_confirm_rows() -> tuple[Row, ...]:
    sjd1, sjd3, mc = row("sjd", guidance_scale=1.0), row("sjd", guidance_scale=3.0), row("sjd", **MAXIMAL)
    return (row("sjd-vp", base=sjd1, guidance_scale=1.0), row("sjd-vp", base=sjd3, guidance_scale=3.0),
            row("sjd-vp", base=mc, guidance_scale=1.0, **MAXIMAL),
            row("sjd-vp", base=mc, guidance_scale=1.0, vp_strength=0.5, vp_beta=0.3, vp_max_gain=None, **MAXIMAL))


VP_SPEED = ("guidance_scale", "step_compression", "vs_base", "acceptance_rate")
VP = Suite(
    "vp", "SJD-VP: where does the verification prior pay?",
    "The verification-prediction prior (defaults N = 3, strength 1, beta 0.5, gain bounded to [0, 1], lossless) "
    "against its base strategy at the same guidance and window (with `draft_coupling=maximal`: maximally coupled "
    "redrafting), with quality proxies; the (N, strength, beta) sweep (unbounded log gain, as in the paper); "
    "bounded variants; window sizes; the paper's growth statistic; the prior's cost per iteration. "
    "`--seeds 100,200 --sections confirm` re-checks the defaults and the sweep's best cell on fresh seeds.",
    (Section("strategies", "Strategies", _vp_strategy_rows(), VP_SPEED + ("d_loglik", "tv_to_ar")),
     Section("sweep", "Sweep: growth steps N x strength x beta (unbounded gain)", _vp_sweep_rows(), VP_SPEED),
     Section("variants", "Bounded variants (from the paper's N = 3, strength 1, beta 0.5, unbounded)",
             _vp_variant_rows(), VP_SPEED),
     Section("window", "Window size (paper's formula)", _vp_window_rows(), ("window",) + VP_SPEED[1:]),
     Section("growth", "The paper's growth statistic (prior at strength 0: sampling unchanged)", _vp_growth_rows(),
             ("guidance_scale", "growth_share", "growth_precision", "acceptance_rate", "growth_rate"),
             "A verified draft *grew* if its token's probability at that position rose in each of the last N "
             "observations before it was drafted. share = accepted drafts that grew / accepted drafts; precision = "
             "grew and accepted / grew (among verified drafts); acceptance = the base rate; grew = share of "
             "verified drafts that grew."),
     Section("cost", "Cost of the prior", (
         row("sjd-vp", probe="prior-cost", label="defaults", draft_prior="bench-vp-probe"),),
         ("prior_ms", "ms_per_forward", "step_compression"),
         "Wall ms inside the verification-prediction prior per call (one call per decoding iteration) next to "
         "the wall ms per iteration of the whole generate call."),
     Section("confirm", "Confirmation (defaults, and the sweep's best maximally coupled cell)", _vp_confirm_rows(),
             VP_SPEED)),
    defaults={"images_per_prompt": 1, "batch_size": 4, "seeds": "0,1"},
)


# -- pv: SJD-PV with the shipped library, ablations (tau, matching, merges), the verifier's cost ----------------
def _pv_strategy_rows() -> tuple[Row, ...]:
    sjd = row("sjd")
    return (row("ar"), sjd, row("sjd-pv", base=sjd, label="defaults"), row("mc-sjd"),
            row("sjd-pv", base=sjd, label="defaults, maximal coupling", **MAXIMAL),
            row("lantern", base=sjd, label="k=10, lambda=2"),
            row("sjd-pv", base=sjd, label="over LANTERN", pv_base_verifier="lantern"),
            row("sjd-pv", base=sjd, label="over GSD", pv_base_verifier="gsd"),
            row("sjd-pv", base=sjd, label="VP prior defaults", **VP_PRIOR))


MERGES = (1000, 4000, 8000, 16000)
PV_COLUMNS = ("step_compression", "vs_base", "acceptance_rate", "d_loglik", "repeat_rate", "tv_to_ar",
              "class_accuracy")
PV = Suite(
    "pv", "SJD-PV: phrase verification with the shipped phrase library",
    "Phrase verification (default library: the model's own, `pv_tau=0.01`, `pv_match='exact'`) next to quality "
    "proxies, then ablations of tau, of matching, and of the number of merges (one 16k-merge library over "
    "tokenized reference crops, truncated with `first(M)`), and the wall time inside the phrase verifier.",
    (Section("strategies", "Strategies", _pv_strategy_rows(), PV_COLUMNS),
     Section("tau", "Ablation: tau (sjd-pv, exact matching)",
             tuple(row("sjd-pv", base=row("sjd"), pv_tau=t) for t in (0.001, 0.01, 0.1)), PV_COLUMNS),
     Section("match", "Ablation: matching (sjd-pv)",
             tuple(row("sjd-pv", base=row("sjd"), pv_match=m, pv_tau=t)
                   for m in ("exact", "neighbourhood") for t in (0.01, 0.1)), PV_COLUMNS,
             "`neighbourhood`: a draft matches a phrase token when it is among that token's latent neighbours."),
     Section("merges", "Ablation: number of merges (sjd-pv)",
             tuple(row("sjd-pv", base=row("sjd"), label=f"{m} merges", phrase_library=f"@merges-{m}")
                   for m in MERGES), PV_COLUMNS),
     Section("cost", "Cost of phrase verification", (row("sjd-pv", probe="pv-cost", label="defaults"),),
             ("verifier_ms", "ms_per_forward", "step_compression"),
             "Wall ms inside the phrase verifier (matching, joint test, walk) per call (one call per decoding "
             "iteration) next to the wall ms per iteration of the whole generate call.")),
    defaults={"images_per_prompt": 2, "batch_size": 8, "seeds": "0,1"},
)


# -- library: phrase-library build speed (no generation) -----------------------------------------------------
LIBRARY = Suite(
    "library", "Phrase-library build speed",
    "`PhraseLibrary.from_token_sequences` wall time (tokenizers' Rust BPE trainer + vectorised phrase counting) "
    "on a synthetic corpus sampled from a first-order Markov chain fitted to tokenized reference crops (real "
    "pair statistics, every sequence distinct), next to the shipped library's recorded build. Target: 8k merges "
    "over 10M tokens in < 2 min.",
    (), defaults={"seeds": "0"}, measurements=("library-build",), needs_reference=True,
)

# -- frontier: fresh drafts, Gumbel coupling, compression vs window, batch 8, the forward cost model -----------
#: (label, knobs) of each fresh-draft rule the ``fresh`` and ``gumbel`` sections compare (mc-sjd, window 16)
FRESH_INITS = (("random", {"draft_init": "random"}), ("last-target", {"draft_init": "last-target"}),
               ("row-above-dist", {"draft_init": "row-above-dist"}))
FRONTIER_WINDOWS = (8, 16, 32, 64)
FRONTIER_STUDY = {"window": 16, "batch_size": 1}  # every frontier row pins these unless it varies them


def _fresh(coupling: str, knobs: dict, label: str, base: Row | None = None, **setting) -> Row:
    """mc-sjd with ``knobs``; ``draft_coupling`` is a knob only off the preset's maximal coupling (same key)."""
    coupled = {} if coupling == "maximal" else {"draft_coupling": coupling}
    return row("mc-sjd", base=base, label=f"{label}, {coupling}", **{**FRONTIER_STUDY, **setting}, **coupled,
               **knobs)


def frontier_default(**setting) -> Row:
    """mc-sjd with its preset (``draft_init="auto"``: row-above-dist where the adapter knows the grid)."""
    return row("mc-sjd", label="auto (preset), maximal", **{**FRONTIER_STUDY, **setting})


def frontier_random(**setting) -> Row:
    """mc-sjd with uniformly random fresh drafts (the preset before the frontier study)."""
    return row("mc-sjd", label="random, maximal", **{**FRONTIER_STUDY, **setting}, draft_init="random")


def _fresh_rows() -> tuple[Row, ...]:
    random = frontier_random()  # the same key as the first fresh row
    return tuple(_fresh("maximal", knobs, label, base=None if knobs == {"draft_init": "random"} else random)
                 for label, knobs in FRESH_INITS)


def _gumbel_rows() -> tuple[Row, ...]:
    return tuple(_fresh("gumbel", knobs, label, base=_fresh("maximal", knobs, label)) for label, knobs in FRESH_INITS)


def _frontier_window_rows() -> tuple[Row, ...]:
    rows = []
    for window in FRONTIER_WINDOWS:
        rows += [row("sjd", window=window, batch_size=1), frontier_random(window=window),
                 frontier_default(window=window)]
    return tuple(rows)


def _frontier_batch_rows() -> tuple[Row, ...]:
    return tuple(make(batch_size=batch) for batch in (1, 8) for make in (frontier_random, frontier_default))


def _frontier_quality_rows() -> tuple[Row, ...]:
    ar = row("ar", batch_size=1)
    return (ar, frontier_random(), frontier_default(), _fresh("gumbel", {"draft_init": "auto"}, "auto (preset)"),
            sibling_row(16, 15))


# -- frontier: why batch 8 keeps less than batch 1 (the batch waits for its slowest row) ------------------------
def _straggler_pairs() -> tuple[tuple[Row, Row], ...]:
    """(batch-1 row, batch-8 row) pairs the ``batch-straggler`` measurement compares: the cells ``"auto"`` picks
    (window 16 on CPU; on CUDA 16 + 15 siblings at one row, 32 + 7 and 32 + 15 around the 7B picks)."""
    return ((frontier_default(batch_size=1), frontier_default(batch_size=8)),
            (sibling_row(16, 15), sibling_row(16, 15, batch=8)),
            (sibling_row(32, 7), sibling_row(32, 7, batch=8)),
            (sibling_row(32, 15), sibling_row(32, 15, batch=8)))


def _straggler_rows() -> tuple[Row, ...]:
    return tuple(dict.fromkeys(r for pair in _straggler_pairs() for r in pair))


# -- frontier: jacobi_window="auto" as a 7B model on a GPU would run it (the cuda-7b probe) -------------------------
def _auto_rule_rows() -> tuple[Row, ...]:
    """At batch 1 and 8: the full batch's cell pinned, against ``jacobi_window="auto"`` (the same cell for the full
    batch, picked again for the rows left as rows finish). At batch 1 no row finishes early: vs base is 0."""
    from hf_sjd.jacobi.cost_model import pick


    rows = []
    for batch in (1, 8):
        window, siblings = pick(SEVEN_B, batch, COST_CONTEXT)
        fixed = row("mc-sjd", label=f"priced as 7B on CUDA: {window} + {siblings} pinned", probe="cuda-7b",
                    window=window, batch_size=batch, jacobi_siblings=siblings)
        rows += [fixed, row("mc-sjd", base=fixed, label="priced as 7B on CUDA: auto, re-picked as rows finish",
                            probe="cuda-7b", window="auto", batch_size=batch, jacobi_siblings="auto")]
    return tuple(rows)


SIBLING_COUNTS = (3, 7, 15)


def sibling_row(window: int, siblings: int, batch: int = 1) -> Row:
    """mc-sjd preset with ``siblings`` siblings of the first draft, paired with the preset at the same window."""
    return row("mc-sjd", base=frontier_default(window=window, batch_size=batch),
               label=f"auto (preset), {siblings} siblings", window=window, batch_size=batch, jacobi_siblings=siblings)


def _sibling_rows() -> tuple[Row, ...]:
    rows = []
    for window in (16, 32):
        rows += [frontier_default(window=window), *(sibling_row(window, m) for m in SIBLING_COUNTS)]
    return (*rows, frontier_default(batch_size=8), sibling_row(16, 7, batch=8))


# -- frontier: the cells the cost model picks the mc-sjd preset's window and siblings from (jacobi_*="auto") ----
AUTO_GRID = ((8, 0), (16, 0), *((16, m) for m in SIBLING_COUNTS), (32, 0), *((32, m) for m in SIBLING_COUNTS),
             (64, 0), *((64, m) for m in SIBLING_COUNTS[1:]))  # (window L, siblings m): the keys of
# hf_sjd.jacobi.cost_model.STEP_COMPRESSION


def _auto_rows() -> tuple[Row, ...]:
    return tuple(sibling_row(window, m) if m else frontier_default(window=window) for window, m in AUTO_GRID)


# -- frontier: what the first draft's siblings are drawn from (jacobi_sibling_law) ---------------------------------
SIBLING_LAW_CELLS = tuple(cell for cell in AUTO_GRID if cell[1])  # every (L, m) the cost model picks siblings at


def law_row(window: int, siblings: int, law: str, base: Row | None = None) -> Row:
    """mc-sjd preset with ``siblings`` siblings drawn from ``law`` (``jacobi_sibling_law``, pinned in every row so
    its tokens do not follow the preset's default)."""
    return row("mc-sjd", base=base, label=f"auto (preset), {siblings} siblings from {law}", window=window,
               batch_size=1, jacobi_siblings=siblings, jacobi_sibling_law=law)


def _sibling_law_rows() -> tuple[Row, ...]:
    rows = []
    for window, m in SIBLING_LAW_CELLS:
        draft = law_row(window, m, "draft")
        rows += [draft, law_row(window, m, "mixture", base=draft)]
    return tuple(rows)


# -- frontier: block verification (verifier="block") against token-by-token verification ----------------------------
#: (window, siblings) cells: the CPU preset's, window 32 alone, and the CUDA picks at jacobi_window=16 and for a 7B
#: model (siblings from the preset's mixture law)
BLOCK_CELLS = ((16, 0), (32, 0), (16, 15), (32, 15))


def verification_row(window: int, siblings: int, verifier: str, batch: int = 1, base: Row | None = None) -> Row:
    """mc-sjd preset at (``window``, ``siblings``) with ``verifier`` pinned, so the row keeps its tokens whatever the
    preset's verifier. Block verification reads every draft of the window, so it runs with independent redraft (a
    coupling that keeps drafts is refused with it: docs/results/frontier_block ran it coupled, which was not
    exact)."""
    extra = {"jacobi_siblings": siblings} if siblings else {}
    if verifier == "block":
        extra["draft_coupling"] = "independent"
    shown = (f", {siblings} siblings" if siblings else "") + (", independent redraft" if verifier == "block" else "")
    return row("mc-sjd", base=base, label=f"auto (preset){shown}, {verifier} verification", window=window,
               batch_size=batch, verifier=verifier, **extra)


def _block_rows() -> tuple[Row, ...]:
    """Each cell token by token (``speculative``), then with ``block`` paired to it; sjd (the paper preset) alike;
    and window 16 at batch 8 (the batch target compares it with the batch-1 row of the same verifier)."""
    sjd = row("sjd", window=16, batch_size=1)
    rows = [row("ar", batch_size=1), sjd,
            row("sjd", base=sjd, label="block verification", window=16, batch_size=1, verifier="block")]
    for window, siblings, batch in (*((w, m, 1) for w, m in BLOCK_CELLS), (16, 0, 8)):
        token = verification_row(window, siblings, "speculative", batch)
        rows += [token, verification_row(window, siblings, "block", batch, base=token)]
    return tuple(rows)


SIBLINGS_COLUMNS = ("batch_size", "window", "step_compression", "vs_base", "row_tokens_per_forward",
                    "siblings_accepted", "acceptance_rate")
# -- cells: the compression of every cell jacobi_window="auto" picks from (the cells suite below) ------------------
#: windows whose compression hf_sjd.calibration.REFERENCE_COMPRESSION holds (mc-sjd's 8 / 16 / 32 / 64 and its
#: sibling cells come from the frontier suite's auto section)
CELL_WINDOWS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)


def _cell_rows() -> tuple[Row, ...]:
    """Each cell without siblings at batch 1: ``sjd`` (token-by-token verification, independent redraft) and the
    mc-sjd preset at the windows the window section has not measured."""
    sjd = tuple(row("sjd", window=w, batch_size=1, jacobi_siblings=0) for w in CELL_WINDOWS)
    mc = tuple(frontier_default(window=w, jacobi_siblings=0) for w in CELL_WINDOWS if w not in FRONTIER_WINDOWS)
    return sjd + mc


FRONTIER_SPEED = ("step_compression", "vs_base", "acceptance_rate", "tokens_per_forward")
FRONTIER = Suite(
    "frontier", "The lossless frontier: fresh drafts, Gumbel coupling, window economics",
    "MC-SJD's fresh drafts (`draft_init`) and coupling (`draft_coupling`) at window 16, batch 1; compression "
    "against the window (8-64) for sjd and mc-sjd; batch 8 against batch 1; quality proxies of the preset "
    "against vanilla sampling; siblings of the first draft and what they are drawn from; block verification; the "
    "roofline forward-cost model with the cells it picks per model size. Every row pins its window and batch "
    "size, so `--window` / `--batch-size` change none of them. Confirmation on fresh seeds: the same suite with "
    "`--seeds 1000`.",
    (Section("fresh", "Fresh drafts (mc-sjd, maximal coupling, window 16)", _fresh_rows(), FRONTIER_SPEED,
             "vs base: paired difference to mc-sjd with `draft_init=random` (same images and seeds)."),
     Section("gumbel", "Gumbel coupling (window 16) against maximal coupling, init by init", _gumbel_rows(),
             FRONTIER_SPEED,
             "`draft_coupling=gumbel` keeps each window position's Gumbel noise as the window slides; vs base: "
             "paired difference to maximal coupling with the same `draft_init`."),
     Section("window", "Compression against the window (batch 1)", _frontier_window_rows(),
             ("window", "step_compression", "acceptance_rate", "nfe_per_call"),
             "The preset row uses `draft_init=auto` (row-above-dist on the reference model's grid); the cost "
             "model below picks a window from these rows."),
     Section("batch", "Batch 8 against batch 1 (window 16)", _frontier_batch_rows(),
             ("batch_size", "nfe_per_call", "step_compression", "row_tokens_per_forward", "acceptance_rate"),
             "step compression: new tokens per row / forwards per generate call (a batch runs until its slowest "
             "row is done: the batch's speed); row tokens/forward: tokens committed per (row, forward) while the "
             "row is active (each image's own compression). At batch 1 the two agree."),
     Section("quality", "Quality proxies (window 16, batch 1) against vanilla sampling", _frontier_quality_rows(),
             ("batch_size", "step_compression", "mean_token_loglik", "d_loglik", "tv_to_ar", "fd_ref",
              "class_accuracy"),
             "Lossless strategies sample the model's distribution: d loglik and FD-ref should sit within seed "
             "noise of ar (compare with the FD-ref floors below)."),
     Section("siblings", "Siblings of the first draft (`jacobi_siblings`), measured", _sibling_rows(),
             SIBLINGS_COLUMNS,
             "m siblings of the first draft ride in each forward (L + 1 + m input tokens per row) and are verified by "
             "recursive rejection sampling where the first draft is rejected; vs base: paired difference to the "
             "preset at the same window and batch. The cost model below charges each forward its L + 1 + m tokens."),
     Section("auto", "The cells `jacobi_window=\"auto\"` / `jacobi_siblings=\"auto\"` pick from (batch 1)",
             _auto_rows(), SIBLINGS_COLUMNS,
             "Every (window, siblings) cell the cost model chooses among; their mean step compression over seeds "
             "0 / 1000 / 3000 is `hf_sjd.jacobi.cost_model.STEP_COMPRESSION`. Up to window 32 and window 64 alone "
             "they are the rows of the `siblings` and `window` sections (same keys, same tokens); the window-64 "
             "sibling cells are this section's own. The auto-cost-model measurement below prints the pick per "
             "model size and forward row count, from the shipped table and from this run."),
     Section("sibling-law", "What the siblings are drawn from (`jacobi_sibling_law`, batch 1)", _sibling_law_rows(),
             SIBLINGS_COLUMNS,
             "At every (window, siblings) cell of the `auto` section: siblings drawn from the first draft's q "
             "(`draft`) or from its average with the target at the last committed position (`mixture`); vs base: "
             "paired difference to `draft` at the same cell. Every row pins its law."),
     Section("block", "Block verification (`verifier=\"block\"`) against token-by-token verification",
             _block_rows(), ("batch_size", "window", "step_compression", "vs_base", "row_tokens_per_forward",
                             "siblings_accepted", "acceptance_rate", "d_loglik", "fd_ref"),
             "Block verification (Sun et al. 2025) decides how many drafts to keep from the whole window's prefix "
             "weights, where token-by-token verification stops at the first rejected draft; both are exact. vs "
             "base: paired difference to the same cell verified token by token (every row pins its verifier, so "
             "the rows keep their tokens whatever the preset's). d loglik and FD-ref against `ar` (same images)."),
     Section("straggler", "Batch 8 against batch 1: what the slowest row costs", _straggler_rows(),
             ("batch_size", "window", "step_compression", "row_tokens_per_forward", "siblings_accepted"),
             "A batch runs until its slowest row is done, so its forwards are the most any of its images needs. "
             "The batch-straggler measurement below predicts each batch-8 row from the batch-1 forwards of the "
             "same images (the most of the eight, batch by batch) and from the spread of those forwards alone."),
     Section("auto-rule", "`jacobi_window=\"auto\"` as a 7B model on CUDA would run it", _auto_rule_rows(),
             ("batch_size", "window", "step_compression", "vs_base", "row_tokens_per_forward", "siblings_accepted",
              "drafts_per_forward"),
             "Rows with the `cuda-7b` probe run on this CPU the cells a 7B model on a GPU would get: the full "
             "batch's pick pinned, against `\"auto\"`, which also picks again (at least as wide) for the rows "
             "still decoding. vs base: auto against pinned at the same batch size."),
),
    defaults={"images_per_prompt": 2, "batch_size": 1, "seeds": "0"},
    measurements=("frontier-cost-model", "siblings-cost-model", "auto-cost-model", "batch-straggler"),
)

# -- cells: the compression of every cell jacobi_window="auto" picks from, per strategy family ---------------------
CELLS = Suite(
    "cells", "Step compression per window: the cells `jacobi_window=\"auto\"` picks from",
    "Every window without siblings at batch 1, for sjd (token-by-token verification, independent redraft) and the "
    "mc-sjd preset below window 8 and at 12: `hf_sjd.calibration.REFERENCE_COMPRESSION` is their mean over the seeds.",
    (Section("cells", "Step compression per window (batch 1, no siblings)", _cell_rows(),
             ("window", "step_compression", "acceptance_rate", "nfe_per_call")),),
    defaults={"images_per_prompt": 2, "batch_size": 1, "seeds": "0,1000,3000"},
)

# -- speed: the wall time of the lossless defaults against ar (the measurement) ------------------------------------
SPEED = Suite(
    "speed", "Never slower than vanilla generate",
    "The wall time of ar and every lossless default as it is (`jacobi_window=\"auto\"`, picked from this machine's "
    "measured costs) at batch 1 / 8 and CFG 1 / 3: speed-up, the cell that ran, its measured cost, the bound "
    "compression / cost and the share of it reached.",
    (), defaults={"seeds": "0,1,2,3,4"}, measurements=("speed",),
)

SUITES: dict[str, Suite] = {s.name: s for s in (CORE, VERIFIERS, VP, PV, LIBRARY, FRONTIER, CELLS, SPEED)}


def with_methods(sections, methods: list[str]) -> list[Section]:
    """``--methods``: the sections' rows of those methods only, in every suite; a base row of another method is
    dropped (its row then has no paired column); sections left without rows are dropped."""
    wanted, kept = set(methods), []
    for section in sections:
        rows = tuple(r if r.base is None or r.base.method in wanted else dataclasses.replace(r, base=None)
                     for r in section.rows if r.method in wanted)
        if rows:
            kept.append(dataclasses.replace(section, rows=rows))
    return kept


def suite_rows(sections) -> list[Row]:
    """Every row the sections name (bases included), each once, in first-seen order."""
    seen: dict[str, Row] = {}
    for section in sections:
        for r in section.rows:
            for one in (r.base, r) if r.base is not None else (r,):
                seen.setdefault(one.key, one)
    return list(seen.values())
