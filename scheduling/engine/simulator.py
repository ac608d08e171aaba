"""Moved to :mod:`scheduling.sim` (the simulator is not part of the compiled core); kept for old imports."""

from __future__ import annotations

from scheduling.sim import (
    BASELINES,
    DEFAULT_START,
    DecayedMeter,
    DecideFn,
    EasyBaseline,
    FifoBaseline,
    Meter,
    ProgressFn,
    SimJob,
    Simulation,
    SimulationError,
    compare,
    jain_index,
    parse_baselines,
    prepare_jobs,
    run_simulation,
)

__all__ = [
    "BASELINES",
    "DEFAULT_START",
    "DecayedMeter",
    "DecideFn",
    "EasyBaseline",
    "FifoBaseline",
    "Meter",
    "ProgressFn",
    "SimJob",
    "Simulation",
    "SimulationError",
    "compare",
    "jain_index",
    "parse_baselines",
    "prepare_jobs",
    "run_simulation",
]
