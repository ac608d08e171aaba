"""The work a victim loses (``work_lost.device_hours_lost``)."""

from __future__ import annotations

import pytest
from engine_factory import T0

from scheduling.engine.work_lost import device_hours_lost


def test_a_job_without_checkpoints_loses_everything_since_its_start() -> None:
    assert device_hours_lost(8, T0 - 2 * 3600, T0) == pytest.approx(16.0)
    assert device_hours_lost(0.25, T0 - 3600, T0) == pytest.approx(0.25)  # a quarter-card vNPU slice
    assert device_hours_lost(4, T0 + 60, T0) == 0.0  # not started yet


def test_a_checkpointing_job_loses_the_work_since_its_last_checkpoint() -> None:
    start = T0 - (2 * 3600 + 50 * 60)  # 2 h 50 min ago, a checkpoint every hour: the last one 50 min ago
    assert device_hours_lost(8, start, T0, 3600) == pytest.approx(8 * 50 / 60)
    assert device_hours_lost(8, start, T0, None) == pytest.approx(8 * 170 / 60)
    # Stopped right at a checkpoint it loses nothing; before its first, all since its start.
    assert device_hours_lost(8, T0 - 7200, T0, 3600) == 0.0
    assert device_hours_lost(2, T0 - 600, T0, 3600) == pytest.approx(2 * 600 / 3600)
