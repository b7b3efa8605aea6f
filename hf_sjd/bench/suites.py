"""The suites of ``hf-sjd bench --suite NAME``: data, not code. A suite is a list of sections; a section is a
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

import itertools
from dataclasses import dataclass, field

#: knob names the table labels leave out (they are implied by the method)
QUIET_KNOBS = ("latent_embeddings",)


@dataclass(frozen=True)
class Row:
    """One setting. ``None`` fields take the run's flags (``--guidance-scale``, ``--window``, ``--batch-size``)."""

    method: str
    knobs: tuple[tuple[str, object], ...] = ()
    label: str | None = None  # the table's "knobs" cell; default: the knobs, formatted
    guidance_scale: float | None = None
    window: int | None = None
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
        guidance_scale: float | None = None, window: int | None = None, batch_size: int | None = None,
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
CORE_METHODS = ("ar", "sjd", "mc-sjd", "sjd-vp", "mc-sjd-vp", "sjd-pv", "mc-sjd-pv", "lantern", "mc-lantern",
                "lantern-pv", "gsd", "mc-gsd", "sjd-vp-pv", "prompt-lookup")


# -- core: every method, then batch size x CFG ---------------------------------------------------------------
def core_rows(methods=CORE_METHODS) -> tuple[Row, ...]:
    sjd = row("sjd")
    return tuple(row(m, base=None if m in ("ar", "sjd", "prompt-lookup") else sjd) for m in methods)


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
    "(FD-ref, class accuracy, log-likelihood, TV to ar) of every method; then batch size x CFG for ar/SJD/MC-SJD.",
    (Section("methods", "Every method", core_rows(), (
        "nfe_per_call", "step_compression", "vs_base", "acceptance_rate", "seconds_per_image", "loop_overhead",
        "peak_memory_mb", "fd_ref", "class_accuracy", "mean_token_loglik", "tv_to_ar", "tokens_per_forward"),
        "vs sjd: paired difference of step compression to `sjd` (same batches and seeds), ± SE over batches."),
     Section("batch-cfg", "Batch size 1 and 8, CFG off and on (scale 3)", _batch_cfg_rows(),
             ("batch_size", "guidance_scale", "nfe_per_call", "step_compression", "vs_base", "acceptance_rate",
              "seconds_per_image", "loop_overhead", "tokens_per_forward"),
             "vs sjd: mc-sjd minus sjd at the same batch size and CFG (paired).")),
    defaults={"num_images": 1, "batch_size": 8, "seeds": "0,1"},
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
    defaults={"num_images": 2, "batch_size": 8, "seeds": "0,1"},
)


# -- vp: SJD-VP strategies, sweep, variants, window, growth statistic, cost ---------------------------------
PAPER_VP = {"vp_growth_steps": 3, "vp_strength": 1.0, "vp_beta": 0.5, "vp_max_gain": None}  # the paper's formula


def _vp_strategy_rows() -> tuple[Row, ...]:
    rows = []
    for g in (1.0, 3.0):
        sjd, mc, lantern, gsd = (row(m, guidance_scale=g) for m in ("sjd", "mc-sjd", "lantern", "gsd"))
        rows += [row("ar", guidance_scale=g), sjd, row("sjd-vp", base=sjd, guidance_scale=g),
                 row("sjd-vp", base=sjd, guidance_scale=g, vp_verify="paper"), mc,
                 row("mc-sjd-vp", base=mc, guidance_scale=g), lantern,
                 row("lantern-vp", base=lantern, guidance_scale=g),
                 gsd, row("gsd-vp", base=gsd, guidance_scale=g)]
    return tuple(rows)


