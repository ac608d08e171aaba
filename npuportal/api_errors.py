"""One JSON error shape for the whole API: ``{"error": ..., "field": ..., "details": {...}}``.

Scripts can always read ``error`` (a sentence) and, for bad input, ``field``
(the first offending field) without knowing which view answered.
"""

from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler


def _first_field(detail: Any, prefix: str = "") -> tuple[str | None, str]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            path = f"{prefix}.{name}" if prefix and name else (name or prefix)
            found, message = _first_field(value, path)
            return found or path or None, message
    if isinstance(detail, list) and detail:
        return _first_field(detail[0], prefix)
    return (prefix or None), str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, dict) and set(data) == {"detail"}:
        body: dict[str, Any] = {"error": str(data["detail"]), "field": None}
    else:
        field, message = _first_field(data)
        body = {"error": f"{field}: {message}" if field else message, "field": field, "details": data}
    response.data = body
    return response
