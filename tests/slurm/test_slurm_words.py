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
    parse_sacct,
    squeue,
)
from devices.slurm.commands import expand_hostlist, parse_gres
from devices.slurm.foreign import parse_job_details

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


NODE_LINES = (
    "NodeName=npu1 Arch=x86_64 AvailableFeatures=910B4,ib ActiveFeatures=910B4,ib Gres=npu:c0:1,npu:c1:1 "
    "OS=Linux 6.1 #1 SMP State=MIXED+DRAIN Partitions=main,debug "
    "Reason=npuportal: replace fan [root@2026-12-03T21:30:16]\n"
    "NodeName=npu2 AvailableFeatures=(null) Gres=npu:910B3:8 State=DOWN+NOT_RESPONDING Partitions=main "
    "Reason=Not responding [slurm@2026-12-03T21:30:16]\n"
    "NodeName=cpu1 AvailableFeatures=ib Gres=(null) State=IDLE Partitions=main\n"
)


def test_a_nodes_state_reason_features_and_chip_are_read_from_scontrol() -> None:
    from devices.slurm.survey import chip_of, parse_nodes

    npu1, npu2, cpu1 = parse_nodes(NODE_LINES)
    assert (npu1.reason, npu1.features, npu1.partitions) == (
        "npuportal: replace fan",
        ("910B4", "ib"),
        ("main", "debug"),
    )
    assert npu1.drained and npu1.drained_by_portal and not npu1.down and npu1.per_card
    assert chip_of(npu1) == "910B4"
    assert npu2.down and not npu2.drained and npu2.reason == "Not responding"
    assert (npu2.cards, npu2.per_card, chip_of(npu2)) == (tuple(range(8)), False, "910B3"), (
        "the GRES type names the chip"
    )
    assert (cpu1.gres, cpu1.cards, chip_of(cpu1), cpu1.reason) == ("", (), "", "")
    assert cpu1.placement == "no npu GRES: the portal cannot place jobs on it"


def test_what_is_wrong_is_said_and_only_problems_make_slurm_unusable() -> None:
    from devices.slurm.survey import Finding, Partition, Survey, assess, parse_nodes

    npu1, npu2, cpu1 = parse_nodes(NODE_LINES)
    found = Survey(conf="/etc/slurm/slurm.conf", version="22.05.8", controller_up=True, controller="UP")
    found.nodes, found.partitions = [npu1, npu2, cpu1], [Partition("main", True, "UP", "npu[1-2],cpu1")]
    found.accounting_type, found.sacct = "accounting_storage/slurmdbd", "sacct: Connection refused"
    assert assess(found) == [
        Finding("warning", "node npu1 is drained (MIXED+DRAIN): npuportal: replace fan"),
        Finding("warning", "node npu2 is DOWN+NOT_RESPONDING: Not responding"),
        Finding("warning", "node cpu1 declares no npu GRES (Gres=(none)): not used"),
        Finding(
            "warning",
            "sacct does not answer (sacct: Connection refused): how jobs ended is read from the controller meanwhile",
        ),
    ]
    found.nodes = [cpu1]
    assert assess(found, partition="gpu")[:2] == [
        Finding(
            "problem", "no node declares an npu GRES (Gres=npu:c0:1,… or Gres=npu:8): the portal has no card to place"
        ),
        Finding("problem", "NPUPORTAL_SLURM_PARTITION='gpu' is no partition of this cluster (main)"),
    ]


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


def test_slurms_node_lists_are_written_out() -> None:
    assert expand_hostlist("ascend-b4-[01-02,04],npu7") == ["ascend-b4-01", "ascend-b4-02", "ascend-b4-04", "npu7"]
    assert expand_hostlist("r[1-2]-n[1-2]") == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
    assert expand_hostlist("") == []


def test_a_heterogeneous_jobs_components_read_as_one_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node run whose nodes take different ``--gres`` is a heterogeneous job: ``31+0``, ``31+1``."""
    ends = parse_sacct(
        "31+0|FAILED|1:0|npu1|2026-12-04T01:35:49|2026-12-04T01:35:40\n"
        "31+0.batch|FAILED|1:0|npu1|2026-12-04T01:35:49|2026-12-04T01:35:40\n"
        "31+0.1|FAILED|1:0|npu1|2026-12-04T01:35:49|2026-12-04T01:35:41\n"
        "31+1|CANCELLED|0:15|npu3|2026-12-04T01:35:50|2026-12-04T01:35:40\n"
        "32+0|CANCELLED|0:15|npu1|2026-12-04T01:36:49|2026-12-04T01:35:40\n"
        "32+1|NODE_FAIL|0:0|npu2|2026-12-04T01:36:49|2026-12-04T01:35:40\n"
    )
    assert sorted(ends) == ["31", "32"]
    assert (ends["31"].base_state, ends["31"].code, ends["31"].nodes) == ("FAILED", 1, "npu1,npu3")
    assert ends["31"].ended_at is not None and ends["31"].ended_at.minute == 35 and ends["31"].ended_at.second == 50
    assert ends["32"].base_state in SYSTEM_ENDS, "a component's node failure requeues the whole job"

    monkeypatch.setattr(
        "devices.executors.slurm.run",
        lambda argv: (
            "31+0|RUNNING|nobody|npu1|2026-12-04T01:35:40|2026-12-04T01:35:30|None|npuportal:7:1\n"
            "31+1|RUNNING|nobody|npu3|2026-12-04T01:35:40|2026-12-04T01:35:30|None|npuportal:7:1\n"
            "33|PENDING|nobody||N/A|2026-12-04T01:35:30|Resources|npuportal:8:1\n"
        ),
    )
    queued = squeue()
    assert sorted(queued) == ["31", "33"]
    assert (queued["31"].state, queued["31"].nodes, queued["31"].portal_run) == ("RUNNING", "npu1,npu3", (7, 1))


def test_the_cards_of_a_job_on_several_nodes_are_read_per_node() -> None:
    held = parse_job_details(
        "JobId=40 JobName=x\n   UserId=alice(1000) GroupId=alice(1000)\n"
        "     Nodes=npu[1-2] CPU_IDs=0 Mem=0 GRES=npu:c3:1(IDX:3),npu:c4:1(IDX:4)\n"
    )
    assert held["40"].cards == {"npu1": (3, 4), "npu2": (3, 4)}


def test_a_time_limit_end_accounted_before_its_batch_step_takes_the_controllers_status(monkeypatch) -> None:
    """slurmdbd hears of the job's end and its batch step's apart: the first may be all ``sacct`` has yet."""
    from devices.executors import slurm

    answers = {
        "sacct": "21|TIMEOUT|0:0|npu1|2026-12-03T21:32:14|2026-12-03T21:30:54\n",
        "scontrol": "JobId=21 JobName=job JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 NodeList=npu1",
    }
    asked: list[str] = []

    def run(argv: list[str], **_: object) -> str:
        asked.append(argv[0])
        return answers[argv[0]]

    monkeypatch.setattr(slurm, "run", run)
    ended = slurm.ended_jobs(["21"])["21"]
    assert (ended.base_state, ended.code, ended.nodes) == ("TIMEOUT", -15, "npu1")
    assert outcome(ended)[2] == "Slurm stopped it at its time limit: killed by signal SIGTERM"

    answers["sacct"] += "21.batch|CANCELLED|0:15|npu1|2026-12-03T21:32:15|2026-12-03T21:30:54\n"
    asked.clear()
    assert slurm.ended_jobs(["21"])["21"].code == -15
    assert asked == ["sacct"], "accounted with its batch step's status: the controller is not asked"
