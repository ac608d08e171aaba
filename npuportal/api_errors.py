"""One JSON error shape for the whole API: ``{"error": ..., "field": ..., "details": {...}}``.

Scripts can always read ``error`` (a sentence) and, for bad input, ``field``
(the first offending field) without knowing which view answered. That holds when
things break too: a database that does not answer is a 503 in this shape (with
``Retry-After``), and any other failure under ``/api/`` a 500 in it, never
Django's HTML error page.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django import db
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework.exceptions import ParseError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from npuportal.limits import in_words

log = logging.getLogger(__name__)


def _database_errors() -> tuple[type[BaseException], ...]:
    """What a database that is down, restarting or unreachable raises (Django's wrappers and psycopg's own)."""
    errors: list[type[BaseException]] = [db.OperationalError, db.InterfaceError]
    try:
        import psycopg
    except ImportError:  # SQLite-only installs
        return tuple(errors)
    return (*errors, psycopg.OperationalError, psycopg.InterfaceError)


DATABASE_DOWN = _database_errors()
#: Seconds a client is told to wait before trying again while the database is down.
RETRY_AFTER_S = 5
DATABASE_DOWN_BODY = {"error": "the database is not answering; try again shortly", "field": None}


def _database_down(request: Any, exc: BaseException) -> None:
    log.warning("database unavailable for %s %s: %s", request.method, request.path, exc)


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


def _too_big(exc: Exception) -> bool:
    """Django refused to read a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``: as itself, or inside a parser's error."""
    if isinstance(exc, RequestDataTooBig):
        return True
    return isinstance(exc, ParseError) and isinstance(exc.__cause__ or exc.__context__, RequestDataTooBig)


def body_too_big(request: Any) -> Response:
    """413 in the API's error shape, saying how large the body was and how large it may be.

    Django raises ``RequestDataTooBig`` from the Content-Length alone, before reading the
    body, and outside DRF's exceptions, so without this it became an HTML page or a bare 400.
    """
    limit = in_words(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    meta = getattr(request, "META", {})
    try:
        size = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        size = 0
    message = (f"the request body is {in_words(size)}; " if size else "the request body is too large; ") + (
        f"at most {limit} are accepted"
    )
    return Response({"error": f"body: {message}", "field": "body", "details": {"body": [message]}}, status=413)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if _too_big(exc):
        return body_too_big(context.get("request"))
    if isinstance(exc, DATABASE_DOWN):
        _database_down(context["request"], exc)
        return Response(dict(DATABASE_DOWN_BODY), status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
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


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: API paths answer in the error shape (503 when the database is down), the rest as Django does.

    The API's own views are covered by :func:`exception_handler`; this catches what fails outside them
    (middleware, plain Django views under ``/api/``). Django calls it while handling the exception, so
    ``sys.exc_info()`` still names it.
    """
    if not request.path.startswith("/api/"):
        return defaults.server_error(request)
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_DOWN):
        _database_down(request, exc)
        response = JsonResponse(DATABASE_DOWN_BODY, status=503)
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
    return JsonResponse({"error": "internal server error", "field": None}, status=500)
