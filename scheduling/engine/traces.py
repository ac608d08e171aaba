"""Moved to :mod:`scheduling.sim.traces` (with the simulator, out of the compiled core); kept for old imports."""

from __future__ import annotations

from scheduling.sim.traces import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    ClusterSpec,
    InputError,
    NodeGroup,
    TraceRow,
    load_cluster,
    load_trace,
    parse_cluster,
    trace_rows,
)

__all__ = [
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "ClusterSpec",
    "InputError",
    "NodeGroup",
    "TraceRow",
    "load_cluster",
    "load_trace",
    "parse_cluster",
    "trace_rows",
]
