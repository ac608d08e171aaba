"""Estimated start times for the jobs a tick left waiting for capacity (``squeue --start``).

``decide`` gives a start estimate only where it costs nothing extra: the
shadow time of each pool's first blocked job, a preemption's deadline. A team
lead whose job is tenth in line sees no time at all. This pass plans the rest
after the tick, in the tick's priority order (``Decisions.waiting`` is in that
order), on a copy of the cluster's future:

* every usable card on a schedulable node comes free at a time: now if it is
  free, else when the last job on it is expected to end (``expected_end``:
  start + estimate, or the max duration once the estimate is overrun; a
  leaving job at its grace deadline; the tick's own starts run from now);
* a promise (``Decisions.promises``) keeps its cards for its job, which takes
  them when they come free or at the promised time, whichever is later; a job
  in its preemption grace without one (a vNPU request) is planned like the
  jobs below, keeping the estimate ``decide`` gave it;
* each job waiting for capacity (``Resources`` or ``Priority``) or for its
  team's own jobs to end (``QuotaMaxDevices``, ``QuotaMaxJobs``) takes, by the
  placement rules (one topology group, whole groups of one node, or whole
  nodes), the cards that let it start earliest, on a chip model its team's
  ``max`` for that model leaves room for, once its team has room for it under
  its ``max`` devices (overall and per chip model) and its max jobs (see
  :class:`_Room`: what the team's running, started and planned jobs give back
  as they end); it keeps them for its estimated duration. That start is its
  estimate. Earlier in the order comes first: this is a plan without
  backfill, so a job may start sooner than estimated (backfill, jobs ending
  early) or later (a higher job submitted meanwhile, a reservation held for
  other classes).

A vNPU request takes the card where its template fits first (see
:class:`_Slices`). A job whose turn comes after cards that never come free (a
job without any duration, an unbounded run), or whose team's limit never
leaves room for it, gets no estimate, nor do jobs waiting for other quota
reasons (class, duration, monthly budget) or static shape reasons. Limits
are those in force now: a time-of-day schedule that raises them later makes
the job start sooner. ``limit`` bounds how many jobs one pass plans, as Slurm's
``bf_max_job_test`` does; the ones after it get none.

The pass is separate from ``decide`` on purpose: it changes no decision, and
the caller (the database tick) runs it after deciding, so the hot path of the
scheduling decision stays as it is. Pure Python, no Django.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scheduling.engine import reasons, run_time
from scheduling.engine.capacity import EPS, expected_end
from scheduling.engine.policy import DEVICES, chip_resource
from scheduling.engine.quota import quota_in_force
from scheduling.engine.snapshot import Decisions, JobState, Slot, Snapshot, VnpuTemplate, Wait

INF = math.inf

#: Reasons whose jobs wait only for cards to come free.
CAPACITY_REASONS = frozenset({reasons.RESOURCES, reasons.PRIORITY})
#: Reasons whose jobs wait for their own team's jobs to end (its ``max`` devices, its max jobs).
QUOTA_WAITS = frozenset({reasons.QUOTA_MAX_DEVICES, reasons.QUOTA_MAX_JOBS})
#: Every reason the pass gives an estimate for.
ESTIMATED_REASONS = CAPACITY_REASONS | QUOTA_WAITS


class _Node:
    """One schedulable server's usable cards of one chip model, as times they come free."""

    __slots__ = ("chip", "gen", "groups", "size", "whole")

    def __init__(self, chip: str, groups: list[list[tuple[float, int]]], size: int) -> None:
        self.chip = chip
        #: Per topology group: ``(free time, device id)`` of its usable cards, sorted.
        self.groups = [sorted(cards) for cards in groups]
        #: Cards per node of this model (usable or not): what decides the shape rules.
        self.size = size
        #: Every card usable: the node can be taken whole.
        self.whole = sum(len(cards) for cards in groups) == size
        #: Bumped when a plan takes cards here: heap entries of an older generation are stale.
        self.gen = 0

    def group_times(self, n: int) -> list[tuple[float, int]]:
        """Per group, the time its ``n`` earliest cards are all free (``INF`` if it has fewer)."""
        return [(cards[n - 1][0] if len(cards) >= n else INF, gi) for gi, cards in enumerate(self.groups)]

    def full_time(self) -> float:
        """When every card of the node is free (``INF`` when one is unusable: never whole)."""
        if not self.whole:
            return INF
        return max(cards[-1][0] for cards in self.groups if cards)