def _vp_sweep_rows() -> tuple[Row, ...]:
    rows = []
    for steps, strength, beta in itertools.product((1, 2, 3), (0.5, 1.0, 2.0), (0.3, 0.7)):
        knobs = {"vp_growth_steps": steps, "vp_strength": strength, "vp_beta": beta, "vp_max_gain": None}
        for method, base, g in (("sjd-vp", "sjd", 1.0), ("sjd-vp", "sjd", 3.0), ("mc-sjd-vp", "mc-sjd", 1.0)):
            rows.append(row(method, base=row(base, guidance_scale=g), guidance_scale=g, **knobs))
    return tuple(rows)


def _vp_variant_rows() -> tuple[Row, ...]:
    variants = ({}, {"vp_max_gain": 0.5}, {"vp_max_gain": 1.0}, {"vp_min_prob": 0.05},
                {"vp_max_gain": 1.0, "vp_min_prob": 0.05}, {"vp_growth_steps": 1, "vp_max_gain": 0.5}, {"vp_top_k": 10})
    return tuple(row("sjd-vp", base=row("sjd", guidance_scale=g), guidance_scale=g, **{**PAPER_VP, **v})
                 for v in variants for g in (1.0, 3.0))


def _vp_window_rows() -> tuple[Row, ...]:
    rows = []
    for window in (8, 16, 32):
        sjd, mc = row("sjd", window=window), row("mc-sjd", window=window)
        rows += [sjd, row("sjd-vp", base=sjd, window=window, **PAPER_VP),
                 mc, row("mc-sjd-vp", base=mc, window=window, **PAPER_VP)]
    return tuple(rows)


def _vp_growth_rows() -> tuple[Row, ...]:
    return tuple(row(method, probe="growth", guidance_scale=g, label=f"{coupling} redraft, N={steps}",
                     draft_prior="bench-vp-probe", verifier="bench-growth-probe", vp_strength=0.0,
                     vp_growth_steps=steps)
                 for (coupling, method), g, steps in itertools.product(
                     (("independent", "sjd"), ("maximal", "mc-sjd")), (1.0, 3.0), (1, 2, 3)))


def _vp_confirm_rows() -> tuple[Row, ...]:
    sjd1, sjd3, mc = row("sjd", guidance_scale=1.0), row("sjd", guidance_scale=3.0), row("mc-sjd", guidance_scale=1.0)
    return (row("sjd-vp", base=sjd1, guidance_scale=1.0), row("sjd-vp", base=sjd3, guidance_scale=3.0),
            row("mc-sjd-vp", base=mc, guidance_scale=1.0),
            row("mc-sjd-vp", base=mc, guidance_scale=1.0, vp_strength=0.5, vp_beta=0.3, vp_max_gain=None))


VP_SPEED = ("guidance_scale", "step_compression", "vs_base", "acceptance_rate")
VP = Suite(
    "vp", "SJD-VP: where does the verification prior pay?",
    "The verification-prediction prior (defaults N = 3, strength 1, beta 0.5, gain bounded to [0, 1], lossless) "
    "against its base strategy at the same guidance and window, with quality proxies; the (N, strength, beta) "
    "sweep (unbounded log gain, as in the paper); bounded variants; window sizes; the paper's growth statistic; "
    "the prior's cost per iteration. `--seeds 100,200 --sections confirm` re-checks the defaults and the sweep's "
    "best cell on fresh seeds.",
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
     Section("confirm", "Confirmation (defaults, and the sweep's best mc-sjd-vp cell)", _vp_confirm_rows(),
             VP_SPEED)),
    defaults={"num_images": 1, "batch_size": 4, "seeds": "0,1"},
)


# -- pv: SJD-PV with the shipped library, ablations (tau, matching, merges), matching cost ------------------
def _pv_strategy_rows() -> tuple[Row, ...]:
    sjd = row("sjd")
    return (row("ar"), sjd, row("sjd-pv", base=sjd, label="defaults"), row("mc-sjd"),
            row("mc-sjd-pv", base=sjd, label="defaults"), row("lantern", base=sjd, label="k=10, lambda=2"),
            row("lantern-pv", base=sjd, label="defaults"), row("gsd-pv", base=sjd, label="defaults"),
            row("sjd-vp-pv", base=sjd, label="VP defaults"))


