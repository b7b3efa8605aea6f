"""Every registry of hf_sjd (verifiers, draft priors, named strategies), and the two steps a selected component
goes through: :func:`resolve_options`, then :func:`build_component`.

Components do not import this module: one that uses another (phrase verification's base verifier) names it in its
options (``ComponentOptions.SELECTS``) and receives it built. Adding a verifier or prior is one class plus one line
below; a strategy is one :func:`register_strategy` call. Users may extend the dicts (``hf_sjd.VERIFIERS["x"] = X``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checks import check_choice
from .options import ComponentOptions, options_class
from .priors import VerificationPredictionPrior
from .verify import BlockVerifier, GSDVerifier, LanternVerifier, PhraseVerifier, SpeculativeVerifier, Verifier

# name -> verifier class (``from_config(config, adapter, draft_token_ids, options)`` if it has one, else ``cls()``)
VERIFIERS: dict[str, type[Verifier]] = {
    "speculative": SpeculativeVerifier,
    "block": BlockVerifier,
    "lantern": LanternVerifier,
    "gsd": GSDVerifier,
    "phrase": PhraseVerifier,
}

# name -> ``LogitsProcessor`` class with ``from_config`` (a draft prior: see ``Drafter``)
DRAFT_PRIORS: dict[str, type] = {"verification-prediction": VerificationPredictionPrior}


def per_token_verifiers() -> dict[str, type[Verifier]]:
    """The verifiers that decide draft by draft (``acceptance_probs``): what phrase verification may build on."""
    return {name: verifier for name, verifier in VERIFIERS.items()
            if verifier.acceptance_probs is not Verifier.acceptance_probs}


def resolve_options(component, lookup: Callable[[str], Any]) -> ComponentOptions:
    """``component``'s options from ``lookup(knob)``, validated, with those of the verifiers it ``SELECTS``."""
    options = options_class(component).resolve(lookup)
    for selector, nested in options.SELECTS.items():
        allowed, name = per_token_verifiers(), getattr(options, selector)
        if isinstance(name, str) and name in VERIFIERS and name not in allowed:
            raise ValueError(f"{options.knob_of(selector)}={name!r} decides the window as a whole (it implements only "
                             f"__call__), but this needs a per-token verifier with acceptance_probs; allowed values: "
                             f"{', '.join(map(repr, allowed))}")
        check_choice(options.knob_of(selector), name, tuple(allowed))
        setattr(options, nested, resolve_options(allowed[name], lookup))
    return options


def build_component(registry: dict, name: str, config, adapter, draft_ids: torch.Tensor,
                    options: ComponentOptions):
    """``registry[name]`` built by ``from_config(config, adapter, draft_ids, options, **selected)`` (or ``cls()``)."""
    component = registry[name]
    if not hasattr(component, "from_config"):
        return component()
    selected = {selector: build_component(VERIFIERS, getattr(options, selector), config, adapter, draft_ids,
                                          getattr(options, nested))
                for selector, nested in options.SELECTS.items()}
    return component.from_config(config, adapter, draft_ids, options, **selected)


def knob_names() -> set[str]:
    """Every knob a registered component reads (the loop's own are ``SJDConfig``'s fields)."""
    return {knob for component in (*VERIFIERS.values(), *DRAFT_PRIORS.values())
            for knob in options_class(component).knob_names()}


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    preset: dict = field(default_factory=dict)  # knob values: SJDConfig fields and component options


STRATEGIES: dict[str, Strategy] = {}


def register_strategy(name: str, description: str, **preset) -> Strategy:
    STRATEGIES[name] = strategy = Strategy(name, description, preset)
    return strategy


# One name per paper; every other combination is one knob away (custom_generate="lantern", draft_coupling="maximal").
register_strategy("sjd", "Speculative Jacobi decoding (Teng et al. 2024): exact verification, independent redraft; "
                  "lossless", verifier="speculative", draft_coupling="independent")
register_strategy("mc-sjd", "MC-SJD (So et al. 2025): maximally coupled redrafting, fresh drafts from the "
                  "distribution one grid row up (no grid: the last target), window and siblings of the first draft "
                  "picked by the forward cost model; lossless",
                  verifier="speculative", draft_coupling="maximal", draft_init="auto", jacobi_window="auto",
                  jacobi_siblings="auto", jacobi_sibling_law="mixture")
register_strategy("sjd-vp", "SJD with the verification-prediction draft prior (SJD-VP, arXiv 2603.27115); lossless "
                  "with vp_verify='lossless' (the default)", verifier="speculative", draft_coupling="independent",
                  draft_prior="verification-prediction")
register_strategy("sjd-pv", "SJD with phrase verification (SJD-PV, Yu et al. 2026): drafted runs that match a "
                  "library phrase are verified jointly; lossy", verifier="phrase", draft_coupling="independent")
register_strategy("lantern", "LANTERN relaxed verification (Jang et al. 2024): drafts borrow the target mass of "
                  "their latent-space neighbours; lossy", verifier="lantern", draft_coupling="independent")
register_strategy("gsd", "Grouped speculative decoding (So et al. 2025): a draft is accepted as a member of a group "
                  "of close-in-rank, -probability and -embedding tokens; lossy", verifier="gsd",
                  draft_coupling="independent")
