"""What the ``policy`` and ``chargeback`` commands share: ``do_<action>`` dispatch and exit codes.

Their exit codes are a contract with scripts (0 ok, 1 refused or invalid, 2 usage
error), so a subcommand stops by raising :class:`Exit` (usually through
:meth:`SubcommandCommand.fail`, which also prints the reason) and ``handle``
turns it into the process's status.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand


def read_text_file(path: str, what: str) -> str:
    """The UTF-8 text of ``path``; ``ValueError`` naming ``what`` and the file when it cannot be read or decoded.

    Read as bytes and decoded here, so the message can say which byte is not UTF-8 and where.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = f"byte 0x{data[exc.start]:02x} at offset {exc.start}"
        raise ValueError(f"{what} {path} is not UTF-8 text ({bad})") from None


class Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class SubcommandCommand(BaseCommand):
    """A command whose first argument picks a ``do_<action>`` method."""

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, "do_" + opts["action"])(opts)
        except Exit as done:
            if done.code:
                sys.exit(done.code)

    def _fail(self, message: str, code: int) -> Exit:
        """Print ``message`` to stderr; the caller raises the returned :class:`Exit`."""
        self.stderr.write(message)
        return Exit(code)