MERGES = (1000, 4000, 8000, 16000)
PV_COLUMNS = ("step_compression", "vs_base", "acceptance_rate", "d_loglik", "repeat_rate", "tv_to_ar",
              "class_accuracy")
PV = Suite(
    "pv", "SJD-PV: phrase verification with the shipped phrase library",
    "Phrase verification (default library: the model's own, `pv_tau=0.01`, `pv_match='exact'`) next to quality "
    "proxies, then ablations of tau, of matching and what is committed, and of the number of merges (one "
    "16k-merge library over tokenized reference crops, truncated with `first(M)`), and the cost of one matching "
    "call.",
    (Section("strategies", "Strategies", _pv_strategy_rows(), PV_COLUMNS),
     Section("tau", "Ablation: tau (sjd-pv, exact matching)",
             tuple(row("sjd-pv", base=row("sjd"), pv_tau=t) for t in (0.001, 0.01, 0.1)), PV_COLUMNS),
     Section("match", "Ablation: matching and what is committed (sjd-pv)",
             tuple(row("sjd-pv", base=row("sjd"), pv_match=m, pv_commit=c, pv_tau=t)
                   for m, c in (("exact", "phrase"), ("neighbourhood", "draft"), ("neighbourhood", "phrase"))
                   for t in (0.01, 0.1)), PV_COLUMNS,
             "`neighbourhood` + `phrase`: phrase tokens replace drafts (committed up to the first substituted "
             "token); `neighbourhood` + `draft`: a neighbourhood match only makes the drafts verified jointly."),
     Section("merges", "Ablation: number of merges (sjd-pv)",
             tuple(row("sjd-pv", base=row("sjd"), label=f"{m} merges", phrase_library=f"@merges-{m}")
                   for m in MERGES), PV_COLUMNS)),
    defaults={"num_images": 2, "batch_size": 8, "seeds": "0,1"},
    measurements=("pv-matching-cost",),
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
FRESH_INITS = (("random", {"draft_init": "random"}), ("repeat-horizon", {"draft_init": "repeat-horizon"}),
               ("last-target", {"draft_init": "last-target"}), ("row-above", {"draft_init": "row-above"}),
               ("row-above-dist", {"draft_init": "row-above-dist"}),
               *((f"row-above-mix, w={w:g}", {"draft_init": "row-above-mix", "draft_init_weight": w})
                 for w in (0.25, 0.5, 0.75)))
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
            sibling_row(16, 15), budget_row(32), budget_siblings_row())


# -- frontier: the adaptive window (jacobi_window_rule="adaptive") against fixed windows ---------------------------
ADAPTIVE_FIXED, ADAPTIVE_UPPER, ADAPTIVE_BATCHES = (8, 12, 16, 32), (32, 16), (1, 8)
#: (scale a, margin b, EMA rate) of ceil(a * estimate) + b, swept at upper bound 32 (seed 0; confirm on 1000)
ADAPTIVE_SWEEP = tuple(itertools.product((1.0, 2.0, 4.0), (4, 8, 16), (0.3, 0.7)))


def adaptive_row(upper: int, batch: int, **rule) -> Row:
    """mc-sjd preset with the adaptive window rule (its defaults unless ``rule`` sets jacobi_window_scale/...),
    paired with the fixed window at the same upper bound and batch size."""
    names = {"jacobi_window_scale": "a", "jacobi_window_margin": "b", "jacobi_window_ema": "ema"}
    shown = "".join(f", {names[k]}={v:g}" for k, v in rule.items())
    return row("mc-sjd", base=frontier_default(window=upper, batch_size=batch),
               label=f"auto (preset), adaptive <= {upper}{shown}", window=upper, batch_size=batch,
               jacobi_window_rule="adaptive", **rule)


