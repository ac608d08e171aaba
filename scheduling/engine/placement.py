"""Where a job goes: exact cards or vNPU slices, or why nowhere.

Rules (``docs/engine.md`` has an example of each):

* A job of ``n`` whole cards, ``n`` no larger than one node's cards of its chip
  model, runs on one node. If ``n`` fits in one topology group (an HCCS ring:
  910A-class servers have two 4-card rings, 910B servers one 8-card group) it
  stays inside one group, and of the groups that fit it takes the one with the
  fewest free cards (best fit, as MindCluster does), so whole rings stay free
  for 4-card jobs. A larger single-node job (8 cards on a 2x4 server) takes
  whole free groups, so ``n`` must be a multiple of the group size.
* A job larger than a node is a multi-node gang: it needs ``n / node size``
  completely free nodes of one chip model; ``n`` must be a multiple of the node
  size. Anything else can never run: reason ``Topology``.
* ``binpack`` fills the fullest node that fits first (keeps whole nodes free
  for big jobs); ``spread`` takes the emptiest (fewer jobs share a node).
* A vNPU slice goes to a card with the template's AI cores, memory and AI
  CPUs left, never overcommitted; a card given whole never gets slices, a
  sliced card is never given whole. ``binpack`` prefers already-sliced cards.
* A job without a chip model may run on any model; models are tried in the
  order the cluster lists them, and all cards of one job are of one model.

Static reasons, decided once per request shape: ``ChipModelUnavailable`` when
the cluster has no device of the model (or no model offers the vNPU template),
``NodeUnhealthy`` when the shape would fit the cluster's devices but not the
healthy, schedulable ones, ``Topology`` when it would not fit even those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice

from scheduling.engine import reasons
from scheduling.engine.capacity import Chip, ClusterState, Pool, lowest_bits  # noqa: F401 (used by backfill, preemption)
from scheduling.engine.record import Record
from scheduling.engine.snapshot import JobState, Slot, VnpuTemplate
from scheduling.engine.words import sized_job


@dataclass(slots=True, eq=False)
class Need:
    """What a request shape needs, resolved against this cluster (shared by equal shapes).

    Compared and hashed by identity: the tick resolves each shape once.
    """

    whole: int
    template: str | None
    #: Chip models the shape can run on (statically), in cluster order.
    chips: tuple[str, ...]
    #: Device units per chip model (``n`` for whole cards, a fraction for a slice).
    units: dict[str, float]
    templates: dict[str, VnpuTemplate] = field(default_factory=dict)
    #: Why ``chips`` is empty.
    reason: str | None = None
    detail: str = ""
    #: Units on the first chip model (what admission and the job-size factor count).
    first_units: float = 0.0


@dataclass
class Placement(Record):
    """Cards chosen for a job, not yet taken."""

    chip: str
    #: ``(pool, card index)`` pairs: several whole cards, or one card for a slice.
    cards: list[tuple[Pool, int]]
    template: VnpuTemplate | None = None
    #: Whole cards on one node: that pool, the card indices and their mask (the fast path of :func:`commit`).
    pool: Pool | None = None
    picked: tuple[int, ...] = ()
    mask: int = 0

    # Written out, not generated: see record.py.
    def __init__(
        self,
        chip: str,
        cards: list[tuple[Pool, int]],
        template: VnpuTemplate | None = None,
        pool: Pool | None = None,
        picked: tuple[int, ...] = (),
        mask: int = 0,
    ) -> None:
        self.chip = chip
        self.cards = cards
        self.template = template
        self.pool = pool
        self.picked = picked
        self.mask = mask


def need_of(state: ClusterState, job: JobState, cache: dict[tuple, Need]) -> Need:
    """The :class:`Need` of ``job``'s shape (memoised per tick in ``cache``)."""
    key = (job.chip_model, job.vnpu_template, 1 if job.vnpu_template else job.num_devices)
    need = cache.get(key)
    if need is None:
        need = need_of_key(state, key, cache)
    return need


def need_of_key(state: ClusterState, key: tuple, cache: dict[tuple, Need]) -> Need:
    """Resolve and cache the :class:`Need` of shape ``key`` = ``(chip model, template, n)``."""
    need = cache[key] = _resolve(state, key[0], key[1], key[2])
    if need.chips:
        need.first_units = need.units[need.chips[0]]
    return need


