"""Keyset ("cursor") pagination for lists that grow without bound, such as jobs.

A page is one indexed range read of ``limit + 1`` rows: the extra row says
whether there is a next page, so no ``COUNT(*)`` is ever run, and a deep page
costs the same as the first because it starts *after* a position (the last
row's ordering values) rather than skipping ``offset`` rows. The ordering must
end in a unique column (``id``) so that positions are total, and should match
a database index so the read is a range scan.

The API answers ``{"next", "previous", "results"}``; ``next``/``previous`` carry
an opaque ``cursor``. ``offset`` still works for scripts written against the
older limit/offset pages (it is applied before the first cursor and costs what
an OFFSET costs), and the links it leads to are cursor links. The console's job
list uses the same :class:`Keyset` directly.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, Q, QuerySet
from rest_framework import pagination
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

#: Most rows one page may ask for; a larger ``limit`` is cut to this.
MAX_LIMIT = 1000


class InvalidCursor(ValueError):
    """A cursor that this list did not make (edited, truncated, or from another list)."""


@dataclass(frozen=True)
class KeysetPage:
    rows: list[Any]
    #: Cursor of the page after this one, or ``None`` at the end.
    next_cursor: str | None
    #: Cursor of the page before this one, or ``None`` at the start.
    previous_cursor: str | None
    #: ``True`` when ``previous_cursor`` is ``None`` only because the page before is the first page
    #: reached without a cursor (the caller links to the bare list then).
    previous_is_first: bool = False


class Keyset:
    """Pages of a queryset in a fixed ordering such as ``("-submitted_at", "-id")``.

    Every ordering field must be a concrete, non-null column of the model; the
    last must be unique.
    """

    def __init__(self, ordering: Sequence[str]) -> None:
        if not ordering:
            raise ValueError("a keyset needs an ordering")
        self.ordering = tuple(ordering)
        self.fields = tuple((name.lstrip("-"), name.startswith("-")) for name in self.ordering)

    # -- cursors -----------------------------------------------------------------
    def encode(self, row: Model, *, reverse: bool) -> str:
        """The cursor of the rows beyond ``row`` (before it when ``reverse``)."""
        values = []
        for name, _ in self.fields:
            value = getattr(row, name)
            values.append(value.isoformat() if isinstance(value, date | datetime) else value)
        raw = json.dumps({"p": values, "r": int(reverse)}, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode(self, cursor: str, model: type[Model]) -> tuple[list[Any], bool]:
        """``(position, reverse)`` of a cursor made by :meth:`encode`; :class:`InvalidCursor` otherwise."""
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            data = json.loads(raw)
            values, reverse = data["p"], data["r"]
        except (binascii.Error, ValueError, TypeError, KeyError) as exc:
            raise InvalidCursor("not a cursor of this list") from exc
        if not isinstance(values, list) or len(values) != len(self.fields) or reverse not in (0, 1):
            raise InvalidCursor("not a cursor of this list")
        position = []
        for (name, _), value in zip(self.fields, values, strict=True):
            if value is None or isinstance(value, dict | list | bool):
                raise InvalidCursor("not a cursor of this list")
            field = model._meta.get_field(name)
            try:
                converted = field.to_python(value)
                field.run_validators(converted)  # integer ranges: no overflow reaches the database
            except (DjangoValidationError, ValueError, TypeError, OverflowError) as exc:
                raise InvalidCursor("not a cursor of this list") from exc
            if converted is None or (isinstance(converted, datetime) and converted.tzinfo is None):
                raise InvalidCursor("not a cursor of this list")
            position.append(converted)
        return position, bool(reverse)

    # -- reads -------------------------------------------------------------------
    def beyond(self, position: Sequence[Any], *, reverse: bool) -> Q:
        """Rows strictly after ``position`` in the ordering (before it when ``reverse``).

        ``(a, b) < (x, y)`` written as ``a <= x AND (a < x OR (a = x AND b < y))``:
        the leading bound lets the database start an index range scan at the
        position on every backend, where a row-value comparison is not portable.
        """
        condition: Q | None = None
        for (name, descending), value in reversed(list(zip(self.fields, position, strict=True))):
            op = "lt" if descending != reverse else "gt"
            strict = Q(**{f"{name}__{op}": value})
            condition = strict if condition is None else strict | (Q(**{name: value}) & condition)
        assert condition is not None
        lead, descending = self.fields[0]
        return Q(**{f"{lead}__{'lte' if descending != reverse else 'gte'}": position[0]}) & condition

    def page(self, queryset: QuerySet, *, limit: int, cursor: str | None = None, offset: int = 0) -> KeysetPage:
        """One page: a single query of ``limit + 1`` rows, whatever the size of the table.

        Raises :class:`InvalidCursor` for a cursor this list did not make.
        """
        position, reverse = self.decode(cursor, queryset.model) if cursor else (None, False)
        if reverse:
            ordering = tuple(name[1:] if name.startswith("-") else f"-{name}" for name in self.ordering)
        else:
            ordering = self.ordering
        qs = queryset.order_by(*ordering)
        if position is not None:
            qs = qs.filter(self.beyond(position, reverse=reverse))
            offset = 0
        rows = list(qs[offset : offset + limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        if reverse:
            if not rows:  # nothing before the position any more (deleted meanwhile): the first page then
                return self.page(queryset, limit=limit)
            rows.reverse()
            # We came here from the page after this one, so there is a next page.
            next_cursor = self.encode(rows[-1], reverse=False)
            previous_cursor = self.encode(rows[0], reverse=True) if more else None
            return KeysetPage(rows, next_cursor, previous_cursor)
        next_cursor = self.encode(rows[-1], reverse=False) if rows and more else None
        if position is None and offset == 0:
            return KeysetPage(rows, next_cursor, None)
        previous_cursor = self.encode(rows[0], reverse=True) if rows else None
        return KeysetPage(rows, next_cursor, previous_cursor, previous_is_first=previous_cursor is None)


#: Largest ``offset`` taken: beyond any table, and within the database's 64-bit OFFSET.
MAX_OFFSET = 2**62

_WHOLE = re.compile(r"-?[0-9]{1,30}")


def read_count(params: Any, name: str, *, default: int, minimum: int, maximum: int) -> int:
    """A whole-number query parameter in ``minimum..maximum``; anything else is a 400 naming it.

    Checked here so that no value the database cannot take (``limit=9223372036854775808``
    was a ``DataError``, a 500) ever reaches a query.
    """
    raw = params.get(name)
    if raw is None:
        return default
    if not _WHOLE.fullmatch(raw):
        raise ValidationError({name: [f"must be a whole number from {minimum} to {maximum}, got {raw[:40]!r}"]})
    value = int(raw)
    if not minimum <= value <= maximum:
        raise ValidationError({name: [f"must be from {minimum} to {maximum}, got {raw[:40]}"]})
    return value


def limit_offset_parameters(limit: str, offset: str, max_limit: int) -> list[dict[str, Any]]:
    """The OpenAPI entries of ``limit`` and ``offset``, with the bounds :func:`read_count` enforces."""
    return [
        {
            "name": limit,
            "required": False,
            "in": "query",
            "description": f"Rows per page (default {settings.REST_FRAMEWORK['PAGE_SIZE']}, at most {max_limit}).",
            "schema": {"type": "integer", "minimum": 1, "maximum": max_limit},
        },
        {
            "name": offset,
            "required": False,
            "in": "query",
            "description": "Rows to skip before the page.",
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
        },
    ]


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    """DRF's ``limit``/``offset`` pages (teams, nodes, devices, policies, tokens), with both checked.

    Out of range or not a whole number is a 400 naming the parameter, where DRF
    passed any integer on to the database.
    """

    max_limit = MAX_LIMIT

    def get_limit(self, request: Request) -> int:
        return read_count(
            request.query_params,
            self.limit_query_param,
            default=settings.REST_FRAMEWORK["PAGE_SIZE"],
            minimum=1,
            maximum=self.max_limit,
        )

    def get_offset(self, request: Request) -> int:
        return read_count(request.query_params, self.offset_query_param, default=0, minimum=0, maximum=MAX_OFFSET)

    def get_schema_operation_parameters(self, view: object) -> list[dict[str, Any]]:
        return limit_offset_parameters(self.limit_query_param, self.offset_query_param, self.max_limit)


class KeysetPagination(BasePagination):
    """DRF pagination over a :class:`Keyset`; subclasses set ``ordering``."""

    ordering: tuple[str, ...] = ("-id",)
    limit_query_param = "limit"
    cursor_query_param = "cursor"
    offset_query_param = "offset"
    max_limit = MAX_LIMIT

    def paginate_queryset(self, queryset: QuerySet, request: Request, view: object = None) -> list[Any]:
        self.request = request
        params = request.query_params
        default = settings.REST_FRAMEWORK["PAGE_SIZE"]
        limit = read_count(params, self.limit_query_param, default=default, minimum=1, maximum=self.max_limit)
        offset = read_count(params, self.offset_query_param, default=0, minimum=0, maximum=MAX_OFFSET)
        try:
            self.current = Keyset(self.ordering).page(
                queryset,
                limit=limit,
                cursor=params.get(self.cursor_query_param) or None,
                offset=offset,
            )
        except InvalidCursor as exc:
            raise ValidationError({self.cursor_query_param: [str(exc)]}) from exc
        return self.current.rows

    def _link(self, cursor: str | None, *, first: bool = False) -> str | None:
        if cursor is None and not first:
            return None
        url = remove_query_param(self.request.build_absolute_uri(), self.offset_query_param)
        if cursor is None:
            return remove_query_param(url, self.cursor_query_param)
        return replace_query_param(url, self.cursor_query_param, cursor)

    def get_paginated_response(self, data: Any) -> Response:
        page = self.current
        return Response(
            {
                "next": self._link(page.next_cursor),
                "previous": self._link(page.previous_cursor, first=page.previous_is_first),
                "results": data,
            }
        )

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        example = f"http://api.example.org/api/v1/jobs/?{self.cursor_query_param}=eyJwIjpbIjIw&limit=100"
        link = {"type": "string", "nullable": True, "format": "uri", "example": example}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {"next": link, "previous": dict(link), "results": schema},
        }

    def get_schema_operation_parameters(self, view: object) -> list[dict[str, Any]]:
        limit, offset = limit_offset_parameters(self.limit_query_param, self.offset_query_param, self.max_limit)
        offset["description"] = "Rows to skip before the first page (compatibility; follow `next` instead)."
        cursor = {
            "name": self.cursor_query_param,
            "required": False,
            "in": "query",
            "description": "Opaque position from a `next` or `previous` link.",
            "schema": {"type": "string"},
        }
        return [limit, cursor, offset]
