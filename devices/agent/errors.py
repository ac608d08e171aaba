"""The one error type the agent's HTTP layer turns into a JSON answer.

Validation and conflicts are raised deep inside job and backend code; carrying the HTTP status and the
offending request field on the exception keeps those modules free of HTTP plumbing while still letting
the caller say exactly which field was wrong.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request the agent refuses: ``status`` is the HTTP code, ``field`` the request field at fault."""

    def __init__(
        self, status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """JSON body: always ``error``; ``field`` only when one request field is to blame."""
        out: dict[str, Any] = {"error": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out