def _resolve(state: ClusterState, chip_model: str | None, template: str | None, n: int) -> Need:
    chips = state.chips
    if chip_model is not None:
        candidates = [chip_model] if chip_model in chips else []
        if not candidates:
            return Need(
                n if template is None else 0,
                template,
                (),
                {},
                {},
                reasons.CHIP_MODEL_UNAVAILABLE,
                f"no {chip_model} devices in the cluster",
            )
    else:
        candidates = list(chips)
        if not candidates:
            return Need(n, template, (), {}, {}, reasons.CHIP_MODEL_UNAVAILABLE, "the cluster has no devices")
    if template is not None:
        return _resolve_slice(state, candidates, template)
    if n < 1:
        return Need(n, None, (), {}, {}, reasons.TOPOLOGY, "the job asks for no device")
    ok: list[str] = []
    unhealthy = False
    detail = ""
    for name in candidates:
        verdict, why = _whole_fits(chips[name], n)
        if verdict is None:
            ok.append(name)
        elif verdict == reasons.NODE_UNHEALTHY:
            unhealthy, detail = True, why
        elif not detail:
            detail = why
    if ok:
        return Need(n, None, tuple(ok), {name: float(n) for name in ok})
    reason = reasons.NODE_UNHEALTHY if unhealthy else reasons.TOPOLOGY
    return Need(n, None, (), {}, {}, reason, detail)


def _whole_fits(chip: Chip, n: int) -> tuple[str | None, str]:
    """``(None, "")`` if ``n`` cards fit the healthy layout, else ``(reason, detail)``.

    Depends on the layout only, so it is kept with it (:class:`capacity.Layout`).
    """
    found = chip.fits.get(n)
    if found is None:
        found = chip.fits[n] = _whole_fits_scan(chip, n)
    return found


def _whole_fits_scan(chip: Chip, n: int) -> tuple[str | None, str]:
    name = chip.name
    if n <= chip.gmax:
        best = max(((p.usable & g).bit_count() for p in chip.pools for g in p.groups), default=0)
        if n <= best:
            return None, ""
        return reasons.NODE_UNHEALTHY, f"no {name} ring/node has {n} healthy schedulable cards"
    if n <= chip.size:
        unit = chip.gmax
        if n % unit:
            return reasons.TOPOLOGY, f"{n} cards on one {name} node must be whole {unit}-card rings"
        need = n // unit
        full_all = max(sum(1 for g in p.groups if g.bit_count() == unit) for p in chip.pools)
        if full_all < need:
            return reasons.TOPOLOGY, f"no {name} node has {need} rings of {unit} cards"
        full_ok = max(sum(1 for g in p.groups if g.bit_count() == unit and p.usable & g == g) for p in chip.pools)
        if full_ok < need:
            return reasons.NODE_UNHEALTHY, f"no {name} node has {need} healthy rings"
        return None, ""
    size = chip.size
    if n % size:
        return reasons.TOPOLOGY, f"{sized_job(n)} spans nodes and must use whole {size}-card {name} nodes"
    nodes = n // size
    if sum(1 for p in chip.pools if p.size == size) < nodes:
        return reasons.TOPOLOGY, f"the cluster has fewer than {nodes} {size}-card {name} nodes"
    full = (1 << size) - 1
    if sum(1 for p in chip.pools if p.size == size and p.usable == full) < nodes:
        return reasons.NODE_UNHEALTHY, f"fewer than {nodes} healthy {name} nodes"
    return None, ""


def _resolve_slice(state: ClusterState, candidates: list[str], template: str) -> Need:
    ok: list[str] = []
    units: dict[str, float] = {}
    tmpls: dict[str, VnpuTemplate] = {}
    reason: str | None = None
    detail = f"no chip model offers vNPU template {template}"
    for name in candidates:
        tmpl = state.templates.get((name, template))
        if tmpl is None:
            continue
        chip = state.chips[name]
        shape = (tmpl.ai_cores, tmpl.memory_mb, tmpl.ai_cpus)
        found = chip.slice_fits.get(shape)
        if found is None:  # depends on the layout only: kept with it
            found = chip.slice_fits[shape] = _slice_fits_scan(chip, tmpl)
        fits_any, usable_fit = found
        if usable_fit:
            ok.append(name)
            units[name] = chip.slice_units(tmpl)
            tmpls[name] = tmpl
        elif fits_any:
            reason, detail = reasons.NODE_UNHEALTHY, f"no healthy {name} card for {template}"
        elif reason is None:
            reason, detail = reasons.TOPOLOGY, f"no {name} card is large enough for {template}"
    if ok:
        return Need(0, template, tuple(ok), units, tmpls)
    return Need(0, template, (), {}, {}, reason or reasons.CHIP_MODEL_UNAVAILABLE, detail)


def _slice_fits_scan(chip: Chip, tmpl: VnpuTemplate) -> tuple[bool, bool]:
    """Whether any card of ``chip`` can hold ``tmpl``, and any usable one."""
    fits_any = False
    for pool in chip.pools:
        for i, dev in enumerate(pool.devs):
            if _card_holds(dev.ai_cores, dev.hbm_mb, dev.ai_cpus, tmpl):
                fits_any = True
                if pool.usable >> i & 1:
                    return True, True
    return fits_any, False


