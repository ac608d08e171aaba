"""Base of the core's dataclasses that a tick makes by the thousand, or that callers copy.

Compiled (see the package docstring), a class becomes a native C type, but the
methods ``@dataclass`` generates at import time stay plain Python: a generated
``__init__`` costs about five times a written one (ten for a frozen class, one
``object.__setattr__`` per field), and a tick makes thousands of ``Occupant``,
``Placement`` and ``Start`` objects, a snapshot thousands of jobs and devices.
So these classes write their ``__init__`` out (same parameters, in field order)
and keep ``@dataclass`` for the rest (``repr``, ``eq``, ``fields``, ``replace``),
without ``slots=True``, which would rebuild the class as a plain Python one.

A native type with a written ``__init__`` cannot be made empty and filled in, which
is how ``copy`` and ``pickle`` rebuild an object, and a frozen one refuses the
filling in either way: :class:`Record` rebuilds it from its fields through
``__init__``, which is what a value should do anyway.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


class Record:
    """Copies and pickles a dataclass by passing its fields to ``__init__``."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]
