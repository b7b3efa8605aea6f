"""The knobs of Jacobi decoding, read from ``generate`` kwargs or ``GenerationConfig`` attributes.

Precedence: explicit ``generate(..., jacobi_window=8)`` kwarg > ``GenerationConfig(jacobi_window=8)``
attribute > the strategy's preset (``STRATEGIES["mc-sjd"]`` sets ``draft_coupling="maximal"``) > the
field default. :class:`SJDConfig` holds the knobs of the loop; each selected component (verifier, draft
prior, and a verifier they nest) brings its own options dataclass (:mod:`hf_sjd.jacobi.options`). Every
value is validated before the first forward.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checks import check_bool, check_choice, check_float, check_int
from . import cost_model
from .cost_model import AUTO
from .drafting import DRAFT_COUPLINGS, DRAFT_INITS, SIBLING_LAWS, SIBLING_SAMPLINGS
from .fresh_drafts import GRID_INITS, resolve_auto
from .options import ABSENT, ComponentOptions, options_class
from .window import DEFAULT_WINDOW_MAX, DEFAULT_WINDOW_MIN, WIDENING_RULES, WINDOW_RULES


def _check_int_or_auto(name: str, value: Any, minimum: int) -> int | str:
    """``value`` as an int >= ``minimum``, or ``"auto"`` (the cost model's pick, made when the model is known)."""
    if isinstance(value, str) and value == AUTO:
        return AUTO
    try:
        return check_int(name, value, minimum=minimum)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{error}; or {AUTO!r} (picked by the cost model, hf_sjd.jacobi.cost_model)") from None


@dataclass
class SJDConfig:
    # L: drafts the first forward verifies: every forward's with the fixed rule, the adaptive rule's upper bound,
    # the budget rule's full-batch width | "auto": the cost model's pick for this model, batch and device
    # (hf_sjd.jacobi.cost_model; what the mc-sjd preset asks for)
    jacobi_window: int | str = 16
    # "fixed": every forward verifies jacobi_window drafts | "adaptive": sized per iteration from what the rows
    # committed in the past iterations | "budget": the full batch's forward size shared by the rows left |
    # "auto": the cost model's window and siblings for the rows left (the mc-sjd preset's; "fixed" where no
    # roofline applies) (hf_sjd.jacobi.window; each reads only the past, so still exact)
    jacobi_window_rule: str = "fixed"
    # adaptive: fewest drafts asked for (None: 4, at most jacobi_window)
    jacobi_window_min: int | None = None
    # budget: the most drafts a row left takes (None: 32, past which widening paid little, docs/results/
    # frontier_auto; at least jacobi_window); auto: the widest cell the rows left may take (None: any measured)
    jacobi_window_max: int | None = None
    # adaptive: width ceil(a * estimate) + b, estimate = EMA of the tokens a row commits per forward. Defaults: the
    # best cell of the frontier suite's adaptive-sweep (seed 0; docs/results/frontier_adaptive).
    jacobi_window_scale: float = 1.0  # a
    jacobi_window_margin: int = 16  # b
    jacobi_window_ema: float = 0.3  # the EMA's rate, in (0, 1]
    # m siblings of the first draft per forward, drawn from its q and verified by recursive rejection sampling
    # where the first draft is rejected (a tree forward; exact speculative verification only; hf_sjd.jacobi.loop)
    # | "auto": picked with the window by the cost model (0 where siblings cannot run: another verifier, a draft
    # prior, an attention without custom masks)
    jacobi_siblings: int | str = 0
    # budget rule: the most siblings of the first draft the rows left take from the tokens a capped window leaves
    # of their share of the full batch's forward (hf_sjd.jacobi.window; at least jacobi_siblings)
    jacobi_budget_siblings: int = 0
    # "without-replacement": the siblings are distinct and never the first draft (a rejected token cannot be
    # accepted again) | "iid": independent draws from q (SIBLING_SAMPLINGS; the frontier suite's sibling-sampling
    # section compares them)
    jacobi_sibling_sampling: str = "without-replacement"
    # what the siblings are drawn from: "draft" (the first draft's q) | "previous" (the target at the last committed
    # position) | "mixture" (their average) (SIBLING_LAWS, Drafter.with_sibling_law; the frontier suite's
    # sibling-law section compares them)
    jacobi_sibling_law: str = "draft"
    # C drafts after the first sibling: it carries the window's next C slots, drawn afresh from their q, and where
    # it is accepted they are verified behind it (a branch of the tree forward; at most jacobi_window - 1, fewer
    # where a forward's window is narrower; 0: an accepted sibling ends the commit)
    jacobi_sibling_drafts: int = 0
    # "random" | "repeat-horizon" | a rule of hf_sjd.jacobi.fresh_drafts | "auto" (the best known rule for the
    # grid the adapter knows, a grid-free one without: what the mc-sjd preset asks for)
    draft_init: str = "random"
    draft_init_weight: float = 0.5  # w of draft_init="row-above-mix": w * delta(token above) + (1 - w) * p_last
    draft_token_ids: Any = None  # ids random drafts are drawn from; None: what the processors allow
    # "maximal" (MC-SJD) | "independent" (SJD). Maximal is the default because it measured +0.6..+1.1 tokens
    # per forward over independent redraft in every setting (README); paper presets pin "independent".
    draft_coupling: str = "maximal"
    grid_width: int | None = None  # token-grid width ("repeat-horizon"); adapters fill it in
    guidance_scale: float | None = None  # batched classifier-free guidance, u + g * (c - u)
    verifier: str = "speculative"  # a key of hf_sjd.VERIFIERS
    draft_prior: str | None = None  # a key of hf_sjd.DRAFT_PRIORS (e.g. the SJD-VP prior), applied when redrafting
    # Keep p and q on their support (hf_sjd.jacobi.distributions) where the processors bound it (a top-k warper;
    # greedy) and the components allow it; False: dense [*, vocab] distributions throughout. Same distribution.
    jacobi_sparse: bool = True
    # Fuse the tensor step between the forward and the commit's device read with torch.compile (inductor, dynamic
    # shapes; hf_sjd.jacobi.compiled): fewer kernel launches per iteration, the same tokens. Compiles on first use.
    jacobi_compile: bool = False
    # The selected components' own knobs (hf_sjd.jacobi.options): one options dataclass per component.
    verifier_options: ComponentOptions = field(default_factory=ComponentOptions)
    prior_options: ComponentOptions | None = None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)} - {"verifier_options", "prior_options"}

    @classmethod
    def resolve(cls, preset: dict, generation_config: Any, kwargs: dict) -> "SJDConfig":
        """Pop this call's knobs (these fields, and the selected components' options) out of ``kwargs`` (in place)
        and merge them with the sources above. Knobs of components that are not selected stay in ``kwargs``,
        where transformers refuses them as unused."""
        from .registry import DRAFT_PRIORS, VERIFIERS

        read: set[str] = set()

        def lookup(name: str):
            read.add(name)
            if name in kwargs:
                return kwargs[name]
            value = getattr(generation_config, name, None)
            if value is None:
                value = preset.get(name)
            return ABSENT if value is None else value

        # For these fields None means "the default" (transformers' convention for generate kwargs).
        config = cls(**{name: value for name in cls.field_names() if (value := lookup(name)) not in (ABSENT, None)})
        config.check_registered()
        config.verifier_options = options_class(VERIFIERS[config.verifier]).resolve(lookup)
        if config.draft_prior is not None:
            config.prior_options = options_class(DRAFT_PRIORS[config.draft_prior]).resolve(lookup)
        for name in read:
            kwargs.pop(name, None)
        config.validate()
        return config

    def components(self) -> list[tuple[str, ComponentOptions]]:
        """(role, options) of every selected component, nested ones (phrase verification's base) included."""
        found = [("verifier", self.verifier_options)]
        if self.prior_options is not None:
            found.append(("draft_prior", self.prior_options))
        for _, options in list(found):
            found.extend(options.nested())
        return found

    def knob_names(self) -> set[str]:
        """Every knob this configuration reads: its fields and its components' options."""
        return self.field_names() | {knob for _, options in self.components() for knob in options.knob_names()}

    def validate(self) -> None:
        """Check every knob's type, finiteness and range (numpy scalars are accepted and converted)."""
        self.jacobi_window = _check_int_or_auto("jacobi_window", self.jacobi_window, minimum=1)
        self._validate_window_rule()
        self.jacobi_siblings = _check_int_or_auto("jacobi_siblings", self.jacobi_siblings, minimum=0)
        self.jacobi_budget_siblings = check_int("jacobi_budget_siblings", self.jacobi_budget_siblings, minimum=0)
        if self.jacobi_budget_siblings and self.jacobi_window_rule != "budget":
            raise ValueError(f"jacobi_budget_siblings={self.jacobi_budget_siblings} gives siblings to the rows left "
                             f"by the budget rule: set jacobi_window_rule='budget' (got "
                             f"{self.jacobi_window_rule!r}), or jacobi_budget_siblings=0")
        check_choice("jacobi_sibling_sampling", self.jacobi_sibling_sampling, SIBLING_SAMPLINGS)
        self._validate_sibling_drafts()
        check_choice("jacobi_sibling_law", self.jacobi_sibling_law, SIBLING_LAWS)
        check_choice("draft_init", self.draft_init, DRAFT_INITS)
        self.draft_init = resolve_auto(self.draft_init, self.grid_width)  # "auto": by whether the grid is known
        check_choice("draft_coupling", self.draft_coupling, DRAFT_COUPLINGS)
        self.grid_width = check_int("grid_width", self.grid_width, minimum=1, allow_none=True)
        self.draft_init_weight = check_float("draft_init_weight", self.draft_init_weight, minimum=0.0, maximum=1.0)
        if self.draft_init in ("repeat-horizon", *GRID_INITS) and not self.grid_width:
            raise ValueError(f"draft_init={self.draft_init!r} needs the token-grid width: pass grid_width=... "
                             "(or use a model whose adapter knows its grid)")
        self.jacobi_sparse = check_bool("jacobi_sparse", self.jacobi_sparse)
        self.jacobi_compile = check_bool("jacobi_compile", self.jacobi_compile)
        self.guidance_scale = check_float("guidance_scale", self.guidance_scale, minimum=0.0, allow_none=True)
        self.check_registered()

    def _validate_sibling_drafts(self) -> None:
        """``jacobi_sibling_drafts`` follow the first sibling, so some forward must carry one, and they are the
        window's next slots, so fewer than the first forward's drafts."""
        drafts = self.jacobi_sibling_drafts = check_int("jacobi_sibling_drafts", self.jacobi_sibling_drafts,
                                                        minimum=0)
        if drafts and self.jacobi_siblings == 0 and not self.jacobi_budget_siblings:
            raise ValueError(f"jacobi_sibling_drafts={drafts} follow the first sibling of the first draft, and no "
                             f"forward carries one: set jacobi_siblings >= 1 (or {AUTO!r}), or "
                             f"jacobi_sibling_drafts=0")
        if drafts and self.jacobi_window != AUTO and drafts >= self.jacobi_window:
            raise ValueError(f"jacobi_sibling_drafts must be < jacobi_window (they are the window's slots 2 .. "
                             f"C + 1), got jacobi_sibling_drafts={drafts} >= jacobi_window={self.jacobi_window}")

    def _validate_window_rule(self) -> None:
        """The window rule's knobs. Each bound belongs to the rules that widen or narrow (``jacobi_window_min`` to
        ``"adaptive"``, ``jacobi_window_max`` to ``"budget"`` and ``"auto"``) and must lie on its side of
        ``jacobi_window``; the defaults (None) are the rule's (:data:`DEFAULT_WINDOW_MIN`,
        :data:`DEFAULT_WINDOW_MAX`; the auto rule's widest measured cell), moved to ``jacobi_window`` where they
        would cross it."""
        rule = check_choice("jacobi_window_rule", self.jacobi_window_rule, WINDOW_RULES)
        self.jacobi_window_min = check_int("jacobi_window_min", self.jacobi_window_min, minimum=1, allow_none=True)
        self.jacobi_window_max = check_int("jacobi_window_max", self.jacobi_window_max, minimum=1, allow_none=True)
        for name, owners in (("jacobi_window_min", ("adaptive",)), ("jacobi_window_max", WIDENING_RULES)):
            if getattr(self, name) is not None and rule not in owners:
                allowed = " or ".join(map(repr, owners))
                raise ValueError(f"{name}={getattr(self, name)} bounds the {allowed} window rule only (got "
                                 f"jacobi_window_rule={rule!r}): set jacobi_window_rule={owners[0]!r} or leave {name} "
                                 f"unset. The budget rule's full batch verifies jacobi_window drafts and the rows "
                                 f"left widen up to jacobi_window_max; the adaptive rule narrows from jacobi_window "
                                 f"down to jacobi_window_min")
        window = self.jacobi_window
        if self.jacobi_window_min is not None and window != AUTO and self.jacobi_window_min > window:
            raise ValueError(f"jacobi_window_min must be <= jacobi_window (the upper bound of drafts per forward), "
                             f"got jacobi_window_min={self.jacobi_window_min} > jacobi_window={window}")
        if self.jacobi_window_max is not None and window != AUTO and self.jacobi_window_max < window:
            raise ValueError(f"jacobi_window_max must be >= jacobi_window (the full batch's drafts per row), got "
                             f"jacobi_window_max={self.jacobi_window_max} < jacobi_window={window}")
        self.jacobi_window_scale = check_float("jacobi_window_scale", self.jacobi_window_scale, minimum=0.0,
                                               low_open=True)
        self.jacobi_window_margin = check_int("jacobi_window_margin", self.jacobi_window_margin, minimum=0)
        self.jacobi_window_ema = check_float("jacobi_window_ema", self.jacobi_window_ema, minimum=0.0, maximum=1.0,
                                             low_open=True)

    @property
    def guided(self) -> bool:
        """Whether classifier-free guidance runs (it doubles the forward's rows)."""
        return self.guidance_scale is not None and self.guidance_scale != 1

    def resolved(self, model: torch.nn.Module, batch: int, context: int, siblings_allowed: bool
                 ) -> tuple["SJDConfig", tuple[tuple[int, int], ...] | None]:
        """This config with ``"auto"`` window and siblings replaced by the cost model's pick for ``model`` with
        ``batch`` images (x 2 forward rows with guidance) over ``context`` cached tokens
        (:func:`hf_sjd.jacobi.cost_model.resolve`), and the auto window rule's cells per number of rows left
        (:func:`hf_sjd.jacobi.cost_model.plan`; None for the other rules). An auto rule whose cells are all the
        same (no roofline: a CPU; one row; nothing to re-pick) becomes the fixed rule it then is."""
        rows_per_image, cells = (2 if self.guided else 1), None
        if self.jacobi_window_rule == "auto":
            cells = cost_model.plan(self.jacobi_window, self.jacobi_siblings, model, batch, rows_per_image, context,
                                    siblings_allowed, widest=self.jacobi_window_max)
            window, siblings = cells[-1]
        else:
            window, siblings = cost_model.resolve(self.jacobi_window, self.jacobi_siblings, model,
                                                  batch * rows_per_image, context, siblings_allowed)
        config = dataclasses.replace(self, jacobi_window=window, jacobi_siblings=siblings)
        config._validate_window_rule()  # an explicit jacobi_window_min / _max against the picked window
        if cells is None:
            return config, None
        if len(set(cells)) == 1:
            return dataclasses.replace(config, jacobi_window_rule="fixed", jacobi_window_max=None), None
        return dataclasses.replace(config, jacobi_window_max=max(L for L, _ in cells)), cells

    def window_min(self) -> int:
        """The fewest drafts a forward verifies (before the shrink near ``max_new_tokens``): the adaptive rule's
        ``jacobi_window_min`` (or its default) never above ``jacobi_window``; ``jacobi_window`` for the others."""
        if self.jacobi_window_rule != "adaptive":
            return self.jacobi_window
        lower = DEFAULT_WINDOW_MIN if self.jacobi_window_min is None else self.jacobi_window_min
        return min(lower, self.jacobi_window)

    def window_max(self) -> int:
        """The most drafts a forward verifies, what the loop's per-slot buffers are sized by: the budget rule's
        ``jacobi_window_max`` (or its default) never below ``jacobi_window``; the resolved auto rule's widest cell
        (:meth:`resolved` sets it); ``jacobi_window`` for the others."""
        if self.jacobi_window_rule == "auto":
            return max(self.jacobi_window_max or 0, self.jacobi_window)
        if self.jacobi_window_rule != "budget":
            return self.jacobi_window
        upper = DEFAULT_WINDOW_MAX if self.jacobi_window_max is None else self.jacobi_window_max
        return max(upper, self.jacobi_window)

    def clamped_to(self, max_new_tokens: int) -> "SJDConfig":
        """This config with every window bound at most ``max_new_tokens - 1`` (what a window can use: the last
        new token is always a recovered or bonus token), so nothing is sized by an unusable request."""
        usable = max(1, max_new_tokens - 1)
        window = min(self.jacobi_window, usable)
        lower = None if self.jacobi_window_min is None else min(self.jacobi_window_min, window)
        upper = None if self.jacobi_window_rule not in WIDENING_RULES else min(self.window_max(), usable)
        return dataclasses.replace(self, jacobi_window=window, jacobi_window_min=lower, jacobi_window_max=upper)

    def check_registered(self) -> None:
        from .registry import DRAFT_PRIORS, VERIFIERS

        check_choice("verifier", self.verifier, tuple(VERIFIERS))
        if self.draft_prior is not None:
            check_choice("draft_prior", self.draft_prior, tuple(DRAFT_PRIORS))

    def draft_ids_tensor(self, vocab_size: int, device: torch.device) -> torch.Tensor | None:
        """Validated ``draft_token_ids`` as a 1D long tensor (``None`` if not given)."""
        if self.draft_token_ids is None:
            return None
        try:
            ids = torch.as_tensor(self.draft_token_ids, device=device)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"draft_token_ids must be a sequence or tensor of integer token ids, got "
                            f"{type(self.draft_token_ids).__name__}: {error}") from None
        if ids.numel() == 0:
            raise ValueError("draft_token_ids is empty: give at least one token id to draft from")
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise TypeError(f"draft_token_ids must hold integer token ids, got dtype {ids.dtype}")
        ids = ids.long().flatten()
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"draft_token_ids must lie in [0, {vocab_size}) (the model's vocabulary); got "
                             f"range [{int(ids.min())}, {int(ids.max())}]")
        return ids.unique()


