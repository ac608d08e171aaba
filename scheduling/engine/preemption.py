"""Making room: guarantee reclaim and class preemption.

Runs for a job that passed admission but found no free cards. Who may be a
victim (a running job, not already leaving, not started in this tick):

* **guarantee reclaim** — the job's team stays within its guarantee on the
  chip model with this job, and the victim's team holds more than its own
  guarantee there (it is *borrowing*; a team with no guarantee borrows all
  it holds). Checked victim by victim as victims are picked, Kueue style, so
  a borrower is never cut below its guarantee by more than one job;
* **class preemption** — the victim's class is listed in the job's class
  ``preempts``, is preemptible and ranks lower; and a team within its
  guarantee is never preempted for a team above its own.

In both cases the victim's class must be preemptible (``preemptible: false``
means never).

**Reclaim bound.** A guarantee reclaim never stops a run that would lose more
than ``spec.preemption.reclaimLossLimit`` (default 2 h) of work per card — its
work since it started or since its last checkpoint, plus the guard's surcharge
for a job served late (below). The job within its guarantee then waits for a
cheaper victim or for a job to end, and its reason says so. A guarantee is a
promise about the cards a team gets *soon*, not at any price: without the bound,
on the Microsoft ITP trace with every ``max`` twice the guarantee, a fifth of the
reclaimed runs had computed more than 2 h per card, and they were 72% of the
device-hours reclaims threw away (the figures: docs/simulator.md). Class
preemption is not bounded: a class that preempts another outranks it.

Choosing victims (least work lost). A victim loses the device-hours it computed
since it started, or since its last checkpoint if it declares
``checkpoint_interval_s`` (:func:`work_lost.device_hours_lost`, at ``now``). A
job the starvation guard served late (it started more than its class's threshold
after submission, :func:`starvation.served_late`) counts its threshold's worth of
its cards more: stopped, it would wait again.

1. If jobs already leaving (their ``preempt_deadline`` is set; their cards count as
   free at their deadline) free enough cards, that is the plan: no victim.
2. Otherwise candidates are ranked lowest class first, then least work lost, then
   id, and walked in that order. Each *spot* — a pool (the cards of one chip model
   on one node) for whole cards, a card for a vNPU slice — collects the candidates
   on it until the job fits there under the placement rules (:mod:`placement`);
   then every victim that spot does not need is put back, last picked first, and
   the spot's plan is complete. The walk goes on for the other spots.
3. Of all the complete plans, the one that loses the fewest device-hours wins,
   then the one with the fewest victims, then the one found first.
4. A multi-node gang needs whole nodes: the walk collects every node it can clear,
   then takes, one at a time, the node whose victims not yet counted lose the
   least work (then the fewest victims, then the node found first); if those
   would leave the reservations short, the first nodes found.

The walk stops early only when nothing left could win: a spot completed by the
candidate at some position keeps that candidate, so its plan loses at least the
least loss of any candidate from there on (see ``Preemptor._candidates``). Cards
promised to one waiting job in this tick are not counted again for another.
Plans are weighed within one chip model: a job free to use several takes the
first model, in the order it tries them, where a plan exists.

The victims get ``grace_deadline = now + policy.grace_period_s``; the waiting
job gets ``PreemptionGrace`` with its estimated start at the latest deadline of
the jobs leaving its cards. What happens to a victim after its deadline
(requeue or cancel) is the DB layer's business (``policy.on_preempt``).
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from scheduling.engine import reasons
from scheduling.engine.capacity import EPS, Chip, ClusterState, Occupant, Pool
from scheduling.engine.placement import Need, best_group, lowest_bits
from scheduling.engine.policy import Policy
from scheduling.engine.quota import TeamLedger
from scheduling.engine.record import Record
from scheduling.engine.snapshot import JobState, VnpuTemplate
from scheduling.engine.work_lost import device_hours_lost

#: Victim searches per tick. Like Kueue, which plans preemption for one queue
#: head per queue per cycle, a tick makes room for a bounded number of jobs; the
#: rest wait (``Resources``) and get their search on a later tick, by which time
#: the first victims are leaving and their cards are counted. Bounds the tick's
#: cost when thousands of waiting jobs could preempt.
MAX_SEARCHES_PER_TICK = 8


@dataclass
class Plan(Record):
    """Room found for one waiting job."""

    chip: str
    victims: list[tuple[Occupant, str]]  # (victim, preemption reason)
    #: Device ids the job will get once the leaving jobs are gone.
    devices: list[int]
    #: When the last job leaving those cards is gone.
    start_at: float

    # Written out, not generated: see record.py.
    def __init__(self, chip: str, victims: list[tuple[Occupant, str]], devices: list[int], start_at: float) -> None:
        self.chip = chip
        self.victims = victims
        self.devices = devices
        self.start_at = start_at


@dataclass
class _Try(Record):
    """Victims picked so far for one pool (or card), and per-team units released."""

    victims: list[Occupant] = field(default_factory=list)
    released: dict[str, float] = field(default_factory=dict)
    extra: set[int] = field(default_factory=set)
    #: Cards of the pool free once the leaving jobs and ``victims`` are gone.
    mask: int = 0

    # Written out, not generated: see record.py.
    def __init__(
        self,
        victims: list[Occupant] | None = None,
        released: dict[str, float] | None = None,
        extra: set[int] | None = None,
        mask: int = 0,
    ) -> None:
        self.victims = victims if victims is not None else list()
        self.released = released if released is not None else dict()
        self.extra = extra if extra is not None else set()
        self.mask = mask


#: Pool bounds worked out one at a time on a chip before the rest are worked out at once.
_BULK_AFTER = 64

#: A spot where the job cannot fit whatever leaves (see ``Preemptor._potential``).
_DEAD = _Try()
#: A spot whose victims are chosen (the job fits there): later candidates are not added to it.
_DONE = _Try()

#: Units released so far at a spot with no victim yet.
_NONE: Mapping[str, float] = {}


class Preemptor:
    """Victim search for one tick; remembers what this tick already promised."""

    def __init__(
        self,
        policy: Policy,
        state: ClusterState,
        ledgers: Mapping[str, TeamLedger],
        now: float,
        leaving: Iterable[Occupant] | None = None,
        promised: Mapping[int, frozenset[int]] | None = None,
        served_late: Mapping[int, float] | None = None,
    ) -> None:
        """``leaving``: the running jobs already leaving, in the state's order (found by a scan if not given).

        ``promised``: device ids promised to waiting jobs by earlier ticks, per job id
        (see ``snapshot.Promise``): no other job's search counts them.

        ``served_late``: running jobs that started past their starvation threshold, and that
        threshold in seconds (:func:`starvation.served_late`): stopping one costs that much of
        its cards more.
        """
        self.state = state
        self.ledgers = ledgers
        self.now = now
        self.grace = policy.grace_period_s
        self.rank = {pc.name: pc.rank for pc in policy.priority_classes}
        self.lowest = len(policy.priority_classes)
        self.preemptible = {pc.name for pc in policy.priority_classes if pc.preemptible}
        self.victim_classes: dict[str, frozenset[str]] = {
            pc.name: frozenset(
                name for name in pc.preempts if name in self.preemptible and self.rank.get(name, self.lowest) > pc.rank
            )
            for pc in policy.priority_classes
        }
        if leaving is None:
            leaving = [occ for occ in state.occupants.values() if occ.leaving is not None]
        #: Jobs that will be gone: already leaving, or picked as victims this tick.
        self.gone: set[int] = {occ.job.id for occ in leaving}
        #: Units per team that are leaving (counted as already given back).
        self.leaving_units: dict[str, float] = {}
        #: Jobs already leaving, per chip model (their cards come free at the deadline).
        self.leaving_on: dict[str, list[Occupant]] = {}
        for occ in leaving:
            team = occ.job.team
            self.leaving_units[team] = self.leaving_units.get(team, 0.0) + occ.units
            self.leaving_on.setdefault(occ.chip, []).append(occ)
        #: Cards promised to a waiting job (by this tick, or held from an earlier one).
        self.promised: Mapping[int, frozenset[int]] = promised or {}
        self.claimed: set[int] = set().union(*self.promised.values())
        self._filtered: dict[tuple[str, frozenset[str] | None], tuple[list[Occupant], list[float]]] = {}
        #: Device-hours each ranked candidate would lose if stopped now, by job id (:mod:`work_lost`).
        self.lost: dict[int, float] = {}
        #: Per victim classes: pool -> cards a search could free (see :meth:`_potential`).
        self._potential_cache: dict[frozenset[str], dict[Pool, int]] = {}
        #: Per (chip model, victim classes): how many whole nodes a search could clear (see _plan_multi).
        self._full_count: dict[tuple[str, frozenset[str]], int] = {}
        #: Per (chip model, victim classes): pool bounds worked out one by one so far.
        self._misses: dict[tuple[str, frozenset[str]], int] = {}
        #: During a search for a job holding a promise: its pools, and their bounds in its view.
        self._private: tuple[set[Pool], dict[frozenset[str], dict[Pool, int]]] | None = None
        self._failed: dict[tuple, int] = {}
        #: Per (class, within, team, chip): the smallest whole-card request a search just failed
        #: for, and the reservation room it had. Nothing changed since (same ``version``), a
        #: request at least as large with no more room fails too: the candidates, their order and
        #: the borrowing checks are the same, and more cards (or whole nodes) are harder to free.
        self._failed_whole: dict[tuple, tuple[int, int, float]] = {}
        #: Failed searches (keys of ``_failed``, and of ``_failed_whole``) that passed over a
        #: borrower for the reclaim bound, at the version they failed: a memoised failure says so too.
        self._bounded_fail: dict[tuple, int] = {}
        self.version = 0
        self.served_late: Mapping[int, float] = served_late or {}
        #: The reclaim bound in hours of work per card (``spec.preemption.reclaimLossLimit``).
        self.reclaim_limit_h = policy.reclaim_loss_limit_s / 3600.0
        #: Whether the last :meth:`plan` passed over a borrower because reclaiming it would lose
        #: more than the bound (the waiting job's reason says so when no plan was found).
        self.bounded = False
        self._unlimited = True
        #: Victim searches run / refused this tick (see ``MAX_SEARCHES_PER_TICK``).
        self.searches = 0
        self.skipped = 0

    # -- public ----------------------------------------------------------------

    def can_try(self, job: JobState, need: Need, chips: list[str]) -> bool:
        """Cheap test: could this job possibly make room (class rights, guarantee or leavers)?"""
        if self.victim_classes.get(job.priority_class):
            return True
        ledger = self.ledgers[job.team]
        return any(ledger.within_guarantee(c, need.units[c]) for c in chips)

    def plan(self, job: JobState, need: Need, chips: list[str], headroom: Mapping[str, float]) -> Plan | None:
        """Victims (maybe none, when leaving jobs suffice) that make room for ``job``, or ``None``."""
        self.bounded = False
        own = self.promised.get(job.id)
        if not own:
            return self._plan_any(job, need, chips, headroom)
        # The job's own promised cards count for it: a search with its own view of the
        # claimed cards. Memos that depend on that view are its own: the failed searches,
        # and the pool bounds of the pools holding its cards (elsewhere the views agree).
        where = self.state.where
        pools = {where[dev][0] for dev in own if dev in where}
        saved = self.claimed, self._failed, self._failed_whole, self._bounded_fail
        self.claimed = self.claimed - own
        self._failed, self._failed_whole, self._bounded_fail = {}, {}, {}
        self._private = (pools, {})
        try:
            return self._plan_any(job, need, chips, headroom)
        finally:
            self.claimed, self._failed, self._failed_whole, self._bounded_fail = saved
            self._private = None

    def _plan_any(self, job: JobState, need: Need, chips: list[str], headroom: Mapping[str, float]) -> Plan | None:
        ledger = self.ledgers[job.team]
        victim_classes = self.victim_classes.get(job.priority_class, frozenset())
        for chip_name in chips:
            units = need.units[chip_name]
            within = ledger.within_guarantee(chip_name, units)
            key = (job.priority_class, within, job.team if within else "", chip_name, need.whole, need.template)
            if self._failed.get(key) == self.version:
                if self._bounded_fail.get(key) == self.version:
                    self.bounded = True
                continue
            if self.searches >= MAX_SEARCHES_PER_TICK:
                self.skipped += 1
                return None
            self.searches += 1
            room = headroom.get(chip_name, math.inf)
            whole = need.template is None
            if whole:
                smaller = self._failed_whole.get(key[:4])
                if smaller and smaller[0] == self.version and need.whole >= smaller[1] and room <= smaller[2]:
                    self._failed[key] = self.version  # (counted as the search it stands for)
                    if self._bounded_fail.get(key[:4]) == self.version:
                        self.bounded = True
                        self._bounded_fail[key] = self.version
                    continue
            self._unlimited = room == math.inf
            bounded, self.bounded = self.bounded, False
            plan = self._plan_chip(job, need, chip_name, units, within, victim_classes, room)
            if plan is not None:
                return plan
            self._failed[key] = self.version
            if self.bounded:
                self._bounded_fail[key] = self.version
            if whole:
                smaller = self._failed_whole.get(key[:4])
                if smaller is None or smaller[0] != self.version or need.whole < smaller[1]:
                    self._failed_whole[key[:4]] = (self.version, need.whole, room)
                    if self.bounded:
                        self._bounded_fail[key[:4]] = self.version
                    else:
                        self._bounded_fail.pop(key[:4], None)
            self.bounded = self.bounded or bounded
        return None

    def commit(self, plan: Plan) -> None:
        """Record a plan: its victims are leaving, its cards are promised."""
        deadline = self.now + self.grace
        for occ, _ in plan.victims:
            occ.leaving = deadline
            self.state.marked.append(occ)
            self.gone.add(occ.job.id)
            team = occ.job.team
            self.leaving_units[team] = self.leaving_units.get(team, 0.0) + occ.units
            self.leaving_on.setdefault(occ.chip, []).append(occ)
        self.claimed.update(plan.devices)
        # The victims' cards now count as free at their deadline for any class: the bound
        # grows on their pools (and only there; elsewhere it still holds, see _potential).
        pools = {pool for occ, _ in plan.victims for pool, _, _ in occ.cards}
        for cache in self._potential_cache.values():
            for pool in pools:
                cache.pop(pool, None)
        self._full_count.clear()

    def forget(self) -> None:
        """Cards came back to the free state mid-tick: the memos that assume it only shrinks go."""
        self._potential_cache.clear()
        self._full_count.clear()
        self.version += 1

    def _full_pools(self, chip: Chip, victim_classes: frozenset[str], full_mask: int) -> int:
        """Whole nodes of ``chip`` whose every card a search outside the guarantee could free.

        An upper bound, like the pool bounds it counts: it only shrinks during a
        tick, except where a plan makes jobs leave (:meth:`commit` drops it).
        A multi-node search that needs more nodes than this cannot succeed.
        """
        key = (chip.name, victim_classes)
        count = self._full_count.get(key)
        if count is None:
            if self._misses.get((chip.name, victim_classes), 0) < _BULK_AFTER:
                self._misses[(chip.name, victim_classes)] = _BULK_AFTER
                self._potential_all(chip, victim_classes)
            size = chip.size
            potential = self._potential
            count = self._full_count[key] = sum(
                1 for pool in chip.pools if pool.size == size and potential(pool, victim_classes) == full_mask
            )
        return count

    def _potential_all(self, chip: Chip, victim_classes: frozenset[str]) -> None:
        """:meth:`_potential` of every pool of ``chip`` without a slice, in one pass over its jobs.

        With whole cards a card holds one job, so a card counts if it is free, or
        usable, not claimed and its job is leaving or a candidate: the jobs'
        cards are OR-ed per pool instead of looking up every card's jobs.
        """
        caches = self._potential_cache
        cache = caches.get(victim_classes)
        if cache is None:
            cache = caches[victim_classes] = {}
        name = chip.name
        gone = self.gone
        ok_classes = victim_classes & self.preemptible
        qualified: dict[Pool, int] = {}
        sliced: set[Pool] = set()
        for occ in self.state.occupants.values():
            if occ.chip != name:
                continue
            job = occ.job
            if job.id in gone or (job.started_at is not None and job.priority_class in ok_classes):
                for pool, i, tmpl in occ.cards:
                    qualified[pool] = qualified.get(pool, 0) | (1 << i)
                    if tmpl is not None:
                        sliced.add(pool)
            else:
                for pool, _, tmpl in occ.cards:
                    if tmpl is not None:
                        sliced.add(pool)
        claimed: dict[Pool, int] = {}
        where = self.state.where
        for dev in self.claimed:
            spot = where.get(dev)
            if spot is not None and spot[0].chip == name:
                claimed[spot[0]] = claimed.get(spot[0], 0) | (1 << spot[1])
        for pool in chip.pools:
            if pool in cache or pool in sliced or any(pool.slices):
                continue  # known, or a card may hold several jobs: card by card (_potential)
            cache[pool] = pool.free | (qualified.get(pool, 0) & pool.usable & ~claimed.get(pool, 0))

    # -- search --------------------------------------------------------------------

    def _ranked_on(self, chip: str, classes: frozenset[str] | None = None) -> list[Occupant]:
        """Running jobs on ``chip`` (of ``classes``, if given), cheapest victim first: lowest class, least work lost."""
        now = self.now
        lowest = self.lowest
        rank = self.rank
        lost = self.lost
        occs = [
            occ
            for occ in self.state.occupants.values()
            if occ.chip == chip
            and occ.job.started_at is not None
            and occ.cards
            and (classes is None or occ.job.priority_class in classes)
        ]
        keys: list[tuple[int, float, int]] = []
        for o in occs:
            job = o.job
            loss = device_hours_lost(o.units, job.started_at, now, job.checkpoint_interval_s)  # type: ignore[arg-type]
            late = self.served_late.get(job.id)
            if late is not None:
                loss += o.units * late / 3600.0
            lost[job.id] = loss
            keys.append((-rank.get(job.priority_class, lowest), loss, job.id))
        return [occs[i] for i in sorted(range(len(occs)), key=keys.__getitem__)]

    def _candidates(
        self, chip: str, within: bool, victim_classes: frozenset[str]
    ) -> tuple[list[Occupant], list[float]]:
        """The running jobs on ``chip`` that :meth:`_eligible` could accept, cheapest first (cached per tick),
        and for each position the least work any of them from there on would lose.

        A job outside its guarantee may only preempt the classes its own class
        preempts (reclaim needs ``within``), so every other running job would be
        refused one by one: fruitless searches, the common case at a full
        cluster, walked all of them. The ranking is a total order (ids break
        ties), so ranking only those gives them in the same order.

        The second list bounds what is left of a search: a spot the job fits once
        the candidate at position ``k`` (or a later one) joins its victims keeps
        that candidate (without it the spot did not fit a step earlier), so its
        plan loses at least ``floor[k]``.
        """
        key = (chip, None if within else victim_classes)
        hit = self._filtered.get(key)
        if hit is None:
            ranked = self._ranked_on(chip, None if within else victim_classes)
            lost = self.lost
            floor = [0.0] * len(ranked)
            low = math.inf
            for i in range(len(ranked) - 1, -1, -1):
                low = min(low, lost[ranked[i].job.id])
                floor[i] = low
            hit = self._filtered[key] = (ranked, floor)
        return hit

    def _potential(self, pool: Pool, victim_classes: frozenset[str]) -> int:
        """Cards of ``pool`` that any search outside the job's guarantee could free (cached per tick).

        A card counts if it is free, or every job on it is leaving or of a class in
        ``victim_classes`` (preemptible, started before this tick). That bounds
        what a search can free there, and the bound only shrinks during a tick
        (starts take free cards, holds and promises take more) except where a plan
        makes jobs leave: :meth:`commit` drops the victims' pools from the cache
        (a bound that shrank since is still a bound, so the rest stays). A pool where the
        job cannot fit even on these cards is one where a search would pick
        victims and never fit, so skipping it picks the same plan.
        """
        caches = self._potential_cache
        private = self._private
        if private is not None and pool in private[0]:
            caches = private[1]
        cache = caches.get(victim_classes)
        if cache is None:
            cache = caches[victim_classes] = {}
        mask = cache.get(pool)
        if mask is not None:
            return mask
        if caches is self._potential_cache:
            # Many misses on one chip (a search walking a full cluster): all its pools at once.
            key = (pool.chip, victim_classes)
            misses = self._misses[key] = self._misses.get(key, 0) + 1
            if misses == _BULK_AFTER:
                self._potential_all(self.state.chips[pool.chip], victim_classes)
                mask = cache.get(pool)
                if mask is not None:
                    return mask
        state = self.state
        card_jobs = state.card_jobs
        occupants = state.occupants
        gone = self.gone
        claimed = self.claimed
        ok_classes = victim_classes & self.preemptible
        free = pool.free
        usable = pool.usable
        ids = pool.ids
        mask = free
        for i in range(pool.size):
            bit = 1 << i
            if free & bit or not usable & bit or ids[i] in claimed:
                continue
            jobs = card_jobs.get(ids[i])
            if not jobs:
                continue  # held for a blocked job
            for j in jobs:
                if j in gone:
                    continue
                occ = occupants.get(j)
                if occ is None or occ.job.started_at is None or occ.job.priority_class not in ok_classes:
                    break
            else:
                mask |= bit
        cache[pool] = mask
        return mask

    def _eligible(
        self,
        occ: Occupant,
        job: JobState,
        within: bool,
        victim_classes: frozenset[str],
        released: Mapping[str, float],
    ) -> str | None:
        """Preemption reason if ``occ`` may be a victim for ``job`` now, else ``None``."""
        victim = occ.job
        if victim.id in self.gone or victim.priority_class not in self.preemptible:
            return None
        team = victim.team
        ledger = self.ledgers.get(team)
        gone_units = self.leaving_units.get(team, 0.0) + released.get(team, 0.0)
        borrowing = ledger is not None and ledger.borrowing(occ.chip, gone_units)
        if within and team != job.team and borrowing:
            if not self._over_bound(occ):
                return reasons.GUARANTEE_RECLAIM
            self.bounded = True  # (class preemption below is not bounded: the class outranks it)
        if victim.priority_class in victim_classes and (borrowing or within):
            return reasons.CLASS_PREEMPTION
        return None

    def _over_bound(self, occ: Occupant) -> bool:
        """Whether reclaiming ``occ`` would lose more than the policy's bound per card (*Reclaim bound*)."""
        lost = self.lost.get(occ.job.id)
        if lost is None:
            job = occ.job
            lost = device_hours_lost(occ.units, job.started_at or self.now, self.now, job.checkpoint_interval_s)
            late = self.served_late.get(job.id)
            if late is not None:
                lost += occ.units * late / 3600.0
        return lost > self.reclaim_limit_h * occ.units + 1e-9

    def _plan_chip(
        self,
        job: JobState,
        need: Need,
        chip_name: str,
        units: float,
        within: bool,
        victim_classes: frozenset[str],
        headroom: float,
    ) -> Plan | None:
        state = self.state
        chip = state.chips[chip_name]
        tmpl = need.templates.get(chip_name) if need.template else None
        tries: dict[object, _Try] = {}
        checker = _Checker(self, chip, need.whole, tmpl)
        if checker.multi:
            return self._plan_multi(job, chip_name, units, within, victim_classes, headroom, checker)
        # Leaving jobs alone may already be enough.
        for occ in self.leaving_on.get(chip_name, ()):
            for spot in checker.spots(occ):
                found = checker.fits(spot, ())
                if found is not None and headroom + self._freed(found[1], ()) >= units:
                    return self._plan(chip_name, [], found)
        slices = tmpl is not None
        bound = not (slices or within)  # (see below)
        # Every spot the job can be made to fit gets its victims; the cheapest plan wins.
        best: Plan | None = None
        best_lost, best_count = math.inf, 0
        lost = self.lost
        candidates, floor = self._candidates(chip_name, within, victim_classes)
        for k, occ in enumerate(candidates):
            if best is not None and not _cheaper(floor[k], 1, best_lost, best_count):
                break  # every plan still to be found loses at least floor[k]: none is cheaper
            if occ.job.id in self.gone:
                continue
            for spot in checker.spots(occ):
                attempt = tries.get(spot)
                if attempt is _DEAD or attempt is _DONE:
                    continue
                # Eligibility first: most candidates of a fruitless search are not victims, and
                # a spot's free mask is only needed once it has one. (Nothing the mask reads
                # changes during a search, so computing it later gives the same mask.)
                reason = self._eligible(occ, job, within, victim_classes, attempt.released if attempt else _NONE)
                if reason is None:
                    continue
                if attempt is None:
                    # Outside its guarantee the job can only free cards whose every job is a
                    # candidate: a pool where even that leaves no room gets no victims.
                    if bound and checker.fits_mask(spot, self._potential(spot, victim_classes)) is None:  # type: ignore[arg-type]
                        tries[spot] = _DEAD
                        continue
                    attempt = tries[spot] = _Try()
                    if not slices:
                        assert isinstance(spot, Pool)
                        attempt.mask = checker.mask(spot, attempt.extra)
                attempt.victims.append(occ)
                attempt.extra.add(occ.job.id)
                team = occ.job.team
                attempt.released[team] = attempt.released.get(team, 0.0) + occ.units
                if slices:
                    found = checker.fits(spot, attempt.victims)
                else:
                    assert isinstance(spot, Pool)
                    attempt.mask = checker.grow(spot, attempt.mask, occ, attempt.extra)
                    found = checker.fits_mask(spot, attempt.mask)
                if found is None or headroom + self._freed(found[1], attempt.victims) < units:
                    continue
                tries[spot] = _DONE
                if best is not None and not _cheaper(lost[occ.job.id], 1, best_lost, best_count):
                    continue  # its plan keeps ``occ`` (see _candidates): it cannot be cheaper
                # Put back every victim the chosen place does not need, last picked first.
                kept = list(attempt.victims)
                for extra in reversed(attempt.victims):
                    trial = [v for v in kept if v is not extra]
                    again = checker.fits(spot, trial)
                    if again is not None and headroom + self._freed(again[1], trial) >= units:
                        kept, found = trial, again
                loss = sum(lost[v.job.id] for v in kept)
                if best is None or _cheaper(loss, len(kept), best_lost, best_count):
                    victims = [
                        (v, self._eligible(v, job, within, victim_classes, {}) or reasons.CLASS_PREEMPTION)
                        for v in kept
                    ]
                    best, best_lost, best_count = self._plan(chip_name, victims, found), loss, len(kept)
        return best

    def _plan_multi(
        self,
        job: JobState,
        chip_name: str,
        units: float,
        within: bool,
        victim_classes: frozenset[str],
        headroom: float,
        checker: _Checker,
    ) -> Plan | None:
        """Whole nodes for a multi-node gang: every node the candidates can clear, then the cheapest of them."""
        chip = checker.chip
        want = checker.whole // chip.size
        full_mask = (1 << chip.size) - 1
        victims: list[Occupant] = []
        released: dict[str, float] = {}
        full: list[Pool] = []
        seen: set[Pool] = set()

        bound = not within  # (victims on pools that can never be full still count as released)
        if bound and self._private is None and self._full_pools(chip, victim_classes, full_mask) < want:
            return None  # fewer whole nodes could ever be freed than the job needs

        lost = self.lost
        card_jobs = self.state.card_jobs
        #: The victims (job ids) of each node found clearable, and the ``want`` smallest losses of one node.
        on: dict[Pool, set[int]] = {}
        cheapest: list[float] = []

        def check(pool: Pool, extra: set[int]) -> None:
            if pool in seen or pool.size != chip.size:
                return
            if bound and self._potential(pool, victim_classes) != full_mask:
                return
            if checker.mask(pool, extra) == full_mask:
                seen.add(pool)
                full.append(pool)
                ids = {j for dev in pool.ids for j in card_jobs.get(dev, ()) if j in extra}
                on[pool] = ids
                insort(cheapest, sum(lost[j] for j in ids))
                del cheapest[want:]

        def done(chosen: list[Pool]) -> Plan | None:
            devices = [p.devs[i].id for p in chosen for i in range(p.size)]
            kept = [v for v in victims if any(p in chosen for p, _, _ in v.cards)]
            if headroom + self._freed(devices, kept) < units:
                return None
            return self._plan(
                chip_name,
                [(v, self._eligible(v, job, within, victim_classes, {}) or reasons.CLASS_PREEMPTION) for v in kept],
                (None, devices),
            )

        for pool in chip.buckets[chip.full_key]:
            check(pool, set())
        for occ in self.leaving_on.get(chip_name, ()):
            for pool, _, _ in occ.cards:
                check(pool, set())
        if len(full) >= want:
            plan = done(full[:want])
            if plan is not None:
                return plan
        extra: set[int] = set()
        candidates, floor = self._candidates(chip_name, within, victim_classes)
        for k, occ in enumerate(candidates):
            if len(cheapest) == want and floor[k] > cheapest[-1] + EPS:
                break  # no node cleared from here on would be taken (see _cheapest_nodes)
            if occ.job.id in self.gone:
                continue
            reason = self._eligible(occ, job, within, victim_classes, released)
            if reason is None:
                continue
            victims.append(occ)
            extra.add(occ.job.id)
            released[occ.job.team] = released.get(occ.job.team, 0.0) + occ.units
            for pool, _, _ in occ.cards:
                check(pool, extra)
        if len(full) < want:
            return None
        # The cheapest nodes; failing the reservation headroom there, the first found (which
        # is what the search took before it weighed the work lost).
        return done(self._cheapest_nodes(full, on, want)) or done(full[:want])

    def _cheapest_nodes(self, full: list[Pool], on: Mapping[Pool, set[int]], want: int) -> list[Pool]:
        """``want`` of the clearable nodes ``full`` (in the order found), ``on`` their victims: each
        in turn the node whose victims not yet counted lose the least work, then the fewest;
        ties go to the node found first. A victim on several nodes counts once.

        Each pick loses at most the ``want``-th smallest loss of one node on its own (one of
        the ``want`` cheapest nodes is still there at every pick), and a node the walk clears
        later loses at least the ``floor`` of the candidate that clears it, which is on no node
        found before. So once that floor is above, the walk can stop: the picks stay the same.
        """
        lost = self.lost
        left = list(full)
        chosen: list[Pool] = []
        taken: set[int] = set()
        for _ in range(want):
            pick, pick_lost, pick_count = 0, math.inf, 0
            for i, pool in enumerate(left):
                new = [j for j in on[pool] if j not in taken]
                loss = sum(lost[j] for j in new)
                if _cheaper(loss, len(new), pick_lost, pick_count):
                    pick, pick_lost, pick_count = i, loss, len(new)
            pool = left.pop(pick)
            chosen.append(pool)
            taken.update(on[pool])
        order = {pool: i for i, pool in enumerate(full)}
        chosen.sort(key=order.__getitem__)
        return chosen

    def _freed(self, devices: list[int], victims: Iterable[Occupant]) -> float:
        """Units that come free for the reservation headroom: the victims' and leavers' on the cards used."""
        if self._unlimited:
            return 0.0
        freed = sum(v.usable_units for v in victims)
        seen = {v.job.id for v in victims}
        for dev in devices:
            for jid in self.state.card_jobs.get(dev, ()):
                occ = self.state.occupants.get(jid)
                if jid not in seen and occ is not None and occ.leaving is not None:
                    seen.add(jid)
                    freed += occ.usable_units
        return freed

    def _plan(self, chip: str, victims: list[tuple[Occupant, str]], found: tuple[object, list[int]]) -> Plan:
        devices = found[1]
        deadline = self.now + self.grace
        start = self.now
        victim_ids = {v.job.id for v, _ in victims}
        card_jobs = self.state.card_jobs
        occupants = self.state.occupants
        for dev in devices:
            for jid in card_jobs.get(dev, ()):
                occ = occupants.get(jid)
                if occ is None:
                    continue
                if jid in victim_ids:
                    start = max(start, deadline)
                elif occ.leaving is not None:
                    start = max(start, occ.leaving)
        return Plan(chip, victims, devices, start)


