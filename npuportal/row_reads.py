"""Model instances from a written-out SELECT, for the few lookups every API request makes.

The ORM compiles each query afresh. For a one-row lookup by a unique key that
costs several times what the database takes to answer it (on a 2-core server,
~0.3 ms of CPU against ~0.05 ms), and every API request makes such lookups: its
token, its user, a submission's team. Here the SQL is written once and the row
comes back as the ORM would give it — every column through the backend's and
the field's converters (SQLite's text datetimes, integer booleans), the
instance built by ``Model.from_db`` — so callers get ordinary model instances.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Model

Converter = Callable[[Any, Any, Any], Any]


@cache
def _plan(model: type[Model], vendor: str) -> tuple[list[str], list[str], list[tuple[Any, list[Converter]]]]:
    """Column names, attribute names and converters of ``model``'s concrete fields, in order."""
    fields = model._meta.concrete_fields
    columns = [f.column for f in fields]
    converters = []
    for field in fields:
        col = field.get_col(model._meta.db_table)
        converters.append((col, [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)]))
    return columns, [f.attname for f in fields], converters


def columns(model: type[Model], alias: str) -> str:
    """``alias."col", …`` for every concrete field of ``model``, in the order :func:`rows` reads them."""
    return _columns(model, alias, connection.vendor)


@cache
def _columns(model: type[Model], alias: str, vendor: str) -> str:
    quote = connection.ops.quote_name
    names, _, _ = _plan(model, vendor)
    return ", ".join(f"{alias}.{quote(name)}" for name in names)


def table(model: type[Model]) -> str:
    """The quoted table name of ``model``."""
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[Model], field: str) -> str:
    """The quoted column name of ``model``'s ``field``."""
    return connection.ops.quote_name(model._meta.get_field(field).column)


def rows(sql: str, params: Sequence[Any], *models: type[Model]) -> list[list[Model]]:
    """Every row of ``sql``, each as one instance of each of ``models``.

    ``sql`` selects :func:`columns` of each model, one after the other, in the order given.
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    plans = [(model, *_plan(model, connection.vendor)[1:]) for model in models]
    out = []
    for row in fetched:
        instances, at = [], 0
        for model, attnames, converters in plans:
            values = list(row[at : at + len(attnames)])
            for i, (col, steps) in enumerate(converters):
                for convert in steps:
                    values[i] = convert(values[i], col, connection)
            instances.append(model.from_db(connection.alias, attnames, values))
            at += len(attnames)
        out.append(instances)
    return out


def first(sql: str, params: Sequence[Any], *models: type[Model]) -> list[Model] | None:
    """The first row of :func:`rows`, or ``None`` when there is none (say ``LIMIT 1`` in ``sql``)."""
    found = rows(sql, params, *models)
    return found[0] if found else None
