"""What the Slurm executor reads from Slurm's text output, and the words a job's end gets: no Slurm needed."""

from __future__ import annotations

import pytest

from devices.executors import EXECUTORS, Executor, get_executor
from devices.executors.slurm import (
    SYSTEM_ENDS,
    QueuedJob,
    SlurmExecutor,
    expand_indexes,
    outcome,
    parse_gres,
    parse_sacct,
)

SACCT = """\
11|COMPLETED|0:0|npu1|2026-12-03T17:52:29
12|FAILED|3:0|npu2|2026-12-03T17:52:30
13|TIMEOUT|0:15|npu1|2026-12-03T17:52:31
14|OUT_OF_MEMORY|0:125|npu3|2026-12-03T17:52:32
15|CANCELLED by 0|0:15|npu1|2026-12-03T17:52:33
16|NODE_FAIL|0:0|npu2|2026-12-03T17:52:34
17|FAILED|0:9|npu2|Unknown
"""


def test_sacct_ends_get_the_agents_words() -> None:
    ends = parse_sacct(SACCT)
    assert outcome(ends["11"]) == (0, "Completed", "exit code 0")
    assert outcome(ends["12"]) == (3, "NonZeroExit", "exit code 3")
    assert outcome(ends["13"]) == (-15, "Walltime", "Slurm stopped it at its time limit: killed by signal SIGTERM")
    assert outcome(ends["14"])[1] == "OutOfMemory"
    assert outcome(ends["15"]) == (-15, "Killed", "stopped in Slurm (CANCELLED by 0): killed by signal SIGTERM")
    assert ends["16"].base_state in SYSTEM_ENDS, "a node failure is requeued, not failed"
    assert outcome(ends["17"]) == (-9, "NonZeroExit", "killed by signal SIGKILL")
    assert ends["17"].ended_at is None
    assert ends["12"].ended_at is not None and ends["12"].ended_at.tzinfo is not None


@pytest.mark.parametrize(
    ("gres", "cards", "per_card"),
    [
        ("npu:c0:1,npu:c1:1,npu:c2:1", (0, 1, 2), True),
        ("npu:c0:1(S:0),npu:c3:1(S:0)", (0, 3), True),
        ("npu:8", tuple(range(8)), False),
        ("npu:8(S:0-1)", tuple(range(8)), False),
        ("gpu:2,npu:4", (0, 1, 2, 3), False),
        ("(null)", (), False),
    ],
)
def test_a_nodes_gres_says_its_cards_and_whether_each_can_be_asked_for(
    gres: str, cards: tuple[int, ...], per_card: bool
) -> None:
    assert parse_gres(gres) == (cards, per_card)


def test_idx_ranges_are_written_out() -> None:
    assert expand_indexes("0-1,4,6-7") == [0, 1, 4, 6, 7]
    assert expand_indexes("3") == [3]


def test_only_the_portals_comments_name_a_run() -> None:
    assert QueuedJob("7", "RUNNING", "npuportal:12:3", "npu1", "ana").portal_run == (12, 3)
    assert QueuedJob("8", "RUNNING", "someone else's job", "npu1", "bo").portal_run is None
    assert QueuedJob("9", "RUNNING", "npuportal:12:3 extra", "npu1", "bo").portal_run is None


def test_slurm_is_an_executor_selected_by_its_name(settings) -> None:  # type: ignore[no-untyped-def]
    assert EXECUTORS["slurm"] == "devices.executors.slurm.SlurmExecutor"
    settings.NPUPORTAL_EXECUTOR = "slurm"
    executor = get_executor()
    assert isinstance(executor, SlurmExecutor) and isinstance(executor, Executor)
    assert executor.name == "slurm"


def test_a_time_limit_end_takes_its_signal_from_the_batch_step() -> None:
    # sacct without -X, as a TIMEOUT really reads: 0:0 on the job, the signal on its batch step.
    ends = parse_sacct(
        "21|TIMEOUT|0:0|npu1|2026-12-03T21:32:14|2026-12-03T21:30:54\n"
        "21.batch|CANCELLED|0:15|npu1|2026-12-03T21:32:15|2026-12-03T21:30:54\n"
        "22|COMPLETED|0:0|npu1|2026-12-03T21:32:14|2026-12-03T21:30:54\n"
        "22.batch|COMPLETED|0:0|npu1|2026-12-03T21:32:14|2026-12-03T21:30:54\n"
    )
    assert sorted(ends) == ["21", "22"]
    assert (ends["21"].code, outcome(ends["21"])) == (
        -15,
        (-15, "Walltime", "Slurm stopped it at its time limit: killed by signal SIGTERM"),
    )
    assert ends["21"].started_at is not None
    assert outcome(ends["22"]) == (0, "Completed", "exit code 0")