class _Shape:
    """How a request of ``n`` whole cards is placed on one chip model (see :mod:`placement`)."""

    __slots__ = ("group_size", "kind", "m")

    def __init__(self, kind: str, m: int, group_size: int) -> None:
        #: ``group``: ``m`` cards in one group; ``groups``: ``m`` whole groups of one node;
        #: ``nodes``: ``m`` whole nodes.
        self.kind = kind
        self.m = m
        self.group_size = group_size


def _shape(n: int, node_size: int, group_size: int) -> _Shape | None:
    if n < 1:
        return None
    if n <= group_size:
        return _Shape("group", n, group_size)
    if n <= node_size:
        return _Shape("groups", n // group_size, group_size) if n % group_size == 0 else None
    return _Shape("nodes", n // node_size, group_size) if n % node_size == 0 else None


class _Plan:
    """The cluster's future as free times per card, and the best spot for a shape, kept in heaps."""

    def __init__(self, nodes: list[_Node]) -> None:
        self.by_chip: dict[str, list[_Node]] = {}
        for node in nodes:
            self.by_chip.setdefault(node.chip, []).append(node)
        #: ``(cards per node, cards per topology group)`` of each chip model (the largest node's).
        self.layout: dict[str, tuple[int, int]] = {}
        for chip, of_chip in self.by_chip.items():
            biggest = max(of_chip, key=lambda node: node.size)
            self.layout[chip] = (biggest.size, max(biggest.size // max(len(biggest.groups), 1), 1))
        #: ``(chip, kind, m)`` -> heap of ``(time, node index in by_chip, generation, group)``.
        self.heaps: dict[tuple[str, str, int], list[tuple[float, int, int, int]]] = {}
        #: The same heaps by chip, as ``(kind, m, heap)``: what a change on one node updates.
        self.heaps_of: dict[str, list[tuple[str, int, list[tuple[float, int, int, int]]]]] = {}

    def _entries(self, node: _Node, i: int, kind: str, m: int) -> Iterable[tuple[float, int, int, int]]:
        if kind == "group":
            for t, gi in node.group_times(m):
                if t < INF:
                    yield (t, i, node.gen, gi)
        elif kind == "groups":
            full = sorted(t for t, _ in node.group_times(self.layout[node.chip][1]))
            if len(full) >= m and full[m - 1] < INF:
                yield (full[m - 1], i, node.gen, -1)
        else:
            t = node.full_time()
            if t < INF:
                yield (t, i, node.gen, -1)

    def heap(self, chip: str, kind: str, m: int) -> list[tuple[float, int, int, int]]:
        key = (chip, kind, m)
        heap = self.heaps.get(key)
        if heap is None:
            heap = [e for i, node in enumerate(self.by_chip[chip]) for e in self._entries(node, i, kind, m)]
            heapq.heapify(heap)
            self.heaps[key] = heap
            self.heaps_of.setdefault(chip, []).append((kind, m, heap))
        return heap

    def earliest(self, chip: str, shape: _Shape) -> list[tuple[float, int, int, int]] | None:
        """The spot where ``shape`` could start first on ``chip`` (its last entry's time), or ``None``."""
        nodes = self.by_chip[chip]
        if shape.kind == "nodes":
            valid = self._top_valid(self.heap(chip, "nodes", 1), nodes, shape.m)
            return valid if len(valid) == shape.m else None
        valid = self._top_valid(self.heap(chip, shape.kind, shape.m), nodes, 1)
        return valid or None

    @staticmethod
    def _top_valid(
        heap: list[tuple[float, int, int, int]], nodes: list[_Node], k: int
    ) -> list[tuple[float, int, int, int]]:
        """The ``k`` best current entries of ``heap`` (stale ones dropped), one per node, left in place."""
        if k == 1:
            while heap:
                entry = heap[0]
                if entry[2] == nodes[entry[1]].gen:
                    return [entry]
                heapq.heappop(heap)
            return []
        taken: list[tuple[float, int, int, int]] = []
        seen: set[int] = set()
        while heap and len(taken) < k:
            entry = heapq.heappop(heap)
            if entry[2] != nodes[entry[1]].gen or entry[1] in seen:
                continue
            taken.append(entry)
            seen.add(entry[1])
        for entry in taken:
            heapq.heappush(heap, entry)
        return taken

    def take(
        self, chip: str, shape: _Shape, spot: list[tuple[float, int, int, int]], until_of: float
    ) -> tuple[float, list[int]]:
        """Plan ``shape`` on ``spot`` (from :meth:`earliest`); its cards are busy ``until_of`` after it starts."""
        nodes = self.by_chip[chip]
        if shape.kind == "nodes":
            picked = spot
            at = picked[-1][0]
            devices: list[int] = []
            for _, i, _, _ in picked:
                node = nodes[i]
                for gi, cards in enumerate(node.groups):
                    devices += [d for _, d in cards]
                    node.groups[gi] = [(at + until_of, d) for _, d in cards]
                self._moved(chip, i)
            return at, devices
        at, i, _, gi = spot[0]
        node = nodes[i]
        end = at + until_of
        if shape.kind == "group":
            cards = node.groups[gi]
            chosen = cards[: shape.m]
            node.groups[gi] = sorted(cards[shape.m :] + [(end, d) for _, d in chosen])
            devices = [d for _, d in chosen]
        else:
            order = sorted(node.group_times(shape.group_size))[: shape.m]
            devices = []
            for _, g in order:
                devices += [d for _, d in node.groups[g]]
                node.groups[g] = [(end, d) for _, d in node.groups[g]]
        self._moved(chip, i)
        return at, devices

    def card_busy(self, chip: str, i: int, gi: int, d: int, until: float) -> None:
        """Card ``d`` (node ``i``, group ``gi``) is busy until ``until`` at least (a slice planned on it)."""
        node = self.by_chip[chip][i]
        cards = node.groups[gi]
        node.groups[gi] = sorted((max(t, until) if dev == d else t, dev) for t, dev in cards)
        self._moved(chip, i)

    def _moved(self, chip: str, i: int) -> None:
        """Node ``i`` changed: its old heap entries go stale, new ones go in every heap of its chip."""
        node = self.by_chip[chip][i]
        node.gen += 1
        gen = node.gen
        push = heapq.heappush
        for kind, m, heap in self.heaps_of.get(chip, ()):
            if kind == "group":
                for gi, cards in enumerate(node.groups):
                    if len(cards) >= m and cards[m - 1][0] < INF:
                        push(heap, (cards[m - 1][0], i, gen, gi))
            else:
                for entry in self._entries(node, i, kind, m):
                    push(heap, entry)


#: A vNPU slice on a card until ``end``: ``(end, AI cores, memory MB, AI CPUs)``.
_Slice = tuple[float, int, int, int]


class _Slices:
    """Cards as vNPU slices see them: the whole-card job's end, and the slices on each card.

    A card without slices takes a slice when it is wholly free: that is the
    plan's own earliest single card (:class:`_Plan`, shape ``group`` of 1). Cards
    with slices are kept here, in a heap per template. A planned slice counts from
    now until its end (not from its start): a later slice never slips in before
    it, as a whole-card job never slips in before another in :class:`_Plan`.
    Between a sliced card and a whole one free as early, the sliced one is taken
    (``binpack`` does the same).
    """

    def __init__(
        self, plan: _Plan, snapshot: Snapshot, whole: dict[int, float], slices: dict[int, list[_Slice]], now: float
    ) -> None:
        self.plan = plan
        self.now = now
        self.whole = whole
        self.slices = slices
        for on in slices.values():
            on.sort()
        self.templates = snapshot.templates
        caps = {dev.id: (dev.ai_cores, dev.hbm_mb, dev.ai_cpus) for node in snapshot.nodes for dev in node.devices}
        self.caps: dict[int, tuple[int, int, int]] = {}
        #: Where each usable card of a schedulable node is in the plan: (chip, node index, group index).
        self.where: dict[int, tuple[str, int, int]] = {}
        for chip, nodes in plan.by_chip.items():
            for i, node in enumerate(nodes):
                for gi, cards in enumerate(node.groups):
                    for _, d in cards:
                        self.caps[d] = caps[d]
                        self.where[d] = (chip, i, gi)
        #: Cards with slices (running or planned), by chip model.
        self.sliced: dict[str, list[int]] = {}
        for d in slices:
            if d in self.where:
                self.sliced.setdefault(self.where[d][0], []).append(d)
        self.gen: dict[int, int] = {}
        #: ``(chip, template)`` -> heap of ``(time, card, generation)`` over the sliced cards.
        self.heaps: dict[tuple[str, str], list[tuple[float, int, int]]] = {}

    def time(self, d: int, tmpl: VnpuTemplate) -> float:
        """The earliest time a ``tmpl`` slice fits on card ``d`` (``INF``: never)."""
        cc, cm, cp = self.caps[d]
        c, m, p = tmpl.ai_cores, tmpl.memory_mb, tmpl.ai_cpus
        if c > cc or m > cm or p > cp:
            return INF
        t0 = max(self.now, self.whole.get(d, self.now))
        on = self.slices.get(d, ())  # sorted by end
        live = [x for x in on if x[0] > t0]
        uc = sum(x[1] for x in live)
        um = sum(x[2] for x in live)
        up = sum(x[3] for x in live)
        if uc + c <= cc and um + m <= cm and up + p <= cp:
            return t0
        for e, sc, sm, sp in live:  # the slices end one by one
            uc -= sc
            um -= sm
            up -= sp
            if uc + c <= cc and um + m <= cm and up + p <= cp:
                return e
        return INF

    def earliest(self, chip: str, tmpl: VnpuTemplate) -> tuple[float, int] | None:
        """The card where a ``tmpl`` slice could start first, and when (``None``: nowhere)."""
        best: tuple[float, int, int] | None = None  # (time, 0 sliced / 1 whole, card)
        key = (chip, tmpl.name)
        heap = self.heaps.get(key)
        if heap is None:
            heap = self.heaps[key] = [(self.time(d, tmpl), d, self.gen.get(d, 0)) for d in self.sliced.get(chip, ())]
            heapq.heapify(heap)
        gen = self.gen
        # A card's time only grows as the plan fills, so a stale entry is a lower bound:
        # it is worked out again when it reaches the top, not each time the card changes.
        while heap:
            t, d, g = heap[0]
            if g == gen.get(d, 0):
                if t < INF:
                    best = (t, 0, d)
                break
            heapq.heapreplace(heap, (self.time(d, tmpl), d, gen.get(d, 0)))
        plan = self.plan
        spot = plan.earliest(chip, _Shape("group", 1, plan.layout[chip][1]))
        if spot is not None:
            t, i, _, gi = spot[0]
            d = plan.by_chip[chip][i].groups[gi][0][1]
            if (best is None or (t, 1) < best[:2]) and self.time(d, tmpl) < INF:
                best = (t, 1, d)
        return (best[0], best[2]) if best is not None else None

    def changed(self, d: int) -> None:
        """Card ``d`` changed (a whole-card job planned on it): its heap entries are stale."""
        self.gen[d] = self.gen.get(d, 0) + 1

    def take(self, d: int, tmpl: VnpuTemplate, end: float) -> None:
        """Plan a ``tmpl`` slice on card ``d`` until ``end``; whole-card jobs wait for it there."""
        chip, i, gi = self.where[d]
        if not self.slices.get(d):
            self.sliced.setdefault(chip, []).append(d)
        insort(self.slices.setdefault(d, []), (end, tmpl.ai_cores, tmpl.memory_mb, tmpl.ai_cpus))
        self.changed(d)
        for (c, name), heap in self.heaps.items():
            if c == chip:
                heapq.heappush(heap, (self.time(d, self.templates[(chip, name)]), d, self.gen[d]))
        self.plan.card_busy(chip, i, gi, d, end)


class _Room:
    """Room under one of a team's limits over time, as chunks ``[time it comes free, amount]``.

    The same model as the cards': room taken by a planned job is its own until
    the job ends, then it comes back. At the start, the limit minus what the
    team holds is free now, and each job the team runs gives its share back when
    it is expected to end (a team above its limit, after a schedule lowered it,
    first works off the excess).
    """

    __slots__ = ("chunks",)

    def __init__(self, cap: float, held: list[tuple[float, float]], now: float) -> None:
        held.sort()
        excess = sum(amount for _, amount in held) - cap
        chunks: list[list[float]] = [[now, -excess]] if excess < -EPS else []
        for end, amount in held:
            if end == INF:
                break  # never given back
            if excess > EPS:
                if amount <= excess:
                    excess -= amount
                    continue
                amount -= excess
                excess = 0.0
            chunks.append([end, amount])
        self.chunks = chunks

    def time_for(self, amount: float) -> float:
        """When ``amount`` is free (``INF``: never)."""
        want = amount - EPS
        acc = 0.0
        for at, part in self.chunks:
            acc += part
            if acc >= want:
                return at
        return INF

    def take(self, amount: float, start: float, end: float) -> None:
        """A job holds ``amount`` from ``start`` to ``end``: the latest room free by ``start`` is its.

        Latest first, as best fit: room free earlier stays for a job planned after
        this one that could start before it (room free from now, say, for a job
        whose cards are free now, while this one waits for its cards). ``start`` is
        at or after :meth:`time_for`, so the room is there (what is missing for
        float slack is simply not given back).
        """
        chunks = self.chunks
        left = amount
        i = bisect_right(chunks, [start, INF]) - 1
        while left > EPS and i >= 0:
            part = chunks[i][1]
            if part <= left + EPS:
                left -= part
                del chunks[i]
            else:
                chunks[i][1] = part - left
                left = 0.0
            i -= 1
        taken = amount - max(left, 0.0)
        if taken > EPS and end < INF:
            insort(chunks, [end, taken])


@dataclass(slots=True)
class _TeamRoom:
    """A team's limits as :class:`_Room`: ``max`` devices overall and per chip model, max jobs."""

    total: _Room | None
    by_chip: dict[str, _Room]
    jobs: _Room | None
    #: :meth:`rooms` per chip model.
    of_chip: dict[str, list[tuple[_Room, bool]]]

    def rooms(self, chip: str) -> list[tuple[_Room, bool]]:
        """The rooms a job on ``chip`` needs, each with whether it counts jobs (else units)."""
        out = self.of_chip.get(chip)
        if out is None:
            out = self.of_chip[chip] = []
            if self.total is not None:
                out.append((self.total, False))
            on_chip = self.by_chip.get(chip)
            if on_chip is not None:
                out.append((on_chip, False))
            if self.jobs is not None:
                out.append((self.jobs, True))
        return out


class _Quotas:
    """Every limited team's room over time, built from the running jobs and the tick's starts.

    ``demand``: per team, at most how many units and jobs the pass may plan for it.
    A limit with that much room now never moves a job (each takes its units from
    the room free now, and the cards come free no earlier), so it is left out:
    most limits, most of the time, and the pass then costs what it did without them.
    """

    def __init__(
        self, snapshot: Snapshot, now: float, held: _Held, cores: dict[str, int], demand: dict[str, tuple[float, int]]
    ) -> None:
        self.snapshot = snapshot
        self.now = now
        self.held = held
        self.card_cores = cores
        self.demand = demand
        self.teams: dict[str, _TeamRoom | None] = {}

    def units(self, chip: str, template: str | None) -> float:
        """Device units of one card (1) or one slice of ``template`` on ``chip``, as ``decide`` counts them."""
        if template is None:
            return 1.0
        tmpl = self.snapshot.templates.get((chip, template))
        cores = self.card_cores.get(chip, 0)
        return tmpl.ai_cores / cores if tmpl is not None and cores else 1.0

    def of(self, team: str) -> _TeamRoom | None:
        """The team's rooms (``None``: no limit to plan against)."""
        if team in self.teams:
            return self.teams[team]
        quota, _ = quota_in_force(self.snapshot.policy, team, self.snapshot.now)
        held = self.held.get(team, [])
        now = self.now
        units, jobs = self.demand.get(team, (0.0, 0))

        def room(cap: float | None, items: list[tuple[float, float]], want: float) -> _Room | None:
            if cap is None or cap - sum(amount for _, amount in items) >= want:
                return None  # never binds in this pass
            return _Room(cap, items, now)

        by_chip: dict[str, _Room] = {}
        for key, cap in quota.max.items():
            if key != DEVICES:
                chip = key[len(DEVICES) + 1 :]
                found_chip = room(cap, [(end, u) for end, c, u in held if c == chip], units)
                if found_chip is not None:
                    by_chip[chip] = found_chip
        total = room(quota.max.get(DEVICES), [(end, u) for end, _, u in held], units)
        cap_jobs = quota.max_concurrent_jobs
        count = room(None if cap_jobs is None else float(cap_jobs), [(end, 1.0) for end, _, _ in held], float(jobs))
        found = None
        if total is not None or by_chip or count is not None:
            found = _TeamRoom(total, by_chip, count, {})
        self.teams[team] = found
        return found

    @staticmethod
    def time_for(rooms: list[tuple[_Room, bool]], units: float) -> float:
        """When every room has space for the job."""
        at = -INF
        for room, counts_jobs in rooms:
            t = room.time_for(1.0 if counts_jobs else units)
            if t > at:
                at = t
        return at

    @staticmethod
    def take(rooms: list[tuple[_Room, bool]], units: float, start: float, end: float) -> None:
        for room, counts_jobs in rooms:
            room.take(1.0 if counts_jobs else units, start, end)


def _duration(job: JobState) -> float:
    """How long a planned job keeps its cards: :func:`run_time.expected`, else forever."""
    return run_time.expected(job) or INF


#: What a team holds now: ``(expected end, chip model, device units)`` per running or started job.
_Held = dict[str, list[tuple[float, str, float]]]


def _free_times(
    snapshot: Snapshot, decisions: Decisions, now: float
) -> tuple[dict[int, float], dict[int, list[_Slice]], _Held, dict[str, int], dict[int, str]]:
    """What holds each busy card, by kind: when its whole-card job ends, and its vNPU slices.

    Also, from the same jobs, what each team holds (for its limits, see :class:`_Quotas`),
    the AI cores of a card per chip model (a slice counts its share of them, as
    ``Chip.slice_units`` does) and each card's chip model.
    """
    evicted = set(decisions.evictions)
    deadlines = {p.job_id: p.grace_deadline for p in decisions.preemptions}
    whole: dict[int, float] = {}
    slices: dict[int, list[_Slice]] = {}
    held: _Held = {}
    chip_of: dict[int, str] = {}
    cores: dict[str, int] = {}
    for node in snapshot.nodes:
        for dev in node.devices:
            chip_of[dev.id] = dev.chip_model
            if dev.ai_cores > cores.get(dev.chip_model, 0):
                cores[dev.chip_model] = dev.ai_cores
    templates = snapshot.templates

    def hold(job: JobState, slots: Iterable[Slot], end: float) -> None:
        chip = job.chip_model or ""
        units = 0.0
        for slot in slots:
            d = slot.device_id
            chip = chip_of.get(d, chip)
            tmpl = templates.get((chip, slot.vnpu_template)) if slot.vnpu_template else None
            if tmpl is None:
                units += 1.0
                if end > whole.get(d, -INF):
                    whole[d] = end
            else:
                units += tmpl.ai_cores / cores[chip] if cores.get(chip) else 1.0
                slices.setdefault(d, []).append((end, tmpl.ai_cores, tmpl.memory_mb, tmpl.ai_cpus))
        mine = held.get(job.team)
        if mine is None:
            held[job.team] = [(end, chip, units)]
        else:
            mine.append((end, chip, units))

    for job in snapshot.running:
        if job.id in evicted:
            continue
        end = expected_end(job, now)
        deadline = deadlines.get(job.id)
        if deadline is not None:
            end = min(end, max(deadline, now))
        hold(job, job.slots, end)
    if decisions.starts:
        pending = {job.id: job for job in snapshot.pending}
        for start in decisions.starts:
            started = pending.get(start.job_id)
            if started is not None:
                hold(started, start.slots, now + _duration(started))
    return whole, slices, held, cores, chip_of


def _build(snapshot: Snapshot, free_at: Callable[[int], float]) -> list[_Node]:
    nodes: list[_Node] = []
    for node in snapshot.nodes:
        by_chip: dict[str, dict[str, list[tuple[float, int]]]] = {}
        sizes: dict[str, int] = {}
        for dev in node.devices:
            groups = by_chip.setdefault(dev.chip_model, {})
            cards = groups.setdefault(dev.topology_group, [])
            sizes[dev.chip_model] = sizes.get(dev.chip_model, 0) + 1
            if node.schedulable and dev.usable:
                cards.append((free_at(dev.id), dev.id))
        if not node.schedulable:
            continue
        for chip, groups in by_chip.items():
            nodes.append(_Node(chip, list(groups.values()), sizes[chip]))
    return nodes


def plan_starts(
    snapshot: Snapshot, decisions: Decisions, limit: int | None = None
) -> dict[int, tuple[float, tuple[int, ...]]]:
    """The plan behind :func:`estimate_starts`: job id -> (estimated start, the cards it is planned on)."""
    now = snapshot.now.timestamp()
    whole, slices, held, cores, chip_of = _free_times(snapshot, decisions, now)

    def free_at(d: int) -> float:
        """When card ``d`` is wholly free: its whole-card job and every slice on it ended."""
        at = whole.get(d, now)
        on = slices.get(d)
        if on:
            at = max(at, max(e for e, *_ in on))
        return at if at > now else now

    pending = {job.id: job for job in snapshot.pending}
    # A promise's cards go to its job: when they come free, or at the promised time if later.
    for jid, promise in decisions.promises.items():
        job = pending.get(jid)
        if job is None:
            continue
        at = max([promise.until, now, *map(free_at, promise.devices)])
        for d in promise.devices:
            whole[d] = at + _duration(job)
        if promise.devices:  # its team's room: held from now (it starts within a grace period)
            chip = chip_of.get(promise.devices[0], job.chip_model or "")
            held.setdefault(job.team, []).append((at + _duration(job), chip, float(len(promise.devices))))
    plan = _Plan(_build(snapshot, free_at))
    sliced: _Slices | None = None  # built for the first slice request
    chips = list(plan.by_chip)
    layout = plan.layout
    # Chip models a team's ``max`` fences off for a job of this size (``devices/<chip>`` below it),
    # as admission narrows them in ``decide``; by team and size.
    fenced: dict[tuple[str, int], list[str]] = {}

    def chips_for(team: str, n: int) -> list[str]:
        key = (team, n)
        hit = fenced.get(key)
        if hit is None:
            quota, _ = quota_in_force(snapshot.policy, team, snapshot.now)
            cap = quota.max
            hit = fenced[key] = [c for c in chips if cap.get(chip_resource(c), n) >= n]
        return hit

    # What the pass may plan per team (slices counted as a whole card): see _Quotas.
    demand: dict[str, tuple[float, int]] = {}
    tried = 0
    for jid, wait in decisions.waiting.items():
        if limit is not None and tried >= limit:
            break
        if jid in decisions.promises or (
            wait.reason not in ESTIMATED_REASONS and wait.reason != reasons.PREEMPTION_GRACE
        ):
            continue
        job = pending.get(jid)
        if job is not None:
            tried += 1
            units, count = demand.get(job.team, (0.0, 0))
            demand[job.team] = (units + (1.0 if job.vnpu_template else job.num_devices), count + 1)
    quotas = _Quotas(snapshot, now, held, cores, demand)
    out: dict[int, tuple[float, tuple[int, ...]]] = {}
    planned = 0
    for jid, wait in decisions.waiting.items():
        if limit is not None and planned >= limit:
            break
        if jid in decisions.promises:
            continue  # its cards are reserved above
        if wait.reason not in ESTIMATED_REASONS and wait.reason != reasons.PREEMPTION_GRACE:
            continue
        job = pending.get(jid)
        if job is None:
            continue
        planned += 1
        team = quotas.of(job.team)
        duration = _duration(job)
        if job.vnpu_template is not None:
            if sliced is None:
                sliced = _Slices(plan, snapshot, whole, slices, now)
            spot_of: tuple[float, int, VnpuTemplate, float] | None = None
            for chip in chips_for(job.team, 1):
                tmpl = snapshot.templates.get((chip, job.vnpu_template))
                if tmpl is None or (job.chip_model is not None and chip != job.chip_model):
                    continue
                found = sliced.earliest(chip, tmpl)
                if found is None:
                    continue
                at = found[0]
                units = quotas.units(chip, job.vnpu_template)
                if team is not None:
                    at = max(at, quotas.time_for(team.rooms(chip), units))
                if at < INF and (spot_of is None or at < spot_of[0]):
                    spot_of = (at, found[1], tmpl, units)
            if spot_of is not None:
                at, card, tmpl, units = spot_of
                sliced.take(card, tmpl, at + duration)
                if team is not None:
                    quotas.take(team.rooms(sliced.where[card][0]), units, at, at + duration)
                out[jid] = (max(at, now), (card,))
            continue
        best: tuple[float, str, _Shape, list[tuple[float, int, int, int]]] | None = None
        for chip in chips_for(job.team, job.num_devices):
            if job.chip_model is not None and chip != job.chip_model:
                continue
            shape = _shape(job.num_devices, *layout[chip])
            if shape is None:
                continue
            spot = plan.earliest(chip, shape)
            if spot is None:
                continue
            at = spot[-1][0]
            if team is not None:
                at = max(at, quotas.time_for(team.rooms(chip), float(job.num_devices)))
            if at < INF and (best is None or at < best[0]):
                best = (at, chip, shape, spot)
        if best is None:
            continue
        at, chip, shape, spot = best
        # The cards are free from the spot's time; a job that waits for room under its
        # team's limits starts later, and keeps them from then until it ends.
        _, devices = plan.take(chip, shape, spot, at - spot[-1][0] + duration)
        end = at + duration
        for d in devices:
            whole[d] = end
            if sliced is not None:
                sliced.changed(d)
        if team is not None:
            quotas.take(team.rooms(chip), float(job.num_devices), at, end)
        out[jid] = (max(at, now), tuple(sorted(devices)))
    return out


def estimate_starts(snapshot: Snapshot, decisions: Decisions, limit: int | None = None) -> int:
    """Fill in ``estimated_start`` of the capacity waits ``decide`` left without one; returns how many.

    Each is the planned start rounded up to a whole minute.

    Estimates ``decide`` gave (a pool's first blocked job, a preemption's
    deadline) are kept: they come from the same end times, and the tick's
    backfill holds are built on them.
    """
    filled = 0
    waiting = decisions.waiting
    for jid, (at, _) in plan_starts(snapshot, decisions, limit).items():
        wait = waiting[jid]
        if wait.estimated_start is None:
            # Up to the next whole minute: finer is false precision, and a value that
            # moves by seconds would rewrite thousands of stored estimates each pass.
            # (To the second first: times read back from a database carry float noise.)
            # (A new value: waits are shared between jobs, see ``snapshot.Wait``.)
            waiting[jid] = Wait(wait.reason, wait.detail, math.ceil(round(at) / 60.0) * 60.0)
            filled += 1
    return filled
