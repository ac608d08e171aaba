"""Trace replay through the decision core, in simulated time.

The loop is a discrete-event simulation. Events are the next submission, the
next job end, the next preemption grace deadline and the next policy clock edge
(a time-of-day quota window opening or closing, a calendar month starting when a
team has a monthly device-hour budget). All events at one timestamp are applied
together, then :func:`scheduling.engine.decide.decide` is called once with a
:class:`Snapshot` built exactly as the database tick builds it, and its decisions
are applied in the tick's order: evictions, starts, preemptions.

The simulator's own bookkeeping is O(changes) per event: pending jobs live in a
list with O(1) add/remove that is handed to every snapshot as it is (no copy);
running jobs in start order, handed over as a list with a ``RunningDelta`` (what
ended and started since the last snapshot) so the core, too, works on what
changed; the node and device objects are built once and reused (nothing in a
replay makes a device unhealthy), the free-capacity map, usage meters and quota
ledger are touched only when a job starts or stops. The core stays the hot path.

Rules the replay adds around the core (all in ``docs/simulator.md``):

* A job runs for its trace ``duration_s``, which is also its estimated duration.
* A preempted job keeps running until its grace deadline; then ``decide`` is
  expected to evict it. If it does not, the simulator stops it anyway and counts
  a *forced stop* (a sign the core forgot an eviction). A stopped victim is
  requeued with its original submission time or cancelled, per
  ``policy.on_preempt``. It loses the work since its start, or since its last
  checkpoint if it checkpoints (:mod:`work_lost`, the rule the victim search
  weighs): requeued, it runs again for its duration less the work it saved.
* Rows that cannot be read as a job (no duration, no devices, an unknown class) and
  jobs that can never run are skipped before the replay and counted by reason. "Can
  never run" is the engine's one rule (:func:`feasibility.check`, the rule that refuses
  such a job at submission), on the simulated inventory: counted as ``never_runnable``.
* ``decide`` is skipped at an event only when it provably cannot start or
  preempt anything (see :meth:`Simulation._decide_needed`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from scheduling.engine import reasons
from scheduling.engine.feasibility import Request, Shapes, check
from scheduling.engine.policy import DEVICES, Policy, Quota, quota_at
from scheduling.engine.snapshot import (
    Decisions,
    JobState,
    NodeState,
    Promise,
    RunningDelta,
    Slot,
    Snapshot,
    Start,
    VnpuTemplate,
    Wait,
)
from scheduling.engine.traces import ClusterSpec, TraceRow, parse_cluster
from scheduling.engine.traces import trace_rows as normalise_rows
from scheduling.engine.work_lost import device_hours_lost, last_checkpoint

DecideFn = Callable[[Snapshot], Decisions]
#: ``progress(done_jobs, total_jobs)``; called at most every few hundred events.
ProgressFn = Callable[[int, int], None]

#: Simulated wall clock of trace second 0 unless the caller gives another (a Monday, UTC midnight).
DEFAULT_START = datetime(2024, 1, 1, tzinfo=UTC)
#: Fairness sampling window.
FAIRNESS_WINDOW_S = 3600.0
#: After the last submission, end and deadline, policy clock edges are still followed this long
#: for jobs a quota window or a monthly budget may yet admit; then they count as never started.
CLOCK_TAIL_S = 35 * 86400.0
#: Guard against a core that keeps evicting at one timestamp.
MAX_DECIDES_PER_INSTANT = 50
#: Jobs a sampled planning pass estimates (``estimates_every``): the database tick's default
#: ``ESTIMATE_MAX_JOBS``, so the replay measures the estimates users are shown.
ESTIMATE_LIMIT = 2000
_EPS = 1e-9

#: Skip reasons (keys of ``jobs.skipped_by_reason``).
SKIP_ZERO_DURATION = "zero_duration"
SKIP_NO_DEVICES = "no_devices"
SKIP_UNKNOWN_CLASS = "unknown_priority_class"
#: A job the engine's feasibility rule says can never run here (the API refuses it at submission).
SKIP_NEVER_RUNNABLE = "never_runnable"

#: The fixed reference schedulers a replay can be compared with (``baseline=``, ``--baseline``).
BASELINES = ("fifo", "easy")


class SimulationError(RuntimeError):
    """The core returned a decision the cluster cannot carry out (a contract violation)."""


# --- jobs -------------------------------------------------------------------------------------


@dataclass(slots=True)
class SimJob:
    """A trace job during the replay: the engine's :class:`JobState` plus what metrics need."""

    state: JobState
    key: str
    duration: float
    units: float  # card equivalents while running (vNPU: template cores / chip cores)
    status: str = "pending"  # pending | running | completed | cancelled
    first_start: float | None = None
    run_token: int = 0
    chip: str = ""  # chip model of the devices it runs on
    preempted: int = 0
    end: float | None = None  # completion or cancellation time
    #: The first estimated start a sampled planning pass gave it (``estimates_every``).
    first_estimate: float | None = None
    #: Seconds it waited with a reason of its own team's limits (``reasons.QUOTA_REASONS``).
    own_limits_s: float = 0.0
    #: Seconds of its run kept by checkpoints before it was stopped: a restart runs the rest.
    saved: float = 0.0


def _default_class(policy: Policy) -> str:
    """The class of trace jobs that name none (``"normal"`` for a policy without classes)."""
    return policy.default_class.name if policy.priority_classes else "normal"


def _vnpu_for(fraction: float, chip: str, chip_cores: int, templates: list[VnpuTemplate]) -> VnpuTemplate | None:
    """Smallest template of ``chip`` whose share of the chip's AI cores covers ``fraction``."""
    fits = [t for t in templates if t.chip_model == chip and t.ai_cores / chip_cores + _EPS >= fraction]
    return min(fits, key=lambda t: (t.ai_cores, t.memory_mb, t.ai_cpus, t.name)) if fits else None


def prepare_jobs(
    rows: list[TraceRow],
    cluster: ClusterSpec,
    policy: Policy,
    epoch: float,
    class_map: Mapping[str, str] | None = None,
) -> tuple[list[SimJob], Counter[str]]:
    """Turn trace rows into jobs for ``decide``; rows that can never run are counted by reason.

    A job's priority class is the row's ``priority_class``, else ``class_map[tenant]``, else
    the policy's default class.
    """
    skipped: Counter[str] = Counter()
    jobs: list[SimJob] = []
    by_chip = cluster.devices_by_chip()
    chip_cores = {g.chip_model: g.ai_cores for g in cluster.node_groups}
    vnpu_chips = [c for c in chip_cores if any(t.chip_model == c for t in cluster.vnpu_templates)]
    templates = list(cluster.vnpu_templates)
    classes = {pc.name for pc in policy.priority_classes}
    default_class = _default_class(policy)
    # The inventory laid out once; each shape and each job's limits answered once.
    shapes = Shapes(policy, cluster.build_nodes(), cluster.templates())
    verdicts: dict[tuple[object, ...], bool] = {}
    for row in rows:
        if row.duration_s <= 0:
            skipped[SKIP_ZERO_DURATION] += 1
            continue
        cls = row.priority_class or (class_map or {}).get(row.tenant) or default_class
        if classes and cls not in classes:
            skipped[SKIP_UNKNOWN_CLASS] += 1
            continue
        chip = row.chip_model
        if chip is not None and chip not in by_chip:
            skipped[SKIP_NEVER_RUNNABLE] += 1  # a chip model the inventory does not have
            continue
        num = row.num_devices
        template: VnpuTemplate | None = None
        units = float(num)
        milli = row.gpu_milli
        if milli is not None and 0 < milli < 1000 and num <= 1:
            vchip = chip if chip is not None else (vnpu_chips[0] if vnpu_chips else None)
            if vchip is not None:
                template = _vnpu_for(milli / 1000.0, vchip, chip_cores[vchip], templates)
                if template is not None:
                    chip = vchip
                    units = template.ai_cores / chip_cores[vchip]
            num, units = 1, (units if template is not None else 1.0)
        if num <= 0:
            skipped[SKIP_NO_DEVICES] += 1
            continue
        tmpl_name = template.name if template is not None else None
        key = (row.tenant, chip, tmpl_name, num, cls, row.duration_s)
        runnable = verdicts.get(key)
        if runnable is None:
            request = Request(
                team=row.tenant,
                num_devices=num,
                chip_model=chip,
                vnpu_template=tmpl_name,
                priority_class=cls,
                duration_s=row.duration_s,
                estimated_duration_s=row.duration_s,
            )
            runnable = verdicts[key] = check(policy, request, shapes) is None
        if not runnable:
            skipped[SKIP_NEVER_RUNNABLE] += 1
            continue
        job_id = len(jobs) + 1
        state = JobState(
            id=job_id,
            team=row.tenant,
            user=row.user,
            priority_class=cls,
            num_devices=num,
            submitted_at=epoch + row.submit_time_s,
            estimated_duration_s=row.duration_s,
            vnpu_template=template.name if template is not None else None,
            chip_model=chip,
            checkpoint_interval_s=row.checkpoint_interval_s,
        )
        jobs.append(SimJob(state=state, key=row.job_id, duration=row.duration_s, units=units))
    shapes.close()
    return jobs, skipped


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


