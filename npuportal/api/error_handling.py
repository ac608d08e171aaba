"""One JSON error shape for the whole API: ``{"error": ..., "field": ..., "details": {...}}``.

Scripts can always read ``error`` (a sentence) and, for bad input, ``field``
(the first offending field) without knowing which view answered. That holds when
things break too: a database that does not answer is a 503 in this shape (with
``Retry-After``), and any other failure under ``/api/`` a 500 in it, never
Django's HTML error page. The console answers the same outage with a page of
its own (``503.html``, 503 and ``Retry-After`` too), not a bare "Server Error".
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from django import db
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views import csrf, defaults
from rest_framework.exceptions import APIException, ParseError
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


def database_down(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """503 with ``Retry-After`` while the database does not answer: JSON under ``/api/``, else a console page.

    The page is rendered without the request, so no context processor runs: they read the
    signed-in user and the policy, from the very database that is down.
    """
    _database_down(request, exc)
    if is_api(request):
        response: HttpResponse = JsonResponse(DATABASE_DOWN_BODY, status=503)
    else:
        page = render_to_string("503.html", {"retry_after": RETRY_AFTER_S, "request_path": request.path})
        response = HttpResponse(page, status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


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


class Conflict(APIException):
    """409: the request is well formed, but the object's current state refuses it (a job already ended)."""

    status_code = 409
    default_detail = "the object's current state does not allow this"
    default_code = "conflict"


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


# -- answers Django gives itself, before or around the API's views -------------------------------
#
# A path the URL patterns reject (``/api/v1/jobs/abc/``, a ``%0A`` in it), a failed CSRF check, a
# body over Django's size limit and an unhandled exception are answered by Django, not DRF: with
# HTML pages. Under ``/api/`` they are answered in the error shape above; elsewhere the console
# keeps Django's pages (and the ``403.html``/``404.html``/``500.html`` templates when there are any).

API_PREFIX = "/api/"


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIX)


def json_error(status: int, message: str, field: str | None = None) -> JsonResponse:
    return JsonResponse({"error": message, "field": field}, status=status)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler404``: no URL pattern matched (or a Django view raised ``Http404``)."""
    if is_api(request):
        return json_error(404, f"no API endpoint at {request.path}")
    return defaults.page_not_found(request, exception)  # type: ignore[arg-type]


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: an exception nothing handled; the traceback goes to the log, never to the client.

    A database that is down is a 503 (Django calls this while handling the exception, so
    ``sys.exc_info()`` still names it): :func:`database_down`. Anything else is a 500: in the
    error shape under ``/api/``, Django's page elsewhere.
    """
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_DOWN):
        return database_down(request, exc)
    if not is_api(request):
        return defaults.server_error(request)
    return json_error(500, "internal server error; the details are in the server's log")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler400``: Django refused the request itself (a body over its size limit, a bad host, ...)."""
    if is_api(request):
        if isinstance(exception, RequestDataTooBig):
            return json_error(413, "the request body is too large")
        return json_error(400, "bad request")
    return defaults.bad_request(request, exception)  # type: ignore[arg-type]


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler403``: a Django view raised ``PermissionDenied``."""
    if is_api(request):
        return json_error(403, str(exception) if exception and str(exception) else "permission denied")
    return defaults.permission_denied(request, exception)  # type: ignore[arg-type]


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: a write with the session cookie but without its CSRF token."""
    if is_api(request):
        return json_error(403, f"CSRF check failed: {reason}" if reason else "CSRF check failed")
    return csrf.csrf_failure(request, reason)


class ApiErrorMiddleware:
    """Under ``/api/``, any HTML error page that still gets out becomes the API's error shape.

    The handlers above cover Django's own answers; this is the net under them (a
    view or middleware answering an error page by itself), keeping the status.
    Outermost in ``MIDDLEWARE`` so it sees every response.

    A view that finds the database down (a console page reading the session) is answered
    here by :func:`database_down`, logged as one line: left to ``handler500`` it would
    answer the same, but Django logs a traceback for every request of the outage.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code >= 400 and is_api(request) and response.get("Content-Type", "").startswith("text/html"):
            answer = json_error(response.status_code, (response.reason_phrase or "error").lower())
            if response.has_header("Allow"):
                answer["Allow"] = response["Allow"]
            return answer
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, RequestDataTooBig) and is_api(request):
            return json_error(413, "the request body is too large")
        if isinstance(exception, DATABASE_DOWN):
            return database_down(request, exception)
        return None
