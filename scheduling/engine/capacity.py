"""The cluster's free state for one tick: who holds which device, what is free.

Built once per tick from the snapshot and then updated in place as the tick
starts jobs, so placement never rescans the cluster. The layout is chosen for
the hot path (10k pending jobs against 8k devices in a few milliseconds):

* a *pool* is the devices of one chip model on one node; its free whole cards
  are a bitmask (bit ``i`` = ``pool.devs[i]``) and its topology groups (HCCS
  rings) are masks over the same bits;
* each chip model keeps its pools in *buckets* keyed by ``(g, f)``: ``f`` free
  cards in the pool, ``g`` free cards in its best group. A job of ``n`` cards
  walks a precomputed list of bucket keys in strategy order (binpack: fullest
  node first; spread: emptiest first) and takes the first pool it finds, so a
  placement costs a handful of dict probes, not a scan of 1,000 nodes;
* ``max_group_free`` per chip answers "does an ``n``-card job fit anywhere?"
  in O(1), which is what makes the long tail of a full cluster cheap;
* vNPU slices: sliced cards sit in buckets by remaining AI cores;
* lookup tables per chip and group layout: the bucket key of a free mask
  (``Pool.ktab``) and the cards best fit takes for ``(free mask, n)``
  (:meth:`Chip.pick`), filled on first use;
* the static part (pools, groups, buckets' shape, device index, the lookup
  tables and the static shape checks of :mod:`placement`) is a
  :class:`Layout`, kept between ticks while the inventory's values are the
  same; a tick only resets the free state and marks the running jobs.

Device units: a whole card is 1; a vNPU slice is ``template.ai_cores /
card.ai_cores`` of a card (quota, reservations and fair share all count so).
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar

from scheduling.engine.record import Record
from scheduling.engine.snapshot import DeviceState, JobState, NodeState, RunningDelta, Slot, Snapshot, VnpuTemplate

#: Float slack for unit sums (slices make fractions such as 0.3 + 0.3 + 0.4).
EPS = 1e-9


def lowest_bits(mask: int, n: int) -> list[int]:
    """Positions of the ``n`` lowest set bits of ``mask`` (``mask`` has at least ``n``)."""
    out: list[int] = []
    while len(out) < n:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _mask_of(bits: list[int]) -> int:
    mask = 0
    for b in bits:
        mask |= 1 << b
    return mask


def _index(dev: DeviceState) -> int:
    return dev.index


class Card:
    """What the free state reads of a device after the layout is built."""

    __slots__ = ("ai_cores", "ai_cpus", "hbm_mb", "id")

    def __init__(self, id: int, ai_cores: int, hbm_mb: int, ai_cpus: int) -> None:
        self.id = id
        self.ai_cores = ai_cores
        self.hbm_mb = hbm_mb
        self.ai_cpus = ai_cpus


class Pool:
    """The devices of one chip model on one node, with their free state."""

    __slots__ = (
        "chip",
        "devs",
        "free",
        "gid",
        "grants",
        "groups",
        "ids",
        "idx",
        "key",
        "key0",
        "ktab",
        "node",
        "size",
        "slices",
        "slot_objs",
        "usable",
        "used_cores",
        "used_cpus",
        "used_mem",
    )

    def __init__(self, idx: int, node: NodeState, chip: str, devs: list[DeviceState]) -> None:
        self.idx = idx
        self.node = node.name
        self.chip = chip
        #: The cards' values at build time (a cached layout outlives the snapshot's objects).
        self.devs = [Card(dev.id, dev.ai_cores, dev.hbm_mb, dev.ai_cpus) for dev in devs]
        size = self.size = len(devs)
        groups: dict[str, int] = {}
        usable = 0
        schedulable = node.schedulable
        for i, dev in enumerate(devs):
            g = dev.topology_group
            groups[g] = groups.get(g, 0) | (1 << i)
            if dev.usable and schedulable:
                usable |= 1 << i
        #: Group masks, in first-seen order (ring 0 before ring 1).
        self.groups: tuple[int, ...] = tuple(groups.values())
        self.ids = [dev.id for dev in devs]
        self.usable = usable
        #: Usable cards with nobody on them (whole-card placement takes from here).
        self.free = usable
        self.key = -1
        #: Bucket key at the start of the last tick (see ``Layout.image``).
        self.key0 = -1
        #: Bucket key per free mask (shared by the pools of one chip with the same groups).
        self.ktab: dict[int, int] = {}
        self.gid = 0
        zeros = [0] * size
        self.used_cores = zeros
        self.used_mem = zeros.copy()
        self.used_cpus = zeros.copy()
        #: Number of vNPU slices on each card (a card with slices is never given whole).
        self.slices = zeros.copy()
        #: The :class:`Slot` of each card given whole (made on first use).
        self.slot_objs: list[Slot | None] = [None] * size
        #: Per card indices a job was given whole: its slots and its ``Occupant.cards`` (values
        #: never changed once made: the placements of a node repeat from tick to tick).
        self.grants: dict[tuple[int, ...], tuple[tuple[Slot, ...], list[tuple[Pool, int, None]]]] = {}

    def grant(self, picked: tuple[int, ...]) -> tuple[tuple[Slot, ...], list[tuple[Pool, int, None]]]:
        """The slots and ``Occupant.cards`` of a job given cards ``picked`` whole (made once)."""
        found = self.grants.get(picked)
        if found is None:
            found = self.grants[picked] = (tuple([self.slot(i) for i in picked]), [(self, i, None) for i in picked])
        return found

    def slot(self, i: int) -> Slot:
        """The :class:`Slot` of card ``i`` given whole (immutable: one object for every tick)."""
        slot = self.slot_objs[i]
        if slot is None:
            slot = self.slot_objs[i] = Slot(self.ids[i])
        return slot

    def reset(self) -> None:
        """Back to "nobody holds anything" (a cached layout starting a new tick)."""
        self.free = self.usable
        self.key = -1
        if any(self.slices):
            self.reset_slices()

    def reset_slices(self) -> None:
        """No vNPU slice on any card."""
        if any(self.slices):
            zeros = [0] * self.size
            self.used_cores = zeros
            self.used_mem = zeros.copy()
            self.used_cpus = zeros.copy()
            self.slices = zeros.copy()

    def best_group_free(self) -> int:
        """Free cards in the group with the most free cards."""
        free = self.free
        return max((free & g).bit_count() for g in self.groups) if self.groups else 0


@dataclass(slots=True)
class Chip:
    """Everything about one chip model: static layout and the live free buckets."""

    name: str
    pools: list[Pool] = field(default_factory=list)
    #: Largest pool (cards of this model on one node) and largest topology group.
    size: int = 0
    gmax: int = 0
    #: Card resources (max over the model's cards) for vNPU units and checks.
    card_cores: int = 0
    card_mem: int = 0
    card_cpus: int = 0
    total: int = 0
    usable_count: int = 0
    #: Usable device units nobody holds: whole free cards plus slices' leftovers.
    free_units: float = 0.0
    buckets: list[dict[Pool, None]] = field(default_factory=list)
    group_count: list[int] = field(default_factory=list)
    max_group_free: int = 0
    #: Sliced usable cards by remaining AI cores: ``slice_buckets[r]`` = {(pool, i): None}.
    slice_buckets: list[dict[tuple[Pool, int], None]] = field(default_factory=list)
    orders: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    #: The buckets at the start of the last tick, in pool order, with their counts, top
    #: group and free units (see ``Layout.image``).
    members: list[list[Pool]] = field(default_factory=list)
    counts0: list[int] = field(default_factory=list)
    top0: int = 0
    free0: float = 0.0
    #: Buckets changed since the tick began (the next tick rebuilds only these from ``members``).
    dirty: set[int] = field(default_factory=set)
    #: Lookup tables: ``picks[(gid, free, n)]`` = (card indices, their mask) best fit takes (see :meth:`pick`).
    picks: dict[tuple[int, int, int], tuple[tuple[int, ...], int] | None] = field(default_factory=dict)
    #: Group layouts seen on this chip -> (gid, shared bucket-key table).
    layouts: dict[tuple[int, ...], tuple[int, dict[int, int]]] = field(default_factory=dict)
    #: Static shape checks of :mod:`placement` (they depend on the layout only).
    fits: dict[int, tuple[str | None, str]] = field(default_factory=dict)
    slice_fits: dict[tuple[int, int, int], tuple[bool, bool]] = field(default_factory=dict)

    def bucket_key(self, pool: Pool) -> int:
        key = pool.ktab.get(pool.free)
        if key is None:
            key = pool.ktab[pool.free] = pool.best_group_free() * (self.size + 1) + pool.free.bit_count()
        return key

    def rebucket(self, pool: Pool) -> None:
        """Move ``pool`` to the bucket of its current free state (O(1))."""
        old = pool.key
        new = pool.ktab.get(pool.free)
        if new is None:
            new = self.bucket_key(pool)
        if new == old:
            return
        width = self.size + 1
        counts = self.group_count
        self.dirty.add(new)
        if old >= 0:
            self.dirty.add(old)
            del self.buckets[old][pool]
            counts[old // width] -= 1
        self.buckets[new][pool] = None
        pool.key = new
        g = new // width
        counts[g] += 1
        if g > self.max_group_free:
            self.max_group_free = g
        elif old >= 0 and old // width == self.max_group_free and counts[self.max_group_free] == 0:
            top = self.max_group_free
            while top > 0 and counts[top] == 0:
                top -= 1
            self.max_group_free = top

    def order(self, strategy: str, n: int) -> list[int]:
        """Bucket keys an ``n``-card single-node job tries, best first (cached)."""
        cached = self.orders.get((strategy, n))
        if cached is not None:
            return cached
        width = self.size + 1
        frees = range(n, self.size + 1)
        if strategy == "spread":
            frees = range(self.size, n - 1, -1)
        keys: list[int] = []
        for f in frees:
            if n <= self.gmax:
                keys.extend(g * width + f for g in range(n, min(f, self.gmax) + 1))
            else:  # a multi-group job needs whole free groups: g is the full group size
                keys.append(self.gmax * width + f)
        self.orders[(strategy, n)] = keys
        return keys

    def pick(self, pool: Pool, free: int, n: int) -> tuple[tuple[int, ...], int] | None:
        """Card indices (and their mask) an ``n``-card single-node job takes on ``pool`` when ``free`` is free.

        Up to a group: the lowest ``n`` cards of the group with the fewest free
        cards that still holds ``n`` (best fit). Larger: the first ``n / gmax``
        whole free groups. ``None`` if it does not fit. Memoised per layout.
        """
        key = (pool.gid, free, n)
        found = self.picks.get(key, False)
        if found is not False:
            return found  # type: ignore[return-value]
        result: tuple[tuple[int, ...], int] | None = None
        if n <= self.gmax:
            best = 0
            best_count = 1 << 30
            for g in pool.groups:
                mask = free & g
                count = mask.bit_count()
                if n <= count < best_count:
                    best, best_count = mask, count
            if best:
                cards = lowest_bits(best, n)
                result = (tuple(cards), _mask_of(cards))
        else:
            unit = self.gmax
            want = n // unit
            full = [g for g in pool.groups if g.bit_count() == unit and free & g == g]
            if len(full) >= want:
                picked: list[int] = []
                for g in full[:want]:
                    picked.extend(lowest_bits(g, unit))
                result = (tuple(picked), _mask_of(picked))
        self.picks[key] = result
        return result

    @property
    def full_key(self) -> int:
        """Bucket of pools with every card free (whole nodes for multi-node gangs)."""
        return self.gmax * (self.size + 1) + self.size

    def slice_units(self, template: VnpuTemplate) -> float:
        return template.ai_cores / self.card_cores if self.card_cores else 1.0


@dataclass
class Occupant(Record):
    """A running job as the free state sees it."""

    job: JobState
    chip: str
    units: float
    #: ``(pool, index, template)``: template ``None`` for a whole card.
    cards: list[tuple[Pool, int, VnpuTemplate | None]]
    #: Units of this job on usable devices (what reservations count).
    usable_units: float
    #: :func:`expected_end` (``None`` until :func:`end_of` needs it).
    expected_end: float | None
    #: Grace deadline when the job is already leaving.
    leaving: float | None = None
    #: The ``now`` and the job's ``preempt_deadline`` ``expected_end`` was worked out with: it
    #: still holds at a later ``now`` it lies after, for the same deadline (see :func:`end_of`).
    end_now: float = -math.inf
    end_deadline: float | None = None
    #: Position in the running list (``Layout.by_end`` breaks ties of equal ends with it),
    #: and the end it is sorted under there.
    seq: int = 0
    sort_end: float = 0.0
    #: The cards as a shadow replay reads them (``backfill.Release.cards``), built on first use.
    release_cards: list[tuple[Pool, int, int, int, int, bool]] | None = None

    # Written out, not generated: see record.py.
    def __init__(
        self,
        job: JobState,
        chip: str,
        units: float,
        cards: list[tuple[Pool, int, VnpuTemplate | None]],
        usable_units: float,
        expected_end: float | None,
        leaving: float | None = None,
        end_now: float = -math.inf,
        end_deadline: float | None = None,
        seq: int = 0,
        sort_end: float = 0.0,
        release_cards: list[tuple[Pool, int, int, int, int, bool]] | None = None,
    ) -> None:
        self.job = job
        self.chip = chip
        self.units = units
        self.cards = cards
        self.usable_units = usable_units
        self.expected_end = expected_end
        self.leaving = leaving
        self.end_now = end_now
        self.end_deadline = end_deadline
        self.seq = seq
        self.sort_end = sort_end
        self.release_cards = release_cards


_IDX = attrgetter("idx")


def inventory_fingerprint(nodes: list[NodeState]) -> list[object]:
    """Every value of the inventory the layout is built from (node names, schedulable flags, devices).

    One flat list (a node's name and flag, then a tuple per device), read field by
    field: compiled, these are native reads, where ``attrgetter`` went through the
    generic attribute lookup of 64,000 values on 8,000 cards.
    """
    out: list[object] = []
    for node in nodes:
        out.append(node.name)
        out.append(node.schedulable)
        for d in node.devices:
            out.append((d.id, d.index, d.chip_model, d.topology_group, d.usable, d.hbm_mb, d.ai_cores, d.ai_cpus))
    return out


class Layout:
    """The static part of the free state: pools, topology groups, chips, device index.

    Building it reads every device (a third of a tick for 8,000 cards), and it
    only changes when the inventory does, so a finished tick hands it back
    (:meth:`put_back`) and the next tick whose inventory has the same
    fingerprint (:func:`inventory_fingerprint`: every value it is built from,
    compared by value, so a snapshot rebuilt from the database and a simulator
    that flips a device's ``usable`` in place are both seen as they are) takes
    it and only resets the free state. A layout is used by one tick at a time:
    a tick takes it out of the cache (under a lock) and puts it back when done;
    concurrent ticks build their own. Pools copy the device values they read
    later (:class:`Card`), so nothing refers to a snapshot's objects.
    """

    _idle: ClassVar[list[Layout]] = []
    _lock: ClassVar[threading.Lock] = threading.Lock()
    #: Layouts kept for reuse (one per inventory seen last).
    KEEP: ClassVar[int] = 2

    def __init__(self, nodes: list[NodeState], fingerprint: object | None) -> None:
        self.fingerprint = fingerprint
        #: ``Snapshot.inventory_key`` of the snapshot it was built for (``None``: match by fingerprint).
        self.key: object | None = None
        self.chips: dict[str, Chip] = {}
        self.pools: list[Pool] = []
        self.where: dict[int, tuple[Pool, int]] = {}
        #: device id -> (pool, mask keeping the other cards, usable?, whole-card entry of ``Occupant.cards``)
        self.slot_info: dict[int, tuple[Pool, int, bool, tuple[Pool, int, None]]] = {}
        #: ``id(slots)`` -> what :meth:`ClusterState.occupy` worked out for a whole-card job last tick:
        #: ``[slots, cards, units, usable units, chip, ((pool, keep mask), ...) or None, Occupant]``;
        #: the occupant is reused (its per-tick fields reset) while the same job object runs there.
        self.seen_slots: dict[int, list] = {}
        #: Per-team totals over the running jobs of the last tick that used this layout, with the
        #: occupants they were summed from and that tick's number (see :meth:`ClusterState.running_totals`).
        self.totals: tuple[dict[int, Occupant] | None, dict[str, list], int] | None = None
        #: Cards held per pool (a bitmask each, usable or not) by the whole-card jobs in
        #: ``seen_slots`` when they are all the running jobs and no card is held twice: the next
        #: tick of a caller that keeps its job objects starts from it (see :meth:`ClusterState.occupy`).
        self.held: list[int] | None = None
        #: ``(tick number, card_jobs)`` of the last tick that built it, without that tick's starts.
        self.card_jobs: tuple[int, dict[int, list[int]]] | None = None
        #: Ticks that occupied this layout (each tick's number tags what it leaves behind).
        self.gen = 0
        #: The tick that left ``held``.
        self.held_gen = -1
        self.largest_node = 0
        #: Pools given a vNPU slice since the last reset (only they need their slice counts cleared).
        self.sliced: set[Pool] = set()
        #: For callers that pass a ``Snapshot.running_delta``: the free state at the start of the
        #: last tick is kept (``Chip.members`` …, ``Pool.key0``, ``held``), the running jobs then by
        #: id (``occ_map``), the pools that tick changed (``touched``), the delta version it was
        #: for, and the jobs it left out as evicted (still in ``running`` until the caller stops them).
        self.image = False
        self.occ_map: dict[int, Occupant] = {}
        self.touched: list[Pool] = []
        self.delta_version: int | None = None
        self.evicted_last: set[int] = set()
        #: For a caller whose running list keeps its order (``RunningDelta.in_order``): per chip
        #: model, the running jobs with cards sorted by (expected end, running position), as
        #: ``(keys, occupants)``, carried from tick to tick (``None``: built when next needed);
        #: and the next running position to hand out.
        self.by_end: dict[str, tuple[list[tuple[float, int]], list[Occupant]]] | None = None
        self.seq = 0
        #: What the last tick left in its occupants' tick fields (see ``ClusterState.marked``).
        self.stale: tuple[list[Occupant], list[Occupant]] = ([], [])
        #: Request shapes resolved against this inventory and the vNPU templates they were
        #: resolved with (``placement.Need``: they depend on nothing else).
        self.needs: dict[tuple, Any] = {}
        self.needs_templates: dict[tuple[str, str], VnpuTemplate] = {}
        self._build(nodes)
        self.reset()

    @classmethod
    def get(cls, nodes: list[NodeState], key: object | None = None, values: object | None = None) -> Layout:
        """A layout for ``nodes``: a cached one with the same fingerprint, else a new one.

        A cached one is as the last tick left it: :meth:`ClusterState.occupy` resets it
        or, given a running delta, starts from its image of the last tick.

        With ``key`` (``Snapshot.inventory_key``) the caller vouches that equal keys mean
        an equal inventory, and the fingerprint (a read of every device) is skipped. With
        ``values`` (``Snapshot.inventory_values``, the rows the database tick read) the
        fingerprint is those values: comparing them costs a fifth of reading the devices.
        """
        fingerprint: object | None = None
        if key is None:
            fingerprint = ("values", values) if values is not None else ("read", inventory_fingerprint(nodes))
        with cls._lock:
            for i, layout in enumerate(cls._idle):
                if key is not None:
                    same = layout.key == key
                else:
                    same = layout.key is None and layout.fingerprint == fingerprint
                if same:
                    del cls._idle[i]
                    break
            else:
                layout = None
        if layout is None:
            layout = cls(nodes, fingerprint)
            layout.key = key
        return layout

    def put_back(self) -> None:
        with self._lock:
            idle = self._idle
            idle.insert(0, self)
            del idle[self.KEEP :]

    def reset(self) -> None:
        """Nothing held: every usable card free, empty buckets."""
        self.image = False
        self.touched = []
        for pool in self.pools:
            pool.free = pool.usable
            pool.key = -1
        for pool in self.sliced:
            pool.reset_slices()
        self.sliced = set()
        for chip in self.chips.values():
            chip.buckets = [{} for _ in range((chip.gmax + 1) * (chip.size + 1))]
            chip.group_count = [0] * (chip.gmax + 1)
            chip.max_group_free = 0
            chip.slice_buckets = [{} for _ in range(chip.card_cores + 1)]
            chip.free_units = float(chip.usable_count)
            chip.dirty = set()

    def _build(self, nodes: list[NodeState]) -> None:
        chips = self.chips
        where = self.where
        slot_info = self.slot_info
        pools = self.pools
        largest = 0
        for node in nodes:
            devices = node.devices
            if not devices:
                continue
            first = devices[0].chip_model
            by_chip: dict[str, list[DeviceState]] | None = None
            for dev in devices:
                if dev.chip_model != first:
                    by_chip = {}
                    for d in devices:
                        by_chip.setdefault(d.chip_model, []).append(d)
                    for devs in by_chip.values():
                        devs.sort(key=_index)
                    break
            if by_chip is None:  # the usual server: one model
                prev = -1
                for dev in devices:
                    if dev.index < prev:
                        by_chip = {first: sorted(devices, key=_index)}
                        break
                    prev = dev.index
                else:
                    by_chip = {first: list(devices)}
            if len(devices) > largest:
                largest = len(devices)
            for chip_name, devs in by_chip.items():
                pool = Pool(len(pools), node, chip_name, devs)
                pools.append(pool)
                chip = chips.get(chip_name)
                if chip is None:
                    chip = chips[chip_name] = Chip(chip_name)
                chip.pools.append(pool)
                if pool.size > chip.size:
                    chip.size = pool.size
                for g in pool.groups:
                    c = g.bit_count()
                    if c > chip.gmax:
                        chip.gmax = c
                chip.total += pool.size
                chip.usable_count += pool.usable.bit_count()
                for i, dev_id in enumerate(pool.ids):
                    where[dev_id] = (pool, i)
                    slot_info[dev_id] = (pool, ~(1 << i), bool(pool.usable >> i & 1), (pool, i, None))
                cores = mem = cpus = 0
                for dev in devs:
                    if dev.ai_cores > cores:
                        cores = dev.ai_cores
                    if dev.hbm_mb > mem:
                        mem = dev.hbm_mb
                    if dev.ai_cpus > cpus:
                        cpus = dev.ai_cpus
                if cores > chip.card_cores:
                    chip.card_cores = cores
                if mem > chip.card_mem:
                    chip.card_mem = mem
                if cpus > chip.card_cpus:
                    chip.card_cpus = cpus
        self.largest_node = largest
        for chip in chips.values():
            layouts = chip.layouts
            for pool in chip.pools:
                found = layouts.get(pool.groups)
                if found is None:
                    found = layouts[pool.groups] = (len(layouts), {})
                pool.gid, pool.ktab = found


class ClusterState:
    """Free state of the whole cluster for one tick (see the module docstring)."""

    def __init__(self, snapshot: Snapshot, strategy: str, now: float) -> None:
        self.strategy = strategy
        self.now = now
        self.templates: Mapping[tuple[str, str], VnpuTemplate] = snapshot.templates
        layout = self._layout = Layout.get(snapshot.nodes, snapshot.inventory_key, snapshot.inventory_values)
        #: The layout went back to the cache (:meth:`release`): this state is dead.
        self._released = False
        self.chips: dict[str, Chip] = layout.chips
        self.pools: list[Pool] = layout.pools
        #: device id -> (pool, index)
        self.where: dict[int, tuple[Pool, int]] = layout.where
        self.largest_node = layout.largest_node
        #: Shapes resolved against this inventory, kept with the layout while the templates stay.
        if layout.needs_templates != self.templates:
            layout.needs = {}
            layout.needs_templates = dict(self.templates)
        self.needs = layout.needs
        self._card_jobs: dict[int, list[int]] | None = None
        self.occupants: dict[int, Occupant] = {}
        #: Some running or started job holds a vNPU slice (fractional units: no incremental sums).
        self.has_slices = False
        #: :meth:`running_totals` carried its sums on the layout; with it, what changed since
        #: the previous tick's (``None``: counted from scratch); :attr:`card_jobs` patches with it.
        self._carried = False
        #: ``(tick number it is from, gone, new)``.
        self._diff: tuple[int, list[Occupant], list[Occupant]] | None = None
        #: This tick's number on the layout, and the changes :meth:`_occupy_changes` found
        #: since the tick that left ``held`` (``(that tick, gone, new)``).
        self.gen = -1
        #: The caller keeps its job objects between ticks (see :meth:`occupy`): only then is
        #: anything about the running jobs carried to the next tick.
        self.reuse = False
        self._occ_diff: tuple[int, list[Occupant], list[Occupant]] | None = None
        #: Jobs started in this tick (taken out of ``card_jobs`` again before it is kept).
        self._started: list[Occupant] = []
        self._delta = snapshot.running_delta
        #: The caller's running list keeps its order (see ``RunningDelta.in_order``).
        self.in_order = False
        #: Pools whose free cards this tick changed (the next tick puts them back first).
        self._touched: list[Pool] = []
        #: The running jobs already leaving (``preempt_deadline`` set), in the running list's order.
        self.leaving: list[Occupant] = []
        #: Occupants this tick made leave (victims): with :attr:`leaving`, the only ones whose
        #: tick field a carried-over running set must clear.
        self.marked: list[Occupant] = []

    def release(self) -> None:
        """The tick is over: hand the layout back for the next tick (this state is dead after)."""
        layout = self._layout
        if not self._released:
            self._released = True
            occ_map = layout.occ_map
            for occ in self._started:  # the kept running set is the one the tick began with
                if occ_map.get(occ.job.id) is occ:
                    del occ_map[occ.job.id]
            layout.touched = self._touched
            layout.stale = (self.leaving, self.marked)
            cj = self._card_jobs
            if cj is not None and self._carried and not self.has_slices:
                for occ in self._started:  # back to the jobs running when the tick began
                    _card_jobs_drop(cj, occ)
                layout.card_jobs = (self.gen, cj)
            layout.put_back()

    def _changes(self, before: dict[int, Occupant]) -> tuple[list[Occupant], list[Occupant]] | None:
        """Occupants gone since ``before`` and new ones, or ``None`` when rebuilding is cheaper.

        Only a caller that reuses its job objects (the simulator) keeps occupants
        between ticks (see :meth:`occupy`); a database tick's are all new, and
        there the diff would cost more than the rebuild it saves.
        """
        occupants = self.occupants
        get = occupants.get
        removed = [occ for jid, occ in before.items() if get(jid) is not occ]
        if len(removed) * 4 > len(occupants) + 16:
            return None
        prev = before.get
        added = [occ for jid, occ in occupants.items() if prev(jid) is not occ]
        if (len(removed) + len(added)) * 4 > len(occupants) + 16:
            return None
        return removed, added

    def running_totals(self) -> dict[str, list]:
        """team -> ``[units, {chip: units}, jobs]`` over the running jobs, whole cards only.

        Every unit is a whole card here, so the sums are exact in any order and
        can be carried from the last tick on this layout: only the jobs that
        ended or started since are added or taken away (the simulator's ticks
        differ by a few jobs out of thousands). The dict is shared with the
        layout: read it, never change it.
        """
        layout = self._layout
        assert layout is not None and not self.has_slices
        occupants = self.occupants
        if not self.reuse:  # new objects every tick (the database's): nothing to carry over
            layout.totals = None
            totals: dict[str, list] = {}
            for occ in occupants.values():
                _add_total(totals, occ, 1.0)
            return totals
        self._carried = True
        known = self._occ_diff
        # The running set as counted, for a next tick that cannot say what changed (no
        # running delta): a copy of it, unless this one could (the next will too, most likely).
        base = dict(occupants) if known is None else None
        cached = layout.totals
        if cached is not None:
            if known is not None and known[0] == cached[2]:  # occupy already knows what changed
                diff: tuple[list[Occupant], list[Occupant]] | None = (known[1], known[2])
            elif cached[0] is not None:
                diff = self._changes(cached[0])
            else:
                diff = None
            if diff is not None:
                self._diff = (cached[2], *diff)
                totals = cached[1]
                for sign, occs in ((-1.0, diff[0]), (1.0, diff[1])):
                    for occ in occs:
                        _add_total(totals, occ, sign)
                layout.totals = (base, totals, self.gen)
                return totals
        totals = {}
        for occ in occupants.values():
            _add_total(totals, occ, 1.0)
        layout.totals = (base, totals, self.gen)
        return totals

    @property
    def card_jobs(self) -> dict[int, list[int]]:
        """device id -> job ids on it (one for a whole card, several slices); built on first use.

        With whole cards only (one job per card, so no order to keep) the last
        tick's map is patched with the jobs that came and went since.
        """
        cj = self._card_jobs
        if cj is None:
            layout = self._layout
            cached = layout.card_jobs if layout is not None else None
            if layout is not None:
                layout.card_jobs = None  # this tick owns the map now (or it is stale)
            diff = self._diff
            if cached is not None and diff is not None and cached[0] == diff[0] and not self.has_slices:
                cj = self._card_jobs = cached[1]
                for occ in diff[1]:
                    _card_jobs_drop(cj, occ)
                for occ in diff[2]:
                    _card_jobs_add(cj, occ)
                for occ in self._started:
                    _card_jobs_add(cj, occ)
                return cj
            cj = self._card_jobs = {}
            for occ in self.occupants.values():
                _card_jobs_add(cj, occ)
        return cj

    def add_occupant(self, occ: Occupant, sliced: bool | None = None) -> None:
        """Record a job started in this tick (after its cards were taken); ``sliced``: it holds a slice, if known."""
        jid = occ.job.id
        self.occupants[jid] = occ
        self._started.append(occ)
        if not self.has_slices and (any(card[2] is not None for card in occ.cards) if sliced is None else sliced):
            self.has_slices = True
        cj = self._card_jobs
        if cj is not None:
            _card_jobs_add(cj, occ)

    def occupy(
        self,
        running: Iterable[JobState],
        evicted: set[int],
        reuse: bool = False,
        leaving: list[JobState] | None = None,
    ) -> None:
        """Mark the running jobs' devices taken (jobs in ``evicted`` are gone). Once, on a fresh state.

        ``reuse``: the caller keeps its job objects from tick to tick (it passes an
        inventory key); then the cards held at the last tick are kept on the layout
        and only the jobs that came and went since are applied (:meth:`_occupy_changes`).
        With a ``Snapshot.running_delta`` as well, even the free state and the running
        set are carried over (:meth:`_occupy_delta`): the tick costs what changed.
        ``leaving``: the running jobs with a ``preempt_deadline``, in order, if the caller
        has them (found by a scan if not).
        """
        layout = self._layout
        layout.gen += 1
        self.gen = layout.gen
        self.reuse = reuse
        held = layout.held
        layout.held = None
        running = running if isinstance(running, list) else list(running)
        delta = self._delta if reuse else None
        in_order = self.in_order = delta is not None and delta.in_order
        stale = layout.stale
        if not in_order:
            layout.by_end = None
        image = layout.image and not layout.sliced and delta is not None and delta.since == layout.delta_version
        layout.delta_version = delta.version if delta is not None else None
        if leaving is None:
            leaving = [job for job in running if job.preempt_deadline is not None]
        if image and held is not None and self._occupy_delta(running, evicted, held, delta):  # type: ignore[arg-type]
            self._find_leaving(leaving)
            if layout.by_end is not None:
                diff = self._occ_diff
                assert diff is not None  # set by _occupy_delta
                self._update_by_end(diff[1], diff[2], stale)
            return
        layout.by_end = None
        layout.reset()
        self.occupants = {}
        if reuse and held is not None:
            jobs = running
            if evicted:
                jobs = [job for job in jobs if job.id not in evicted]
            if not self._occupy_changes(jobs, held):
                layout.reset()  # half applied: start again from nothing held
                self.occupants.clear()
                self._occupy_all(jobs, set(), reuse)
        else:
            self._occupy_all(running, evicted, reuse)
        layout.occ_map = self.occupants if reuse else {}
        if in_order:  # running positions, in the running list's order (so is the dict)
            seq = layout.seq
            for occ in self.occupants.values():
                occ.seq = seq
                seq += 1
            layout.seq = seq
        layout.evicted_last = set(evicted)
        # (``self._layout``, not ``layout``: the type checker still sees the ``None`` set above,
        # and a compiled build would check the value against it.)
        if delta is not None and self._layout.held is not None:
            self._keep_image()
        self._find_leaving(leaving)

    def _find_leaving(self, jobs: list[JobState]) -> None:
        """:attr:`leaving` from the running jobs with a deadline, in the running list's order
        (what breaks ties between leaving jobs)."""
        occupants = self.occupants
        leaving = self.leaving = []
        for job in jobs:
            occ = occupants.get(job.id)
            if occ is not None and occ.job is job:
                occ.leaving = job.preempt_deadline
                leaving.append(occ)

    def by_end(self, running: list[JobState]) -> dict[str, list[Occupant]]:
        """Running jobs with cards (started before this tick) per chip model, by expected end.

        Ties keep the running list's order (what the shadow replay reads first). For a
        caller whose list keeps its order, the lists are kept on the layout and patched
        from tick to tick (:meth:`_update_by_end`); otherwise sorted here. Read only.
        """
        layout = self._layout
        kept = layout.by_end
        if kept is not None:
            return {name: occs for name, (_, occs) in kept.items()}
        now = self.now
        by_chip: dict[str, list[Occupant]] = {}
        occupants = self.occupants
        if self.in_order:  # the running set is kept in the list's order
            for occ in occupants.values():
                if occ.cards and occ.job.started_at is not None:
                    occs = by_chip.get(occ.chip)
                    if occs is None:
                        by_chip[occ.chip] = [occ]
                    else:
                        occs.append(occ)
        else:
            for job in running:
                found = occupants.get(job.id)
                if found is not None and found.job is job and found.cards and job.started_at is not None:
                    occs = by_chip.get(found.chip)
                    if occs is None:
                        by_chip[found.chip] = [found]
                    else:
                        occs.append(found)
        out: dict[str, list[Occupant]] = {}
        keep: dict[str, tuple[list[tuple[float, int]], list[Occupant]]] = {}
        for name, occs in by_chip.items():
            ends = ends_of(occs, now)
            order = sorted(range(len(occs)), key=ends.__getitem__)
            out[name] = ordered = [occs[i] for i in order]
            if self.in_order:
                keys = []
                for i in order:
                    occ = occs[i]
                    occ.sort_end = ends[i]
                    keys.append((ends[i], occ.seq))
                keep[name] = (keys, ordered)
        if self.in_order:
            layout.by_end = keep
        return out

    def _update_by_end(self, gone: list[Occupant], added: list[Occupant], stale: tuple[list[Occupant], ...]) -> None:
        """Patch ``Layout.by_end`` with the jobs that left, came, or changed deadline since the last tick.

        A kept end still holds while it lies after ``now`` (see :func:`end_of`): when the
        earliest does not, the lists are dropped and sorted afresh when next needed.
        """
        layout = self._layout
        kept = layout.by_end
        assert kept is not None
        now = self.now
        moved = {id(occ): occ for group in stale for occ in group}  # deadlines may have changed
        for occ in self.leaving:
            moved[id(occ)] = occ
        for occ in gone:
            moved[id(occ)] = occ
        for occ in moved.values():  # take them out where they were sorted
            entry = kept.get(occ.chip)
            if entry is None or not occ.cards:
                continue
            keys, occs = entry
            i = bisect_left(keys, (occ.sort_end, occ.seq))
            if i < len(occs) and occs[i] is occ:
                del keys[i]
                del occs[i]
        occupants = self.occupants
        back = [occ for occ in moved.values() if occupants.get(occ.job.id) is occ]
        for occ in [*back, *added]:
            if not occ.cards or occ.job.started_at is None:
                continue
            entry = kept.get(occ.chip)
            if entry is None:
                entry = kept[occ.chip] = ([], [])
            keys, occs = entry
            end = end_of(occ, now)
            occ.sort_end = end
            key = (end, occ.seq)
            i = bisect_left(keys, key)
            keys.insert(i, key)
            occs.insert(i, occ)
        for keys, _ in kept.values():
            if keys and keys[0][0] <= now:
                layout.by_end = None
                return

    def _keep_image(self) -> None:
        """Record the free state as the tick begins, for the next tick's :meth:`_occupy_delta`."""
        for chip in self.chips.values():
            chip.members = [list(bucket) for bucket in chip.buckets]  # in pool order, as just bucketed
            chip.counts0 = list(chip.group_count)
            chip.top0 = chip.max_group_free
            chip.free0 = chip.free_units
            chip.dirty = set()
        for pool in self.pools:
            pool.key0 = pool.key
        self._layout.image = True

    def _occupy_delta(self, running: list[JobState], evicted: set[int], held: list[int], delta: RunningDelta) -> bool:
        """Start from the last tick's image and apply ``delta``: ``False`` (nothing changed) when it does not hold.

        Builds what :meth:`_occupy_all` would: the same free masks, buckets in
        pool order, per-chip counts and free units (whole cards: integer sums), one
        occupant per running job with its tick fields cleared. The running set is
        kept by job id, in the running list's order only when the caller promises
        ``in_order``: what depends on that order (:attr:`leaving`, the shadow time's
        releases) walks the running list otherwise. Everything is checked before
        anything is changed.
        """
        layout = self._layout
        occ_map = layout.occ_map
        evicted_last = layout.evicted_last
        gone: dict[int, Occupant] = {}
        for job in delta.ended:
            occ = occ_map.get(job.id)
            if occ is None:
                if job.id in evicted_last:
                    continue  # left out as evicted last tick, stopped since
                return False
            if occ.job is not job:
                return False
            gone[job.id] = occ
        if evicted_last and not evicted_last <= ({job.id for job in delta.ended} | evicted):
            return False  # an evicted job is back without being stopped: count the long way
        for jid in evicted:
            occ = occ_map.get(jid)
            if occ is not None:
                gone[jid] = occ
        new_held = list(held)
        changed: set[Pool] = set()
        for occ in gone.values():
            for pool, i, _ in occ.cards:
                new_held[pool.idx] &= ~(1 << i)
                changed.add(pool)
        added: list[Occupant] = []
        seq = layout.seq
        for job in delta.started:
            if job.id in evicted:
                continue
            if job.id in occ_map and job.id not in gone:
                return False
            occ = self._whole_card_occupant(job, new_held, changed)
            if occ is None:
                return False
            occ.seq = seq
            seq += 1
            added.append(occ)
        layout.seq = seq
        # The promise holds: apply it.
        for jid in gone:
            del occ_map[jid]
        for occ in added:
            occ_map[occ.job.id] = occ
        leaving, marked = layout.stale  # the tick fields the last tick set, cleared
        for occ in leaving:
            occ.leaving = None
        for occ in marked:
            occ.leaving = None
        self.occupants = occ_map  # (expected ends carry over while they hold: see end_of)
        for pool in layout.touched:  # back to the free state the last tick began with
            pool.free = pool.usable & ~held[pool.idx]
            pool.key = pool.key0
        chips = self.chips
        moved: set[str] = set()
        for pool in changed:
            chip = chips[pool.chip]
            before = pool.usable & ~held[pool.idx]
            free = pool.free = pool.usable & ~new_held[pool.idx]
            chip.free0 += free.bit_count() - before.bit_count()
            key = pool.ktab.get(free)
            if key is None:
                key = chip.bucket_key(pool)
            old = pool.key0
            if key != old:
                chip.members[old].remove(pool)
                insort(chip.members[key], pool, key=_IDX)
                chip.dirty.add(old)
                chip.dirty.add(key)
                width = chip.size + 1
                chip.counts0[old // width] -= 1
                chip.counts0[key // width] += 1
                pool.key0 = key
                moved.add(chip.name)
            pool.key = key
        for chip in chips.values():
            if chip.name in moved:
                counts = chip.counts0
                top = len(counts) - 1
                while top > 0 and counts[top] == 0:
                    top -= 1
                chip.top0 = top
            if chip.dirty:
                buckets = chip.buckets
                members = chip.members
                for key in chip.dirty:
                    buckets[key] = dict.fromkeys(members[key])
                chip.dirty = set()
            chip.group_count = list(chip.counts0)
            chip.max_group_free = chip.top0
            chip.free_units = chip.free0
        if layout.seen_slots:
            layout.seen_slots = {}  # the running set is kept here now; the slots index is stale
        self._occ_diff = (layout.held_gen, list(gone.values()), added)
        layout.held = new_held
        layout.held_gen = self.gen
        layout.evicted_last = set(evicted)
        self.has_slices = False
        return True

    def _occupy_changes(self, jobs: list[JobState], base: list[int]) -> bool:
        """Occupy from the last tick's cards: ``False`` (nothing to trust) when that does not apply.

        It applies when every running job is a whole-card job known by its slots
        tuple (``seen_slots``) or new, the set changed by a few jobs, and no card is
        claimed twice. The result is what :meth:`_occupy_all` would build: the same
        free masks (usable and not held), occupants in the running list's order,
        pools bucketed in pool order.
        """
        layout = self._layout
        seen = layout.seen_slots
        cur = {id(job.slots): job for job in jobs}
        if len(cur) != len(jobs):  # a tuple shared by two jobs (``()``): count them the long way
            return False
        gone = seen.keys() - cur.keys()
        new = cur.keys() - seen.keys()
        if (len(gone) + len(new)) * 4 > len(jobs) + 16:
            return False
        held = list(base)
        removed = []
        for key in gone:
            hit = seen.pop(key)
            removed.append(hit[6])
            for pool, i, _ in hit[1]:
                held[pool.idx] &= ~(1 << i)
        added = []
        for key in new:
            job = cur[key]
            occ = self._whole_card_occupant(job, held, None)
            if occ is None:
                return False
            seen[key] = [job.slots, occ.cards, occ.units, occ.usable_units, occ.chip, None, occ]
            added.append(occ)
        occupants = self.occupants
        for key, job in cur.items():  # the running list's order (its keys are distinct)
            occ = seen[key][6]
            if occ is None or occ.job is not job:
                return False
            occ.expected_end = None
            occ.leaving = job.preempt_deadline
            occupants[job.id] = occ
        for pool, mask in zip(self.pools, held, strict=True):
            pool.free = pool.usable & ~mask
        self._occ_diff = (layout.held_gen, removed, added)
        layout.held = held
        layout.held_gen = self.gen
        self.has_slices = False
        self._bucket_all(set())
        return True

    def _whole_card_occupant(self, job: JobState, held: list[int], changed: set[Pool] | None) -> Occupant | None:
        """A new running job's occupant, its cards marked in ``held`` (and their pools in ``changed``).

        ``None`` where the short ways stop (an unknown card, a vNPU slice, a card
        already held, no card at all): the caller then counts the long way.
        """
        slot_info = self._layout.slot_info
        cards: list[tuple[Pool, int, VnpuTemplate | None]] = []
        usable_units = 0.0
        chip_name = ""
        for slot in job.slots:
            info = slot_info.get(slot.device_id)
            if info is None or slot.vnpu_template is not None:
                return None
            pool, _, usable, card = info
            bit = 1 << card[1]
            if held[pool.idx] & bit:
                return None  # claimed twice
            held[pool.idx] |= bit
            if changed is not None:
                changed.add(pool)
            chip_name = pool.chip
            if usable:
                usable_units += 1.0
            cards.append(card)
        if not cards:
            return None
        return Occupant(job, chip_name, float(len(cards)), cards, usable_units, None, job.preempt_deadline)

    def _occupy_all(self, running: Iterable[JobState], evicted: set[int], reuse: bool) -> None:
        """:meth:`occupy` job by job."""
        templates = self.templates
        chips = self.chips
        occupants = self.occupants
        sliced: set[Pool] = set()
        layout = self._layout
        slot_info = layout.slot_info
        # Whole-card jobs already seen by this layout, by their slots tuple: the
        # simulator keeps a running job's tuple from tick to tick. A tuple of
        # frozen slots is a value, so the same object means the same cards;
        # the entry keeps the tuple alive so its id cannot be reused. Entries
        # not seen in this tick are dropped.
        # (A caller that builds new objects every tick, the database, never hits: no index.)
        seen = layout.seen_slots if reuse else {}
        kept: dict[int, list] = {}
        # Such a caller has nothing to patch :attr:`card_jobs` from: it is built here, in the
        # order the property would build it (running jobs, then their cards), at little cost.
        cj: dict[int, list[int]] | None = None if reuse else {}
        for job in running:
            if evicted and job.id in evicted:
                continue
            slots = job.slots
            hit = seen.get(id(slots)) if reuse else None
            if hit is not None and hit[0] is slots:
                masks = hit[5]
                if masks is None:  # second sighting: worth a mask per node
                    merged: dict[Pool, int] = {}
                    for pool, i, _ in hit[1]:
                        merged[pool] = merged.get(pool, -1) & ~(1 << i)
                    masks = hit[5] = tuple(merged.items())
                for pool, keep in masks:
                    pool.free &= keep
                kept[id(slots)] = hit
                occ = hit[6]
                if occ is not None and occ.job is job:  # the same run as last tick: only its tick fields change
                    occ.expected_end = None
                    occ.leaving = job.preempt_deadline
                else:
                    occ = hit[6] = Occupant(job, hit[4], hit[2], hit[1], hit[3], None, job.preempt_deadline)
                occupants[job.id] = occ
                continue
            cards: list[tuple[Pool, int, VnpuTemplate | None]] = []
            mine: list[int] | None = None  # the job's list in ``cj``, shared by its cards
            units = usable_units = 0.0
            chip_name = job.chip_model
            located: str | None = None
            whole = True
            for slot in slots:
                info = slot_info.get(slot.device_id)
                if info is None:  # device gone from the inventory: count it, place nothing
                    units += 1.0
                    if slot.vnpu_template is not None:
                        whole = False
                    continue
                pool, keep, usable, card = info
                chip_name = located = pool.chip
                pool.free &= keep
                if cj is not None:  # (see _card_jobs_add)
                    on_card = cj.get(slot.device_id)
                    if on_card is None:
                        if mine is None:
                            mine = [job.id]
                        cj[slot.device_id] = mine
                    else:
                        cj[slot.device_id] = [*on_card, job.id]
                tmpl = None
                if slot.vnpu_template is not None:
                    whole = False
                    tmpl = templates.get((chip_name, slot.vnpu_template))
                if tmpl is None:
                    units += 1.0
                    if usable:
                        usable_units += 1.0
                    cards.append(card)
                    continue
                i = card[1]
                pool.used_cores[i] += tmpl.ai_cores
                pool.used_mem[i] += tmpl.memory_mb
                pool.used_cpus[i] += tmpl.ai_cpus
                pool.slices[i] += 1
                sliced.add(pool)
                u = chips[chip_name].slice_units(tmpl)
                units += u
                if usable:
                    usable_units += u
                cards.append((pool, i, tmpl))
            # expected_end is worked out when a shadow time needs it (see :func:`end_of`)
            occ = Occupant(job, chip_name or "", units, cards, usable_units, None, job.preempt_deadline)
            if whole and cards and reuse:
                kept[id(slots)] = [slots, cards, units, usable_units, located, None, occ]
            occupants[job.id] = occ
        layout.seen_slots = kept
        if cj is not None:
            self._card_jobs = cj
        self.has_slices = bool(sliced)
        layout.sliced |= sliced
        if reuse and not sliced and len(kept) == len(occupants):
            layout.held = self._held_masks(kept)
            layout.held_gen = self.gen
        self._bucket_all(sliced)

    def _held_masks(self, kept: dict[int, list]) -> list[int] | None:
        """Cards held per pool by the jobs in ``kept``, or ``None`` when a card is held twice."""
        held = [0] * len(self.pools)
        for hit in kept.values():
            for pool, i, _ in hit[1]:
                bit = 1 << i
                if held[pool.idx] & bit:
                    return None
                held[pool.idx] |= bit
        return held

    def _bucket_all(self, sliced: set[Pool]) -> None:
        """Every pool into its bucket (all empty after the reset), in pool order."""
        for chip in self.chips.values():
            free_units = 0.0
            width = chip.size + 1
            buckets = chip.buckets
            counts = chip.group_count
            top = chip.max_group_free
            for pool in chip.pools:
                free = pool.free
                key = pool.ktab.get(free)
                if key is None:
                    key = chip.bucket_key(pool)
                buckets[key][pool] = None
                pool.key = key
                g = key // width
                counts[g] += 1
                if g > top:
                    top = g
                free_units += free.bit_count()
                if pool in sliced:
                    for i in range(pool.size):
                        if pool.slices[i] and pool.usable >> i & 1:
                            free_units += self._slice_left(chip, pool, i) / chip.card_cores
                            self._rebucket_slice(chip, pool, i, None)
            chip.max_group_free = top
            chip.free_units = free_units

    # -- slices --------------------------------------------------------------

    @staticmethod
    def _slice_left(chip: Chip, pool: Pool, i: int) -> int:
        return max(pool.devs[i].ai_cores - pool.used_cores[i], 0)

    def _rebucket_slice(self, chip: Chip, pool: Pool, i: int, old_left: int | None) -> None:
        if old_left is not None:
            chip.slice_buckets[old_left].pop((pool, i), None)
        if pool.slices[i] and pool.usable >> i & 1:
            chip.slice_buckets[self._slice_left(chip, pool, i)][(pool, i)] = None

    def hide_slices(self, pool: Pool, i: int) -> None:
        """Take a sliced card out of slice placement (held for a blocked job); :meth:`show_slices` undoes it.

        Its slices stay; a slice started on it puts it back (:meth:`take_slice`).
        """
        chip = self.chips[pool.chip]
        chip.slice_buckets[self._slice_left(chip, pool, i)].pop((pool, i), None)

    def show_slices(self, pool: Pool, i: int) -> None:
        self._rebucket_slice(self.chips[pool.chip], pool, i, None)

    # -- taking devices ------------------------------------------------------

    def take_whole(self, pool: Pool, mask: int) -> None:
        """Give the cards in ``mask`` (free ones) to a job."""
        self._touched.append(pool)
        pool.free &= ~mask
        self.chips[pool.chip].rebucket(pool)

    def release_whole(self, pool: Pool, mask: int) -> None:
        """Undo :meth:`take_whole` (used for the backfill hold, never for running jobs)."""
        self._touched.append(pool)
        pool.free |= mask & pool.usable
        self.chips[pool.chip].rebucket(pool)

    def take_slice(self, pool: Pool, i: int, tmpl: VnpuTemplate) -> None:
        chip = self.chips[pool.chip]
        bit = 1 << i
        old_left: int | None = None
        if not self._released:  # (a released layout may be another tick's by now)
            self._layout.sliced.add(pool)
        if pool.slices[i]:
            old_left = self._slice_left(chip, pool, i)
        elif pool.free & bit:
            self.take_whole(pool, bit)
        pool.used_cores[i] += tmpl.ai_cores
        pool.used_mem[i] += tmpl.memory_mb
        pool.used_cpus[i] += tmpl.ai_cpus
        pool.slices[i] += 1
        self._rebucket_slice(chip, pool, i, old_left)


def _card_jobs_add(cj: dict[int, list[int]], occ: Occupant) -> None:
    """Put ``occ``'s job on its cards in a ``card_jobs`` map.

    The lists of the map are never changed in place, only replaced: so the cards a
    job has to itself share one list (a whole-card job of 8 cards makes one, not 8;
    a tick's 10,000 such lists were a tenth of its allocations).
    """
    jid = occ.job.id
    mine: list[int] | None = None
    for pool, i, _ in occ.cards:
        dev = pool.ids[i]
        jobs = cj.get(dev)
        if jobs is None:
            if mine is None:
                mine = [jid]
            cj[dev] = mine
        else:
            cj[dev] = [*jobs, jid]


def _card_jobs_drop(cj: dict[int, list[int]], occ: Occupant) -> None:
    """Take ``occ``'s job off its cards in a ``card_jobs`` map (replacing lists, see :func:`_card_jobs_add`)."""
    jid = occ.job.id
    for pool, i, _ in occ.cards:
        dev = pool.ids[i]
        jobs = cj.get(dev)
        if jobs is not None and jid in jobs:
            rest = [j for j in jobs if j != jid]
            if rest:
                cj[dev] = rest
            else:
                del cj[dev]


def _add_total(totals: dict[str, list], occ: Occupant, sign: float) -> None:
    """Add (``sign`` 1) or take away (-1) one whole-card job in :meth:`ClusterState.running_totals`."""
    team = occ.job.team
    units = sign * occ.units
    row = totals.get(team)
    if row is None:
        row = totals[team] = [0.0, {}, 0]
    row[0] += units
    chips = row[1]
    left = chips.get(occ.chip, 0.0) + units
    if left:
        chips[occ.chip] = left
    else:
        chips.pop(occ.chip, None)
    row[2] += 1 if sign > 0 else -1
    if not row[2]:
        del totals[team]


def expected_end(job: JobState, now: float) -> float:
    """When a running job should end: start + estimate, or + max duration, never before now.

    A job that overran its estimate is expected to run to its max duration; one
    that overran both is taken to end "now" for planning, one that has neither
    has no known end (``inf``). A leaving job ends at its grace deadline at the
    latest.
    """
    start = job.started_at if job.started_at is not None else now
    end = start + job.estimated_duration_s if job.estimated_duration_s > 0 else float("inf")
    if end <= now and job.max_duration_s:
        end = start + job.max_duration_s
    if end == float("inf") and job.max_duration_s:
        end = start + job.max_duration_s
    end = max(end, now)
    if job.preempt_deadline is not None:
        end = min(end, max(job.preempt_deadline, now))
    return end


def end_of(occ: Occupant, now: float) -> float:
    """When ``occ``'s cards come free: its expected end, or its grace deadline if earlier.

    ``expected_end`` is kept with the time it was worked out at: it depends on ``now``
    only where ``now`` clamps it (an overrun estimate, a deadline already passed), so a
    value that lies after a later ``now``, worked out for the same deadline, is still
    right then (a running set carried from tick to tick reuses it).
    """
    end = occ.expected_end
    if (
        end is None
        or occ.job.preempt_deadline != occ.end_deadline
        or (now != occ.end_now and not (now > occ.end_now and end > now))
    ):
        end = occ.expected_end = expected_end(occ.job, now)
        occ.end_now = now
        occ.end_deadline = occ.job.preempt_deadline
    leaving = occ.leaving
    return end if leaving is None else min(end, leaving)


def ends_of(occs: list[Occupant], now: float) -> list[float]:
    """``[end_of(occ, now) for occ in occs]``, inlined: a shadow time needs it for every running job."""
    inf = float("inf")
    out: list[float] = []
    append = out.append
    for occ in occs:
        end = occ.expected_end
        if (
            end is None
            or occ.job.preempt_deadline != occ.end_deadline
            or (now != occ.end_now and not (now > occ.end_now and end > now))
        ):
            job = occ.job
            start = job.started_at if job.started_at is not None else now
            est = job.estimated_duration_s
            end = start + est if est > 0 else inf
            longest = job.max_duration_s
            if longest and (end <= now or end == inf):
                end = start + longest
            if end < now:
                end = now
            deadline = job.preempt_deadline
            if deadline is not None:
                end = min(end, max(deadline, now))
            occ.expected_end = end
            occ.end_now = now
            occ.end_deadline = deadline
        leaving = occ.leaving
        append(end if leaving is None or end <= leaving else leaving)
    return out


def slot_units(state: ClusterState, device_id: int, template: str | None) -> float:
    """Device units of one slot (1 for a whole card)."""
    if template is None:
        return 1.0
    loc = state.where.get(device_id)
    if loc is None:
        return 1.0
    chip = state.chips[loc[0].chip]
    tmpl = state.templates.get((chip.name, template))
    return chip.slice_units(tmpl) if tmpl is not None else 1.0
