"""The knobs of Jacobi decoding, resolved once per ``generate`` call into a frozen :class:`SJDConfig`.

Precedence: a ``generate`` kwarg > a ``GenerationConfig`` attribute > the strategy's preset > the field default.
:meth:`SJDConfig.resolve` reads and validates the fields and the selected components' options
(:mod:`hf_sjd.jacobi.options`) before the first forward; :meth:`SJDConfig.for_call` fixes what needs the model and
the batch (``"auto"``, the plan as rows finish).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig

from ..checks import check_bool, check_choice, check_float, check_int
from . import cost_model
from .cost_model import AUTO
from .drafting import DRAFT_COUPLINGS, DRAFT_INITS, GRID_INITS, KEEPS_DRAFTS, SIBLING_LAWS, resolve_auto_init
from .options import ABSENT, ComponentOptions
from .registry import DRAFT_PRIORS, VERIFIERS, knob_names, resolve_options

# Name prefixes of hf_sjd knobs: an unknown GenerationConfig attribute with one of them is a misspelt knob.
KNOB_PREFIXES = ("jacobi_", "draft_", "vp_", "pv_", "phrase_", "lantern_", "gsd_", "sjd_")


def _or_auto(check, name: str, value: Any, meaning: str, **limits: Any) -> Any:
    """``check(name, value, **limits)``'s value, or ``"auto"`` (``meaning``, decided when the call is known); a
    refused value's message names ``"auto"`` too."""
    if isinstance(value, str) and value == AUTO:
        return AUTO
    try:
        return check(name, value, **limits)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{error}; or {AUTO!r} ({meaning})") from None


