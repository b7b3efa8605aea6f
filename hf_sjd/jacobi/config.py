"""The knobs of Jacobi decoding, read from ``generate`` kwargs or ``GenerationConfig`` attributes.

Precedence: explicit ``generate(..., jacobi_window=8)`` kwarg > ``GenerationConfig(jacobi_window=8)``
attribute > the strategy's preset (``STRATEGIES["mc-sjd"]`` sets ``draft_coupling="maximal"``) > the
field default. Every value is validated before the first forward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from .drafting import DRAFT_COUPLINGS, DRAFT_INITS


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed values: {', '.join(map(repr, allowed))}")


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
        from .drafting import DRAFT_PRIORS
        from .verifiers import VERIFIERS

        components = [VERIFIERS[self.verifier], DRAFT_PRIORS.get(self.draft_prior)]
        return tuple(knob for c in components if c is not None for knob in getattr(c, "knobs", ()))

    def validate(self) -> None:
        if not isinstance(self.jacobi_window, int) or self.jacobi_window < 1:
            raise ValueError(f"jacobi_window must be an integer >= 1, got {self.jacobi_window!r}")
        _choice("draft_init", self.draft_init, DRAFT_INITS)
        _choice("draft_coupling", self.draft_coupling, DRAFT_COUPLINGS)
        if self.draft_init == "repeat-horizon" and not self.grid_width:
            raise ValueError("draft_init='repeat-horizon' needs the token-grid width: pass grid_width=... "
                             "(or use a model whose adapter knows its grid)")
        self.check_registered()
        if self.grid_width is not None and (not isinstance(self.grid_width, int) or self.grid_width < 1):
            raise ValueError(f"grid_width must be a positive integer, got {self.grid_width!r}")

    def check_registered(self) -> None:
        from .drafting import DRAFT_PRIORS
        from .verifiers import VERIFIERS

        _choice("verifier", self.verifier, tuple(VERIFIERS))
        if self.draft_prior is not None:
            _choice("draft_prior", self.draft_prior, tuple(DRAFT_PRIORS))

    def draft_ids_tensor(self, vocab_size: int, device: torch.device) -> torch.Tensor | None:
        """Validated ``draft_token_ids`` as a 1D long tensor (``None`` if not given)."""
        if self.draft_token_ids is None:
            return None
        ids = torch.as_tensor(self.draft_token_ids, device=device).long().flatten()
        if ids.numel() == 0:
            raise ValueError("draft_token_ids is empty: give at least one token id to draft from")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"draft_token_ids must lie in [0, {vocab_size}) (the model's vocabulary); got "
                             f"range [{int(ids.min())}, {int(ids.max())}]")
        return ids.unique()