def _cheaper(lost: float, count: int, best_lost: float, best_count: int) -> bool:
    """Does a plan losing ``lost`` device-hours with ``count`` victims beat the best so far?

    Less work lost, then fewer victims; a tie keeps the plan found first.
    """
    if lost < best_lost - EPS:
        return True
    return lost <= best_lost + EPS and count < best_count


class _Checker:
    """Does the job fit on one pool (or card) once some jobs are gone?"""

    def __init__(self, owner: Preemptor, chip: Chip, whole: int, tmpl: VnpuTemplate | None) -> None:
        self.owner = owner
        self.state = owner.state
        self.chip = chip
        self.whole = whole
        self.tmpl = tmpl
        self.multi = tmpl is None and whole > chip.size

    def spots(self, occ: Occupant) -> list[object]:
        """Where removing ``occ`` can help: its pools (whole cards) or its cards (slices)."""
        if self.tmpl is not None:
            return [(pool, i) for pool, i, _ in occ.cards]
        seen: list[object] = []
        for pool, _, _ in occ.cards:
            if pool not in seen:
                seen.append(pool)
        return seen

    def _card_free(self, pool: Pool, i: int, gone: set[int], extra: set[int]) -> bool:
        bit = 1 << i
        if pool.free & bit:
            return True
        if not pool.usable & bit:
            return False
        dev = pool.devs[i].id
        if dev in self.owner.claimed:
            return False
        jobs = self.state.card_jobs.get(dev)
        if not jobs:
            return False  # free but held for a blocked job (backfill)
        return all(j in gone or j in extra for j in jobs)

    def mask(self, pool: Pool, extra: set[int]) -> int:
        """Cards of ``pool`` free once the leaving jobs and ``extra`` are gone (:meth:`_card_free`, inlined)."""
        gone = self.owner.gone
        claimed = self.owner.claimed
        card_jobs = self.state.card_jobs
        free = pool.free
        usable = pool.usable
        ids = pool.ids
        mask = free
        for i in range(pool.size):
            bit = 1 << i
            if free & bit or not usable & bit:
                continue
            dev = ids[i]
            if dev in claimed:
                continue
            jobs = card_jobs.get(dev)
            if not jobs:
                continue  # free but held for a blocked job (backfill)
            for j in jobs:
                if j not in gone and j not in extra:
                    break
            else:
                mask |= bit
        return mask

    def grow(self, pool: Pool, mask: int, occ: Occupant, extra: set[int]) -> int:
        """``mask`` plus the cards of ``occ`` on ``pool`` that are now free."""
        gone = self.owner.gone
        for p, i, _ in occ.cards:
            if p is pool and not mask >> i & 1 and self._card_free(pool, i, gone, extra):
                mask |= 1 << i
        return mask

    def fits(self, spot: object, victims: object) -> tuple[object, list[int]] | None:
        """``(spot, device ids)`` the job would get, or ``None``."""
        extra = {v.job.id for v in victims}  # type: ignore[attr-defined]
        if self.tmpl is not None:
            pool, i = cast("tuple[Pool, int]", spot)
            return self._fits_slice(pool, i, extra)
        assert isinstance(spot, Pool)
        return self.fits_mask(spot, self.mask(spot, extra))

    def fits_mask(self, pool: Pool, mask: int) -> tuple[object, list[int]] | None:
        """Placement on ``pool`` when ``mask`` is free (whole cards)."""
        spot = pool
        n = self.whole
        if n <= self.chip.gmax:
            group = best_group(mask, pool.groups, n)
            if not group:
                return None
            return spot, [pool.devs[i].id for i in lowest_bits(group, n)]
        unit = self.chip.gmax
        full = [g for g in pool.groups if g.bit_count() == unit and mask & g == g]
        if len(full) < n // unit:
            return None
        devices: list[int] = []
        for g in full[: n // unit]:
            devices.extend(pool.devs[i].id for i in lowest_bits(g, unit))
        return spot, devices

    def _fits_slice(self, pool: Pool, i: int, extra: set[int]) -> tuple[object, list[int]] | None:
        tmpl = self.tmpl
        assert tmpl is not None
        bit = 1 << i
        dev = pool.devs[i]
        if not pool.usable & bit or dev.id in self.owner.claimed:
            return None
        gone = self.owner.gone
        cores = mem = cpus = 0
        for jid in self.state.card_jobs.get(dev.id, ()):
            if jid in gone or jid in extra:
                continue
            occ = self.state.occupants.get(jid)
            if occ is None:
                continue
            for p, j, t in occ.cards:
                if p is pool and j == i:
                    if t is None:
                        return None  # someone keeps the card whole
                    cores += t.ai_cores
                    mem += t.memory_mb
                    cpus += t.ai_cpus
        if (
            dev.ai_cores - cores >= tmpl.ai_cores
            and dev.hbm_mb - mem >= tmpl.memory_mb
            and dev.ai_cpus - cpus >= tmpl.ai_cpus
        ):
            return (pool, i), [dev.id]
        return None