# --- the FIFO baseline ------------------------------------------------------------------------


class FifoBaseline:
    """Strict first-come first-served: no priorities, quotas, backfill or preemption.

    Jobs start in submission order; the first job that does not fit blocks all
    later ones. Placement is first fit in node order: a job of up to one node's
    devices goes on the first node with enough free devices; a larger job takes
    whole free nodes (and the rest on one more node). A vNPU job goes on the
    first device with room for its template. It reads the simulator's
    :class:`Occupancy` instead of rebuilding it from the snapshot, to stay cheap.
    """

    def __init__(self, occupancy: Occupancy, queue: Mapping[int, JobState]) -> None:
        self.occ = occupancy
        #: The simulator's pending jobs in submission order (the snapshot's list is unordered).
        self.queue = queue
        self.nodes_by_chip: dict[str, list[int]] = defaultdict(list)
        for i, chip in enumerate(occupancy.node_chip):
            self.nodes_by_chip[chip].append(i)
        self.per_node = {
            chip: max(len(occupancy.node_devices[i]) for i in nodes) for chip, nodes in self.nodes_by_chip.items()
        }
        #: True when the last call left a job at the head of the queue: until devices are
        #: freed nothing can start, whatever arrives behind it.
        self.blocked = False

    def __call__(self, snapshot: Snapshot) -> Decisions:
        out = Decisions()
        occ = self.occ
        taken: list[tuple[JobState, tuple[Slot, ...]]] = []
        self.blocked = False
        # ``queue`` is in submission order (no requeues without preemption).
        for job in self.queue.values():
            slots = self._place(job)
            if slots is None:
                out.waiting[job.id] = Wait("Resources", "first-come first-served: head of the queue")
                self.blocked = True
                break
            out.starts.append(Start(job.id, slots))
            occ.take(job, slots)  # reserve now so the next job sees it; undone below
            taken.append((job, slots))
        for job, slots in taken:  # the simulator applies the starts itself
            saved = job.slots
            job.slots = slots
            occ.give_back(job)
            job.slots = saved
        return out

    def _place(self, job: JobState) -> tuple[Slot, ...] | None:
        occ = self.occ
        if job.vnpu_template is not None:
            return self._place_vnpu(job)
        n = job.num_devices
        chips = [job.chip_model] if job.chip_model is not None else list(occ.whole_free_by_chip)
        for chip in chips:
            if occ.whole_free_by_chip.get(chip, 0) < n:
                continue
            nodes = self.nodes_by_chip[chip]
            per_node = self.per_node[chip]
            if n <= per_node:
                for i in nodes:
                    if occ.node_whole_free[i] >= n:
                        return self._take_on(i, n)
                continue
            full = [i for i in nodes if occ.node_whole_free[i] == len(occ.node_devices[i])]
            whole, rest = divmod(n, per_node)
            if len(full) < whole:
                continue
            picked: list[Slot] = []
            for i in full[:whole]:
                picked.extend(self._take_on(i, per_node))
            if rest:
                extra = next((i for i in nodes if i not in full[:whole] and occ.node_whole_free[i] >= rest), None)
                if extra is None:
                    continue
                picked.extend(self._take_on(extra, rest))
            return tuple(picked)
        return None

    def _take_on(self, node: int, n: int) -> tuple[Slot, ...]:
        occ = self.occ
        out = []
        for dev in occ.node_devices[node]:
            if occ.usable[dev] and occ.is_whole_free(dev):
                out.append(Slot(dev))
                if len(out) == n:
                    break
        return tuple(out)

    def _place_vnpu(self, job: JobState) -> tuple[Slot, ...] | None:
        occ = self.occ
        assert job.vnpu_template is not None
        t = occ.templates.get((job.chip_model or "", job.vnpu_template))
        if t is None:
            return None
        fallback = None
        for dev in range(1, len(occ.known)):
            if not occ.known[dev] or not occ.usable[dev] or occ.chip[dev] != t.chip_model:
                continue
            if (
                t.ai_cores <= occ.free_cores[dev]
                and t.memory_mb <= occ.free_mem[dev]
                and t.ai_cpus <= occ.free_cpus[dev]
            ):
                if not occ.is_whole_free(dev):
                    return (Slot(dev, t.name),)
                if fallback is None:
                    fallback = dev
        return (Slot(fallback, t.name),) if fallback is not None else None


