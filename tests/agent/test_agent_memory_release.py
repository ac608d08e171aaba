"""A job is reported ended only once npu-smi's process table lists no process on its cards, or after a bound.

The agent runs on the npu-smi backend with a fake ``npu-smi`` that prints the real 910B1 output of
``tests/fixtures/npu-smi/05_...`` (one training process per NPU), with NPU 0's process replaced by the
job's own, real pid for as many readings as the test says, and without it afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from devices.agent.backends import NpuSmiBackend, NvidiaSmiBackend, ProcessTable
from devices.agent.device_memory import free_words, held_words, holders
from tests.agent.test_agent_backends import APPS_CSV, GPU_CSV, FakeTool, fixture
from tests.agent.test_agent_stop_every_process import RealAgent, _record, marked
from tests.waiting import wait_for

#: NPU 0's process in fixture 05, and its row with the border under it.
FIXTURE_PID = 576489
NPU0_ROW = "| 0       0                 | 576489        | python                   | 60703                   |\n"
BORDER = "+===========================+===============+====================================================+\n"


class CountingNpuSmi:
    """A fake ``npu-smi`` whose table lists ``pid`` on NPU 0 for the next ``held`` readings, then no process there.

    Every reading appends ``held`` or ``free`` to ``calls``.
    """

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        text = fixture("05_").read_text()
        assert NPU0_ROW + BORDER in text
        (tmp / "free.txt").write_text(text.replace(NPU0_ROW + BORDER, ""))
        self.real = text
        self.path = tmp / "npu-smi"
        (tmp / "held-readings").write_text("0")
        self.path.write_text(
            "#!/bin/sh\n"
            f'd="{tmp}"\n'
            'n=$(cat "$d/held-readings")\n'
            'if [ "$n" -gt 0 ]; then\n'
            '  echo $((n - 1)) > "$d/held-readings"; echo held >> "$d/calls"; cat "$d/held.txt"\n'
            "else\n"
            '  echo free >> "$d/calls"; cat "$d/free.txt"\n'
            "fi\n"
        )
        self.path.chmod(0o755)

    def hold(self, pid: int, readings: int) -> None:
        (self.dir / "held.txt").write_text(self.real.replace(str(FIXTURE_PID), str(pid)))
        (self.dir / "held-readings").write_text(str(readings))

    def calls(self) -> list[str]:
        path = self.dir / "calls"
        return path.read_text().split() if path.exists() else []

    def held_left(self) -> int:
        return int((self.dir / "held-readings").read_text())


def _agent(tmp_path: Path, tool: CountingNpuSmi, *extra: str) -> RealAgent:
    backend = ("--backend", "npu-smi", "--tool-path", str(tool.path), "--tool-timeout", "5")
    return RealAgent(tmp_path, "--stop-jobs-on-exit", *extra, backend=backend)


def _job_pid(tmp_path: Path, job_id: str) -> int:
    """The pid of the job's command (not its wrapper): the process a card's table would list."""
    mark = _record(tmp_path, job_id)["mark"]
    return min(wait_for(lambda: marked(mark), interval=0.1, message="the job's command to start"))


def test_a_stop_waits_until_the_table_no_longer_lists_the_jobs_pid(tmp_path: Path) -> None:
    tool = CountingNpuSmi(tmp_path)
    agent = _agent(tmp_path, tool)
    try:
        agent.run("train", "sleep 600", device=0)
        pid = _job_pid(tmp_path, "train")
        before = len(tool.calls())
        tool.hold(pid, readings=3)
        stopped = agent.call("DELETE", "/v1/jobs/train?wait=60").json()
        assert stopped["state"] == "killed" and stopped["exit_reason"] == "cancelled"
        assert tool.held_left() == 0
        assert tool.calls()[before:] == ["held", "held", "held", "free"], "reported ended before the table cleared"
        words = stopped["accelerator_memory"]
        assert words.startswith("accelerator memory free after "), words
        assert float(words.split()[-2]) >= 0.9  # three readings half a second apart
        assert _record(tmp_path, "train")["accelerator_memory"] == words
    finally:
        agent.close()


def test_memory_never_released_is_reported_after_the_bound_in_words(tmp_path: Path) -> None:
    tool = CountingNpuSmi(tmp_path)
    agent = _agent(tmp_path, tool, "--memory-release-wait", "2")
    try:
        agent.run("stuck", "sleep 600", device=0)
        pid = _job_pid(tmp_path, "stuck")
        tool.hold(pid, readings=1_000_000)
        t0 = time.monotonic()
        stopped = agent.call("DELETE", "/v1/jobs/stuck?wait=60").json()
        waited = time.monotonic() - t0
        assert stopped["state"] == "killed" and stopped["exit_reason"] == "cancelled"
        words = f"accelerator memory still held by pid {pid} on card 0 after 2 s"
        assert stopped["accelerator_memory"] == words
        assert 2 <= waited < 60, waited  # after the bound, not the stop's whole wait
        assert marked(_record(tmp_path, "stuck")["mark"]) == []  # the job itself is gone all the same
        assert f"job stuck: {words}" in agent.log.read_text()
    finally:
        agent.close()


def test_a_job_that_ends_by_itself_waits_for_its_memory_too(tmp_path: Path) -> None:
    tool = CountingNpuSmi(tmp_path)
    agent = _agent(tmp_path, tool)
    go = tmp_path / "go"
    try:
        agent.run("short", f"while [ ! -e {go} ]; do sleep 0.1; done", device=0)
        tool.hold(_job_pid(tmp_path, "short"), readings=2)
        go.touch()  # no stop request: the command ends by itself
        record = agent.wait_ended("short")
        assert record["state"] == "succeeded" and record["exit_reason"] == "exit code 0"
        assert tool.held_left() == 0
        assert record["accelerator_memory"].startswith("accelerator memory free after "), record
    finally:
        agent.close()


# --------------------------------------------------------------------------------------------------
# the process table of each backend, and the rule


def test_npu_smi_process_table_by_card(tmp_path: Path) -> None:
    tool = FakeTool(tmp_path, "npu-smi")
    backend = NpuSmiBackend(str(tool.path), timeout_s=5)
    tool.serve(fixture("05_"))
    assert backend.may_list_processes()
    table = backend.process_table()
    assert table is not None and table.error is None
    assert table.processes[0] == [{"pid": 576489, "name": "python", "memory_mb": 60703}]
    assert sorted(table.processes) == list(range(8))


def test_npu_smi_without_a_process_table_is_not_checked(tmp_path: Path) -> None:
    tool = FakeTool(tmp_path, "npu-smi")
    backend = NpuSmiBackend(str(tool.path), timeout_s=5)
    tool.serve(fixture("02_"))  # 22.0.3.1 prints no process table
    assert backend.process_table() is None
    assert not backend.may_list_processes()  # so later jobs do not even ask


def test_a_failing_tool_gives_no_table_and_says_why(tmp_path: Path) -> None:
    tool = FakeTool(tmp_path, "npu-smi")
    tool.serve("fail")
    table = NpuSmiBackend(str(tool.path), timeout_s=5).process_table()
    assert table is not None and table.processes == {}
    assert "exited with status 1" in (table.error or "")


def test_nvidia_smi_compute_apps_are_its_process_table(tmp_path: Path) -> None:
    tool = FakeTool(tmp_path, "nvidia-smi")
    (tmp_path / "gpus.csv").write_text(GPU_CSV)
    (tmp_path / "gpus.csv.apps").write_text(APPS_CSV)
    tool.serve(tmp_path / "gpus.csv")
    table = NvidiaSmiBackend(str(tool.path), timeout_s=5).process_table()
    assert table == ProcessTable({0: [], 1: [{"pid": 4242, "name": "python", "memory_mb": 79000}]}, None)


@pytest.mark.parametrize(
    ("others", "expected"),
    [
        (set(), [(3, 11), (3, 12)]),
        ({12}, [(3, 11)]),  # another running job's process on a shared card is its own
    ],
)
def test_holders_are_the_processes_on_the_jobs_cards_but_other_jobs(
    others: set[int], expected: list[tuple[int, int]]
) -> None:
    rows: dict[int, list[dict[str, Any]]] = {3: [{"pid": 11}, {"pid": 12}], 4: [{"pid": 13}], 5: []}
    found, unread = holders([3, 5, 6], ProcessTable(rows), others)
    assert [(h.device, h.pid) for h in found] == expected
    assert unread == [6]


def test_the_words() -> None:
    found, _ = holders([3], ProcessTable({3: [{"pid": 4242}]}), ())
    assert held_words(found, 10.0) == "accelerator memory still held by pid 4242 on card 3 after 10 s"
    many, _ = holders([0], ProcessTable({0: [{"pid": p} for p in range(1, 7)] + [{"pid": None}]}), ())
    assert held_words(many, 2.5) == (
        "accelerator memory still held by pid 1 on card 0, pid 2 on card 0, pid 3 on card 0, pid 4 on card 0 "
        "and 3 more after 2.5 s"
    )
    assert free_words(None) == "accelerator memory free"
    assert free_words(1.54) == "accelerator memory free after 1.5 s"
