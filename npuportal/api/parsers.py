"""How the API reads request bodies and picks a response format, so bad input is a 400, never a 500.

* :class:`JSONParser` is the API's only body parser. It reads at most
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes (DRF's own parser reads the stream
  whatever its length, past Django's limit) and refuses bodies nested deeper
  than :data:`MAX_DEPTH` before ``json`` recurses into them: a body of 100,000
  ``[`` made the decoder raise ``RecursionError``, a 500.
* :class:`ContentNegotiation` answers an unknown ``?format=`` with a 400 that
  names ``format`` and the formats there are, where DRF answered 404 as if the
  path did not exist (an unknown ``.xml`` suffix, part of the path, stays a 404).
* :class:`FormatSuffixes`, a base of every API viewset, takes a ``.json``/``.api``
  suffix off the handler's keywords, so every route answers its suffixed path.
"""

from __future__ import annotations

import codecs
import json
from typing import IO, Any

from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from rest_framework import exceptions, parsers, renderers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.utils.json import strict_constant

#: Deepest nesting of arrays and objects a body may have; the API's deepest input is far shallower.
MAX_DEPTH = 64


class RequestTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = "the request body is too large"
    default_code = "request_too_large"


def nesting_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of a JSON text, counted without recursion (brackets in strings skipped).

    0 when the text has too few brackets to be nested past :data:`MAX_DEPTH` at all.
    """
    if text.count("[") + text.count("{") <= MAX_DEPTH:  # the usual body: nothing to count
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _bad_body(message: str) -> exceptions.ParseError:
    """A 400 whose error body names ``body`` as the offending field."""
    return exceptions.ParseError({"body": [message]})


class JSONParser(parsers.JSONParser):
    """``application/json`` bodies, bounded in size and depth; every failure a 400 (413 when too large)."""

    def parse(self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1 if limit is not None else -1) if stream is not None else b""
        if limit is not None and len(raw) > limit:
            raise RequestTooLarge(f"the request body is larger than {limit} bytes")
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.decode(raw, encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise _bad_body(f"not {encoding} text") from exc
        if nesting_depth(text) > MAX_DEPTH:
            raise _bad_body(f"JSON nested deeper than {MAX_DEPTH} levels")
        try:
            return json.loads(text, parse_constant=strict_constant if self.strict else None)
        except RecursionError as exc:  # cannot happen below MAX_DEPTH; kept so no body can ever be a 500
            raise _bad_body("JSON nested too deeply") from exc
        except ValueError as exc:
            raise _bad_body(f"not valid JSON ({exc})") from exc


class ContentNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, but ``?format=`` naming no renderer of the view is a 400 naming ``format``."""

    def select_renderer(
        self, request: Request, renderers: list[renderers.BaseRenderer], format_suffix: str | None = None
    ) -> tuple[renderers.BaseRenderer, str]:
        known = [r.format for r in renderers]
        if format_suffix and format_suffix not in known:  # ``/jobs/1.xml``: a path that does not exist
            raise exceptions.NotFound(f"no API endpoint at {request.path}")
        wanted = format_suffix or request.query_params.get(api_settings.URL_FORMAT_OVERRIDE)
        if wanted:
            if wanted not in known:
                raise exceptions.ValidationError(
                    {"format": [f"unknown format {wanted!r}; this endpoint answers {', '.join(known)}"]}
                )
        return super().select_renderer(request, renderers, format_suffix)


class FormatSuffixes:
    """Base of every API viewset: a path's ``.json``/``.api`` suffix picks the format, and nothing else.

    DRF's router adds a ``<route>.<format>`` path beside each route and hands the suffix to
    the handler as a ``format`` keyword. DRF's own handlers take ``**kwargs``; one written
    ``def log(self, request, pk=None)`` does not, and ``/api/v1/jobs/1/log.json`` was a
    ``TypeError``, a 500. Here the suffix leaves the keywords before any handler sees them
    and is kept where content negotiation looks for it, so a handler never has to know
    about suffixes. ``npuportal.api.urls`` registers no viewset without this base.
    """

    _format_suffix: str | None = None

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        self._format_suffix = kwargs.pop(api_settings.FORMAT_SUFFIX_KWARG, None)
        return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]

    def get_format_suffix(self, **kwargs: Any) -> str | None:
        return self._format_suffix
