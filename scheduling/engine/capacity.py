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
* vNPU slices: sliced cards sit in buckets by remaining AI cores.

Device units: a whole card is 1; a vNPU slice is ``template.ai_cores /
card.ai_cores`` of a card (quota, reservations and fair share all count so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scheduling.engine.snapshot import DeviceState, JobState, NodeState, Snapshot, VnpuTemplate

#: Float slack for unit sums (slices make fractions such as 0.3 + 0.3 + 0.4).
EPS = 1e-9


def lowest_bits(mask: int, n: int) -> list[int]:
    """Positions of the ``n`` lowest set bits of ``mask`` (``mask`` has at least ``n``)."""
    out = []
    while len(out) < n:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _index(dev: DeviceState) -> int:
    return dev.index


def _bits_to_mask(bits: Iterable[int]) -> int:
    mask = 0
    for b in bits:
        mask |= 1 << b
    return mask


class Pool:
    """The devices of one chip model on one node, with their free state."""

    __slots__ = (
        "chip",
        "devs",
        "free",
        "groups",
        "idx",
        "key",
        "node",
        "size",
        "slices",
        "usable",
        "used_cores",
        "used_cpus",
        "used_mem",
    )

    def __init__(self, idx: int, node: NodeState, chip: str, devs: list[DeviceState]) -> None:
        self.idx = idx
        self.node = node.name
        self.chip = chip
        self.devs = devs
        self.size = len(devs)
        groups: dict[str, int] = {}
        for i, dev in enumerate(devs):
            groups[dev.topology_group] = groups.get(dev.topology_group, 0) | (1 << i)
        #: Group masks, in first-seen order (ring 0 before ring 1).
        self.groups: tuple[int, ...] = tuple(groups.values())
        schedulable = node.schedulable
        self.usable = _bits_to_mask(i for i, dev in enumerate(devs) if dev.usable and schedulable)
        #: Usable cards with nobody on them (whole-card placement takes from here).
        self.free = self.usable
        self.key = -1
        self.used_cores = [0] * self.size
        self.used_mem = [0] * self.size
        self.used_cpus = [0] * self.size
        #: Number of vNPU slices on each card (a card with slices is never given whole).
        self.slices = [0] * self.size

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

    def bucket_key(self, pool: Pool) -> int:
        return pool.best_group_free() * (self.size + 1) + pool.free.bit_count()

    def rebucket(self, pool: Pool) -> None:
        """Move ``pool`` to the bucket of its current free state (O(1))."""
        old = pool.key
        new = self.bucket_key(pool)
        if new == old:
            return
        width = self.size + 1
        counts = self.group_count
        if old >= 0:
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

    @property
    def full_key(self) -> int:
        """Bucket of pools with every card free (whole nodes for multi-node gangs)."""
        return self.gmax * (self.size + 1) + self.size

    def slice_units(self, template: VnpuTemplate) -> float:
        return template.ai_cores / self.card_cores if self.card_cores else 1.0


@dataclass(slots=True)
class Occupant:
    """A running job as the free state sees it."""

    job: JobState
    chip: str
    units: float
    #: ``(pool, index, template)``: template ``None`` for a whole card.
    cards: list[tuple[Pool, int, VnpuTemplate | None]]
    #: Units of this job on usable devices (what reservations count).
    usable_units: float
    expected_end: float
    #: Grace deadline when the job is already leaving.
    leaving: float | None = None


class ClusterState:
    """Free state of the whole cluster for one tick (see the module docstring)."""

    def __init__(self, snapshot: Snapshot, strategy: str, now: float) -> None:
        self.strategy = strategy
        self.now = now
        self.templates: Mapping[tuple[str, str], VnpuTemplate] = snapshot.templates
        self.chips: dict[str, Chip] = {}
        self.pools: list[Pool] = []
        #: device id -> (pool, index)
        self.where: dict[int, tuple[Pool, int]] = {}
        #: device id -> job ids on it (one for a whole card, several slices)
        self.card_jobs: dict[int, list[int]] = {}
        self.occupants: dict[int, Occupant] = {}
        self.largest_node = 0
        self._build_layout(snapshot.nodes)

    # -- construction ------------------------------------------------------

    def _build_layout(self, nodes: list[NodeState]) -> None:
        chips = self.chips
        where = self.where
        for node in nodes:
            devices = node.devices
            if not devices:
                continue
            first = devices[0].chip_model
            by_chip: dict[str, list[DeviceState]]
            if all(dev.chip_model == first for dev in devices):  # the usual server: one model
                by_chip = {first: sorted(devices, key=_index)}
            else:
                by_chip = {}
                for dev in devices:
                    by_chip.setdefault(dev.chip_model, []).append(dev)
                for devs in by_chip.values():
                    devs.sort(key=_index)
            self.largest_node = max(self.largest_node, len(devices))
            for chip_name, devs in by_chip.items():
                pool = Pool(len(self.pools), node, chip_name, devs)
                self.pools.append(pool)
                chip = chips.get(chip_name)
                if chip is None:
                    chip = chips[chip_name] = Chip(chip_name)
                chip.pools.append(pool)
                chip.size = max(chip.size, pool.size)
                chip.gmax = max([chip.gmax] + [g.bit_count() for g in pool.groups])
                chip.total += pool.size
                chip.usable_count += pool.usable.bit_count()
                where.update({dev.id: (pool, i) for i, dev in enumerate(devs)})
                chip.card_cores = max(chip.card_cores, max(dev.ai_cores for dev in devs))
                chip.card_mem = max(chip.card_mem, max(dev.hbm_mb for dev in devs))
                chip.card_cpus = max(chip.card_cpus, max(dev.ai_cpus for dev in devs))
        for chip in chips.values():
            chip.buckets = [{} for _ in range((chip.gmax + 1) * (chip.size + 1))]
            chip.group_count = [0] * (chip.gmax + 1)
            chip.slice_buckets = [{} for _ in range(chip.card_cores + 1)]
            chip.free_units = float(chip.usable_count)

    def occupy(self, running: Iterable[JobState], evicted: set[int]) -> None:
        """Mark the running jobs' devices taken (jobs in ``evicted`` are gone)."""
        where = self.where
        templates = self.templates
        card_jobs = self.card_jobs
        now = self.now
        for job in running:
            if job.id in evicted:
                continue
            cards: list[tuple[Pool, int, VnpuTemplate | None]] = []
            units = usable_units = 0.0
            chip_name = job.chip_model
            for slot in job.slots:
                loc = where.get(slot.device_id)
                if loc is None:  # device gone from the inventory: count it, place nothing
                    units += 1.0
                    continue
                pool, i = loc
                chip_name = pool.chip
                bit = 1 << i
                tmpl = None
                if slot.vnpu_template is not None:
                    tmpl = templates.get((pool.chip, slot.vnpu_template))
                if tmpl is None:
                    pool.free &= ~bit
                    u = 1.0
                else:
                    pool.free &= ~bit
                    pool.used_cores[i] += tmpl.ai_cores
                    pool.used_mem[i] += tmpl.memory_mb
                    pool.used_cpus[i] += tmpl.ai_cpus
                    pool.slices[i] += 1
                    u = self.chips[pool.chip].slice_units(tmpl)
                units += u
                if pool.usable & bit:
                    usable_units += u
                cards.append((pool, i, tmpl))
                card_jobs.setdefault(slot.device_id, []).append(job.id)
            self.occupants[job.id] = Occupant(
                job,
                chip_name or "",
                units,
                cards,
                usable_units,
                expected_end(job, now),
                job.preempt_deadline,
            )
        for chip in self.chips.values():
            free_units = 0.0
            for pool in chip.pools:
                chip.rebucket(pool)
                free_units += pool.free.bit_count()
                for i in range(pool.size):
                    if pool.slices[i] and pool.usable >> i & 1:
                        free_units += self._slice_left(chip, pool, i) / chip.card_cores
                        self._rebucket_slice(chip, pool, i, None)
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

    # -- taking devices ------------------------------------------------------

    def take_whole(self, pool: Pool, mask: int) -> None:
        """Give the cards in ``mask`` (free ones) to a job."""
        pool.free &= ~mask
        self.chips[pool.chip].rebucket(pool)

    def release_whole(self, pool: Pool, mask: int) -> None:
        """Undo :meth:`take_whole` (used for the backfill hold, never for running jobs)."""
        pool.free |= mask & pool.usable
        self.chips[pool.chip].rebucket(pool)

    def take_slice(self, pool: Pool, i: int, tmpl: VnpuTemplate) -> None:
        chip = self.chips[pool.chip]
        bit = 1 << i
        old_left: int | None = None
        if pool.slices[i]:
            old_left = self._slice_left(chip, pool, i)
        elif pool.free & bit:
            self.take_whole(pool, bit)
        pool.used_cores[i] += tmpl.ai_cores
        pool.used_mem[i] += tmpl.memory_mb
        pool.used_cpus[i] += tmpl.ai_cpus
        pool.slices[i] += 1
        self._rebucket_slice(chip, pool, i, old_left)


def expected_end(job: JobState, now: float) -> float:
    """When a running job should end: start + estimate, or + max duration, never before now.

    A job that overran its estimate is expected to run to its max duration; one
    that overran both (or has neither) is taken to end "now" for planning. A
    leaving job ends at its grace deadline at the latest.
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