def _adaptive_rows() -> tuple[Row, ...]:
    rows = []
    for batch in ADAPTIVE_BATCHES:
        rows += [frontier_default(window=w, batch_size=batch) for w in ADAPTIVE_FIXED]
        rows += [adaptive_row(upper, batch) for upper in ADAPTIVE_UPPER]
    return tuple(rows)


def _adaptive_sweep_rows() -> tuple[Row, ...]:
    return tuple(adaptive_row(32, b, jacobi_window_scale=a, jacobi_window_margin=m, jacobi_window_ema=e)
                 for b in ADAPTIVE_BATCHES for a, m, e in ADAPTIVE_SWEEP)


# -- frontier: the budget window (jacobi_window_rule="budget"): a batch's stragglers take the forward's tokens ---------
BUDGET_UPPER = (32, 64)


def budget_row(upper: int, batch: int = 8, width: int = 16, siblings: int = 0) -> Row:
    """mc-sjd preset whose full batch verifies ``width`` drafts per row and whose rows left share the full batch's
    tokens (up to ``upper`` drafts), paired with the fixed window ``width`` at the same batch size (and the same
    ``siblings``)."""
    extra = {"jacobi_siblings": siblings} if siblings else {}
    base = sibling_row(width, siblings, batch) if siblings else frontier_default(window=width, batch_size=batch)
    shown = f", {siblings} siblings" if siblings else ""
    return row("mc-sjd", base=base, label=f"auto (preset), budget {width} -> <= {upper}{shown}", window=width,
               batch_size=batch, jacobi_window_rule="budget", jacobi_window_max=upper, **extra)


def _budget_rows() -> tuple[Row, ...]:
    return (frontier_default(batch_size=1), frontier_default(batch_size=8), *(budget_row(u) for u in BUDGET_UPPER),
            sibling_row(16, 7), budget_row(32, siblings=7))


BUDGET_SIBLINGS = 15  # jacobi_budget_siblings of the budget-siblings section: the most siblings measured


def budget_siblings_row(upper: int = 32, batch: int = 8, width: int = 16) -> Row:
    """:func:`budget_row` whose rows left also spend the tokens their capped window leaves on siblings of the
    first draft (``jacobi_budget_siblings``), paired with the same budget rule without them."""
    return row("mc-sjd", base=budget_row(upper, batch, width),
               label=f"auto (preset), budget {width} -> <= {upper} + <= {BUDGET_SIBLINGS} siblings", window=width,
               batch_size=batch, jacobi_window_rule="budget", jacobi_window_max=upper,
               jacobi_budget_siblings=BUDGET_SIBLINGS)


def _budget_sibling_rows() -> tuple[Row, ...]:
    return frontier_default(batch_size=1), frontier_default(batch_size=8), budget_row(32), budget_siblings_row()


# -- frontier: why batch 8 keeps less than batch 1 (the batch waits for its slowest row) ------------------------
def _straggler_pairs() -> tuple[tuple[Row, Row], ...]:
    """(batch-1 row, batch-8 row) pairs the ``batch-straggler`` measurement compares: the fixed settings the
    ``"auto"`` picks (window 16 on CPU; on CUDA 16 + 15 siblings at ``jacobi_window=16``, 32 + 7 before the
    mixture law, 32 + 15 with it), and the budget rule with siblings for the rows left against the fixed batch-1
    row of its full-batch width."""
    return ((frontier_default(batch_size=1), frontier_default(batch_size=8)),
            (sibling_row(16, 15), sibling_row(16, 15, batch=8)),
            (sibling_row(32, 7), sibling_row(32, 7, batch=8)),
            (sibling_row(32, 15), sibling_row(32, 15, batch=8)),
            (frontier_default(batch_size=1), budget_siblings_row()))


def _straggler_rows() -> tuple[Row, ...]:
    return tuple(dict.fromkeys(r for pair in _straggler_pairs() for r in pair))