# Name prefixes of hf_sjd knobs: an unknown GenerationConfig attribute with one of them is a misspelt knob.
KNOB_PREFIXES = ("jacobi_", "draft_", "vp_", "pv_", "phrase_", "lantern_", "gsd_", "sjd_")


def known_knobs() -> set[str]:
    """Every knob any strategy or registered component reads (``SJDConfig`` fields and component options)."""
    from .registry import DRAFT_PRIORS, VERIFIERS

    components = (*VERIFIERS.values(), *DRAFT_PRIORS.values())
    return (SJDConfig.field_names() | {knob for c in components for knob in options_class(c).knob_names()}
            | {"sjd_method"})


def check_generation_config_knobs(generation_config: Any) -> None:
    """Refuse ``GenerationConfig`` attributes that look like hf_sjd knobs but are not (``jacobi_windw``).

    transformers keeps unknown attributes silently, so a misspelt knob would otherwise be ignored. Other
    unknown attributes (a user's own, another library's) are left alone."""
    from transformers import GenerationConfig

    known = known_knobs()
    standard = set(vars(GenerationConfig()))
    for name in sorted(set(vars(generation_config)) - standard - known):
        if name.startswith("_"):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.8)
        if close or name.startswith(KNOB_PREFIXES):
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise ValueError(f"GenerationConfig attribute {name!r} is not an hf_sjd knob; {hint}known knobs: "
                             f"{', '.join(sorted(known))}")
