"""The cluster lock: whoever changes what runs where (the tick, a poll, the walltime backstop) holds it.

A PostgreSQL advisory lock held to the end of the transaction; on SQLite the write lock taken up
front (``transaction_mode=IMMEDIATE``) serialises the same writers. Its own module, below the
services and the executors, so each takes the one lock without importing the others.
"""

from __future__ import annotations

from django.db import connection

#: Arbitrary constant naming the tick's advisory lock on PostgreSQL.
TICK_LOCK_KEY = 0x6E7075_7469636B  # "npu" "tick"


def lock_cluster() -> None:
    """Take the cluster lock for this transaction (PostgreSQL; SQLite's write lock is implicit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [TICK_LOCK_KEY])