# -- frontier: the auto window rule, priced as a 7B model on a GPU (the cuda-7b probe) -----------------------------
def priced_row(window: int, batch: int, rule: str, siblings: int | str = "auto", base: Row | None = None) -> Row:
    """mc-sjd preset as a 7B model on CUDA would run it (probe ``cuda-7b``): ``window`` drafts in the full batch's
    forward, siblings (``"auto"``: the cost model's count), and the window rule ``rule``."""
    shown = "auto siblings" if siblings == "auto" else f"{siblings} siblings"
    return row("mc-sjd", base=base, label=f"priced as 7B on CUDA: {window} + {shown}, {rule} rule", probe="cuda-7b",
               window=window, batch_size=batch, jacobi_siblings=siblings, jacobi_window_rule=rule)


def _auto_rule_rows() -> tuple[Row, ...]:
    """Batch 1 (16 and 32 drafts: the roofline gives them 15 siblings; 32 was the preset's window there when the
    section ran, 64 since block verification) and batch 8 (16 drafts + 7 siblings: the preset's pick for 8 rows),
    fixed against auto; and the CPU preset's knobs (16 drafts, no siblings) at batch 8 under the auto rule, against
    the fixed rule."""
    fixed = priced_row(16, 8, "fixed")
    return (priced_row(16, 1, "auto"), priced_row(32, 1, "auto"), fixed, priced_row(16, 8, "auto", base=fixed),
            frontier_default(batch_size=1), frontier_default(batch_size=8),
            priced_row(16, 8, "auto", siblings=0, base=frontier_default(batch_size=8)))


# -- frontier: what sibling drafts (tree attention) would add, priced on the real loop's p and q ------------------
def siblings_row(base: Row) -> Row:
    """``base`` verified by the siblings probe's wrapper (token-by-token verification, which it prices; unchanged
    tokens where ``base`` verifies token by token too: vs base is 0)."""
    return row(base.method, base=base, label=f"{base.label or 'preset'}, siblings probe", probe="siblings",
               window=base.window, batch_size=base.batch_size,
               **{**dict(base.knobs), "verifier": "bench-siblings-probe"})


def _siblings_rows() -> tuple[Row, ...]:
    """The probe wraps token-by-token verification, so the mc-sjd bases pin it (the preset verifies by blocks)."""
    return tuple(siblings_row(base) for base in (row("sjd", window=16, batch_size=1),
                                                 frontier_default(verifier="speculative"),
                                                 frontier_default(window=32, verifier="speculative")))


SIBLINGS_PROBE_COLUMNS = ("window", "step_compression", "vs_base", "first_slot_rejection", "siblings_first_1",
                          "siblings_first_3", "siblings_first_7", "siblings_all_1", "siblings_all_3")
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


def iid_sibling_row(window: int, siblings: int) -> Row:
    """:func:`sibling_row` with its siblings drawn i.i.d. from q (the sampling before the default without
    replacement), paired with that default row: vs base is i.i.d. minus without replacement."""
    return row("mc-sjd", base=sibling_row(window, siblings), label=f"auto (preset), {siblings} siblings, i.i.d.",
               window=window, batch_size=1, jacobi_siblings=siblings, jacobi_sibling_sampling="iid")


def _sibling_sampling_rows() -> tuple[Row, ...]:
    return tuple(iid_sibling_row(window, m) for window in (16, 32) for m in SIBLING_COUNTS[1:])


# -- frontier: what the first draft's siblings are drawn from (jacobi_sibling_law) ---------------------------------
SIBLING_LAW_CELLS = tuple(cell for cell in AUTO_GRID if cell[1])  # every (L, m) the cost model picks siblings at
PREVIOUS_LAW_CELLS = ((16, 7), (64, 15))  # the law alone, at a middle cell and at the best cell before this study


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
        if (window, m) in PREVIOUS_LAW_CELLS:
            rows.append(law_row(window, m, "previous", base=draft))
    return tuple(rows)


