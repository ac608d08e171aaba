"""New jobs and their ``Submitted`` events, written in one statement on PostgreSQL.

A submission is the API's hottest write. Through the ORM it is a transaction of
two INSERTs — BEGIN, INSERT, INSERT, COMMIT: four round trips and two compiled
queries. As one data-modifying CTE it is one round trip, and atomic by itself:
an event never exists without its job, nor a job without its event. A job array
is one statement too: the database numbers the copies (``unnest`` of their indices), so
the spec crosses the wire once instead of once per copy.

The statements are built once per process from the models' own metadata — every
concrete column but the primary key, each value prepared by its field exactly as
the ORM's INSERT prepares it (``pre_save`` then ``get_db_prep_save``) — so a
field added to ``Job`` or ``JobEvent`` is written here with no edit. Other
databases (SQLite has no INSERT inside a CTE) take the ORM path in
``scheduling.services.jobs``; tests/test_api_endpoints.py checks both write the same rows.
"""

from __future__ import annotations

from functools import cache

from django.db import connection
from django.db.models import Field

from scheduling.models import Job, JobEvent


def available() -> bool:
    """Whether the database can take the one-statement insert."""
    return connection.vendor == "postgresql"


@cache
def _statement() -> tuple[str, tuple[Field, ...], tuple[Field, ...]]:
    quote = connection.ops.quote_name
    job_fields = tuple(f for f in Job._meta.concrete_fields if not f.primary_key)
    event_fields = tuple(f for f in JobEvent._meta.concrete_fields if not f.primary_key and f.name != "job")
    job_pk = quote(Job._meta.pk.column)
    event_job = quote(JobEvent._meta.get_field("job").column)
    job_columns = ", ".join(quote(f.column) for f in job_fields)
    event_columns = ", ".join(quote(f.column) for f in event_fields)
    sql = (
        f"WITH new_job AS ("
        f"INSERT INTO {quote(Job._meta.db_table)} ({job_columns}) "
        f"VALUES ({', '.join(['%s'] * len(job_fields))}) RETURNING {job_pk}) "
        f"INSERT INTO {quote(JobEvent._meta.db_table)} ({event_job}, {event_columns}) "
        f"VALUES ((SELECT {job_pk} FROM new_job), {', '.join(['%s'] * len(event_fields))}) "
        f"RETURNING {event_job}"
    )
    return sql, job_fields, event_fields


def insert_with_event(job: Job, event: JobEvent) -> None:
    """Insert the unsaved ``job`` and its unsaved ``event`` (whose job is ``job``) together.

    Afterwards ``job`` is a saved instance with its ``pk``, and ``event`` points at it.
    """
    sql, job_fields, event_fields = _statement()
    params = [f.get_db_prep_save(f.pre_save(job, True), connection) for f in job_fields]
    params += [f.get_db_prep_save(f.pre_save(event, True), connection) for f in event_fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        job.pk = cursor.fetchone()[0]
    job._state.adding = False
    job._state.db = connection.alias
    event.job = job


#: The fields of a job array's copies that differ from copy to copy; the database fills them in.
_PER_COPY = ("name", "array_id", "array_index")


@cache
def _array_statement(suffixed: bool) -> tuple[str, tuple[Field, ...], tuple[Field, ...]]:
    quote = connection.ops.quote_name
    meta = Job._meta
    fixed = tuple(f for f in meta.concrete_fields if not f.primary_key and f.name not in _PER_COPY)
    event_fields = tuple(f for f in JobEvent._meta.concrete_fields if not f.primary_key and f.name != "job")
    job_pk = quote(meta.pk.column)
    columns = (
        ", ".join(quote(c) for c in (meta.pk.column, *(f.column for f in fixed)))
        + ", "
        + ", ".join(quote(meta.get_field(name).column) for name in _PER_COPY)
    )

    def typed(fields: tuple[Field, ...]) -> str:
        # INSERT … SELECT does not type its parameters from the target columns, so each says its type.
        return ", ".join(f"CAST(%s AS {f.db_type(connection)})" for f in fields)

    name = "CAST(%s AS text) || '[' || ids.i || ']'" if suffixed else "CAST(%s AS text)"
    event_job = quote(JobEvent._meta.get_field("job").column)
    sql = (
        f"WITH ids AS (SELECT nextval(pg_get_serial_sequence(%s, %s)) AS id, i "
        f"FROM unnest(CAST(%s AS integer[])) WITH ORDINALITY AS given(i, n) ORDER BY n), "
        f"first AS (SELECT min(id) AS id FROM ids), "
        f"new_jobs AS (INSERT INTO {quote(meta.db_table)} ({columns}) "
        f"SELECT ids.id, {typed(fixed)}, {name}, 'A' || first.id, ids.i FROM ids CROSS JOIN first ORDER BY ids.i "
        f"RETURNING {job_pk}, {quote(meta.get_field('array_index').column)}, "
        f"{quote(meta.get_field('array_id').column)}), "
        f"events AS (INSERT INTO {quote(JobEvent._meta.db_table)} "
        f"({event_job}, {', '.join(quote(f.column) for f in event_fields)}) "
        f"SELECT new_jobs.{job_pk}, {typed(event_fields)} FROM new_jobs) "
        f"SELECT * FROM new_jobs"
    )
    return sql, fixed, event_fields


def insert_array(template: Job, event: JobEvent, indices: list[int], suffixed: bool) -> list[tuple[int, int, str]]:
    """Insert one copy of the unsaved ``template`` per index, as one job array, each with a copy of ``event``.

    ``indices`` ascending; the copy of index ``i`` is named ``<template.name>[i]`` (just the name
    when not ``suffixed``) and has ``array_index`` ``i``; ``array_id`` is ``A<id of the first
    copy>``, the lowest index's. Returns ``(id, array_index, array_id)`` of every copy.
    """
    sql, fixed, event_fields = _array_statement(suffixed)
    params: list[object] = [Job._meta.db_table, Job._meta.pk.column, list(indices)]
    params += [f.get_db_prep_save(f.pre_save(template, True), connection) for f in fixed]
    params.append(template.name)
    params += [f.get_db_prep_save(f.pre_save(event, True), connection) for f in event_fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return sorted(cursor.fetchall(), key=lambda row: row[1])