class EasyBaseline(FifoBaseline):
    """EASY backfill: FIFO order, one reservation for the first blocked job, backfill around it.

    Jobs are taken in submission order and placed as :class:`FifoBaseline` places
    them. The first job that does not fit now gets a reservation: its *shadow
    time* is the earliest estimated end of running jobs after which the FIFO
    placement finds room for it, and the cards that placement picks then are its
    reserved cards. Every later job starts now if it fits now and either ends (by
    its estimate) by the shadow time or fits without touching a reserved card.
    No priorities, quotas, fair share or preemption: a fixed reference, like FIFO.

    The shadow is found by giving the running jobs' cards back to the simulator's
    :class:`Occupancy` in order of estimated end until the job fits, then taking
    them again, so it sees exactly the placement rules of the starts.
    """

    def __init__(self, occupancy: Occupancy, queue: Mapping[int, JobState], running: OrderedJobs) -> None:
        super().__init__(occupancy, queue)
        self.running = running
        #: The reservation of the last call: (job id, shadow time, reserved device ids). It stays
        #: valid until a run ends (backfilled jobs never delay it), so it is kept until then.
        self.reservation: tuple[int, float, frozenset[int]] | None = None

    def __call__(self, snapshot: Snapshot) -> Decisions:
        out = Decisions()
        occ = self.occ
        now = snapshot.now.timestamp()
        if snapshot.running_delta is None or snapshot.running_delta.ended:
            self.reservation = None  # cards came back: the shadow may be earlier
        taken: list[tuple[JobState, tuple[Slot, ...]]] = []
        head: JobState | None = None
        shadow = math.inf
        reserved: frozenset[int] = frozenset()
        # Cards only get fewer during a call: once ``n`` cards of a shape did not fit (anywhere, or
        # off the reserved cards), no later job of that shape with ``n`` or more fits either.
        no_fit: dict[tuple[str | None, str | None], int] = {}
        no_fit_off: dict[tuple[str | None, str | None], int] = {}
        for job in self.queue.values():
            if occ.devices_with_room <= 0:
                break  # nothing more can start; the rest keep their place in line
            if head is None:
                slots = self._place(job)
                if slots is not None:
                    self._start_now(job, slots, out, taken)
                    continue
                head = job
                res = self.reservation
                if res is None or res[0] != job.id:
                    res = self.reservation = (job.id, *self._shadow(job, now))
                shadow, reserved = res[1], res[2]
                out.waiting[job.id] = Wait("Resources", "EASY backfill: first in line, cards reserved")
                continue
            shape = (job.chip_model, job.vnpu_template)
            n = job.num_devices
            slots = None
            if n >= no_fit.get(shape, math.inf):
                pass
            elif now + job.estimated_duration_s <= shadow + _EPS:
                slots = self._place(job)  # ends before the reserved cards are needed
                if slots is None:
                    no_fit[shape] = n
            elif n < no_fit_off.get(shape, math.inf):
                slots = self._place_avoiding(job, reserved)
                if slots is None:
                    no_fit_off[shape] = n
            if slots is None:
                out.waiting[job.id] = Wait("Resources", "EASY backfill: behind the first job in line")
                continue
            self._start_now(job, slots, out, taken)
        for job, slots in taken:  # the simulator applies the starts itself
            saved = job.slots
            job.slots = slots
            occ.give_back(job)
            job.slots = saved
        if head is None:
            self.reservation = None
        return out

    def _start_now(
        self,
        job: JobState,
        slots: tuple[Slot, ...],
        out: Decisions,
        taken: list[tuple[JobState, tuple[Slot, ...]]],
    ) -> None:
        out.starts.append(Start(job.id, slots))
        self.occ.take(job, slots)  # reserve now so the next job sees it; undone at the end of the call
        taken.append((job, slots))

    def _shadow(self, job: JobState, now: float) -> tuple[float, frozenset[int]]:
        """When and on which cards ``job`` could start if running jobs end as estimated.

        ``(inf, {})`` if it does not fit even on the empty cluster (no reservation: later
        jobs are not held back by a job that can never start under this placement).
        """
        occ = self.occ

        def est_end(js: JobState) -> float:
            started = js.started_at if js.started_at is not None else now
            return max(started + (js.estimated_duration_s or 0.0), now)

        released: list[JobState] = []
        found: tuple[float, frozenset[int]] = (math.inf, frozenset())
        try:
            for js in sorted(self.running.items, key=est_end):
                occ.give_back(js)
                released.append(js)
                slots = self._place(job)
                if slots is not None:
                    found = (est_end(js), frozenset(s.device_id for s in slots))
                    break
        finally:
            for js in reversed(released):
                occ.take(js, js.slots)
        return found

    def _place_avoiding(self, job: JobState, reserved: frozenset[int]) -> tuple[Slot, ...] | None:
        """The FIFO placement of ``job`` with the reserved cards' free capacity masked out."""
        occ = self.occ
        masked: list[tuple[int, int, int, int]] = []
        for dev in reserved:
            if occ.free_cores[dev] > 0 or occ.free_mem[dev] > 0:
                room = (dev, occ.free_cores[dev], occ.free_mem[dev], occ.free_cpus[dev])
                occ._use(*room)
                masked.append(room)
        try:
            return self._place(job)
        finally:
            for room in reversed(masked):
                occ._free(*room)


# --- usage meters -----------------------------------------------------------------------------


class Meter:
    """Integral of a piecewise-constant rate per key (device-seconds), updated on rate changes."""

    __slots__ = ("cum", "rate", "since")

    def __init__(self) -> None:
        self.cum: dict[Any, float] = defaultdict(float)
        self.rate: dict[Any, float] = defaultdict(float)
        self.since: dict[Any, float] = {}

    def add(self, key: Any, delta: float, t: float) -> None:
        last = self.since.get(key, t)
        self.cum[key] += self.rate[key] * (t - last)
        self.rate[key] += delta
        if abs(self.rate[key]) < _EPS:
            self.rate[key] = 0.0
        self.since[key] = t

    def value(self, key: Any, t: float) -> float:
        return self.cum.get(key, 0.0) + self.rate.get(key, 0.0) * (t - self.since.get(key, t))


class DecayedMeter:
    """Usage with exponential decay (half-life ``h``), integrated exactly, in device-hours.

    Matches the database tick's ``_usage``: each device-second counts
    ``2^(-(now - t)/h)``. (The tick also ignores allocations that ended more
    than four half-lives ago; the difference is under 1/16 of that old usage.)
    """

    __slots__ = ("k", "rate", "since", "value_at")

    def __init__(self, half_life_s: float) -> None:
        self.k = math.log(2) / half_life_s if half_life_s > 0 else 0.0
        self.value_at: dict[Any, float] = {}
        self.rate: dict[Any, float] = {}
        self.since: dict[Any, float] = {}

    def _at(self, key: Any, t: float) -> float:
        v = self.value_at.get(key, 0.0)
        dt = t - self.since.get(key, t)
        r = self.rate.get(key, 0.0)
        if not self.k:
            return v + r * dt / 3600.0
        d = math.exp(-self.k * dt)
        return v * d + r * (1.0 - d) / self.k / 3600.0

    def add(self, key: Any, delta: float, t: float) -> None:
        self.value_at[key] = self._at(key, t)
        self.rate[key] = self.rate.get(key, 0.0) + delta
        self.since[key] = t

    def snapshot(self, t: float) -> dict[Any, float]:
        return {key: self._at(key, t) for key in self.value_at}


# --- policy clock -----------------------------------------------------------------------------


class PolicyClock:
    """Times at which the quota in force may change: schedule edges and month starts."""

    def __init__(self, policy: Policy) -> None:
        self.tz = ZoneInfo(policy.timezone)
        teams = [*policy.teams.values(), policy.defaults]
        #: Minutes after local midnight at which some window opens or closes (any day: an
        #: extra edge only costs one decide call).
        self.minutes = sorted({m % 1440 for tp in teams for s in tp.schedules for m in (s.start_min, s.end_min)})
        self.monthly = any(tp.quota.device_hours_per_month is not None for tp in teams) or any(
            "deviceHoursPerMonth" in s.quota for tp in teams for s in tp.schedules
        )

    @property
    def active(self) -> bool:
        return bool(self.minutes) or self.monthly

    def next_after(self, t: float) -> float:
        """The first edge strictly after ``t`` (epoch seconds); ``inf`` if the policy has none."""
        best = math.inf
        local = datetime.fromtimestamp(t, tz=self.tz)
        if self.minutes:
            midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
            for day in range(2):
                base = (midnight + timedelta(days=day)).replace(tzinfo=None)
                for minute in self.minutes:
                    # wall-clock arithmetic, then localised (DST-safe enough for edges)
                    edge = (base + timedelta(minutes=minute)).replace(tzinfo=self.tz).timestamp()
                    if edge > t:
                        best = min(best, edge)
                        break
                if best < math.inf:
                    break
        if self.monthly:
            best = min(best, self.month_end(t))
        return best

    def month_start(self, t: float) -> float:
        local = datetime.fromtimestamp(t, tz=self.tz)
        return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()

    def month_end(self, t: float) -> float:
        local = datetime.fromtimestamp(t, tz=self.tz)
        year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
        return datetime(year, month, 1, tzinfo=self.tz).timestamp()


def _quota_in_force(policy: Policy, team: str, at: datetime) -> Quota:
    return quota_at(policy, team, at)[0]


# --- the simulation ---------------------------------------------------------------------------