# -- frontier: block verification (verifier="block") against token-by-token verification ----------------------------
#: (window, siblings) cells: the CPU preset's, window 32 alone, and the CUDA picks at jacobi_window=16 and for a 7B
#: model (siblings from the preset's mixture law)
BLOCK_CELLS = ((16, 0), (32, 0), (16, 15), (32, 15))


def verification_row(window: int, siblings: int, verifier: str, batch: int = 1, base: Row | None = None) -> Row:
    """mc-sjd preset at (``window``, ``siblings``) with ``verifier`` pinned, so the row keeps its tokens whatever the
    preset's verifier."""
    extra = {"jacobi_siblings": siblings} if siblings else {}
    shown = f", {siblings} siblings" if siblings else ""
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


# -- frontier: drafts after the first sibling (jacobi_sibling_drafts), a branch of the tree forward ------------------
#: (window, siblings) cells: the CPU-measured pick at jacobi_window=16 with 7 siblings and the 7B pick's 32 + 15
#: neighbour; each with 0 (the base), 3 and 7 drafts after the first sibling
SIBLING_DRAFT_CELLS, SIBLING_DRAFTS = ((16, 7), (32, 15)), (3, 7)


def _sibling_draft_rows() -> tuple[Row, ...]:
    rows = [row("ar", batch_size=1)]
    for window, siblings in SIBLING_DRAFT_CELLS:
        base = row("mc-sjd", label=f"auto (preset), {siblings} siblings", window=window, batch_size=1,
                   jacobi_siblings=siblings)
        rows += [base, *(row("mc-sjd", base=base, label=f"auto (preset), {siblings} siblings, {drafts} after the "
                             f"first", window=window, batch_size=1, jacobi_siblings=siblings,
                             jacobi_sibling_drafts=drafts) for drafts in SIBLING_DRAFTS)]
    return tuple(rows)


SIBLINGS_COLUMNS = ("batch_size", "window", "step_compression", "vs_base", "row_tokens_per_forward",
                    "siblings_accepted", "acceptance_rate")
ADAPTIVE_COLUMNS = ("batch_size", "window", "step_compression", "vs_base", "drafts_per_forward",
                    "row_tokens_per_forward", "acceptance_rate")
