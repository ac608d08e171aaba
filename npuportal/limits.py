"""Wording of the size limits (docs/api.md#limits), shared by every error that names one.

The limits themselves are settings (``npuportal/settings.py``); this only says them the
same way everywhere, so an answer's numbers match the documentation's table.
"""

from __future__ import annotations


def in_words(size: int) -> str:
    """A byte count as the limits are written: ``65,536 bytes (64 KiB)``."""
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if size >= scale:
            amount = f"{size / scale:.1f}".removesuffix(".0")
            return f"{size:,} bytes ({amount} {unit})"
    return f"{size:,} bytes"