@dataclass(frozen=True)
class SJDConfig:
    # L, drafts per forward (0: plain decoding) | "auto": the cell of highest modelled speed-up for this model, batch
    # and device, picked again as rows finish (hf_sjd.jacobi.cost_model)
    jacobi_window: int | str = AUTO
    # m siblings of the first draft per forward (exact verifiers only) | "auto": picked with the window
    jacobi_siblings: int | str = 0
    # the rest: hf_sjd.jacobi.drafting's table
    jacobi_sibling_law: str = "draft"
    draft_init: str = "random"
    draft_coupling: str = "maximal"
    draft_token_ids: Any = None  # ids random drafts are drawn from; None: the adapter's, else what processors allow
    grid_width: int | None = None  # token-grid width (grid drafting rules); adapters fill it in
    guidance_scale: float | None = None  # batched classifier-free guidance, u + g * (c - u)
    verifier: str = "speculative"  # a key of hf_sjd.VERIFIERS
    draft_prior: str | None = None  # a key of hf_sjd.DRAFT_PRIORS (the SJD-VP prior), applied when redrafting
    # p and q on their support where the processors bound it (the same distributions) | "auto": where that support is
    # at most 1/SPARSE_MIN_RATIO of the vocabulary (hf_sjd.jacobi.loop)
    jacobi_sparse: bool | str = AUTO
    jacobi_compile: bool = False  # fuse the loop's tensor steps with torch.compile (hf_sjd.jacobi.loop)
    verifier_options: ComponentOptions = field(default_factory=ComponentOptions)
    prior_options: ComponentOptions | None = None
    # set by for_call: (drafts, siblings) per row of a forward with 1, 2, ... rows still decoding
    plan: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        """Check every knob's type, finiteness and range; store canonical values (numpy scalars become ints)."""
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        picked = "picked by the cost model, hf_sjd.jacobi.cost_model"
        put("jacobi_window", _or_auto(check_int, "jacobi_window", self.jacobi_window, picked, minimum=0))
        put("jacobi_siblings", _or_auto(check_int, "jacobi_siblings", self.jacobi_siblings, picked, minimum=0))
        check_choice("jacobi_sibling_law", self.jacobi_sibling_law, SIBLING_LAWS)
        check_choice("draft_coupling", self.draft_coupling, DRAFT_COUPLINGS)
        put("grid_width", check_int("grid_width", self.grid_width, minimum=1, allow_none=True))
        check_choice("draft_init", self.draft_init, DRAFT_INITS)
        put("draft_init", resolve_auto_init(self.draft_init, self.grid_width))
        if self.draft_init in GRID_INITS and not self.grid_width:
            raise ValueError(f"draft_init={self.draft_init!r} needs the token-grid width: pass grid_width=... "
                             "(or use a model whose adapter knows its grid)")
        put("jacobi_sparse", _or_auto(check_bool, "jacobi_sparse", self.jacobi_sparse,
                                      "sparse where the support is at most 1/16 of the vocabulary"))
        put("jacobi_compile", check_bool("jacobi_compile", self.jacobi_compile))
        put("guidance_scale", check_float("guidance_scale", self.guidance_scale, minimum=0.0, allow_none=True))
        check_choice("verifier", self.verifier, tuple(VERIFIERS))
        if VERIFIERS[self.verifier].reads_past_rejection and self.draft_coupling in KEEPS_DRAFTS:
            raise ValueError(
                f"draft_coupling={self.draft_coupling!r} keeps a slot's previous draft, which is exact only if that "
                f"draft still follows its q given what was committed; verifier={self.verifier!r} decides from every "
                f"draft of the window, so the drafts after the first rejection are biased by the decision. Use "
                f"draft_coupling='independent' with verifier={self.verifier!r}, or verifier='speculative'")
        check_choice("draft_prior", self.draft_prior, tuple(DRAFT_PRIORS), allow_none=True)

    @classmethod
    def field_names(cls) -> set[str]:
        """The loop's knobs (the fields a user sets)."""
        return {f.name for f in dataclasses.fields(cls)} - {"verifier_options", "prior_options", "plan"}

    @classmethod
    def resolve(cls, preset: dict, generation_config: Any, kwargs: dict) -> "SJDConfig":
        """Pop this call's knobs out of ``kwargs`` (unselected components' stay: transformers refuses them)."""
        read: set[str] = set()

        def lookup(name: str):
            read.add(name)
            if name in kwargs:
                return kwargs[name]
            value = getattr(generation_config, name, None)
            value = preset.get(name) if value is None else value
            return ABSENT if value is None else value

        # For these fields None means "the default" (transformers' convention for generate kwargs).
        config = cls(**{name: value for name in cls.field_names()
                         if (value := lookup(name)) is not ABSENT and value is not None})  # (an array has no ==)
        config = dataclasses.replace(
            config, verifier_options=resolve_options(VERIFIERS[config.verifier], lookup),
            prior_options=None if config.draft_prior is None else resolve_options(DRAFT_PRIORS[config.draft_prior],
                                                                                  lookup))
        growth = getattr(config.prior_options, "growth_steps", None)  # (the SJD-VP prior's N)
        if growth is not None and isinstance(config.jacobi_window, int) and 0 < config.jacobi_window <= growth:
            raise ValueError(f"vp_growth_steps={growth} needs jacobi_window > {growth}, got {config.jacobi_window}: a "
                             f"position is verified in at most jacobi_window forwards, so {growth} increases in a row "
                             f"are never seen and the prior would change nothing; lower vp_growth_steps or widen the "
                             f"window")
        for name in read:
            kwargs.pop(name, None)
        return config

    def for_call(self, model: torch.nn.Module, batch: int, prompt_length: int, max_new_tokens: int,
                 siblings_allowed: bool, cost=None, table=cost_model.STEP_COMPRESSION) -> "SJDConfig":
        """This config for one call, with its plan (:func:`~hf_sjd.jacobi.cost_model.plan`), windows capped."""
        rows_per_image = 2 if self.guided else 1
        cells = cost_model.plan(self.jacobi_window, self.jacobi_siblings, model, batch, rows_per_image,
                                context=prompt_length + max_new_tokens // 2, siblings_allowed=siblings_allowed,
                                cost=cost, table=table)
        usable = max(1, max_new_tokens - 1)
        # siblings are of the first draft: a cell without drafts has none (window 0 is plain decoding)
        cells = tuple((min(window, usable), siblings if window else 0) for window, siblings in cells)
        return dataclasses.replace(self, jacobi_window=cells[-1][0], jacobi_siblings=cells[-1][1], plan=cells)

    @property
    def widest(self) -> int:
        """The most drafts a forward of this call verifies: what per-slot buffers are sized by."""
        return max(window for window, _ in self.plan) if self.plan else self.jacobi_window

    @property
    def rows(self) -> int | None:
        """The rows this call decodes (its plan has a cell per count of rows still decoding); ``None`` before."""
        return len(self.plan) if self.plan else None

    @property
    def guided(self) -> bool:
        """Whether classifier-free guidance runs (it doubles the forward's rows)."""
        return self.guidance_scale is not None and self.guidance_scale != 1

    def components(self) -> list[ComponentOptions]:
        """The options of every selected component, nested ones (phrase verification's base) included."""
        found = [self.verifier_options, *([self.prior_options] if self.prior_options is not None else [])]
        for options in list(found):
            found.extend(options.nested())
        return found

    def knob_names(self) -> set[str]:
        """Every knob this configuration reads: its fields and its components' options."""
        return self.field_names() | {knob for options in self.components() for knob in options.knob_names()}

    def draft_ids_tensor(self, vocab_size: int, device: torch.device, keyed: str | None = None
                         ) -> torch.Tensor | None:
        """Validated ``draft_token_ids`` as a 1D long tensor of distinct ids (``None`` if not given); in the caller's
        order where ``keyed`` (what is matched to them by position) names a use, which refuses repeated ids."""
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
        if keyed is None:
            return ids.unique()
        if ids.unique().numel() != ids.numel():
            raise ValueError(f"draft_token_ids has repeated ids, so {keyed} cannot be matched to them")
        return ids


def known_knobs() -> set[str]:
    """Every knob any strategy or registered component reads (``SJDConfig`` fields and component options)."""
    return SJDConfig.field_names() | knob_names() | {"sjd_method"}


def check_generation_config_knobs(generation_config: Any) -> None:
    """Refuse ``GenerationConfig`` attributes that look like misspelt knobs (transformers keeps them silently)."""
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
