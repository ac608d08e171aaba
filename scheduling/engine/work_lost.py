"""The work a running job loses when it is stopped: the one rule, for the victim search and the simulator.

A stopped job loses what it computed since it last saved its state. A job that
declares no checkpoints (``checkpoint_interval_s`` is ``None``) saved nothing,
so it loses everything since it started. A job that checkpoints every ``c``
seconds saved at ``start + c``, ``start + 2c``, ...; its last checkpoint
before ``at`` is ``start + floor((at - start) / c) × c``, and it loses what it
computed since then.

The loss is in device-hours: the job's device units (whole cards count 1, a
vNPU slice its share of a card) × those hours, as quotas and usage count.

*Example.* An 8-card job started 2 h 50 min ago loses 8 × 170 / 60 ≈ 22.7
device-hours; the same job checkpointing every hour saved 50 minutes ago and
loses 8 × 50 / 60 ≈ 6.7.
"""

from __future__ import annotations

import math


def last_checkpoint(started_at: float, at: float, checkpoint_interval_s: float | None = None) -> float:
    """When a job that started at ``started_at`` last saved its state before ``at`` (its start if it never did)."""
    if checkpoint_interval_s is None or checkpoint_interval_s <= 0.0 or at <= started_at:
        return started_at
    return min(started_at + math.floor((at - started_at) / checkpoint_interval_s) * checkpoint_interval_s, at)


def device_hours_lost(units: float, started_at: float, at: float, checkpoint_interval_s: float | None = None) -> float:
    """Device-hours lost if a job of ``units`` that started at ``started_at`` stops at ``at`` (see the module)."""
    if at <= started_at:
        return 0.0
    return units * (at - last_checkpoint(started_at, at, checkpoint_interval_s)) / 3600.0