@dataclass
class _TeamStats:
    jobs: int = 0
    started: int = 0
    preemptions: int = 0
    lost_device_h: float = 0.0
    waits: list[float] = field(default_factory=list)


class Simulation:
    """One replay of prepared jobs through one decide function."""

    def __init__(
        self,
        jobs: list[SimJob],
        cluster: ClusterSpec,
        policy: Policy,
        *,
        decide_fn: DecideFn | None = None,
        fifo: bool = False,
        baseline: str | None = None,
        epoch: float = DEFAULT_START.timestamp(),
        progress: ProgressFn | None = None,
        check_quota: bool = True,
        promises: bool = True,
        estimates_every: float = 0.0,
    ) -> None:
        """``promises=False`` does not hand the core's promises back (what a caller without them gets).

        ``baseline`` (one of :data:`BASELINES`) replays under that fixed reference scheduler
        instead of ``decide``; ``fifo=True`` is ``baseline="fifo"``.

        ``estimates_every`` > 0: every that many simulated seconds, the first decide
        after it is followed by the tick's planning pass (``estimate.estimate_starts``,
        ``ESTIMATE_LIMIT`` jobs), and each job's first estimate is compared with its
        start (``metrics["estimates"]``): how far the time a user was shown was off.
        """
        self.jobs = jobs
        self.by_id = {j.state.id: j for j in jobs}
        self.cluster = cluster
        self.policy = policy
        self.epoch = epoch
        self.progress = progress
        self.nodes = cluster.build_nodes()
        self.templates = cluster.templates()
        self.occ = Occupancy(self.nodes, self.templates)
        #: Nothing in a replay changes the inventory: one key for all its snapshots (see Snapshot).
        self.inventory_key = object()
        self.pending: dict[int, JobState] = {}
        #: Cards promised to waiting jobs by the last decide, handed back to the next (``Snapshot.promises``).
        self.promises: dict[int, Promise] = {}
        self.keep_promises = promises
        self.running_list = OrderedJobs()
        if fifo:
            baseline = "fifo"
        if baseline is not None and baseline not in BASELINES:
            raise ValueError(f"unknown baseline {baseline!r} (known: {', '.join(BASELINES)})")
        #: Which scheduler decides: ``"engine"`` or the name of a baseline.
        self.scheduler = baseline or "engine"
        self.fifo_baseline = FifoBaseline(self.occ, self.pending) if baseline == "fifo" else None
        self.easy_baseline = EasyBaseline(self.occ, self.pending, self.running_list) if baseline == "easy" else None
        if self.fifo_baseline is not None:
            self.decide_fn: DecideFn = self.fifo_baseline
        elif self.easy_baseline is not None:
            self.decide_fn = self.easy_baseline
        elif decide_fn is not None:
            self.decide_fn = decide_fn
        else:
            from scheduling.engine.decide import decide

            self.decide_fn = decide
        #: A fixed reference scheduler: no quotas checked, no fair-share usage, no preemption.
        self.reference = reference = baseline is not None
        self.check_quota = check_quota and not reference
        self.clock = PolicyClock(policy)
        all_teams = [*policy.teams.values(), policy.defaults]
        self.may_preempt = not reference and (
            any(pc.preempts for pc in policy.priority_classes)
            or any(tp.quota.guaranteed for tp in all_teams)
            or any(s.quota.get("guaranteed") for tp in all_teams for s in tp.schedules)
        )

        #: ``self.pending`` (set above): pending jobs in queue order (submission, requeues at the end).
        #: The same jobs as the lists handed to every snapshot, kept in place (no copy per event).
        self.pending_list = JobList()
        #: What changed in ``running_list`` since the last snapshot (see ``RunningDelta``): runs
        #: the core saw end, runs it has not seen yet; the last snapshot's delta version.
        self.delta_ended: dict[int, JobState] = {}
        self.delta_started: dict[int, JobState] = {}
        self.delta_version = 0
        self.ends: list[tuple[float, int, int]] = []  # (end time, job id, run token)
        self.deadlines: list[tuple[float, int, int]] = []
        self.next_clock = math.inf

        self.busy = Meter()  # key None: all teams, card equivalents
        self.team_use = Meter()
        self.team_chip_units: dict[tuple[str, str], float] = defaultdict(float)
        self.team_units: dict[str, float] = defaultdict(float)
        self.fair_usage = DecayedMeter(policy.ordering.usage_half_life_s)
        self.month_base: dict[str, float] = {}
        self.month_start = -math.inf

        teams = sorted({j.state.team for j in jobs})
        self.teams = teams
        #: The priority classes of the replayed jobs.
        self.classes = sorted({j.state.priority_class for j in jobs})
        self.team_stats = {t: _TeamStats() for t in teams}
        self.class_waits: dict[str, list[float]] = defaultdict(list)
        self.waits: list[float] = []
        #: Each started job's wait less the time its own team's limits held it (``wait_s.beyond_own_limits``).
        self.waits_beyond: list[float] = []
        #: Jobs the last decide left waiting for their own team's limits, and since when.
        self._own_waiting: list[SimJob] = []
        self._own_since = 0.0
        self.team_pending: dict[str, int] = defaultdict(int)
        self.entitled = _entitlements(policy, teams)

        # fairness windows
        self.window_start = -math.inf
        self.window_used: dict[str, float] = {}
        self.window_active: set[str] = set()
        self.jain: list[float] = []
        self.windows = 0
        # backlogged fairness: Jain's index of the current holdings among teams with waiting jobs,
        # integrated over time (``_advance``); recomputed only after the holdings or the queue changed
        self.backlog_dirty = True
        self.backlog_index: float | None = None
        self.backlog_integral = 0.0
        self.backlog_s = 0.0

        # quota overrun
        self.over: dict[str, float] = {}  # team -> device units above max, since ``over_since``
        self.over_since = 0.0
        self.overrun_device_s = 0.0
        self.quota_violations = 0
        self.violation_examples: list[str] = []

        self.n_started = self.n_completed = self.n_cancelled = self.n_requeued = 0
        self.n_preemptions = self.n_stopped = self.n_forced = self.n_finished_in_grace = 0
        self.n_called_off = 0
        self.lost_device_h = 0.0
        #: Device-hours lost by the victims of each priority class.
        self.class_lost: dict[str, float] = defaultdict(float)
        self.decide_calls = self.decide_skipped = 0
        self.decide_s = 0.0
        self.last_waiting: dict[int, Wait] = {}
        self.done = 0
        self.now = 0.0
        self.estimates_every = estimates_every if not reference else 0.0
        self.next_estimate = -math.inf
        self.estimate_passes = 0
        self.estimate_s = 0.0
        #: Start minus first estimate, per job that had one and started.
        self.estimate_errors: list[float] = []

    # -- event loop ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        jobs = self.jobs
        n_jobs = len(jobs)
        sub = 0
        first = jobs[0].state.submitted_at if jobs else self.epoch
        self.now = first
        self._open_window(first)
        if self.clock.active:
            self.next_clock = self.clock.next_after(first - 1e-6)
            self.month_start = self.clock.month_start(first)
        last_activity = first
        events = 0
        while True:
            t = math.inf
            if sub < n_jobs:
                t = jobs[sub].state.submitted_at
            end_t = self._peek(self.ends)
            dead_t = self._peek(self.deadlines)
            t = min(t, end_t, dead_t)
            if t == math.inf and not self.pending:
                break
            clock_t = self.next_clock if self.pending or t < math.inf else math.inf
            if clock_t <= t:
                if t == math.inf and clock_t > last_activity + CLOCK_TAIL_S:
                    break
                t = clock_t
            if t == math.inf:
                break
            self._advance(t)
            freed = False
            while self.ends and self.ends[0][0] <= t:
                _, job_id, token = heapq.heappop(self.ends)
                sj = self.by_id[job_id]
                if sj.status == "running" and sj.run_token == token:
                    self._finish(sj, t)
                    freed = True
            submitted = False
            while sub < n_jobs and jobs[sub].state.submitted_at <= t:
                self._submit(jobs[sub])
                sub += 1
                submitted = True
            deadline_due = self._peek(self.deadlines) <= t
            clock_edge = False
            if self.next_clock <= t:
                clock_edge = True
                self._month_roll(t)
                self.next_clock = self.clock.next_after(t)
            if freed or submitted or deadline_due:
                last_activity = t
            if self._decide_needed(freed, deadline_due, clock_edge):
                if self._decide_at(t):
                    last_activity = t
            else:
                self.decide_skipped += 1
            events += 1
            if self.progress is not None and events % 256 == 0:
                self.progress(self.done, n_jobs)
        end = max(self.now, first)
        self._advance(end)
        self._close_window(end, final=True)
        if self.progress is not None:
            self.progress(n_jobs, n_jobs)
        return self._metrics(first, end, time.perf_counter() - wall0)

    def _peek(self, heap: list[tuple[float, int, int]]) -> float:
        """Time of the heap's first live entry (an end or deadline of a run that is still on)."""
        by_id = self.by_id
        while heap:
            _, job_id, token = heap[0]
            sj = by_id[job_id]
            if sj.status == "running" and sj.run_token == token:
                return heap[0][0]
            heapq.heappop(heap)
        return math.inf

    def _decide_needed(self, freed: bool, deadline_due: bool, clock_edge: bool) -> bool:
        """Whether ``decide`` could change anything now.

        Provably not, when nothing was freed, no grace deadline or quota clock
        edge is due, no device has any room left (so no start can be placed: a
        start must fit in free capacity) and the policy cannot preempt (no
        priority class preempts another and no team has a guarantee to reclaim).
        """
        if not self.pending:
            return deadline_due
        if freed or deadline_due or clock_edge or self.may_preempt:
            return True
        if self.fifo_baseline is not None and self.fifo_baseline.blocked:
            return False  # strict FIFO: the blocked head still does not fit
        return self.occ.devices_with_room > 0

    def _decide_at(self, t: float) -> bool:
        """Call decide at ``t`` (again while stops free cards it did not plan with); True if anything started."""
        started_any = False
        for _ in range(MAX_DECIDES_PER_INSTANT):
            snapshot = Snapshot(
                now=datetime.fromtimestamp(t, tz=UTC),
                policy=self.policy,
                nodes=self.nodes,
                pending=self.pending_list.items,
                running=self.running_list.items,
                templates=self.templates,
                usage=self.fair_usage.snapshot(t) if not self.reference else {},
                month_device_hours=self._month_hours(t) if self.clock.monthly else {},
                inventory_key=self.inventory_key,
                running_delta=self._running_delta(),
                promises=self.promises if self.keep_promises else None,
            )
            c0 = time.perf_counter()
            decisions = self.decide_fn(snapshot)
            self.decide_s += time.perf_counter() - c0
            self.decide_calls += 1
            if self.estimates_every > 0 and t >= self.next_estimate and decisions.waiting:
                self._sample_estimates(snapshot, decisions, t)
            if self.keep_promises:
                self.promises = decisions.promises
            self._count_own_limits(decisions, t)
            again, started_teams = self._apply(decisions, t, snapshot.now)
            started_any = started_any or bool(started_teams)
            self.last_waiting = decisions.waiting
            if self.check_quota and (started_teams or self.over):
                self._check_quota(started_teams, snapshot.now)
            if not again or not self.pending:
                break
        return started_any

    def _count_own_limits(self, decisions: Decisions, t: float) -> None:
        """Charge the time since the last decide to the jobs it left waiting for their own team's limits.

        A wait holds until the next decide (nothing changes in between), so each such
        job's ``own_limits_s`` grows by the time between the two calls.
        """
        since = self._own_since
        for sj in self._own_waiting:
            sj.own_limits_s += t - since
        by_id = self.by_id
        self._own_waiting = [
            by_id[jid] for jid, wait in decisions.waiting.items() if wait.reason in reasons.QUOTA_REASONS
        ]
        self._own_since = t

    def _sample_estimates(self, snapshot: Snapshot, decisions: Decisions, t: float) -> None:
        """Run the planning pass on a copy of the waits; remember each job's first estimate."""
        from scheduling.engine.estimate import estimate_starts

        self.next_estimate = t + self.estimates_every
        waiting = dict(decisions.waiting)  # the decisions stay as decided (the pass replaces waits, never edits)
        copy = Decisions(decisions.starts, decisions.preemptions, decisions.evictions, waiting, decisions.promises)
        c0 = time.perf_counter()
        estimate_starts(snapshot, copy, ESTIMATE_LIMIT)
        self.estimate_s += time.perf_counter() - c0
        self.estimate_passes += 1
        by_id = self.by_id
        for job_id, wait in copy.waiting.items():
            if wait.estimated_start is not None:
                sj = by_id[job_id]
                if sj.first_estimate is None and sj.first_start is None:
                    sj.first_estimate = wait.estimated_start

    def _running_delta(self) -> RunningDelta:
        """The running list's changes since the last snapshot (and start counting anew)."""
        delta = RunningDelta(
            self.delta_version,
            self.delta_version + 1,
            tuple(self.delta_ended.values()),
            tuple(self.delta_started.values()),
            in_order=True,
        )
        self.delta_version += 1
        self.delta_ended.clear()
        self.delta_started.clear()
        return delta

    def _apply(self, decisions: Decisions, t: float, now: datetime) -> tuple[bool, set[str]]:
        """Apply evictions, starts, preemptions; returns (decide again now?, teams that started)."""
        # ``again``: cards were freed (or a victim requeued) that this decide did not see as such.
        again = False
        for job_id in decisions.evictions:
            sj = self.by_id.get(job_id)
            if sj is None or sj.status != "running":
                raise SimulationError(f"decide evicted job {job_id}, which is not running")
            self._stop_victim(sj, t)
            # decide already re-planned the evicted cards; only a requeued victim is new to it
            again = again or sj.status == "pending"
        started_teams: set[str] = set()
        for start in decisions.starts:
            sj = self.by_id.get(start.job_id)
            if sj is None or sj.status != "pending":
                raise SimulationError(f"decide started job {start.job_id}, which is not pending")
            self._start(sj, start.slots, t)
            started_teams.add(sj.state.team)
        for job_id in decisions.called_off:  # decide cleared the deadline on our object already
            sj = self.by_id.get(job_id)
            if sj is None or sj.status != "running":
                raise SimulationError(f"decide called off the preemption of job {job_id}, which is not running")
            sj.state.preempt_deadline = None
            sj.state.preempted_for = None
            self.n_called_off += 1
        preempted_now: set[int] = set()
        for pre in decisions.preemptions:
            sj = self.by_id.get(pre.job_id)
            if sj is None or sj.status != "running":
                raise SimulationError(f"decide preempted job {pre.job_id}, which is not running")
            if sj.state.preempt_deadline is not None:
                continue  # already leaving; the first deadline stands (as in the tick)
            sj.state.preempt_deadline = pre.grace_deadline
            sj.state.preempted_for = pre.for_job
            preempted_now.add(pre.job_id)
            sj.preempted += 1
            self.n_preemptions += 1
            self.team_stats[sj.state.team].preemptions += 1
            heapq.heappush(self.deadlines, (pre.grace_deadline, sj.state.id, sj.run_token))
        # Safety net: a victim whose grace is over leaves even if decide forgot to evict it.
        while self.deadlines and self.deadlines[0][0] <= t:
            deadline, job_id, token = heapq.heappop(self.deadlines)
            sj = self.by_id[job_id]
            # (a preemption called off and decided again later has another deadline)
            if sj.status == "running" and sj.run_token == token and sj.state.preempt_deadline == deadline:
                if job_id not in preempted_now:
                    self.n_forced += 1  # its grace ran out before this decide, which did not evict it
                self._stop_victim(sj, t)
                again = True
        return again and self.occ.devices_with_room > 0, started_teams

    # -- job transitions -----------------------------------------------------------------------

    def _submit(self, sj: SimJob) -> None:
        js = sj.state
        self.pending[js.id] = js
        self.pending_list.add(js)
        self.team_pending[js.team] += 1
        self.window_active.add(js.team)
        self.team_stats[js.team].jobs += 1
        self.backlog_dirty = True

    def _start(self, sj: SimJob, slots: tuple[Slot, ...], t: float) -> None:
        js = sj.state
        sj.chip = self.occ.take(js, slots)
        del self.pending[js.id]
        self.pending_list.remove(js)
        self.team_pending[js.team] -= 1
        js.slots = tuple(slots)
        js.started_at = t
        js.preempt_deadline = None
        js.preempted_for = None
        self.running_list.add(js)
        self.delta_started[js.id] = js
        sj.status = "running"
        sj.run_token += 1
        heapq.heappush(self.ends, (t + sj.duration - sj.saved, js.id, sj.run_token))
        self._rate(sj, +sj.units, t)
        if sj.first_start is None:
            sj.first_start = t
            if sj.first_estimate is not None:
                self.estimate_errors.append(t - sj.first_estimate)
            wait = t - js.submitted_at
            self.waits.append(wait)
            self.waits_beyond.append(wait - sj.own_limits_s)
            self.class_waits[js.priority_class].append(wait)
            stats = self.team_stats[js.team]
            stats.waits.append(wait)
            stats.started += 1
            self.n_started += 1

    def _release(self, sj: SimJob, t: float) -> None:
        js = sj.state
        self.occ.give_back(js)
        self.running_list.remove(js)
        if self.delta_started.pop(js.id, None) is None:  # a run no snapshot has shown needs no word
            self.delta_ended[js.id] = js
        self._rate(sj, -sj.units, t)
        if js.team in self.over:
            self._check_quota(set(), datetime.fromtimestamp(t, tz=UTC))

    def _finish(self, sj: SimJob, t: float) -> None:
        if sj.state.preempt_deadline is not None:
            self.n_finished_in_grace += 1
        self._release(sj, t)
        sj.status = "completed"
        sj.end = t
        sj.state.preempt_deadline = None
        sj.state.preempted_for = None
        self.n_completed += 1
        self.done += 1

    def _stop_victim(self, sj: SimJob, t: float) -> None:
        js = sj.state
        assert js.started_at is not None
        lost = device_hours_lost(sj.units, js.started_at, t, js.checkpoint_interval_s)
        self.lost_device_h += lost
        self.team_stats[js.team].lost_device_h += lost
        self.class_lost[js.priority_class] += lost
        saved = last_checkpoint(js.started_at, t, js.checkpoint_interval_s) - js.started_at
        if saved > 0:
            # Its work up to its last checkpoint is kept: a restart runs the rest, and says so.
            sj.saved += saved
            js.estimated_duration_s = sj.duration - sj.saved
        self.n_stopped += 1
        self._release(sj, t)
        js.slots = ()
        js.started_at = None
        js.preempt_deadline = None
        js.preempted_for = None
        if self.policy.on_preempt == "cancel":
            sj.status = "cancelled"
            sj.end = t
            self.n_cancelled += 1
            self.done += 1
        else:
            sj.status = "pending"
            self.pending[js.id] = js
            self.pending_list.add(js)
            self.team_pending[js.team] += 1
            self.window_active.add(js.team)
            self.n_requeued += 1
            self.backlog_dirty = True

    def _rate(self, sj: SimJob, delta: float, t: float) -> None:
        js = sj.state
        self.busy.add(None, delta, t)
        self.team_use.add(js.team, delta, t)
        self.fair_usage.add((js.team, js.user), delta, t)
        self.team_units[js.team] += delta
        self.backlog_dirty = True
        self.team_chip_units[(js.team, sj.chip)] += delta

    # -- quota ---------------------------------------------------------------------------------

    def _check_quota(self, started_teams: set[str], now: datetime) -> None:
        """After a decide: a team that started a job must not be above its max in force."""
        for team in started_teams | set(self.over):
            quota = _quota_in_force(self.policy, team, now)
            excess = 0.0
            for key, cap in quota.max.items():
                if key == DEVICES:
                    used = self.team_units[team]
                elif key.startswith(DEVICES + "/"):
                    used = self.team_chip_units.get((team, key[len(DEVICES) + 1 :]), 0.0)
                else:
                    continue
                excess = max(excess, used - cap)
            if excess > _EPS:
                if team in started_teams and team not in self.over:
                    self.quota_violations += 1
                    if len(self.violation_examples) < 5:
                        self.violation_examples.append(f"{now.isoformat()}: team {team} {excess:g} devices over max")
                if team in started_teams or team in self.over:
                    self.over[team] = excess
            else:
                self.over.pop(team, None)

    def _month_hours(self, t: float) -> dict[str, float]:
        return {team: (self.team_use.value(team, t) - self.month_base.get(team, 0.0)) / 3600.0 for team in self.teams}

    def _month_roll(self, t: float) -> None:
        if not self.clock.monthly:
            return
        start = self.clock.month_start(t)
        if start > self.month_start:
            self.month_start = start
            self.month_base = {team: self.team_use.value(team, start) for team in self.teams}

    # -- time and fairness windows -------------------------------------------------------------

    def _advance(self, t: float) -> None:
        if self.backlog_dirty:
            self.backlog_index = self._backlogged_index()
            self.backlog_dirty = False
        if self.backlog_index is not None and t > self.now:
            self.backlog_integral += self.backlog_index * (t - self.now)
            self.backlog_s += t - self.now
        if self.over:
            self.overrun_device_s += sum(self.over.values()) * (t - self.now)
        while t >= self.window_start + FAIRNESS_WINDOW_S:
            self._close_window(self.window_start + FAIRNESS_WINDOW_S)
        self.now = t

    def _backlogged_index(self) -> float | None:
        """Jain's index, among the teams with a waiting job now, of cards held ÷ entitled fraction.

        ``None`` (the instant does not count) with fewer than two such teams (with an
        entitlement) or when none of them holds a card.
        """
        entitled = self.entitled
        backlogged = [team for team, n in self.team_pending.items() if n > 0 and entitled.get(team, 0.0) > 0]
        if len(backlogged) < 2:
            return None
        units = self.team_units
        return jain_index([max(units[team], 0.0) / entitled[team] for team in backlogged])

    def _open_window(self, t: float) -> None:
        self.window_start = t
        self.window_used = {team: self.team_use.value(team, t) for team in self.teams}
        self.window_active = {
            team for team in self.teams if self.team_pending[team] > 0 or self.team_units[team] > _EPS
        }

    def _close_window(self, t: float, final: bool = False) -> None:
        active = self.window_active
        if len(active) >= 2 and (not final or t > self.window_start):
            xs = [
                (self.team_use.value(team, t) - self.window_used[team]) / self.entitled[team]
                for team in active
                if self.entitled.get(team, 0) > 0
            ]
            index = jain_index(xs)
            if index is not None:
                self.jain.append(index)
                self.windows += 1
        if not final:
            self._open_window(t)

    # -- results -------------------------------------------------------------------------------

    def job_records(self) -> list[dict[str, Any]]:
        """One row per replayed job (for ``--jobs-out``): times relative to the start of the trace clock."""
        epoch = self.epoch
        out = []
        for sj in self.jobs:
            js = sj.state
            out.append(
                {
                    "job_id": sj.key,
                    "team": js.team,
                    "priority_class": js.priority_class,
                    "num_devices": js.num_devices,
                    "vnpu_template": js.vnpu_template or "",
                    "submit_time_s": js.submitted_at - epoch,
                    "first_start_s": "" if sj.first_start is None else sj.first_start - epoch,
                    "wait_s": "" if sj.first_start is None else sj.first_start - js.submitted_at,
                    "end_s": "" if sj.end is None else sj.end - epoch,
                    "status": sj.status,
                    "preemptions": sj.preempted,
                }
            )
        return out

    def _metrics(self, first: float, end: float, wall_s: float) -> dict[str, Any]:
        span = max(end - first, 0.0)
        total_devices = sum(1 for n in self.nodes for d in n.devices if d.usable)
        busy_s = self.busy.value(None, end)
        never: Counter[str] = Counter()
        unfinished = 0
        for js in self.pending.values():
            if self.by_id[js.id].first_start is not None:
                unfinished += 1  # requeued after a preemption, never restarted
                continue
            w = self.last_waiting.get(js.id)
            never[w.reason if w is not None else "NotConsidered"] += 1
        team_hours = {team: self.team_use.value(team, end) / 3600.0 for team in self.teams}
        all_hours = sum(team_hours.values())
        teams: dict[str, Any] = {}
        for team in self.teams:
            st = self.team_stats[team]
            used = team_hours[team] / all_hours if all_hours > 0 else 0.0
            ent = self.entitled.get(team, 0.0)
            teams[team] = {
                "jobs": st.jobs,
                "started": st.started,
                "device_hours": round(team_hours[team], 3),
                "usage_fraction": round(used, 6),
                "entitled_fraction": round(ent, 6),
                "usage_over_entitlement": round(used / ent, 6) if ent > 0 else None,
                "wait_s": _summary(st.waits),
                "preemptions": st.preemptions,
                "device_hours_lost": round(st.lost_device_h, 3),
            }
        jain_sorted = sorted(self.jain)
        return {
            "scheduler": self.scheduler,
            "policy": self.policy.name if not self.reference else None,
            "jobs": {
                "eligible": len(self.jobs),
                "started": self.n_started,
                "completed": self.n_completed,
                "cancelled": self.n_cancelled,
                "never_started": sum(never.values()),
                "never_started_by_reason": dict(sorted(never.items())),
                "requeued_not_restarted": unfinished,
            },
            "devices": {
                "total": total_devices,
                "utilisation": round(busy_s / (total_devices * span), 6) if span > 0 and total_devices else 0.0,
                "busy_device_hours": round(busy_s / 3600.0, 3),
            },
            "wait_s": {
                "overall": _summary(self.waits),
                "beyond_own_limits": _summary(self.waits_beyond),
                "by_class": {c: _summary(w) for c, w in sorted(self.class_waits.items())},
                "by_team": {team: teams[team]["wait_s"] for team in self.teams},
            },
            "teams": teams,
            "fairness": {
                "window_s": FAIRNESS_WINDOW_S,
                "windows": self.windows,
                "jain_mean": round(sum(self.jain) / len(self.jain), 6) if self.jain else None,
                "jain_p10": round(_percentile(jain_sorted, 10), 6) if jain_sorted else None,
                "jain_min": round(jain_sorted[0], 6) if jain_sorted else None,
                "backlogged": round(self.backlog_integral / self.backlog_s, 6) if self.backlog_s > 0 else None,
                "backlogged_s": round(self.backlog_s, 3),
            },
            "quota": {
                "checked": self.check_quota,
                "overrun_device_s": round(self.overrun_device_s, 3),
                "violations": self.quota_violations,
                "examples": self.violation_examples,
            },
            "preemption": {
                "preemptions": self.n_preemptions,
                "victims_stopped": self.n_stopped,
                "forced_stops": self.n_forced,
                "finished_in_grace": self.n_finished_in_grace,
                "called_off": self.n_called_off,
                "requeued": self.n_requeued,
                "cancelled": self.n_cancelled,
                "device_hours_lost": round(self.lost_device_h, 3),
                "device_hours_lost_by_team": {team: teams[team]["device_hours_lost"] for team in self.teams},
                "device_hours_lost_by_class": {c: round(self.class_lost[c], 3) for c in self.classes},
            },
            "decide": {
                "calls": self.decide_calls,
                "skipped": self.decide_skipped,
                "seconds": round(self.decide_s, 3),
            },
            **({"estimates": self._estimate_metrics()} if self.estimates_every > 0 else {}),
            "start": datetime.fromtimestamp(first, tz=UTC).isoformat(),
            "end": datetime.fromtimestamp(end, tz=UTC).isoformat(),
            "span_s": round(span, 3),
            "wall_s": round(wall_s, 3),
        }

    def _estimate_metrics(self) -> dict[str, Any]:
        """How far started jobs' first estimates were off (start minus estimate: > 0 is late)."""
        errors = sorted(self.estimate_errors)
        late = [e for e in errors if e > 60.0]
        early = [-e for e in errors if e < -60.0]
        absolute = sorted(abs(e) for e in errors)
        n = len(errors)
        return {
            "every_s": self.estimates_every,
            "passes": self.estimate_passes,
            "seconds": round(self.estimate_s, 3),
            "jobs": n,
            "error_s": {f"p{q}": round(_percentile(errors, q), 3) if errors else None for q in (5, 25, 50, 75, 95)},
            "abs_error_s": _summary(absolute),
            "within_60s": round(sum(1 for e in absolute if e <= 60.0) / n, 6) if n else None,
            "within_1h": round(sum(1 for e in absolute if e <= 3600.0) / n, 6) if n else None,
            "started_later": {"share": round(len(late) / n, 6) if n else None, "by_s": _summary(late)},
            "started_sooner": {"share": round(len(early) / n, 6) if n else None, "by_s": _summary(early)},
        }