FRONTIER_SPEED = ("step_compression", "vs_base", "acceptance_rate", "tokens_per_forward")
FRONTIER = Suite(
    "frontier", "The lossless frontier: fresh drafts, Gumbel coupling, window economics",
    "MC-SJD's fresh drafts (`draft_init`) and coupling (`draft_coupling`) at window 16, batch 1; compression "
    "against the window (8-64) for sjd and mc-sjd; batch 8 against batch 1; quality proxies of the preset "
    "against vanilla sampling; and the roofline forward-cost model with the window it picks per model size. "
    "Every row pins its window and batch size, so `--window` / `--batch-size` change none of them. "
    "Confirmation on fresh seeds: the same suite with `--seeds 1000`.",
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
             "noise of ar (compare with the FD-ref floors below). The budget rows run at batch 8 (their rule acts "
             "only when rows finish); d loglik pairs images, whatever their batch."),
     Section("adaptive", "Adaptive window (mc-sjd preset) against fixed windows, batch 1 and 8", _adaptive_rows(),
             ADAPTIVE_COLUMNS,
             "window: the fixed width, or the adaptive rule's upper bound; drafts/forward: the mean width actually "
             "verified; vs base: paired difference to the fixed window at the same upper bound and batch. The "
             "cost model below turns both into a modelled speed-up."),
     Section("adaptive-sweep", "Adaptive window: sweep of a, b, EMA rate of ceil(a * estimate) + b (upper 32)",
             _adaptive_sweep_rows(), ADAPTIVE_COLUMNS,
             "Swept on seed 0 only; the defaults are confirmed with `--sections adaptive --seeds 1000`."),
     Section("budget", "Budget window (mc-sjd preset, batch 8): the rows left share the full batch's tokens",
             _budget_rows(), ADAPTIVE_COLUMNS,
             "A batch runs until its slowest row is done. With `jacobi_window_rule=budget` the full batch verifies "
             "16 drafts per row (8 x 17 input tokens per forward) and, as rows finish, the rows left widen to "
             "share those tokens, up to the bound shown (`jacobi_window_max`): no forward is larger than the full "
             "batch's. vs base: paired difference to the fixed window 16 at batch 8 (with the same siblings); "
             "compare step compression with the batch-1 row of the same knobs (the target: batch 8 >= 85% of "
             "batch 1)."),
     Section("siblings-probe", "Sibling drafts (the tree lead), priced on this loop's own p and q (batch 1)",
             _siblings_rows(), SIBLINGS_PROBE_COLUMNS,
             "Each row runs exact verification unchanged (vs base: the same row without the probe, so 0) and "
             "prices, per (row, forward), the expected extra tokens had a window slot carried m more drafts drawn "
             "i.i.d. from its q, verified by recursive rejection sampling (a tree forward: m more input tokens per "
             "slot). First order: the run after a rescue is taken as it went. The `siblings` section measures it."),
     Section("siblings", "Siblings of the first draft (`jacobi_siblings`), measured", _sibling_rows(),
             SIBLINGS_COLUMNS,
             "m siblings of the first draft ride in each forward (L + 1 + m input tokens per row) and are verified by "
             "recursive rejection sampling where the first draft is rejected; vs base: paired difference to the "
             "preset at the same window and batch. The cost model below charges each forward its L + 1 + m tokens. "
             "The siblings are drawn without replacement (`jacobi_sibling_sampling`, the default)."),
     Section("sibling-sampling", "Siblings drawn i.i.d. against without replacement (batch 1)",
             _sibling_sampling_rows(), SIBLINGS_COLUMNS,
             "Each row draws its siblings i.i.d. from q, as before `jacobi_sibling_sampling` (whose default draws "
             "them without replacement: distinct, never the first draft); vs base: paired difference to the same "
             "row without replacement (the `siblings` section's row), so a negative number is what sampling "
             "without replacement adds."),
     Section("budget-siblings", "Budget window with siblings for the rows left (batch 8)", _budget_sibling_rows(),
             SIBLINGS_COLUMNS,
             "As `budget`, and the tokens of a row's share that its window, capped at 32 drafts, cannot use go to "
             f"siblings of its first draft (`jacobi_budget_siblings={BUDGET_SIBLINGS}`; at batch 8 none while 5 or "
             "more rows are left). No forward is larger than the full batch's. vs base: paired difference to the "
             "budget rule without them; compare step compression with the batch-1 row (the target: batch 8 >= 85% "
             "of batch 1)."),
     Section("auto", "The cells `jacobi_window=\"auto\"` / `jacobi_siblings=\"auto\"` pick from (batch 1)",
             _auto_rows(), SIBLINGS_COLUMNS,
             "Every (window, siblings) cell the cost model chooses among; their mean step compression over seeds "
             "0 / 1000 / 3000 is `hf_sjd.jacobi.cost_model.STEP_COMPRESSION` (the cells with siblings as measured "
             "by the `sibling-law` section's rows with the preset's law: the same tokens). Up to window 32 and "
             "window 64 alone "
             "they are the rows of the `siblings` and `window` sections (same keys, same tokens); the window-64 "
             "sibling cells are this section's own. The auto-cost-model measurement below prints the pick per "
             "model size and forward row count, from the shipped table and from this run."),
     Section("sibling-law", "What the siblings are drawn from (`jacobi_sibling_law`, batch 1)", _sibling_law_rows(),
             SIBLINGS_COLUMNS,
             "At every (window, siblings) cell of the `auto` section: siblings drawn from the first draft's q "
             "(`draft`), from the target at the last committed position (`previous`: computed behind committed "
             "tokens, where q was computed behind the rejected draft) or from their average (`mixture`); vs base: "
             "paired difference to `draft` at the same cell. Every row pins its law."),
     Section("block", "Block verification (`verifier=\"block\"`) against token-by-token verification",
             _block_rows(), ("batch_size", "window", "step_compression", "vs_base", "row_tokens_per_forward",
                             "siblings_accepted", "acceptance_rate", "d_loglik", "fd_ref"),
             "Block verification (Sun et al. 2025) decides how many drafts to keep from the whole window's prefix "
             "weights, where token-by-token verification stops at the first rejected draft; both are exact. vs "
             "base: paired difference to the same cell verified token by token (every row pins its verifier, so "
             "the rows keep their tokens whatever the preset's). d loglik and FD-ref against `ar` (same images)."),
     Section("sibling-drafts", "Drafts after the first sibling (`jacobi_sibling_drafts`, batch 1)",
             _sibling_draft_rows(), ("window", "step_compression", "vs_base", "siblings_accepted", "branch_accepted",
                                     "after_recovered", "after_sibling", "after_branch_rejection", "d_loglik",
                                     "fd_ref"),
             "The first sibling carries the window's next C slots, drawn afresh from their q; where it is the "
             "accepted sibling they are verified behind it (C more input tokens per row). vs base: paired difference "
             "to the same cell without them. The `next after` columns: tokens a row commits in the forward right "
             "after one that ended with a recovered token, after a plain sibling, and after a branch that rejected "
             "a draft."),
     Section("straggler", "Batch 8 against batch 1: what the slowest row costs", _straggler_rows(),
             ("batch_size", "window", "step_compression", "row_tokens_per_forward", "siblings_accepted"),
             "A batch runs until its slowest row is done, so its forwards are the most any of its images needs. "
             "The batch-straggler measurement below predicts each batch-8 row from the batch-1 forwards of the "
             "same images (the most of the eight, batch by batch) and from the spread of those forwards alone."),
     Section("auto-rule", "The auto window rule: the cost model's cell for the rows left (priced as a 7B model on "
             "CUDA)", _auto_rule_rows(),
             ("batch_size", "window", "step_compression", "vs_base", "row_tokens_per_forward", "siblings_accepted",
              "drafts_per_forward"),
             "Rows with the `cuda-7b` probe run on this CPU the cells a 7B model on a GPU would get: the full "
             "batch's pick, then (auto rule) the roofline's pick for the rows still decoding, at least as wide. "
             "The window column is the full batch's. vs base: the auto rule against the fixed rule at batch 8.")),
    defaults={"num_images": 2, "batch_size": 1, "seeds": "0"},
    measurements=("frontier-cost-model", "adaptive-cost-model", "siblings-cost-model", "auto-cost-model",
                  "batch-straggler"),
)

SUITES: dict[str, Suite] = {s.name: s for s in (CORE, VERIFIERS, VP, PV, LIBRARY, FRONTIER)}


def with_methods(suite: Suite, methods: list[str]) -> Suite:
    """``core`` with ``--methods``: its first section lists those methods instead."""
    first = suite.sections[0]
    return Suite(suite.name, suite.title, suite.description,
                 (Section(first.name, first.title, core_rows(methods), first.columns, first.note),
                  *suite.sections[1:]), suite.defaults, suite.measurements, suite.needs_reference)


def suite_rows(sections) -> list[Row]:
    """Every row the sections name (bases included), each once, in first-seen order."""
    seen: dict[str, Row] = {}
    for section in sections:
        for r in section.rows:
            for one in (r.base, r) if r.base is not None else (r,):
                seen.setdefault(one.key, one)
    return list(seen.values())
