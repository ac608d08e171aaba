"""Base of the core's frozen dataclasses: they copy and pickle by their fields.

A frozen dataclass with slots restores a copy through ``object.__setattr__``;
compiled (see the package docstring) that lands in the frozen ``__setattr__``
and fails, so ``copy.deepcopy`` of a snapshot would. Rebuilding the object from
its fields through ``__init__`` is what a value should do either way.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


class Frozen:
    """Mixed into every ``@dataclass(frozen=True, slots=True)`` of the core."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]
