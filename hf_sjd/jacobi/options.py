"""Component options: one dataclass per verifier or draft prior, one field per knob.

A component (a class in :data:`~hf_sjd.jacobi.registry.VERIFIERS` or ``DRAFT_PRIORS``) names its options in
``options_class``. A field's knob is ``PREFIX + name`` (``VPOptions.strength`` is ``vp_strength``) unless its
metadata names it (``latent_embeddings``, ``phrase_library``); adding a knob is adding a field.
:meth:`ComponentOptions.validate` checks every field before the first forward and returns the options in
canonical types; a field may select another component (``PhraseOptions.base_verifier``), whose options are
then resolved too and nested (``PhraseOptions.base_options``).

Where a knob's value comes from (:meth:`ComponentOptions.resolve`): an explicit ``generate`` kwarg, else a
``GenerationConfig`` attribute, else the strategy's preset, else the field default. An explicit ``None``
kwarg sets ``None`` (``vp_max_gain=None``: the unbounded gain), not the default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

ABSENT = object()  # a knob no source sets


@dataclass
class ComponentOptions:
    """Base class (and the options of a component without knobs)."""

    PREFIX: ClassVar[str] = ""

    @classmethod
    def knob(cls, field: dataclasses.Field) -> str:
        return field.metadata.get("knob", cls.PREFIX + field.name)

    @classmethod
    def knob_names(cls) -> tuple[str, ...]:
        return tuple(cls.knob(f) for f in dataclasses.fields(cls) if f.init)

    @classmethod
    def resolve(cls, lookup: Callable[[str], Any]) -> "ComponentOptions":
        """The options from ``lookup(knob)`` (``ABSENT`` where no source sets it), validated."""
        values = {f.name: value for f in dataclasses.fields(cls) if f.init
                  if (value := lookup(cls.knob(f))) is not ABSENT}
        return cls(**values).validate()

    def validate(self) -> "ComponentOptions":
        return self

    def nested(self) -> list[tuple[str, "ComponentOptions"]]:
        """(role, options) of components these options select (the phrase verifier's base verifier)."""
        return []


def options_class(component) -> type[ComponentOptions]:
    """``component.options_class``; a component that declares none has no knobs."""
    return getattr(component, "options_class", ComponentOptions)
