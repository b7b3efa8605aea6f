"""Component options: one dataclass per verifier or draft prior (its ``options_class``), one field per knob.

A field's knob is ``PREFIX + name`` (``VPOptions.strength`` is ``vp_strength``) unless its metadata names it.
:meth:`ComponentOptions.validate` checks every field before the first forward and returns canonical types. A field
may select another component (``SELECTS``), whose options the registry resolves into the field it names. An
explicit ``None`` kwarg sets ``None`` (``vp_max_gain=None``), not the default.
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
    SELECTS: ClassVar[dict[str, str]] = {}  # field naming a per-token verifier -> field receiving its options

    @classmethod
    def knob(cls, field: dataclasses.Field) -> str:
        return field.metadata.get("knob", cls.PREFIX + field.name)

    @classmethod
    def knob_of(cls, name: str) -> str:
        """The knob of the field ``name``."""
        return cls.knob(next(f for f in dataclasses.fields(cls) if f.name == name))

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

    def nested(self) -> list["ComponentOptions"]:
        """The options of the components these options select (resolved by the registry)."""
        return [getattr(self, target) for target in self.SELECTS.values() if getattr(self, target) is not None]


def options_class(component) -> type[ComponentOptions]:
    """``component.options_class``; a component that declares none has no knobs."""
    return getattr(component, "options_class", ComponentOptions)