def _entitlements(policy: Policy, teams: list[str]) -> dict[str, float]:
    """Each team's entitled fraction of the cluster among ``teams``, from shares.

    Teams with a department share their department's part of the cluster in
    proportion to their own shares; departments and teams without one split the
    cluster in proportion to their shares.
    """
    top: dict[str, float] = {}
    within: dict[str, dict[str, float]] = defaultdict(dict)
    for team in teams:
        tp = policy.team(team)
        dept = tp.department if tp.department and tp.department in policy.departments else None
        if dept is None:
            top["team:" + team] = max(tp.shares, 0.0)
            within["team:" + team][team] = 1.0
        else:
            top["dept:" + dept] = max(policy.departments[dept], 0.0)
            within["dept:" + dept][team] = max(tp.shares, 0.0)
    total = sum(top.values())
    out: dict[str, float] = {}
    for key, members in within.items():
        part = top[key] / total if total > 0 else 0.0
        inner = sum(members.values())
        for team, shares in members.items():
            out[team] = part * shares / inner if inner > 0 else 0.0
    return out


def jain_index(xs: list[float]) -> float | None:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all equal, 1/n when one has all.

    ``None`` for no values or all zero (nobody used anything: fairness is undefined).
    """
    squares = sum(x * x for x in xs)
    if not xs or squares <= 0:
        return None
    total = sum(xs)
    return total * total / (len(xs) * squares)


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) on sorted ``values``."""
    if not values:
        return 0.0
    pos = (len(values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    s = sorted(values)
    return {
        "count": len(s),
        "mean": round(sum(s) / len(s), 3),
        "p50": round(_percentile(s, 50), 3),
        "p95": round(_percentile(s, 95), 3),
        "p99": round(_percentile(s, 99), 3),
        "max": round(s[-1], 3),
    }


# --- public entry points ----------------------------------------------------------------------


def run_simulation(
    trace_rows: Iterable[TraceRow | Mapping[str, Any]],
    cluster: ClusterSpec | Mapping[str, Any],
    policy: Policy,
    *,
    baseline: str | Sequence[str] | None = None,
    progress: ProgressFn | None = None,
    start: datetime = DEFAULT_START,
    class_map: Mapping[str, str] | None = None,
    job_records: bool = False,
    decide_fn: DecideFn | None = None,
    promises: bool = True,
    estimates_every: float = 0.0,
) -> dict[str, Any]:
    """Replay ``trace_rows`` on ``cluster`` under ``policy`` through ``decide``.

    Returns ``{"input": {...}, "policy": metrics}``; with ``baseline="fifo"``
    also ``"baseline"`` (the same jobs under strict FIFO) and ``"comparison"``
    (:func:`compare` of policy against baseline). ``baseline`` may name several of
    :data:`BASELINES` (a list, or ``"fifo,easy"``): ``"baseline"`` and ``"comparison"``
    are then the first one's, and ``"baselines"`` / ``"comparisons"`` hold every one by
    name (a single baseline adds neither, so ``baseline="fifo"`` reads as it always did).
    ``progress`` is called as ``progress(done_jobs, total_jobs)``; with baselines the
    runs report in turn. ``start`` is the wall-clock time of trace second 0 (time-of-day quotas and
    monthly budgets follow it). ``class_map`` gives rows without a ``priority_class``
    one by tenant. ``job_records`` adds ``"job_records": {"policy": [...], "baseline": [...]}``,
    one dict per job (:meth:`Simulation.job_records`; a further baseline's under ``"baseline-<name>"``).
    ``decide_fn`` replaces the core (tests only);
    ``promises=False`` drops the promises ``decide`` returns instead of handing them back
    (``snapshot.Promise``; for comparing with a core that has none). ``estimates_every`` > 0
    samples the planning pass of estimated starts and adds ``"estimates"`` to the metrics
    (see :class:`Simulation`).
    """
    names = parse_baselines(baseline)
    rows = normalise_rows(trace_rows)
    spec = cluster if isinstance(cluster, ClusterSpec) else parse_cluster(cluster)
    epoch = start.timestamp()
    jobs, skipped = prepare_jobs(rows, spec, policy, epoch, class_map)
    info = {
        "jobs_total": len(rows),
        "jobs_eligible": len(jobs),
        "skipped": sum(skipped.values()),
        "skipped_by_reason": dict(sorted(skipped.items())),
        "never_runnable": skipped[SKIP_NEVER_RUNNABLE],
        "devices": spec.total_devices,
        "policy": policy.name,
        "start": start.isoformat(),
        "class_map": dict(class_map or {}),
    }
    out: dict[str, Any] = {"input": info}
    sim = Simulation(
        jobs,
        spec,
        policy,
        decide_fn=decide_fn,
        epoch=epoch,
        progress=progress,
        promises=promises,
        estimates_every=estimates_every,
    )
    out["policy"] = _with_input(sim.run(), info)
    records = {"policy": sim.job_records()} if job_records else {}
    runs: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        fresh, _ = prepare_jobs(rows, spec, policy, epoch, class_map)
        ref = Simulation(fresh, spec, policy, baseline=name, epoch=epoch, progress=progress)
        runs[name] = _with_input(ref.run(), info)
        if job_records:
            records["baseline" if i == 0 else f"baseline-{name}"] = ref.job_records()
    if names:
        out["baseline"] = runs[names[0]]
        out["comparison"] = compare(out["baseline"], out["policy"])
    if len(names) > 1:
        out["baselines"] = runs
        out["comparisons"] = {name: compare(m, out["policy"]) for name, m in runs.items()}
    if job_records:
        out["job_records"] = records
    return out


def parse_baselines(baseline: str | Sequence[str] | None) -> list[str]:
    """Baseline names from ``"fifo,easy"`` or a list, in order, each once; ``ValueError`` names an unknown one."""
    if baseline is None:
        return []
    items = baseline.split(",") if isinstance(baseline, str) else list(baseline)
    names: list[str] = []
    for item in items:
        name = item.strip()
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r} (known: {', '.join(BASELINES)})")
        if name not in names:
            names.append(name)
    return names


def _with_input(metrics: dict[str, Any], info: Mapping[str, Any]) -> dict[str, Any]:
    metrics["jobs"] = {
        "total": info["jobs_total"],
        "skipped": info["skipped"],
        "skipped_by_reason": info["skipped_by_reason"],
        "never_runnable": info["never_runnable"],
        **metrics["jobs"],
    }
    return metrics


def compare(metrics_a: Mapping[str, Any], metrics_b: Mapping[str, Any]) -> dict[str, Any]:
    """Per-team differences ``b - a`` (device-hours, wait p50/p95/max, preemptions) and overall ones.

    ``a`` is the reference (current policy, or FIFO), ``b`` the candidate.
    """
    teams_a = metrics_a.get("teams", {})
    teams_b = metrics_b.get("teams", {})
    out_teams: dict[str, Any] = {}
    for team in sorted(set(teams_a) | set(teams_b)):
        ta, tb = teams_a.get(team, {}), teams_b.get(team, {})
        out_teams[team] = {
            "device_hours": _diff(ta.get("device_hours"), tb.get("device_hours")),
            "wait_p50_s": _diff(ta.get("wait_s", {}).get("p50"), tb.get("wait_s", {}).get("p50")),
            "wait_p95_s": _diff(ta.get("wait_s", {}).get("p95"), tb.get("wait_s", {}).get("p95")),
            "wait_max_s": _diff(ta.get("wait_s", {}).get("max"), tb.get("wait_s", {}).get("max")),
            "preemptions": _diff(ta.get("preemptions"), tb.get("preemptions")),
            "usage_over_entitlement": _diff(ta.get("usage_over_entitlement"), tb.get("usage_over_entitlement")),
        }
    wa, wb = metrics_a.get("wait_s", {}).get("overall", {}), metrics_b.get("wait_s", {}).get("overall", {})
    overall = {
        "utilisation": _diff(
            metrics_a.get("devices", {}).get("utilisation"), metrics_b.get("devices", {}).get("utilisation")
        ),
        "wait_p50_s": _diff(wa.get("p50"), wb.get("p50")),
        "wait_p95_s": _diff(wa.get("p95"), wb.get("p95")),
        "wait_p99_s": _diff(wa.get("p99"), wb.get("p99")),
        "wait_max_s": _diff(wa.get("max"), wb.get("max")),
        "jain_mean": _diff(
            metrics_a.get("fairness", {}).get("jain_mean"), metrics_b.get("fairness", {}).get("jain_mean")
        ),
        "preemptions": _diff(
            metrics_a.get("preemption", {}).get("preemptions"), metrics_b.get("preemption", {}).get("preemptions")
        ),
        "span_s": _diff(metrics_a.get("span_s"), metrics_b.get("span_s")),
    }
    return {"overall": overall, "teams": out_teams}


def _diff(a: Any, b: Any) -> dict[str, Any]:
    delta = round(b - a, 6) if isinstance(a, int | float) and isinstance(b, int | float) else None
    return {"a": a, "b": b, "delta": delta}


__all__ = [
    "BASELINES",
    "DEFAULT_START",
    "EasyBaseline",
    "FifoBaseline",
    "Simulation",
    "SimulationError",
    "compare",
    "jain_index",
    "parse_baselines",
    "prepare_jobs",
    "run_simulation",
]
