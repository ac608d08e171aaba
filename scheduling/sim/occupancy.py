"""The replay's bookkeeping of jobs and cards, O(changes) per event.

Pending jobs in a list with O(1) add and remove (:class:`JobList`), running jobs
in start order (:class:`OrderedJobs`), and which cards each running job holds
(:class:`Occupancy`); the event loop and the baselines share them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from scheduling.engine.snapshot import (
    JobState,
    NodeState,
    Slot,
    VnpuTemplate,
)


class SimulationError(RuntimeError):
    """The core returned a decision the cluster cannot carry out (a contract violation)."""


class JobList:
    """A list of jobs with O(1) add and remove (swap with the last), handed to snapshots as is.

    The order is arbitrary; the core orders pending jobs itself (priority, then
    submission time, then id) and must not mutate its snapshot.
    """

    __slots__ = ("items", "pos")

    def __init__(self) -> None:
        self.items: list[JobState] = []
        self.pos: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, job: JobState) -> None:
        self.pos[job.id] = len(self.items)
        self.items.append(job)

    def remove(self, job: JobState) -> None:
        i = self.pos.pop(job.id)
        last = self.items.pop()
        if last is not job:
            self.items[i] = last
            self.pos[last.id] = i


class OrderedJobs:
    """Running jobs in start order, O(1) add and remove, handed to a snapshot as a new list.

    The order is kept (no swap-remove), which the snapshot's ``RunningDelta.in_order``
    promises: the core then keeps the running jobs sorted by expected end from tick
    to tick instead of sorting them at every shadow time.
    """

    __slots__ = ("jobs",)

    def __init__(self) -> None:
        self.jobs: dict[int, JobState] = {}

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def items(self) -> list[JobState]:
        return list(self.jobs.values())

    def add(self, job: JobState) -> None:
        self.jobs[job.id] = job

    def remove(self, job: JobState) -> None:
        del self.jobs[job.id]


# --- cluster occupancy ------------------------------------------------------------------------


class Occupancy:
    """Free capacity per device and node, updated as slots are taken and given back."""

    def __init__(self, nodes: list[NodeState], templates: Mapping[tuple[str, str], VnpuTemplate]) -> None:
        self.templates = templates
        n = 1 + max((d.id for node in nodes for d in node.devices), default=0)
        self.known = [False] * n
        self.usable = [False] * n
        self.chip = [""] * n
        self.node_of = [0] * n
        self.full_cores = [0] * n
        self.full_mem = [0] * n
        self.full_cpus = [0] * n
        self.free_cores = [0] * n
        self.free_mem = [0] * n
        self.free_cpus = [0] * n
        self.node_devices: list[list[int]] = []
        self.node_chip: list[str] = []
        self.node_whole_free: list[int] = []
        self.whole_free_by_chip: dict[str, int] = defaultdict(int)
        #: Devices with some capacity left (whole or partly free).
        self.devices_with_room = 0
        for ni, node in enumerate(nodes):
            ids = []
            for d in node.devices:
                self.known[d.id] = True
                self.usable[d.id] = d.usable and node.schedulable
                self.chip[d.id] = d.chip_model
                self.node_of[d.id] = ni
                self.full_cores[d.id] = self.free_cores[d.id] = max(d.ai_cores, 1)
                self.full_mem[d.id] = self.free_mem[d.id] = d.hbm_mb
                self.full_cpus[d.id] = self.free_cpus[d.id] = d.ai_cpus
                ids.append(d.id)
            self.node_devices.append(ids)
            self.node_chip.append(node.devices[0].chip_model if node.devices else "")
            free = sum(1 for i in ids if self.usable[i])
            self.node_whole_free.append(free)
            self.whole_free_by_chip[self.node_chip[-1]] += free
            self.devices_with_room += free

    def is_whole_free(self, dev: int) -> bool:
        return self.free_cores[dev] == self.full_cores[dev] and self.free_mem[dev] == self.full_mem[dev]

    def take(self, job: JobState, slots: tuple[Slot, ...]) -> str:
        """Occupy ``slots`` for ``job``; raise :class:`SimulationError` if they are not free. Returns the chip."""
        want = 1 if job.vnpu_template is not None else job.num_devices
        if len(slots) != want or len({s.device_id for s in slots}) != len(slots):
            raise SimulationError(f"start of job {job.id}: {len(slots)} slots for a job of {want} device(s)")
        chip = ""
        for slot in slots:
            dev = slot.device_id
            if dev <= 0 or dev >= len(self.known) or not self.known[dev]:
                raise SimulationError(f"start of job {job.id}: unknown device {dev}")
            if not self.usable[dev]:
                raise SimulationError(f"start of job {job.id}: device {dev} is not usable")
            if chip and self.chip[dev] != chip:
                raise SimulationError(f"start of job {job.id}: slots on several chip models")
            chip = self.chip[dev]
            if job.chip_model is not None and chip != job.chip_model:
                raise SimulationError(f"start of job {job.id}: device {dev} is {chip}, job wants {job.chip_model}")
            if slot.vnpu_template != job.vnpu_template:
                raise SimulationError(
                    f"start of job {job.id}: slot template {slot.vnpu_template!r}, job wants {job.vnpu_template!r}"
                )
            if slot.vnpu_template is None:
                if not self.is_whole_free(dev):
                    raise SimulationError(f"start of job {job.id}: device {dev} is not free")
                self._use(dev, self.full_cores[dev], self.full_mem[dev], self.full_cpus[dev])
            else:
                t = self.templates.get((chip, slot.vnpu_template))
                if t is None:
                    raise SimulationError(f"start of job {job.id}: no vNPU template {slot.vnpu_template!r} on {chip}")
                if (
                    t.ai_cores > self.free_cores[dev]
                    or t.memory_mb > self.free_mem[dev]
                    or t.ai_cpus > self.free_cpus[dev]
                ):
                    raise SimulationError(f"start of job {job.id}: no room for {t.name} on device {dev}")
                self._use(dev, t.ai_cores, t.memory_mb, t.ai_cpus)
        return chip

    def give_back(self, job: JobState) -> None:
        for slot in job.slots:
            dev = slot.device_id
            if slot.vnpu_template is None:
                self._free(dev, self.full_cores[dev], self.full_mem[dev], self.full_cpus[dev])
            else:
                t = self.templates[(self.chip[dev], slot.vnpu_template)]
                self._free(dev, t.ai_cores, t.memory_mb, t.ai_cpus)

    def _use(self, dev: int, cores: int, mem: int, cpus: int) -> None:
        was_whole = self.is_whole_free(dev)
        had_room = self.free_cores[dev] > 0
        self.free_cores[dev] -= cores
        self.free_mem[dev] -= mem
        self.free_cpus[dev] -= cpus
        if was_whole:
            self.node_whole_free[self.node_of[dev]] -= 1
            self.whole_free_by_chip[self.chip[dev]] -= 1
        if had_room and self.free_cores[dev] <= 0:
            self.devices_with_room -= 1

    def _free(self, dev: int, cores: int, mem: int, cpus: int) -> None:
        had_room = self.free_cores[dev] > 0
        self.free_cores[dev] += cores
        self.free_mem[dev] += mem
        self.free_cpus[dev] += cpus
        if self.is_whole_free(dev):
            self.node_whole_free[self.node_of[dev]] += 1
            self.whole_free_by_chip[self.chip[dev]] += 1
        if not had_room and self.free_cores[dev] > 0:
            self.devices_with_room += 1