def _card_holds(cores: int, mem: int, cpus: int, tmpl: VnpuTemplate) -> bool:
    return cores >= tmpl.ai_cores and mem >= tmpl.memory_mb and cpus >= tmpl.ai_cpus


# -- finding free cards -----------------------------------------------------------


def find(state: ClusterState, need: Need, chip_name: str) -> Placement | None:
    """Free cards for ``need`` on ``chip_name`` now, or ``None``. Takes nothing."""
    chip = state.chips[chip_name]
    if need.template is not None:
        return _find_slice(state, chip, need.templates[chip_name])
    n = need.whole
    if n <= chip.gmax:
        if n > chip.max_group_free:
            return None
        buckets = chip.buckets
        for key in chip.order(state.strategy, n):
            bucket = buckets[key]
            if bucket:
                pool = next(iter(bucket))
                found = chip.pick(pool, pool.free, n)
                assert found is not None
                picked, mask = found
                return Placement(chip_name, [(pool, i) for i in picked], None, pool, picked, mask)
        return None
    if n <= chip.size:
        if chip.max_group_free < chip.gmax:
            return None  # no pool has even one whole free group
        buckets = chip.buckets
        for key in chip.order(state.strategy, n):
            for pool in buckets[key]:
                found = chip.pick(pool, pool.free, n)
                if found is not None:
                    picked, mask = found
                    return Placement(chip_name, [(pool, i) for i in picked], None, pool, picked, mask)
        return None
    nodes = n // chip.size
    bucket = chip.buckets[chip.full_key]
    if len(bucket) < nodes:
        return None
    cards: list[tuple[Pool, int]] = []
    for pool in islice(bucket, nodes):
        cards.extend((pool, i) for i in range(pool.size))
    return Placement(chip_name, cards)


def best_group(free: int, groups: tuple[int, ...], n: int) -> int:
    """Free mask of the group with the fewest free cards that still holds ``n`` (best fit)."""
    best = 0
    best_count = 1 << 30
    for g in groups:
        mask = free & g
        count = mask.bit_count()
        if n <= count < best_count:
            best, best_count = mask, count
    return best


def _find_slice(state: ClusterState, chip: Chip, tmpl: VnpuTemplate) -> Placement | None:
    strategy = state.strategy
    if strategy == "spread":
        whole = _free_card_for(state, chip, tmpl)
        if whole is not None:
            return whole
    lefts = range(tmpl.ai_cores, len(chip.slice_buckets))
    if strategy == "spread":
        lefts = range(len(chip.slice_buckets) - 1, tmpl.ai_cores - 1, -1)
    for left in lefts:
        for pool, i in chip.slice_buckets[left]:
            dev = pool.devs[i]
            if dev.hbm_mb - pool.used_mem[i] >= tmpl.memory_mb and dev.ai_cpus - pool.used_cpus[i] >= tmpl.ai_cpus:
                return Placement(chip.name, [(pool, i)], tmpl)
    if strategy != "spread":
        return _free_card_for(state, chip, tmpl)
    return None


def _free_card_for(state: ClusterState, chip: Chip, tmpl: VnpuTemplate) -> Placement | None:
    if chip.max_group_free < 1:
        return None
    for key in chip.order(state.strategy, 1):
        for pool in chip.buckets[key]:
            free = pool.free
            while free:
                low = free & -free
                i = low.bit_length() - 1
                dev = pool.devs[i]
                if _card_holds(dev.ai_cores, dev.hbm_mb, dev.ai_cpus, tmpl):
                    return Placement(chip.name, [(pool, i)], tmpl)
                free ^= low
    return None


#: Slots are immutable values: one object per (device id, template) serves every tick.
_SLOTS: dict[tuple[int, str | None], Slot] = {}


def _slot(device_id: int, template: str | None = None) -> Slot:
    key = (device_id, template)
    slot = _SLOTS.get(key)
    if slot is None:
        if len(_SLOTS) > 200_000:  # devices come and go over months: stay bounded
            _SLOTS.clear()
        slot = _SLOTS[key] = Slot(device_id, template)
    return slot


def commit(state: ClusterState, placement: Placement, units: float) -> tuple[Slot, ...]:
    """Take the placement's cards for a job; returns its slots."""
    chip = state.chips[placement.chip]
    chip.free_units -= units
    tmpl = placement.template
    if tmpl is not None:
        pool, i = placement.cards[0]
        state.take_slice(pool, i, tmpl)
        return (_slot(pool.ids[i], tmpl.name),)
    one = placement.pool
    if one is not None:  # one node: one mask
        state.take_whole(one, placement.mask)
        return tuple([one.slot(i) for i in placement.picked])
    cards = placement.cards
    masks: dict[Pool, int] = {}
    for pool, i in cards:
        masks[pool] = masks.get(pool, 0) | (1 << i)
    for pool, mask in masks.items():
        state.take_whole(pool, mask)
    return tuple([pool.slot(i) for pool, i in cards])
