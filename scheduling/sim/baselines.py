"""The fixed reference schedulers a replay is compared with: strict FIFO and EASY backfill.

Neither is the core: each is a small ``decide`` of its own over the replay's
bookkeeping (:mod:`scheduling.sim.occupancy`), so a policy's figures can be read
against a scheduler every reader knows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from scheduling.engine.snapshot import (
    Decisions,
    JobState,
    Slot,
    Snapshot,
    Start,
    Wait,
)
from scheduling.sim.jobs import EPS as _EPS
from scheduling.sim.occupancy import Occupancy, OrderedJobs

#: The fixed reference schedulers a replay can be compared with (``baseline=``, ``--baseline``).
BASELINES = ("fifo", "easy")


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
