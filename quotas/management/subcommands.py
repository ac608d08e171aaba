"""What the ``policy`` and ``chargeback`` commands share: ``do_<action>`` dispatch and exit codes.

Their exit codes are a contract with scripts (0 ok, 1 refused or invalid, 2 usage
error), so a subcommand stops by raising :class:`Exit` (usually through
:meth:`SubcommandCommand.fail`, which also prints the reason) and ``handle``
turns it into the process's status.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand


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
