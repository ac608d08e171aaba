"""EASY backfill: when a blocked job can start, and what may run before it.

For the highest-priority job that finds no room on a chip model (the pool),
:func:`shadow` replays the running jobs' expected ends (start + estimated
duration; the max duration when the estimate is overrun; a leaving job's grace
deadline) in time order on a copy of the pool's free state, until the job fits
under the placement rules. That time is the *shadow time*, reported as the
job's estimated start, and the cards it would take then are held for it.

With ``policy.backfill`` on, a lower job may still start now if it does not
touch the held cards, or if it ends (by its estimate) before the shadow time
(held cards that carry vNPU slices take no new slice otherwise either);
such starts are marked ``Start.backfilled``. With backfill off, nothing lower
starts in that pool: those jobs wait with ``Priority``. Either way only the
first blocked job per pool gets a hold, like Slurm's EASY scheme; later blocked
jobs report ``Resources`` without an estimate. The starvation guard
(:mod:`starvation`) is the one exception: jobs that waited too long each hold
cards, several per pool, in wait order.

Cards promised to jobs in their preemption grace count as busy until that job
would end (deadline + its estimate).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduling.engine.capacity import Chip, ClusterState, Occupant, Pool
from scheduling.engine.layout import PoolReplay
from scheduling.engine.placement import Need, best_group, lowest_bits
from scheduling.engine.record import Record


@dataclass
class Hold(Record):
    """Cards held for the blocked job of one pool until its shadow time."""

    chip: str
    job_id: int
    shadow: float
    #: ``(pool, card mask)`` of held cards that are free now (taken out of the free state).
    free_now: list[tuple[Pool, int]]
    devices: frozenset[int]
    #: ``(pool, card)`` of held cards that carry vNPU slices with room left: hidden from slice
    #: placement (a slice there that outlives the shadow time would delay the held job).
    sliced_now: list[tuple[Pool, int]] = field(default_factory=list)
    #: Held for a starving job (:mod:`starvation`): no job within its guarantee takes these cards.
    starving: bool = False
    #: When the held job would end if it starts at ``shadow`` (its cards are busy until then for
    #: the reservations made after it; ``inf`` without a known duration).
    until: float = float("inf")
    #: Its place in its chip model's list of holds (``Tick.holds``), for the memo of failed placements.
    place: int = 0

    # Written out, not generated: see record.py.
    def __init__(
        self,
        chip: str,
        job_id: int,
        shadow: float,
        free_now: list[tuple[Pool, int]],
        devices: frozenset[int],
        sliced_now: list[tuple[Pool, int]] | None = None,
        starving: bool = False,
        until: float = float("inf"),
        place: int = 0,
    ) -> None:
        self.chip = chip
        self.job_id = job_id
        self.shadow = shadow
        self.free_now = free_now
        self.devices = devices
        self.sliced_now = sliced_now if sliced_now is not None else list()
        self.starving = starving
        self.until = until
        self.place = place


@dataclass
class Release(Record):
    """Cards that come free at ``at`` (a running job's expected end)."""

    at: float
    cards: list[tuple[Pool, int, int, int, int, bool]]  # pool, index, cores, mem, cpus, whole
    occupant: Occupant | None = None

    # Written out, not generated: see record.py.
    def __init__(
        self,
        at: float,
        cards: list[tuple[Pool, int, int, int, int, bool]],
        occupant: Occupant | None = None,
    ) -> None:
        self.at = at
        self.cards = cards
        self.occupant = occupant


def shadow(
    state: ClusterState,
    need: Need,
    chip_name: str,
    releases: Iterable[Release],
    floor: float = -math.inf,
) -> tuple[float, list[int]] | None:
    """``(shadow time, device ids)`` of the first moment ``need`` fits, or ``None`` if never.

    ``releases`` must be in time order. Only the pools of ``chip_name`` are copied.
    ``floor``: a time before which ``need`` is known not to fit (``tick_memo.ShadowMemo``);
    releases before it are applied without trying to place the job.
    """
    replay = Replay(state, need, chip_name, floor)
    for rel in releases:
        found = replay.step(rel.at, rel.cards)
        if found is not None:
            return rel.at, found
    return None


class Replay:
    """The walk of :func:`shadow`, one release at a time (:meth:`step`).

    Apart from :func:`shadow` so that a caller may feed it releases from a stream of its own
    without a generator between (the starving jobs' replays: ``decide.Tick.replay``).
    """

    __slots__ = (
        "card_jobs",
        "chip",
        "chip_name",
        "floor",
        "full",
        "full_mask",
        "mark",
        "multi",
        "need",
        "tmpl",
        "used",
        "want",
    )

    def __init__(self, state: ClusterState, need: Need, chip_name: str, floor: float = -math.inf) -> None:
        chip = state.chips[chip_name]
        self.chip = chip
        self.chip_name = chip_name
        self.need = need
        self.floor = floor
        self.tmpl = tmpl = need.templates.get(chip_name) if need.template else None
        self.multi = multi = tmpl is None and need.whole > chip.size
        # The pools a release touched so far are as the replay has them in ``Pool.replayed``, with
        # this mark (the rest are as they are now): no dictionary read and written per card.
        self.mark = object()
        self.used: dict[tuple[Pool, int], list[int]] = {}  # cores, mem, cpus (slices only)
        self.card_jobs = state.card_jobs
        self.full_mask = full_mask = (1 << chip.size) - 1
        # A multi-node gang's whole free nodes, in the order they came free (those free now first).
        self.full: list[Pool] = [p for p in chip.pools if p.size == chip.size and p.free == full_mask] if multi else []
        self.want = need.whole // chip.size if multi else 0

    def step(self, at: float, cards: list[tuple[Pool, int, int, int, int, bool]]) -> list[int] | None:
        """Apply the release of ``cards`` at ``at``; the devices ``need`` takes if it fits now."""
        chip_name = self.chip_name
        tmpl = self.tmpl
        used = self.used
        mark = self.mark
        # The pools the release touched, in order: nearly always one (a job's cards on one node),
        # kept in ``last`` without a list; ``more`` only when a second shows.
        last: Pool | None = None
        more: list[Pool] | None = None
        for pool, i, cores, mem, cpus, whole in cards:
            if pool.chip != chip_name:
                continue
            replayed = pool.replayed
            if replayed is None:
                replayed = pool.replayed = PoolReplay(pool, mark, self.card_jobs)
            elif replayed.mark is not mark:
                # The pool as it is now, for this replay (see PoolReplay).
                replayed.mark = mark
                replayed.free = pool.free
                if replayed.base_map is not self.card_jobs or replayed.base_stamp != pool.jobs_changed:
                    replayed.read_base(pool, self.card_jobs)
                replayed.counts = replayed.base
                replayed.own = False
            counts = replayed.counts
            left = counts[i] - 1
            if left or tmpl is not None:
                # (A count that reaches 0 is not written where slices are not placed: a card's
                # count is read again only by another release of it, and <= 0 is free either way.)
                if not replayed.own:
                    counts = replayed.counts = counts.copy()
                    replayed.own = True
                counts[i] = left
            if tmpl is not None:
                key = (pool, i)
                if not whole:
                    u = used.get(key)
                    if u is None:
                        u = used[key] = [pool.used_cores[i], pool.used_mem[i], pool.used_cpus[i]]
                    u[0] -= cores
                    u[1] -= mem
                    u[2] -= cpus
                if left <= 0 and pool.usable >> i & 1:
                    used[key] = [0, 0, 0]
            if left <= 0 and pool.usable >> i & 1:
                replayed.free |= 1 << i
            if pool is not last:
                if last is not None:
                    if more is None:
                        more = [last]
                    more.append(pool)
                last = pool
        if last is None:
            return None
        if self.multi:
            if more is None:
                self._came_free(last)
            else:
                for pool in more:
                    self._came_free(pool)
            want = self.want
            full = self.full
            if len(full) >= want:
                return [p.devs[i].id for p in full[:want] for i in range(p.size)]
            return None
        if at < self.floor:
            return None
        if more is None:
            return _fits(self.chip, self.need, tmpl, used, last)
        for pool in more:
            found = _fits(self.chip, self.need, tmpl, used, pool)
            if found is not None:
                return found
        return None

    def _came_free(self, pool: Pool) -> None:
        """A multi-node gang's step: ``pool`` joins the whole free nodes if the release freed all of it."""
        replayed = pool.replayed
        assert replayed is not None
        if replayed.free == self.full_mask and pool.size == self.chip.size and pool not in self.full:
            self.full.append(pool)


def _fits(
    chip: Chip,
    need: Need,
    tmpl: object,
    used: dict[tuple[Pool, int], list[int]],
    pool: Pool,
) -> list[int] | None:
    """The devices ``need`` takes on ``pool`` as the replay has it, if it fits there."""
    n = need.whole
    replayed = pool.replayed
    assert replayed is not None
    if tmpl is not None:
        from scheduling.engine.snapshot import VnpuTemplate

        assert isinstance(tmpl, VnpuTemplate)
        for i, dev in enumerate(pool.devs):
            if not pool.usable >> i & 1:
                continue
            u = used.get((pool, i))
            if u is None:
                if replayed.free >> i & 1:
                    u = [0, 0, 0]
                elif pool.slices[i]:
                    u = [pool.used_cores[i], pool.used_mem[i], pool.used_cpus[i]]
                else:
                    continue
            left = replayed.counts[i]
            whole_taken = left > 0 and not pool.slices[i]
            if whole_taken:
                continue
            if (
                dev.ai_cores - u[0] >= tmpl.ai_cores
                and dev.hbm_mb - u[1] >= tmpl.memory_mb
                and dev.ai_cpus - u[2] >= tmpl.ai_cpus
            ):
                return [dev.id]
        return None
    mask = replayed.free
    if n <= chip.gmax:
        group = best_group(mask, pool.groups, n)
        if group:
            return [pool.devs[i].id for i in lowest_bits(group, n)]
    else:
        unit = chip.gmax
        groups = [g for g in pool.groups if g.bit_count() == unit and mask & g == g]
        if len(groups) >= n // unit:
            return [pool.devs[i].id for g in groups[: n // unit] for i in lowest_bits(g, unit)]
    return None


def ends_before(now: float, duration: float, shadow_time: float) -> bool:
    """Whether a job started now with this estimated duration ends by the shadow time."""
    return duration > 0 and now + duration <= shadow_time
