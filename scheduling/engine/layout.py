"""What carries over between ticks: the cluster's layout, kept while the inventory is the same.

Lifetime: a :class:`Layout` lives from the first tick that sees an inventory
(by :func:`inventory_fingerprint`, or the snapshot's ``inventory_key``) until
:attr:`Layout.KEEP` other inventories have been seen since; between ticks it
waits in a small cache, and a tick takes it out (under a lock) and puts it back
when done, so one tick at a time uses it. Everything that a tick may reuse from
the last one hangs off it: the pools, topology groups and chips (:class:`Pool`,
:class:`Chip`, their lookup tables), the device index, the occupants of the
running jobs and what the last tick worked out for them (``seen_slots``,
``held``, ``totals``, ``by_end``, the image of the last tick's free state), and
the request shapes resolved against this inventory (``needs``).

The free state of one tick (which cards are free now, the buckets, what the
tick started) is :class:`capacity.ClusterState`; it resets or patches the
layout's free fields at the start of a tick and changes them only through its
own methods. Nothing here refers to a snapshot's objects (pools copy the device
values they read, :class:`Card`), so a kept layout is valid for any later
snapshot with the same inventory.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from scheduling.engine.record import Record
from scheduling.engine.snapshot import DeviceState, JobState, NodeState, Slot, VnpuTemplate

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


class PoolReplay:
    """One pool as a shadow replay (``backfill.Replay``) has it: its free cards, and how many jobs each card still has.

    A card is free once all its occupants have ended: their count goes down with each release.
    Kept on the pool (``Pool.replayed``) and marked with the replay it belongs to: the next
    replay that touches the pool renews it in place. A tick replays a few dozen times over the
    same pools; one object per pool and replay, in a dictionary per replay, was a fifth of a
    replay's cost. (A tick owns its layout's pools: no two replays run at once on them.)

    The counts a replay starts from (``base``) are read from the map of jobs per card once and
    kept until that map changes on one of the pool's cards (``Pool.jobs_changed``) or is
    another map: a starving tick's replays read the same cards' counts tens of times, and
    that look-up per card was the largest single cost of a replay's step.
    """

    __slots__ = ("base", "base_map", "base_stamp", "counts", "free", "mark", "own")

    def __init__(self, pool: Pool, mark: object, card_jobs: dict[int, list[int]]) -> None:
        #: The replay this state belongs to (``backfill.Replay.mark``).
        self.mark = mark
        #: Jobs per card now, and the map and ``Pool.jobs_changed`` they were read at (none yet).
        self.base: list[int] = []
        self.base_map: dict[int, list[int]] | None = None
        self.base_stamp = -1
        #: Jobs per card as the replay has them (``base`` less the releases so far): ``base`` itself
        #: until the replay writes a count (``own``: a copy of its own). A whole card's one job
        #: ending leaves nothing to write, and that is most releases: most replays copy nothing.
        self.counts: list[int] = []
        self.own = False
        #: The free mask: as it is now until a release frees a card.
        self.free: int = pool.free
        self.read_base(pool, card_jobs)
        self.counts = self.base
        # (A later replay renews it in ``backfill.Replay.step``, written out there: most of a
        # replay's steps renew a pool.)

    def read_base(self, pool: Pool, card_jobs: dict[int, list[int]]) -> None:
        """Read the pool's jobs per card from ``card_jobs``, as of ``Pool.jobs_changed``."""
        self.base = [len(card_jobs.get(dev, ())) for dev in pool.ids]
        self.base_map = card_jobs
        self.base_stamp = pool.jobs_changed


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
        "jobs_changed",
        "key",
        "key0",
        "keys",
        "ktab",
        "node",
        "replayed",
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
        #: The same list, read as objects: a look-up by device id in a dictionary (a replay's
        #: claimed cards) takes the list's own int, where reading ``ids`` builds one again.
        self.keys = cast("list[object]", self.ids)
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
        #: This pool as the last shadow replay that touched it had it (:class:`PoolReplay`).
        self.replayed: PoolReplay | None = None
        #: Bumped whenever a map of jobs per card (``ClusterState.card_jobs``) changes on one of
        #: this pool's cards: a replay's counts read before are stale then (:class:`PoolReplay`).
        self.jobs_changed = 0

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
    #: Bumped whenever a pool changes place in the buckets (placement walks them in order): a
    #: tick's memo of failed held-card tries knows from it that their moves were the last ones.
    moves: int = 0
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
        self.moves += 1
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
    #: Marks a shadow replay reads instead of a set of ids per replay (``decide.Tick.replay``):
    #: the tick whose start or leave moved this job's release (its token), and the replay for
    #: which some of its cards are claimed. Compared by identity, so a copy never matches.
    moved_in: object | None = field(default=None, compare=False, repr=False)
    claimed_in: object | None = field(default=None, compare=False, repr=False)

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
        moved_in: object | None = None,
        claimed_in: object | None = None,
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
        self.moved_in = moved_in
        self.claimed_in = claimed_in


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
        #: ``held`` is the cards of the jobs in ``seen_slots`` (left by a tick that counted the
        #: running jobs by their slots). A tick that applied a ``running_delta`` keeps ``held``
        #: but empties ``seen_slots``: the way between (``ClusterState._occupy_changes``), which
        #: finds the jobs gone by ``seen_slots``, must not start from it.
        self.held_seen = False
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
