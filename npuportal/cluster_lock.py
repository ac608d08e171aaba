"""The cluster lock: one writer at a time of what the tick decides from (jobs, allocations, devices).

The tick, the poll's reconcile and launch steps and the walltime sweep each change jobs and their
devices; each takes this lock first, in its own transaction, so no two of them act on the same stale
view. On PostgreSQL it is a transaction-scoped advisory lock (released at commit or rollback); SQLite
takes its database-wide write lock on the first write anyway, so there it is a no-op.
"""

from __future__ import annotations

from django.db import connection

#: Arbitrary constant naming the cluster's advisory lock on PostgreSQL.
TICK_LOCK_KEY = 0x6E7075_7469636B  # "npu" "tick"


def lock_cluster() -> None:
    """Take the cluster lock for this transaction (PostgreSQL; SQLite's write lock is implicit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [TICK_LOCK_KEY])
