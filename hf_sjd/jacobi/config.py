"""The knobs of Jacobi decoding, read from ``generate`` kwargs or ``GenerationConfig`` attributes.

Precedence: explicit ``generate(..., jacobi_window=8)`` kwarg > ``GenerationConfig(jacobi_window=8)``
attribute > the strategy's preset (``STRATEGIES["mc-sjd"]`` sets ``draft_coupling="maximal"``) > the
field default. Every value is validated before the first forward.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checks import check_choice, check_float, check_int
from .drafting import DRAFT_COUPLINGS, DRAFT_INITS


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    check_choice(name, value, allowed)


@dataclass
class SJDConfig:
    jacobi_window: int = 16  # L: drafts verified per forward
    draft_init: str = "random"  # "random" | "repeat-horizon"
    draft_token_ids: Any = None  # ids random drafts are drawn from; None: what the processors allow
    # "maximal" (MC-SJD) | "independent" (SJD). Maximal is the default because it measured +0.6..+1.1 tokens
    # per forward over independent redraft in every setting (README); paper presets pin "independent".
    draft_coupling: str = "maximal"
    grid_width: int | None = None  # token-grid width ("repeat-horizon"); adapters fill it in
    guidance_scale: float | None = None  # batched classifier-free guidance, u + g * (c - u)
    verifier: str = "speculative"  # a key of hf_sjd.VERIFIERS
    draft_prior: str | None = None  # a key of hf_sjd.DRAFT_PRIORS (e.g. the SJD-VP prior), applied when redrafting
    extra: dict = field(default_factory=dict)  # strategy-specific knobs (verifier / prior arguments)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)} - {"extra"}

    @classmethod
    def resolve(cls, preset: dict, generation_config: Any, kwargs: dict, extra_knobs: tuple[str, ...] = ()
                ) -> "SJDConfig":
        """Pop this config's knobs out of ``kwargs`` (in place) and merge with the sources above."""
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}

        def take(names) -> None:
            for name in names:
                value = preset.get(name, None)
                config_value = getattr(generation_config, name, None)
                if config_value is not None:
                    value = config_value
                explicit_none = name in kwargs and kwargs[name] is None
                if name in kwargs:
                    value = kwargs.pop(name)
                if value is not None:
                    (values if name in cls.field_names() else extra)[name] = value
                elif explicit_none and name not in cls.field_names():
                    extra[name] = None  # e.g. vp_max_gain=None: "no bound", not "use the default"

        take((*cls.field_names(), *extra_knobs))
        config = cls(**values, extra=extra)
        config.check_registered()
        # Components compose with any strategy: ``custom_generate="mc-sjd", draft_prior=..., vp_strength=...``
        # works because the chosen verifier and prior declare the knobs they read.
        take(config.component_knobs())
        config.extra = extra
        config.validate()
        return config

    def component_knobs(self) -> tuple[str, ...]:
        """Knobs read by the selected verifier and draft prior (their class attribute ``knobs``)."""
        from .registry import DRAFT_PRIORS, VERIFIERS

        components = [VERIFIERS[self.verifier], DRAFT_PRIORS.get(self.draft_prior)]
        return tuple(knob for c in components if c is not None for knob in getattr(c, "knobs", ()))

    def validate(self) -> None:
        """Check every knob's type, finiteness and range (numpy scalars are accepted and converted)."""
        self.jacobi_window = check_int("jacobi_window", self.jacobi_window, minimum=1)
        _choice("draft_init", self.draft_init, DRAFT_INITS)
        _choice("draft_coupling", self.draft_coupling, DRAFT_COUPLINGS)
        self.grid_width = check_int("grid_width", self.grid_width, minimum=1, allow_none=True)
        if self.draft_init == "repeat-horizon" and not self.grid_width:
            raise ValueError("draft_init='repeat-horizon' needs the token-grid width: pass grid_width=... "
                             "(or use a model whose adapter knows its grid)")
        self.guidance_scale = check_float("guidance_scale", self.guidance_scale, minimum=0.0, allow_none=True)
        self.check_registered()

    def clamped_to(self, max_new_tokens: int) -> "SJDConfig":
        """This config with ``jacobi_window`` at most ``max_new_tokens - 1`` (what a window can use: the last
        new token is always a recovered or bonus token), so nothing is sized by an unusable request."""
        return dataclasses.replace(self, jacobi_window=max(1, min(self.jacobi_window, max_new_tokens - 1)))

    def check_registered(self) -> None:
        from .registry import DRAFT_PRIORS, VERIFIERS

        _choice("verifier", self.verifier, tuple(VERIFIERS))
        if self.draft_prior is not None:
            _choice("draft_prior", self.draft_prior, tuple(DRAFT_PRIORS))

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
    """Every knob a strategy or a registered component reads (``SJDConfig`` fields and component knobs)."""
    from .registry import DRAFT_PRIORS, STRATEGIES, VERIFIERS

    components = (*VERIFIERS.values(), *DRAFT_PRIORS.values())
    return (SJDConfig.field_names() | {knob for s in STRATEGIES.values() for knob in s.knobs}
            | {knob for c in components for knob in getattr(c, "knobs", ())} | {"sjd_method"})


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
