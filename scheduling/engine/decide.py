"""Entry point of the decision core: ``decide(snapshot) -> Decisions``.

This docstring is the one place where the policy features are put together
(``docs/engine.md`` says the same with examples). Like a Kueue scheduling cycle
or a Volcano session, a tick is a fixed pipeline over an in-memory copy of the
free state; nothing here does I/O and the same snapshot always gives the same
decisions.

0. **Held** jobs (not eligible; :func:`eligible`): a job whose dependencies are not satisfied
   waits with ``Dependency`` (:mod:`dependency`), or is cancelled
   (``Decisions.cancelled``, ``DependencyNeverSatisfied``) when they never can
   be; then a copy of a job array beyond its ``%N`` limit, counting its
   running copies and the ones let through before it (lowest index first),
   waits with ``JobArrayTaskLimit`` (:mod:`array_throttle`); then a member's job beyond
   the limits their team lead set (cards or jobs at once) waits with ``MemberLimit``
   (:mod:`member_limits`). Held jobs take no
   part in the steps below: no place in the order, no hold, no estimate, no
   block on the jobs behind them.
1. **Evict** (:func:`evict`) running jobs whose preemption grace deadline has passed
   (``Decisions.evictions``); their devices are free for this tick. A victim
   whose job no longer waits, and whose cards no promise counts on, is not
   evicted but let run on (``Decisions.called_off``).
2. **Capacity** (:func:`free_state`, then ``Tick``'s constructor; :mod:`capacity`):
   free cards per node, topology group and chip model; vNPU slices per card; every team's usage in device units
   (:mod:`quota` ledgers, quota in force at ``now``); reservation counters
   (:mod:`reservations`); jobs already leaving (a set ``preempt_deadline``).
   Cards an earlier tick promised to a waiting job (``Snapshot.promises``)
   are held for it: the free ones leave the free state until its turn, and no
   other job's victim search counts them.
3. **Order** (:meth:`Tick.order`) the pending jobs (:mod:`priority`): Slurm multifactor priority
   from class, fair share (:mod:`fairshare`, classic algorithm), age and size;
   ties by submission time, then id. *Starvation guard* (:mod:`starvation`,
   ``spec.starvation``): jobs that waited longer than their class's threshold
   come before all of these, oldest first.
4. **For each job in that order** (:meth:`Tick.run`, then :meth:`Tick.place` from c on), first failure wins:

   a. *admission* (:func:`quota.admit`): class allowed, max job duration, monthly
      device-hours, max concurrent jobs, ``max`` devices overall and per chip
      model (which also narrows the chip models the job may use);
   b. *static shape* (:mod:`placement`, :meth:`Tick._admit_slow`): chip model exists
      (``ChipModelUnavailable``), enough healthy devices for the shape
      (``NodeUnhealthy``), shape fits the servers at all (``Topology``);
   c. *reservation* (:meth:`Tick._within_reservations`): free devices minus the job stay at
      or above what is held for other classes (``ReservedCapacity`` when
      devices are free but held, or when the job is larger than the
      reservations would leave it with every card free: it gets no hold);
   d. *queue position* (:meth:`Tick._behind_blocked`): without backfill, a pool (chip model) whose first
      blocked job is waiting takes no lower job (``Priority``) — except a job
      within its team's guarantee, which is entitled to that capacity;
   e. *placement* (:meth:`Tick._place_on_free`, :mod:`placement`): exact cards or a slice → ``Start``; with
      backfill on, only on cards not held for the pool's blocked job unless
      the job ends before that job's shadow time (``Start.backfilled``);
   f. *no fit → preemption* (:meth:`Tick._preempt_for`, :mod:`preemption`): guarantee reclaim from
      borrowing teams, or preemption of lower classes the job's class may
      preempt; cards of jobs already leaving count first. Found →
      ``Preemption`` per victim (deadline ``now + grace``) and the job waits
      with ``PreemptionGrace``, estimated start = the deadline; the cards it
      will get are returned as a ``Promise`` (whole cards), which the caller
      hands back until the job starts. The plan counts toward its team's
      quota at once and, through its promise, in later ticks (Kueue reserves
      quota at admission too), so no later job of the team is admitted or
      given victims on room it took. At most
      ``preemption.MAX_SEARCHES_PER_TICK`` searches run per tick (Kueue-like:
      only queue heads plan preemption), the rest wait for a later tick. Of the
      victim sets that free the cards, the one losing the least work
      (:mod:`work_lost`), then the fewest victims; a job the starvation guard
      served late costs its threshold's worth of cards more (:mod:`starvation`);
   g. *still no room* (:meth:`Tick.blocked_job`, :mod:`backfill`): the first blocked job of each pool
      gets its shadow time as estimated start and (with backfill) a hold on
      the cards it will take; it waits with ``Resources``. Later blocked jobs
      wait with ``Resources`` (backfill on) or ``Priority`` (off). With
      backfill on, every starving job gets a hold of its own (:mod:`starvation`:
      several per pool, in wait order, each shadow time worked out with the
      earlier holds' cards busy until their jobs would end); a job within its
      guarantee may take an ordinary hold's cards, never a starving job's.

5. **Never runnable** (:func:`feasibility.mark_never_runnable`): a job left waiting for its team's
   limits, a reservation or its shape that no schedule of the policy and no
   state of the inventory would ever let run waits with ``NeverRunnable`` ("cannot run
   under the current policy: ..."), not a reason that sounds temporary.

Quota reasons never block the jobs behind: a job stopped by its own team's
limits holds no place (Slurm does the same with association limits).
"""

from __future__ import annotations

import gc
import heapq
import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import replace
from datetime import date
from typing import cast

from scheduling.engine import array_throttle, dependency, member_limits, priority, reasons, run_time
from scheduling.engine.backfill import Hold, Release, Replay
from scheduling.engine.capacity import EPS, ClusterState, Occupant, Pool, end_of
from scheduling.engine.durations import format_duration
from scheduling.engine.fairshare import user_factors
from scheduling.engine.feasibility import mark_never_runnable
from scheduling.engine.placement import Need, Placement, commit, find, need_of_key
from scheduling.engine.policy import DEVICES, chip_resource, policy_clock, quota_for_team
from scheduling.engine.preemption import MAX_SEARCHES_PER_TICK, Plan, Preemptor
from scheduling.engine.priority import class_factors, size_scale
from scheduling.engine.quota import TeamLedger, admit
from scheduling.engine.reservations import ReservationLedger
from scheduling.engine.snapshot import (
    Decisions,
    JobState,
    Preemption,
    Promise,
    Snapshot,
    Start,
    VnpuTemplate,
    Wait,
)
from scheduling.engine.starvation import (
    MAX_HOLDS_PER_CHIP,
    Guard,
    held_detail,
    served_late,
    starving_first,
    unheld_detail,
)
from scheduling.engine.tick_memo import MemoWait, RankMemo, Ranks, ShadowMemo, TickMemo, covered, passed

_PRIORITY_TEXT = "a higher-priority job waits for these devices"
_LEAVING_TEXT = "waiting for jobs already leaving"


class _Group:
    """Pending jobs of one team, class and shape: what the tick decides once for all of them."""

    __slots__ = (
        "base",
        "cls",
        "ledger",
        "memo",
        "n",
        "need",
        "promise",
        "size",
        "slow",
        "starving_memo",
        "starving_wide",
        "static",
        "team",
        "wide",
    )

    def __init__(self, team: str, cls: str, need: Need, ledger: TeamLedger) -> None:
        self.team = team
        self.cls = cls
        self.need = need
        self.ledger = ledger
        #: ``(reason, detail)`` every job of the group waits with (class not in the policy / not allowed).
        self.static: Wait | None = None
        #: No chip model fits the shape: admission job by job, then the shape's reason.
        self.slow = False
        #: Waits of steps 4c-4g by rank (see ``Tick.run``).
        self.memo = RankMemo()
        #: The same for its starving jobs (their waits name the guard, so they are not shared with
        #: the others').
        self.starving_memo = RankMemo()
        #: Its last stable wait, and its starving jobs': the wait of any job of the group while
        #: the epoch stands, its placement tries made again (``tick_memo``, ``Tick._retry``).
        self.wide: MemoWait | None = None
        self.starving_wide: MemoWait | None = None
        #: The jobs' ``num_devices`` (part of the group key) and job-size term of the priority.
        self.n = 0
        self.size = 0.0
        #: The class's term of the priority (set by ``Tick.order``).
        self.base = 0.0
        #: A job holding a promise from an earlier tick is a group of its own (see ``Tick.run``).
        self.promise: _Promised | None = None


class _Promised:
    """A promise from an earlier tick (``snapshot.Promise``) and the free cards held for it now."""

    __slots__ = ("free_now", "promise")

    def __init__(self, promise: Promise, free_now: list[tuple[Pool, int]]) -> None:
        self.promise = promise
        #: ``(pool, card mask)`` of promised cards that are free now (taken out of the free state).
        self.free_now = free_now


def decide(snapshot: Snapshot) -> Decisions:
    """Starts, preemptions, evictions and a reason for every waiting job."""
    # A tick allocates tens of thousands of small objects and frees almost none of
    # them before it ends: the cyclic collector would walk the caller's whole heap
    # several times (a tenth of a 10k-job tick) to find nothing. It runs after.
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        snapshot, held, cancelled = eligible(snapshot)  # step 0
        decisions = Tick(snapshot).run()
        mark_never_runnable(snapshot, decisions)  # step 5: a wait that can never end says so
        decisions.waiting.update(held)
        decisions.cancelled = cancelled
        return decisions
    finally:
        if enabled:
            gc.enable()


def eligible(snapshot: Snapshot) -> tuple[Snapshot, dict[int, Wait], dict[int, str]]:
    """Step 0 (see the module's docstring): ``(snapshot of the eligible jobs, waits of the held ones, jobs to cancel)``.

    ``decide`` and ``explain`` both start here, so a held job is held in both. The snapshot is
    the one given when no job is held.
    """
    held: dict[int, Wait] = {}
    cancelled: dict[int, str] = {}
    if snapshot.dependencies:
        held, cancelled = dependency.hold(snapshot.pending, snapshot.dependencies)
    if snapshot.array_limits:
        left = (job for job in snapshot.pending if job.id not in held and job.id not in cancelled)
        held.update(array_throttle.hold(left, snapshot.running, snapshot.array_limits))
    if snapshot.member_limits:
        left = (job for job in snapshot.pending if job.id not in held and job.id not in cancelled)
        held.update(member_limits.hold(left, snapshot.running, snapshot.member_limits))
    if not held and not cancelled:
        return snapshot, held, cancelled
    pending = [job for job in snapshot.pending if job.id not in held and job.id not in cancelled]
    return replace(snapshot, pending=pending), held, cancelled


def evict(snapshot: Snapshot, out: Decisions, now: float) -> list[JobState]:
    """Step 1: ``out.evictions`` (grace deadline passed) and ``out.called_off``; returns the leaving jobs."""
    if snapshot.promises is not None:
        _call_off(snapshot, out)
    leaving = [job for job in snapshot.running if job.preempt_deadline is not None]
    out.evictions = [job.id for job in leaving if job.preempt_deadline <= now]  # type: ignore[operator]
    return leaving


def free_state(snapshot: Snapshot, evictions: list[int], leaving: list[JobState], now: float) -> ClusterState:
    """Step 2, the cards: the free state of this tick, with the running jobs (but the evicted) on it."""
    state = ClusterState(snapshot, snapshot.policy.placement_strategy, now)
    state.occupy(snapshot.running, set(evictions), reuse=snapshot.inventory_key is not None, leaving=leaving)
    return state


class Tick:
    """One run of the pipeline over a tick's state (the steps of the module docstring).

    Steps 1-2 in the constructor (:func:`evict`, :func:`free_state`, the ledgers,
    reservations and promises), step 3 :meth:`order`, step 4 :meth:`run` per job:
    4a :func:`quota.admit`, 4b :meth:`_admit_slow` (no chip model fits the shape),
    then :meth:`place`: 4c :meth:`_within_reservations`, 4d :meth:`_behind_blocked`,
    4e :meth:`_place_on_free`, 4f :meth:`_preempt_for`, 4g :meth:`blocked_job`.
    Steps 0 and 5 are :func:`eligible` and :func:`feasibility.mark_never_runnable`,
    around it in :func:`decide`.
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.policy = policy = snapshot.policy
        self.now = now = snapshot.now.timestamp()
        self.out = out = Decisions()
        leaving = evict(snapshot, out, now)  # step 1
        self.state = state = free_state(snapshot, out.evictions, leaving, now)  # step 2, then the ledgers
        self.ledgers: dict[str, TeamLedger] = {}
        #: ``now`` on the policy's wall clock (weekday, minute): what quotas in force depend on.
        self._clock: tuple[int, int, date] | None = None
        already = self._count_running()
        #: The running jobs already leaving when the tick began (the preemptor starts from them).
        self._leaving = tuple(already)
        #: Occupants with cards started or newly leaving in this tick (their releases move), per
        #: chip model: what a shadow replay of the model merges in. Each is marked with this
        #: tick's token (``Occupant.moved_in``): a replay skips its release among the running jobs'.
        self._changed_on: dict[str, list[Occupant]] = {}
        self._token = object()
        for occ in already:
            self._change(occ)
        self.reservations = ReservationLedger(policy.reservations, state.chips, state.occupants.values())
        self.class_rank = {pc.name: pc.rank for pc in policy.priority_classes}
        self._preemptor: Preemptor | None = None
        #: The job whose last victim search passed over borrowers for the reclaim bound (its wait says so).
        self._bounded_for = -1
        self.need_cache: dict[tuple, Need] = state.needs
        #: Backfill holds (backfill on) per chip model, and their shadow times in order. A chip
        #: model has one hold (its first blocked job's), or several with the starvation guard.
        self.holds: dict[str, list[Hold]] = {}
        self._shadows: list[float] = []
        #: The starvation guard (:mod:`starvation`).
        self.guard = Guard(policy)
        #: How many jobs at the front of the order are starving (:func:`starving_first`), and
        #: whether the job whose turn it is is one of them (``Tick.run``; read in ``blocked_job``).
        self.starving = 0
        self._turn_starving = False
        #: Starving holds per chip model (at most :data:`MAX_HOLDS_PER_CHIP`).
        self._starving_count: dict[str, int] = {}
        #: Per chip model, the pools the last failed held-card try made again moved to the ends of
        #: their buckets, in order, and the chip's ``moves`` after it (``_tried_in_vain``).
        self._moved: dict[str, tuple[list[Pool], int]] = {}
        #: Chip-model lists whose starving holds are all taken (they only fill up in a tick).
        self._holds_full: set[tuple[str, ...]] = set()
        #: The words of a starving job's wait without a hold, by class and chip models (``_starving_blocked``).
        self._unheld: dict[tuple[str, tuple[str, ...]], str] = {}
        #: The reservations' margin for a class, shape and chip models, and ``reservations.taken``
        #: when it was worked out (``_still_fits``): the same for every remembered wait of them.
        self._margins: dict[tuple[str, Need, tuple[str, ...]], tuple[float, float]] = {}
        #: Per chip model, its holds as waiting jobs ask for them (:class:`_HeldOn`, see
        #: :meth:`_usable_holds`), until a hold is added.
        self._held_on: dict[str, _HeldOn] = {}
        #: The cards of every hold of the tick (a later hold lends none of them: ``hold``).
        self._held_devices: set[int] = set()
        #: Pools with a blocked job in front (backfill off).
        self.blocked: set[str] = set()
        #: Cards promised to waiting jobs, busy for other jobs' shadow times until then, by job id,
        #: and a count of their changes per chip model (what the claimed cards kept for it were built at).
        self._claims: dict[int, tuple[list[int], float]] = {}
        self._claims_version: dict[str, int] = {}
        self._claimed_on: dict[str, _Claimed] = {}
        #: Promises from earlier ticks still in force, by job id (see :meth:`_hold_promises`).
        self.promised: dict[int, _Promised] = {}
        #: Their cards as the tick began, for the victim search (``promised`` changes as jobs take
        #: their turn; a search made during or after one must still see the others' cards claimed).
        self._promised_devices: dict[int, frozenset[int]] = {}
        #: Jobs counted in their team's ledger without running: a plan of this tick or a promise
        #: in force (they will start once their victims are gone), as ``(ledger, chip, units,
        #: device-hours)``.
        self._counted: dict[int, tuple[TeamLedger, str, float, float]] = {}
        #: The tick's shrink-only memory of the free state (:mod:`tick_memo`; lives as long as the tick).
        self.free_memo = TickMemo()
        #: The starving jobs' shadow replays (:class:`tick_memo.ShadowMemo`; lives as long as the tick).
        self.shadow_memo = ShadowMemo()
        #: The groups of :meth:`_groups`, each once.
        self._distinct: list[_Group] = []
        #: Running jobs per chip model by expected end (built on the first shadow time).
        self._base_releases: dict[str, list[Occupant]] = {}
        #: Their releases, built as far as a replay with claims has read (kept for the next one).
        self._base_rels: dict[str, _Releases] = {}
        if snapshot.promises:
            self._hold_promises()

    def _hold_promises(self) -> None:
        """Take the free cards promised to waiting jobs out of the free state until their turn.

        A promise is kept while its job waits, asks for whole cards and is not
        one grace period past the promised time; the cards still held by leaving
        jobs are marked claimed for every other job's victim search (the
        preemptor is told) and busy for shadow times until the job would end.
        """
        state = self.state
        now = self.now
        lapse = self.policy.grace_period_s
        promises = self.snapshot.promises
        if not promises:
            return
        jobs = {job.id: job for job in self.snapshot.pending if job.id in promises}
        where = state.where
        for jid, promise in promises.items():
            job = jobs.get(jid)
            if job is None or job.vnpu_template is not None or now >= promise.until + lapse:
                continue
            masks: dict[Pool, int] = {}
            for dev in promise.devices:
                spot = where.get(dev)
                if spot is not None and spot[0].free >> spot[1] & 1:
                    masks[spot[0]] = masks.get(spot[0], 0) | (1 << spot[1])
            for pool, mask in masks.items():
                state.take_whole(pool, mask)
            self.promised[jid] = _Promised(promise, list(masks.items()))
            self._promised_devices[jid] = frozenset(promise.devices)
            duration = run_time.expected(job) or math.inf
            self._set_claim(jid, list(promise.devices), max(promise.until, now) + duration)
            spot = where.get(promise.devices[0]) if promise.devices else None
            if spot is not None:
                units = float(len(promise.devices))
                self._count(jid, self.ledger(job.team), spot[0].chip, units, units * job.estimated_duration_s / 3600.0)

    def _set_claim(self, jid: int, devices: list[int], free_at: float) -> None:
        """``jid``'s cards are busy for other jobs' shadow times until ``free_at`` (a promise, a plan)."""
        old = self._claims.get(jid)
        if old is not None:
            self._claims_changed(old[0])
        self._claims[jid] = (devices, free_at)
        self._claims_changed(devices)

    def _drop_claim(self, jid: int) -> None:
        """``jid``'s claim ends (it started, or its promise lapsed)."""
        old = self._claims.pop(jid, None)
        if old is not None:
            self._claims_changed(old[0])

    def _claims_changed(self, devices: list[int]) -> None:
        """A claim on ``devices`` came or went: the claimed cards kept for their chip model are stale.

        Counted per chip model (a claim's cards are all of one, as :meth:`_claimed` reads them):
        a victim search's plan on one model left the others' kept claims as they were.
        """
        spot = self.state.where.get(devices[0]) if devices else None
        if spot is not None:
            chip = spot[0].chip
            self._claims_version[chip] = self._claims_version.get(chip, 0) + 1

    def _change(self, occ: Occupant) -> None:
        """``occ`` started or began to leave in this tick: its release moves."""
        if occ.cards:
            occ.moved_in = self._token
            on = self._changed_on.get(occ.chip)
            if on is None:
                self._changed_on[occ.chip] = [occ]
            else:
                on.append(occ)

    def _count_running(self) -> list[Occupant]:
        """Charge the running jobs to their teams' ledgers; returns the jobs already leaving."""
        state = self.state
        if not state.has_slices:  # whole cards: per-team totals, carried between ticks
            keys: dict[str, str] = {}
            for team, (units, chips, jobs) in state.running_totals().items():
                ledger = self.ledger(team)
                usage = ledger.usage
                usage[DEVICES] += units
                for chip, u in chips.items():
                    key = keys.get(chip)
                    if key is None:
                        key = keys[chip] = chip_resource(chip)
                    usage[key] = usage.get(key, 0.0) + u
                ledger.jobs += jobs
            return list(state.leaving)
        ledgers = self.ledgers
        keys = {}
        leaving: list[Occupant] = []
        for occ in self.state.occupants.values():
            team = occ.job.team
            found = ledgers.get(team)
            ledger = found if found is not None else self.ledger(team)
            usage = ledger.usage
            units = occ.units
            usage[DEVICES] += units
            key = keys.get(occ.chip)
            if key is None:
                key = keys[occ.chip] = chip_resource(occ.chip)
            usage[key] = usage.get(key, 0.0) + units
            ledger.jobs += 1
            if occ.leaving is not None:
                leaving.append(occ)
        return leaving

    def _count(self, jid: int, ledger: TeamLedger, chip: str, units: float, hours: float) -> None:
        """Count a job that will start once its victims are gone in its team's ledger.

        As Kueue reserves quota when it admits a workload, before preemption ends: the
        team's ``max``, max jobs, monthly device-hours and guarantee see it from the
        moment it is planned, so a later job of the team is not admitted (nor given
        victims) on room it has taken, and its victims never leave for a job its own
        team's limits then refuse.
        """
        ledger.add(chip, units, 1)
        ledger.month_hours += hours
        self._counted[jid] = (ledger, chip, units, hours)

    def _uncount(self, jid: int) -> tuple[TeamLedger, str, float, float] | None:
        """Take a job's count back (its own turn must not see it). Usage shrinks: the
        ledger's memo of admissions may hold refusals that no longer apply."""
        counted = self._counted.pop(jid, None)
        if counted is not None:
            ledger, chip, units, hours = counted
            ledger.add(chip, -units, -1)
            ledger.month_hours -= hours
            ledger.adm.clear()
        return counted

    # -- helpers -------------------------------------------------------------

    def ledger(self, team: str) -> TeamLedger:
        ledger = self.ledgers.get(team)
        if ledger is None:
            clock = self._clock
            if clock is None:
                clock = self._clock = policy_clock(self.policy, self.snapshot.now)
            quota, schedule = quota_for_team(self.policy.team(team), *clock)
            month = float(self.snapshot.month_device_hours.get(team, 0.0))
            ledger = self.ledgers[team] = TeamLedger(team, quota, schedule, month)
        return ledger

    def may_preempt(self, job: JobState, need: Need, chips: list[str]) -> bool:
        """Whether a victim search for ``job`` could run (rights, and budget left this tick)."""
        preemptor = self.preemptor
        if preemptor.searches >= MAX_SEARCHES_PER_TICK:
            return False
        return preemptor.can_try(job, need, chips)

    @property
    def preemptor(self) -> Preemptor:
        if self._preemptor is None:
            self._preemptor = Preemptor(
                self.policy,
                self.state,
                self.ledgers,
                self.now,
                self._leaving,
                self._promised_devices,
                served_late(self.guard, self.snapshot.running) if self.guard.on else None,
            )
        return self._preemptor

    def wait(self, job_id: int, reason: str, detail: str = "", estimated: float | None = None) -> None:
        self.out.waiting[job_id] = Wait(reason, detail, estimated)

    def fair_share_of(self, users: set[tuple[str, str]] | None = None) -> dict[tuple[str, str], float]:
        """Fair-share factor of every ``(team, user)`` with a pending job (or of ``users``)."""
        snap = self.snapshot
        if users is None:
            users = {(job.team, job.user) for job in snap.pending}
        return user_factors(self.policy, snap.usage, users)

    # -- the pipeline ------------------------------------------------------------

    def order(self) -> tuple[list[int], list[_Group]]:
        """Step 3: indices into ``snapshot.pending``, highest priority first, and every job's group.

        Starving jobs (:mod:`starvation`) first, oldest first; then the multifactor order.
        """
        idx, groups = self._order()
        if self.guard.on:
            idx, self.starving = starving_first(self.guard, self.snapshot.pending, idx, self.now)
        return idx, groups

    def _order(self) -> tuple[list[int], list[_Group]]:
        """The multifactor order (without the starvation guard) and every job's group.

        :func:`priority.rank` sums and sorts; what it takes as given (the class and
        fair-share terms, the job-size term) is worked out here once per (team, user)
        and per group of jobs.
        """
        pending = self.snapshot.pending
        groups = self._groups()
        n = len(pending)
        if n < 2:  # nothing to order (half the simulator's ticks): no fair share, no scores
            return list(range(n)), groups
        ordering = self.policy.ordering
        w_class = ordering.weight_priority_class
        w_fs = ordering.weight_fair_share
        w_size = ordering.weight_job_size
        scale = size_scale(ordering, self.state.largest_node)
        class_f = class_factors(self.policy)
        # Fair share per (team, user), looked up team first: no key tuple per job.
        users: dict[str, set[str]] = {}
        for job in pending:
            team_users = users.get(job.team)
            if team_users is None:
                users[job.team] = {job.user}
            else:
                team_users.add(job.user)
        fair = self.fair_share_of({(team, user) for team, names in users.items() for user in names})
        fair_of: dict[str, dict[str, float]] = {team: {} for team in users}
        for (team, user), factor in fair.items():
            fair_of[team][user] = w_fs * factor
        # What is constant per group: its class's term and its job-size term.
        for group in self._distinct:
            group.base = w_class * class_f.get(group.cls, 0.0)
            if scale:
                need = group.need
                units = need.first_units if need.chips else float(group.n)
                group.size = min(units * scale, w_size)
            else:
                group.size = 0.0
        fixed = [0.0] * n
        for i in range(n):
            job = pending[i]
            fixed[i] = groups[i].base + fair_of[job.team][job.user]
        size = [group.size for group in groups] if scale else None
        return priority.rank(pending, fixed, size, ordering, self.now), groups

    def _groups(self) -> list[_Group]:
        """Every pending job's :class:`_Group` (team, class and shape), aligned with ``snapshot.pending``."""
        pending = self.snapshot.pending
        class_rank = self.class_rank
        state = self.state
        nc = self.need_cache
        groups: dict[tuple, _Group] = {}

        def make(key: tuple) -> _Group:
            team, cls, chip_model, template, n = key
            shape = (chip_model, template, 1 if template else n)
            need = nc.get(shape) or need_of_key(state, shape, nc)
            ledger = self.ledger(team)
            group = _Group(team, cls, need, ledger)
            group.n = n
            if cls not in class_rank:
                group.static = Wait(reasons.QUOTA_CLASS_NOT_ALLOWED, f"class {cls} is not in the policy")
            elif not need.chips:
                group.slow = True  # admission per job, then the static shape reason
            elif ledger.allowed is not None and cls not in ledger.allowed:
                group.static = Wait(reasons.QUOTA_CLASS_NOT_ALLOWED, f"class {cls} is not allowed")
            return group

        keys: list[tuple] = []
        out: list[_Group] = []
        for j in pending:
            key = (j.team, j.priority_class, j.chip_model, j.vnpu_template, j.num_devices)
            group = groups.get(key)
            if group is None:
                group = groups[key] = make(key)
            keys.append(key)
            out.append(group)
        # The largest request of the tick: a team's memo of admissions outlives its starts while
        # every limit keeps room for it (TeamLedger.add). Ledgers made later assume no bound.
        big = max((max(group.need.units.values()) for group in groups.values() if group.need.units), default=0.0)
        for ledger in self.ledgers.values():
            ledger.big = big
        distinct = self._distinct = list(groups.values())
        promised = self.promised
        if promised:  # a job holding a promise answers for itself: no memo shared with others
            for i, job in enumerate(pending):
                if job.id in promised:
                    group = out[i] = make(keys[i])
                    group.promise = promised[job.id]
                    distinct.append(group)
        return out

    def run(self, ordered: tuple[list[int], list[_Group]] | None = None) -> Decisions:
        """The tick; ``ordered``: :meth:`order`'s result if the caller worked it out (the benchmark times it apart)."""
        state = self.state
        idx, groups = ordered if ordered is not None else self.order()
        pending = self.snapshot.pending
        waiting = self.out.waiting
        holds = self.holds
        now = self.now
        reservations = self.reservations
        reserved = bool(reservations.held)
        shadows = self._shadows
        ranks = Ranks(shadows)  # (made again when ``shadows`` changes, before a job reads it)
        # The starving jobs are the first of the order (``starving_first``): counted off.
        front = self.starving
        #: One wait per refusal of the admission memo (the waits are values: shared).
        refused: dict[tuple, Wait] = {}
        # (Plain indexing and ``self.place``, not ``map`` and a bound method in a local: compiled,
        # they are a typed list read and a native call; interpreted they cost about the same.)
        for k in idx:
            starving = self._turn_starving = front > 0
            front -= 1
            job = pending[k]
            group = groups[k]
            if group.promise is not None:
                self._promised_turn(job, group)
                continue
            jid = job.id
            ledger = group.ledger
            need = group.need
            if group.static is not None:  # class not in the policy / not allowed: the whole group
                waiting[jid] = group.static
                continue
            if group.slow:
                self._admit_slow(job, group)
                continue
            adm = admit(ledger, job, need)
            if adm[0] is not None:
                refusal = refused.get(adm)
                if refusal is None:
                    refusal = refused[adm] = Wait(adm[0], adm[1])
                waiting[jid] = refusal
                continue
            chips = adm[2]
            # A starving job's wait names the guard: remembered apart. One that may still hold
            # cards of its own is placed in full unless the free state is as an earlier starving
            # job of its group left it, waiting without a hold (its chip models with room for one
            # out of reach: a reservation, backfill off): a hold, a start or a victim search
            # changes the free state's version, and the rest only fills up during a tick.
            memo = group.starving_memo if starving else group.memo
            # Steps 4c-4g give the same answer to every job of the same team, class
            # and shape until the free state changes (a start, a hold, a preemption):
            # the long tail of a full queue is answered from this memo. With holds,
            # the answer also depends on which shadow times the job ends before.
            if holds:
                duration = run_time.expected(job) or 0.0
                if duration > 0:
                    if ranks.times is not shadows:
                        ranks = Ranks(shadows)
                    end = now + duration
                    # (A list too short for a grid is searched without the method call: the
                    # guard-off tick, with a hold or two, was slower through it.)
                    rank = ranks.count(end) if ranks.scale > 0.0 else passed(shadows, end)
                else:
                    rank = -1
            else:
                duration = 0.0  # (read below only once a hold exists)
                rank = 0
            hit = memo.get(rank)
            version = self.free_memo.version
            epoch = self.free_memo.epoch
            if hit is not None and (hit.chips is chips or hit.chips == chips):
                if hit.version == version and not hit.held:
                    waiting[jid] = hit.wait
                    continue
                # A stable wait (see place), if no reservation holds back devices it could use now;
                # one that tried held cards, if this job's tries are failures known too (tick_memo).
                if (
                    (hit.version == version or hit.epoch == epoch)
                    and (not reserved or hit.version == version or self._still_fits(hit, group.cls, need))
                    and (not hit.held or self._retry(need, ledger, duration, hit.looked, rank, shadows) is not None)
                ):
                    waiting[jid] = hit.wait
                    continue
            wide = group.wide if memo is group.memo else group.starving_wide
            if (
                holds
                and wide is not None
                and wide.epoch == epoch
                and wide.chips == chips
                and (not reserved or self._still_fits(wide, group.cls, need))
            ):
                # The group's last stable wait is every job's while the epoch stands, whatever holds
                # it ends before, if its own placements are failures known too (tick_memo).
                tried = self._retry(need, ledger, duration, wide.looked, rank, shadows)
                if tried is not None:
                    wait = waiting[jid] = wide.wait
                    # (Upward: a longer job ends before no more holds: the same tries, or fewer.)
                    entry = MemoWait(chips, version, wait, epoch, reservations.taken, -1.0, wide.looked, tried)
                    memo.put(rank, entry, upward=True)
                    continue
            outcome = self.place(job, need, ledger, list(chips))
            shadows = self._shadows
            if outcome is not None:
                wait = waiting[jid] = Wait(*outcome)
                # (A wait that names the reclaim bound is this job's own: the next job of the
                # group places itself, and its search — or the memo of failed ones — says.)
                if self.free_memo.version == version and self._bounded_for != jid:
                    stable = self.free_memo.stable
                    entry = MemoWait(
                        chips,
                        version,
                        wait,
                        self.free_memo.epoch if stable else -1,
                        reservations.taken,
                        -1.0,  # margin unknown: check the reservations after the next start
                        tuple(self.free_memo.looked),
                        self.free_memo.held,
                    )
                    if stable:
                        if memo is group.memo:
                            group.wide = entry
                        else:
                            group.starving_wide = entry
                    # A stable wait is a longer job's of the group too (a higher rank ends before
                    # no more shadow times: its held-card tries made again, fewer).
                    memo.put(rank, entry, upward=stable)
        promises = self.out.promises
        for jid, kept in self.promised.items():  # still waiting, no new plan: the promise stands
            if jid not in promises:
                promises[jid] = kept.promise
        state.release()  # the free state is dead now: its layout goes back for the next tick
        return self.out

    def _promised_turn(self, job: JobState, group: _Group) -> None:
        """The turn of a job holding a promise: admission and placement with its own count out.

        Its count (see :meth:`_count`) is taken out for the whole turn, so neither its
        team's limits nor its guarantee see the job twice; admission is the reference
        :func:`quota.admit`, unmemoised (a handful of jobs). Afterwards the count is put
        back while the promise stands (a new plan counts itself); where it went (the
        promise dropped or lapsed, or the job started on another chip model) the team's
        usage shrank, which the memos of admissions and stable waits take never to
        happen during a tick: they are voided.
        """
        jid = job.id
        ledger = group.ledger
        need = group.need
        assert group.promise is not None
        counted = self._uncount(jid)
        try:
            if group.static is not None:
                self.out.waiting[jid] = group.static
            elif group.slow:
                self._admit_slow(job, group)
            else:
                reason, detail, chips = admit(ledger, job, need, memo=False)
                if reason is not None:
                    self.out.waiting[jid] = Wait(reason, detail)
                else:
                    outcome = self._place_promised(job, need, ledger, list(chips), group.promise)
                    if outcome is not None:
                        self.out.waiting[jid] = Wait(*outcome)
        finally:
            if counted is not None:
                if jid in self.promised and jid not in self._counted:  # still due to start
                    self._count(jid, *counted)
                if self._counted.get(jid) != counted:
                    occ = self.state.occupants.get(jid)
                    if occ is None or occ.chip != counted[1] or occ.units < counted[2]:
                        self.free_memo.epoch += 1
                        self.free_memo.version += 1

    def _place_promised(
        self, job: JobState, need: Need, ledger: TeamLedger, chips: list[str], held: _Promised
    ) -> tuple[str, str, float | None] | None:
        """:meth:`place` for a job holding a promise: its held cards are free for it alone.

        The job places with the tick's shrink-only memos (failed placements,
        reservation headroom) set aside, as they were worked out without its
        cards; if it does not fit and its promised cards are all free or held by
        leaving jobs, it waits for them (no victim search). Afterwards the cards
        of the promise in force (a new plan's, else the old one) that are still
        free are held again, and the memos come back: as they were if the free
        state is too, else dropped where it grew (:meth:`_free_grew`) or told of
        the cards taken (like a start) where it only shrank.
        """
        state = self.state
        reservations = self.reservations
        self.shadow_memo.earlier()  # its cards are lent to it; its claim may lapse
        before = dict(held.free_now)
        for pool, mask in held.free_now:
            state.release_whole(pool, mask)
        kept = reservations.save()
        self._forget_headroom()
        starts = len(self.out.starts)
        jid = job.id
        del self.promised[jid]
        try:
            with self.free_memo.set_aside():
                outcome = self.place(job, need, ledger, chips, held.promise)
        finally:
            reservations.restore(kept)
            self._margins.clear()  # (worked out with its cards lent)
        masks: dict[Pool, int] = {}
        if len(self.out.starts) > starts:  # started: the promise is kept
            self._forget_headroom()  # its start moved the headrooms (a reserved class's use)
            self._drop_claim(jid)
            if self._preemptor is not None:
                self._preemptor.claimed.difference_update(held.promise.devices)
        elif jid in self.promised:  # a new plan, its free cards held already (_hold_new)
            self._forget_headroom()
        else:
            promise = self.out.promises.get(jid, held.promise)  # a new plan replaces the old promise
            if self.now >= promise.until + self.policy.grace_period_s:
                self._drop_claim(jid)
            else:
                self.out.promises[jid] = promise
                for dev in promise.devices:
                    spot = state.where.get(dev)
                    if spot is not None and spot[0].free >> spot[1] & 1:
                        masks[spot[0]] = masks.get(spot[0], 0) | (1 << spot[1])
                for pool, mask in masks.items():
                    state.take_whole(pool, mask)
                self.promised[jid] = _Promised(promise, list(masks.items()))  # (for shadow times)
        if any(pool.free & mask for pool, mask in before.items()):
            self._free_grew()
        else:
            took = sum((mask & ~before.get(pool, 0) & pool.usable).bit_count() for pool, mask in masks.items())
            if took:  # fewer free cards, as after a start
                self.free_memo.version += 1
                reservations.on_taken(float(took))
        self.shadow_memo.earlier()
        return outcome

    def _promised_cards(self, need: Need, promise: Promise) -> Placement | None:
        """The promised cards as a placement for ``need``, if they are all free now and are what it asks for."""
        where = self.state.where
        spots = [where.get(dev) for dev in promise.devices]
        if need.template is not None or not spots or len(spots) != need.whole:
            return None
        cards: list[tuple[Pool, int]] = []
        for spot in spots:
            if spot is None or not spot[0].free >> spot[1] & 1:
                return None
            cards.append(spot)
        chip = cards[0][0].chip
        if chip not in need.units or any(p.chip != chip for p, _ in cards):
            return None
        pool = cards[0][0]
        if all(p is pool for p, _ in cards):
            picked = tuple(sorted(i for _, i in cards))
            mask = 0
            for i in picked:
                mask |= 1 << i
            return Placement(chip, [(pool, i) for i in picked], None, pool, picked, mask)
        return Placement(chip, cards)

    def _promise_due(self, promise: Promise) -> float | None:
        """When the promised cards are all free, if each is free or held only by leaving jobs; else ``None``."""
        state = self.state
        where = state.where
        card_jobs = state.card_jobs
        occupants = state.occupants
        due = self.now
        for dev in promise.devices:
            spot = where.get(dev)
            if spot is None:
                return None
            pool, i = spot
            if pool.free >> i & 1:
                continue
            jobs = card_jobs.get(dev)
            if not pool.usable >> i & 1 or not jobs:
                return None
            for jid in jobs:
                occ = occupants.get(jid)
                if occ is None or occ.leaving is None:
                    return None
                if occ.leaving > due:
                    due = occ.leaving
        return due

    def _free_grew(self) -> None:
        """Cards came back to the free state mid-tick: drop what assumed it only shrinks."""
        self.free_memo.free_grew()
        self.shadow_memo.earlier()
        self._forget_headroom()
        if self._preemptor is not None:
            self._preemptor.forget()

    def _admit_slow(self, job: JobState, group: _Group) -> None:
        """Steps 4a-4b when no chip model fits the shape: the team's limits first, then the shape's reason."""
        need = group.need
        reason, detail, _ = admit(group.ledger, job, need, memo=False)
        if reason is None:
            reason, detail = need.reason or reasons.TOPOLOGY, need.detail
        self.out.waiting[job.id] = Wait(reason, detail)

    def _still_fits(self, entry: MemoWait, cls: str, need: Need) -> bool:
        """Whether the reservations still leave a remembered stable wait as it was (see :meth:`_reservations_fit`).

        The margin depends on the class, shape and chip models only, not on the wait: one worked
        out for another wait of them (a job's end ranks it among the holds' shadow times, so a
        group has a wait per rank) answers while the units taken since stay below it. Dropped
        whenever the headrooms are (:meth:`_forget_headroom`): only then may one grow.
        """
        taken = self.reservations.taken
        if taken - entry.taken < entry.margin:
            return True
        key = (cls, need, entry.chips)
        known = self._margins.get(key)
        if known is not None and taken - known[0] < known[1]:
            entry.taken, entry.margin = known
            return True
        margin = self._reservations_fit(cls, need, entry.chips)
        if margin is None:
            return False
        entry.taken = taken
        entry.margin = margin
        self._margins[key] = (taken, margin)
        return True

    def _forget_headroom(self) -> None:
        """The free state changed other than by a start: the reservations' headrooms and margins are void."""
        self.reservations.forget()
        self._margins.clear()

    def _reservations_fit(self, cls: str, need: Need, chips: tuple[str, ...]) -> float | None:
        """``None`` if a reservation holds back free devices a job of ``cls`` and shape ``need`` could use now.

        Else the margin: by how many units the reservations' headroom may still
        shrink before one could. Headroom only shrinks during a tick, by at most
        the units started (a start takes free units; one of a reserved class
        gives back at most as much), so a memo entry checks again only when
        ``reservations.taken`` has grown by its margin. A chip beyond the
        headroom but short of free devices anyway is out of reach in
        :meth:`place` too, and stays so: neither number grows during a tick.
        """
        reservations = self.reservations
        rooms = reservations._room
        units = need.units
        margin = math.inf
        state_chips = self.state.chips
        for chip in chips:
            room = rooms.get((cls, chip))
            if room is None:
                room = reservations.headroom(cls, chip)
            if units[chip] > room + EPS:
                if state_chips[chip].free_units + EPS >= units[chip]:
                    return None  # held back now: the wait may have become ``ReservedCapacity``
                continue  # short of free devices anyway, as in :meth:`place`; stays so (both only shrink)
            left = room - units[chip]
            if left < margin:
                margin = left
        if margin == math.inf:
            return margin
        return margin - 1e-6 * (1.0 + abs(margin))  # slack for the float sums behind the headroom

    def place(
        self, job: JobState, need: Need, ledger: TeamLedger, chips: list[str], promise: Promise | None = None
    ) -> tuple[str, str, float | None] | None:
        """Steps 4c-4g; ``None`` when the job started or got room by preemption, else its wait.

        Each step that could make the wait change later in the tick clears
        ``free_memo.stable`` (when a wait is stable: :mod:`tick_memo`).
        """
        self.free_memo.stable = True
        self.free_memo.looked = []
        self.free_memo.held = False
        headroom: dict[str, float] = {}  # chips a reservation keeps the job from (their headroom)
        held_back = ""
        if self.reservations.held:  # 4c
            chips, held_back = self._within_reservations(job, need, chips, headroom)
            if not chips:
                return reasons.RESERVED_CAPACITY, held_back, None
        open_chips = chips
        if self.blocked:  # 4d (backfill off)
            open_chips = [c for c in chips if c not in self.blocked or ledger.within_guarantee(c, need.units[c])]
            if not open_chips:
                return self._behind_blocked(job, need, ledger, chips, headroom, promise)
        if self._place_on_free(job, need, ledger, open_chips, headroom):  # 4e
            return None
        # 4f (a job whose promised cards are on their way just waits for them)
        if promise is not None and (due := self._promise_due(promise)) is not None:
            return reasons.PREEMPTION_GRACE, _LEAVING_TEXT, due
        if self._preempt_for(job, need, chips, headroom):
            return None
        # 4g
        if held_back and all(c in headroom for c in chips):
            return reasons.RESERVED_CAPACITY, held_back, None
        wait = self.blocked_job(job, need, open_chips)
        if self._bounded_for == job.id and not wait[1]:
            return wait[0], self._reclaim_bound_text(), wait[2]
        return wait

    def _within_reservations(
        self, job: JobState, need: Need, chips: list[str], headroom: dict[str, float]
    ) -> tuple[list[str], str]:
        """Step 4c: the chips where the job stays within the reservations, and what holds it back elsewhere.

        Fills ``headroom`` with the chips it may only reach by preemption (their headroom);
        an empty list means it waits with ``ReservedCapacity`` (the text returned).
        """
        state = self.state
        units = need.units
        reservations = self.reservations
        held_back = ""
        cls = job.priority_class
        fit_chips = []
        for chip in chips:
            if reservations.surely_fits(cls, chip, units[chip]):
                fit_chips.append(chip)
                continue
            room = reservations.headroom(cls, chip)
            if units[chip] <= room + EPS:
                fit_chips.append(chip)
                continue
            headroom[chip] = room
            if state.chips[chip].free_units + EPS >= units[chip]:
                held_back = reservations.describe(cls, chip)
                self.free_memo.stable = False  # fewer free devices later may turn this into a plain wait
            elif units[chip] > reservations.ceiling(cls, chip) + EPS:
                # More than the reservations ever leave it: no card coming free, no victim
                # helps, and a hold would keep cards from jobs that can run (step 5 says
                # "never" when the whole inventory would not do either).
                held_back = reservations.describe(cls, chip)
            else:  # short of devices anyway: preemption may still make room
                # Both the headroom and the free devices only shrink (until the free state
                # grows, which bumps the epoch): this chip stays out of reach for the tick.
                fit_chips.append(chip)
        return fit_chips, held_back

    def _behind_blocked(
        self,
        job: JobState,
        need: Need,
        ledger: TeamLedger,
        chips: list[str],
        headroom: dict[str, float],
        promise: Promise | None,
    ) -> tuple[str, str, float | None] | None:
        """Step 4d: every chip the job may use has a blocked job in front (backfill off).

        It waits with ``Priority``, unless its promised cards are free or on their way,
        or it may preempt and finds room.
        """
        if promise is not None and (due := self._promise_due(promise)) is not None:
            # Its own cards are free: they were freed for it and held from every other
            # job, the one in front included, so it takes them (else its victims would
            # have stopped for nothing, and the cards would idle until the promise lapses).
            placement = self._promised_cards(need, promise) if due <= self.now else None
            if placement is not None and placement.chip in chips:
                self.start(job, ledger, need, placement, backfilled=False)
                return None
            return reasons.PREEMPTION_GRACE, _LEAVING_TEXT, due
        if self.may_preempt(job, need, chips):
            self.free_memo.stable = False
            if self.try_preempt(job, need, chips, headroom):
                return None
        return reasons.PRIORITY, _PRIORITY_TEXT, None

    def _place_on_free(
        self, job: JobState, need: Need, ledger: TeamLedger, chips: list[str], headroom: dict[str, float]
    ) -> bool:
        """Step 4e: start the job on free cards (or held ones it ends in time for); True if it started."""
        state = self.state
        units = need.units
        holds = self.holds
        free_memo = self.free_memo
        looked = free_memo.looked
        for chip in chips:
            if chip in headroom:
                continue  # needs preemption to stay within the reservation
            looked.append(chip)
            if free_memo.failed(need, chip):
                placement = None
            else:
                placement = find(state, need, chip)
                if placement is None:
                    free_memo.fail(need, chip)
            held = holds.get(chip)
            if placement is None and held is not None:
                usable = self._usable_holds(chip, held, run_time.expected(job) or 0.0, ledger, units[chip])
                if usable.holds:
                    self.free_memo.held = True
                    placement = self.find_with_hold(need, chip, usable)
            if placement is not None:
                self.start(job, ledger, need, placement, backfilled=held is not None)
                return True
        return False

    def _preempt_for(self, job: JobState, need: Need, chips: list[str], headroom: dict[str, float]) -> bool:
        """Step 4f: a victim search within the tick's budget; True if it made room (the job waits for it)."""
        preemptor = self._preemptor
        if (preemptor is None or preemptor.searches < MAX_SEARCHES_PER_TICK) and self.may_preempt(job, need, chips):
            self.free_memo.stable = False
            if self.try_preempt(job, need, chips, headroom):
                return True
        return False

    def _usable_holds(
        self,
        chip: str,
        held: list[Hold],
        duration: float,
        ledger: TeamLedger,
        units: float,
        rank: int = -2,
        ranked_on: list[float] | None = None,
    ) -> _Usable:
        """The holds on ``chip`` whose cards a job of ``duration`` may use (in the holds' order),
        and their places in the chip's list of holds as a mask (what the memo of failed
        placements on held cards is keyed by): a :class:`_Usable`.

        Those it ends before (``backfill.ends_before``: shadow time at or after its end), and
        ordinary ones when its team stays within its guarantee. Which holds it ends before
        depends only on how many shadow times its end passes, so the lists are kept per chip
        by that count until a hold is added: with the starvation guard a chip has up to
        :data:`MAX_HOLDS_PER_CHIP` holds more, and each waiting job walked them all.

        ``rank``: how many of all chip models' shadow times (the list ``ranked_on``) the job's end
        passes, if the caller counted it (``Tick.run`` does for every job): the chip's count is
        then read from a table instead of counted again.
        """
        on = self._held_on.get(chip)
        if on is None:
            on = self._held_on[chip] = _HeldOn(held)
        shadows = on.shadows
        if duration <= 0:
            k = len(shadows)
        elif rank >= 0 and ranked_on is self._shadows:
            if on.ranked_on is not ranked_on:
                # Entry r: how many of the chip's shadow times lie before an end that passes r of
                # all of them (those at or before the r-th of all; the chip's are among them).
                on.table = [0] + [bisect_right(shadows, at) for at in ranked_on]
                on.ranked_on = ranked_on
            k = on.table[rank]
        else:
            k = passed(shadows, self.now + duration)
        within = on.ordinary and ledger.within_guarantee(chip, units)
        key = 2 * k + within
        got = on.lists[key]
        if got is None:
            least = shadows[k] if k < len(shadows) else math.inf
            usable = [h for h in held if h.shadow >= least or (within and not h.starving)]
            which = 0
            for hold in usable:
                which |= 1 << hold.place
            got = on.lists[key] = _Usable(usable, which)
        return got

    def find_with_hold(self, need: Need, chip: str, usable: _Usable) -> Placement | None:
        """Placement that may use the cards of the ``usable`` holds (the job ends before their shadow
        times), as :meth:`_usable_holds` gives them."""
        state = self.state
        failed = self.free_memo.hold_failures(need, chip)
        which = usable.which
        if failed is not None and covered(which, failed):
            # Known not to fit: the free cards and the holds only shrink, and these holds are
            # some of those a failed try had (fewer cards fit no more).
            self._tried_in_vain(chip, usable)
            return None
        if not self._may_fit_held(need, chip, usable.holds):
            # Not on any node with held cards, nor (the caller found) on the others: the try would
            # release and take back the held cards and find nothing. Its moves are made alone.
            self.free_memo.hold_failed(need, chip, which)
            self._tried_in_vain(chip, usable)
            return None
        # The holds' cards are lent to this one placement; what it does not start on is held again.
        holds = usable.holds
        with state.tentative([(hold.free_now, hold.sliced_now) for hold in holds]) as lent:
            placement = find(state, need, chip)
            if placement is not None:
                lent.give(placement.cards)
        for hold, kept in zip(holds, lent.kept, strict=True):
            hold.free_now = kept
        if placement is None:
            self.free_memo.hold_failed(need, chip, which)
        else:
            self.shadow_memo.earlier()  # an ordinary hold's cards never came free in a replay
        return placement

    def _may_fit_held(self, need: Need, chip: str, holds: list[Hold]) -> bool:
        """Whether a single-node whole-card ``need`` may fit on a node of ``chip`` with the ``holds``'
        free cards lent (``False``: surely not).

        Called after the placement on free cards alone failed, so only the nodes with held
        cards can take it: each is asked as placement asks it (``Chip.pick``), with its held
        cards free. Slices, multi-node gangs and holds of sliced cards are tried in full.
        """
        chip_state = self.state.chips[chip]
        n = need.whole
        if need.template is not None or n > chip_state.size:
            return True
        lent: dict[Pool, int] = {}
        for hold in holds:
            if hold.sliced_now:
                return True
            for pool, mask in hold.free_now:
                lent[pool] = lent.get(pool, 0) | mask
        for pool, mask in lent.items():
            if chip_state.pick(pool, pool.free | (mask & pool.usable), n) is not None:
                return True
        return False

    def _tried_in_vain(self, chip: str, usable: _Usable) -> None:
        """What a failed try on the ``usable`` holds' cards leaves behind: releasing and re-taking
        the held cards moves their pools to the end of their buckets, which later placements see.

        Jobs of different lengths retry different lists of holds, often the end of the list
        tried last: moving the end of the pools just moved, with nothing moved since, leaves
        them where they are, so nothing is moved. Each list keeps the chip's ``moves`` when its
        pools were last in place (nothing moved since: still so).

        A pool with no free card left is not moved: its bucket (no free card) is one placement
        never walks, and the next tick builds a changed bucket again from the pools' order.
        """
        chip_state = self.state.chips[chip]
        moves = chip_state.moves
        if usable.in_place == moves:
            return
        seq = [pool for hold in usable.holds for pool, _ in hold.free_now if pool.free]
        last = self._moved.get(chip)
        if seq and (
            last is None or last[1] != moves or len(seq) > len(last[0]) or last[0][len(last[0]) - len(seq) :] != seq
        ):
            buckets = chip_state.buckets
            for pool in seq:
                bucket = buckets[pool.key]
                del bucket[pool]
                bucket[pool] = None
                chip_state.dirty.add(pool.key)
            chip_state.moves = moves = moves + 1
            self._moved[chip] = (seq, moves)
        usable.in_place = moves

    def _retry(
        self,
        need: Need,
        ledger: TeamLedger,
        duration: float,
        looked: tuple[str, ...],
        rank: int = -2,
        ranked_on: list[float] | None = None,
    ) -> bool | None:
        """Step 4e for a job of ``duration`` from the memo of failed placements, on the chip models a
        remembered wait looked at (``MemoWait.looked``): if each placement, on free cards and on the
        held cards the job ends before, is a failure the memo knows, the failed tries are made (as
        :meth:`find_with_hold` would) and the answer is whether it tried held cards; else ``None``
        and nothing done (the job is placed in full).

        (Its answer is not kept per group and rank: that saved instructions but not time, the
        objects it was kept in costing more to make than the look-ups they saved.)
        """
        holds = self.holds
        failed_on = self.free_memo.find_fail.get(need)  # (read once: the loop asks per chip model)
        if failed_on is None:
            return None
        by_chip = self.free_memo.hold_fail.get(need)
        units = need.units
        plan: list[tuple[str, _Usable]] = []
        for chip in looked:
            if chip not in failed_on:
                return None
            held = holds.get(chip)
            if held is None:
                continue
            usable = self._usable_holds(chip, held, duration, ledger, units[chip], rank, ranked_on)
            if not usable.holds:
                continue
            failed = by_chip.get(chip) if by_chip is not None else None
            if failed is None or not covered(usable.which, failed):
                return None
            plan.append((chip, usable))
        for chip, usable in plan:
            self._tried_in_vain(chip, usable)
        return bool(plan)

    def start(self, job: JobState, ledger: TeamLedger, need: Need, placement: Placement, backfilled: bool) -> None:
        one = placement.pool
        if one is not None and placement.template is None:
            self._start_whole(job, ledger, need.units[placement.chip], one, placement, backfilled)
            return
        state = self.state
        chip = placement.chip
        units = need.units[chip]
        slots = commit(state, placement, units)
        ledger.add(chip, units, 1)
        ledger.month_hours += units * job.estimated_duration_s / 3600.0
        self.reservations.on_start(job.priority_class, chip, units)  # also clears its memo
        tmpl = placement.template
        cards: list[tuple[Pool, int, VnpuTemplate | None]] = [(pool, i, tmpl) for pool, i in placement.cards]
        if tmpl is not None:  # a slice on a held card: the card stays held (it ends before the shadow)
            lends = False
            for hold in self.holds.get(chip, ()):
                for pool, i, _ in cards:
                    if pool.devs[i].id in hold.devices:
                        state.hide_slices(pool, i)
                        if (pool, i) not in hold.sliced_now:
                            hold.sliced_now.append((pool, i))
                            lends = True
            if lends:
                # A hold whose cards were busy or another's may now lend this card's room left to
                # a slice: for slices, holds did not only shrink.
                self.free_memo.slices_lent(chip)
        duration = run_time.expected(job) or 0.0
        # Without an estimate or a max the job has no known end, as expected_end says once it runs.
        end = self.now + duration if duration > 0 else math.inf
        occ = Occupant(job, chip, units, cards, units, end, None, self.now, job.preempt_deadline)
        state.add_occupant(occ, tmpl is not None)
        self._change(occ)
        if self._preemptor is not None:
            self._preemptor.version += 1
        self.out.starts.append(Start(job.id, slots, backfilled))
        self.free_memo.version += 1
        self.shadow_memo.changed(chip)

    def _start_whole(
        self, job: JobState, ledger: TeamLedger, units: float, pool: Pool, placement: Placement, backfilled: bool
    ) -> None:
        """:meth:`start` for whole cards on one node, most starts: ``commit`` and ``add_occupant`` inlined."""
        state = self.state
        chip = placement.chip
        chip_state = state.chips[chip]
        chip_state.free_units -= units
        state._touched.append(pool)
        pool.free &= ~placement.mask
        chip_state.rebucket(pool)
        slots, cards = pool.grant(placement.picked)
        ledger.add(chip, units, 1)
        ledger.month_hours += units * job.estimated_duration_s / 3600.0
        self.reservations.on_start(job.priority_class, chip, units)
        now = self.now
        duration = run_time.expected(job) or 0.0
        end = now + duration if duration > 0 else math.inf
        occ = Occupant(job, chip, units, cards, units, end, None, now, job.preempt_deadline)  # type: ignore[arg-type]
        jid = job.id
        state.occupants[jid] = occ
        state._started.append(occ)
        cj = state._card_jobs
        if cj is not None:  # (see capacity._card_jobs_add)
            pool.jobs_changed += 1
            ids = pool.ids
            mine: list[int] | None = None
            for i in placement.picked:
                on = cj.get(ids[i])
                if on is None:
                    if mine is None:
                        mine = [jid]
                    cj[ids[i]] = mine
                else:
                    cj[ids[i]] = [*on, jid]
        self._change(occ)
        if self._preemptor is not None:
            self._preemptor.version += 1
        self.out.starts.append(Start(jid, slots, backfilled))
        self.free_memo.version += 1
        self.shadow_memo.changed(chip)

    def try_preempt(self, job: JobState, need: Need, chips: list[str], headroom: dict[str, float]) -> bool:
        plan: Plan | None = self.preemptor.plan(job, need, chips, headroom)
        if plan is None:
            if self.preemptor.bounded:
                self._bounded_for = job.id
            return False
        self.preemptor.commit(plan)
        self.shadow_memo.earlier()  # its victims' cards come free at their deadline
        deadline = self.now + self.policy.grace_period_s
        for occ, why in plan.victims:
            self.out.preemptions.append(Preemption(occ.job.id, why, deadline, job.id))
            self._change(occ)
        duration = run_time.expected(job) or math.inf  # (no known end: never)
        self._set_claim(job.id, plan.devices, plan.start_at + duration)
        units = need.units[plan.chip]
        self._count(job.id, self.ledgers[job.team], plan.chip, units, units * job.estimated_duration_s / 3600.0)
        if need.template is None:
            promise = self.out.promises[job.id] = Promise(job.id, tuple(plan.devices), plan.start_at)
            if self.snapshot.promises is not None:  # the caller keeps promises: so does the tick
                self._hold_new(promise)
        detail = f"{len(plan.victims)} job(s) preempted" if plan.victims else _LEAVING_TEXT
        self.wait(job.id, reasons.PREEMPTION_GRACE, detail, plan.start_at)
        self.free_memo.version += 1
        return True

    def _reclaim_bound_text(self) -> str:
        """The detail of a job whose guarantee reclaim found only borrowers over the bound."""
        limit = format_duration(self.policy.reclaim_loss_limit_s)
        return (
            f"within its team's guarantee, but reclaiming cards would throw away more than {limit} of a "
            "borrower's work per card: waiting for a job to end"
        )

    def _hold_new(self, promise: Promise) -> None:
        """Take the free cards of a plan just made out of the free state: later jobs of the tick
        would otherwise start on them and break the promise before its job's turn next tick."""
        state = self.state
        masks: dict[Pool, int] = {}
        for dev in promise.devices:
            pool, i = state.where[dev]
            if pool.free >> i & 1:
                masks[pool] = masks.get(pool, 0) | (1 << i)
        for pool, mask in masks.items():
            state.take_whole(pool, mask)
            self.shadow_memo.changed(pool.chip)
        self.promised[promise.job_id] = _Promised(promise, list(masks.items()))
        taken = sum(mask.bit_count() for mask in masks.values())
        if taken:  # fewer free cards, as after a start (the caller bumps the version)
            self.reservations.on_taken(float(taken))

    def blocked_job(self, job: JobState, need: Need, chips: list[str]) -> tuple[str, str, float | None]:
        """4g: first blocked job of a pool gets a shadow time (and a hold); others wait."""
        backfill = self.policy.backfill
        holds = self.holds
        blocked = self.blocked
        if backfill and need.template is None and self._turn_starving:
            return self._starving_blocked(job, need, chips)
        fresh = [c for c in chips if c not in holds and c not in blocked]
        if not fresh:
            if backfill:
                return reasons.RESOURCES, "", None
            return reasons.PRIORITY, _PRIORITY_TEXT, None
        self.free_memo.stable = False
        best: tuple[float, str, list[int]] | None = None
        for chip in fresh:
            found = self.replay(need, chip)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], chip, found[1])
        if best is None:
            return reasons.RESOURCES, "does not fit even when running jobs end", None
        at, chip, devices = best
        if backfill:
            self.hold(job, chip, at, devices)
        else:
            self.blocked.update(c for c in fresh)
        self.free_memo.version += 1
        # A pool whose cards never all come free (a job without any duration holds one) has no
        # start time to show: the hold stays (it keeps nothing from a job that ends), no estimate.
        return reasons.RESOURCES, "", at if at < math.inf else None

    def _starving_holds_full(self, chips: tuple[str, ...]) -> bool:
        """Whether every chip model in ``chips`` has :data:`MAX_HOLDS_PER_CHIP` starving holds."""
        if chips in self._holds_full:  # (asked once per starving job: most are past the first few)
            return True
        counts = self._starving_count
        if all(counts.get(c, 0) >= MAX_HOLDS_PER_CHIP for c in chips):
            self._holds_full.add(chips)
            return True
        return False

    def _starving_blocked(self, job: JobState, need: Need, chips: list[str]) -> tuple[str, str, float | None]:
        """4g for a starving job: a hold of its own at its shadow time, even where others hold cards.

        The shadow time is worked out with the cards of the starving jobs held before
        it busy until those jobs would end (:meth:`releases`), so holds never overlap
        in time on a card. See :mod:`starvation`.
        """
        guard = self.guard
        counts = self._starving_count
        room = [c for c in chips if counts.get(c, 0) < MAX_HOLDS_PER_CHIP]
        if not room:
            # Stable as an ordinary wait is: the starving holds only fill up during a tick. The
            # words are the same for every job of a class and chip models: written once a tick.
            key = (job.priority_class, tuple(chips))
            detail = self._unheld.get(key)
            if detail is None:
                why = f"{MAX_HOLDS_PER_CHIP} jobs that waited longer hold cards on {', '.join(chips)} first"
                detail = self._unheld[key] = unheld_detail(guard, job, why)
            return reasons.RESOURCES, detail, None
        self.free_memo.stable = False
        best: tuple[float, str, list[int]] | None = None
        for chip in room:
            found = self._starving_shadow(need, chip)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], chip, found[1])
        if best is None or best[0] == math.inf:
            why = "its cards are not known to come free (a job without any duration holds them)"
            return reasons.RESOURCES, unheld_detail(guard, job, why), None
        at, chip, devices = best
        duration = run_time.expected(job) or 0.0
        until = at + duration if duration > 0 else math.inf
        self.hold(job, chip, at, devices, starving=True, until=until)
        self.free_memo.version += 1
        where = self.state.where
        nodes = sorted({where[dev][0].node for dev in devices if dev in where})
        return reasons.RESOURCES, held_detail(guard, job, nodes, at, self.policy), at

    def _starving_shadow(self, need: Need, chip: str) -> tuple[float, list[int]] | None:
        """:func:`backfill.shadow` of a starving job's whole cards on ``chip``, through :attr:`shadow_memo`."""
        memo = self.shadow_memo
        cards = need.whole
        known, found = memo.answer(chip, cards)
        if known:
            return found
        from_no_fit = self.free_memo.failed(need, chip)
        floor = memo.floor(chip, cards) if from_no_fit else -math.inf
        found = self.replay(need, chip, floor)
        memo.keep(chip, cards, found, from_no_fit)
        return found

    def hold(
        self, job: JobState, chip: str, at: float, devices: list[int], starving: bool = False, until: float = math.inf
    ) -> None:
        """Hold ``devices`` for the pool's blocked job until ``at``: free ones leave the free state,
        sliced ones leave slice placement (a card freed by its slices ending is one the job needs)."""
        state = self.state
        masks: dict[Pool, int] = {}
        sliced: list[tuple[Pool, int]] = []
        earlier = self._held_devices
        for dev in devices:
            pool, i = state.where[dev]
            if pool.free >> i & 1:
                masks[pool] = masks.get(pool, 0) | (1 << i)
            elif pool.slices[i] and pool.usable >> i & 1 and dev not in earlier:
                # A sliced card an earlier hold has is that hold's first (stacked holds follow
                # each other on a card): lending this one's cards must not show it. (A free card
                # is never in two holds: the first took it.)
                state.hide_slices(pool, i)
                sliced.append((pool, i))
        earlier.update(devices)
        for pool, mask in masks.items():
            state.take_whole(pool, mask)
        hold = Hold(chip, job.id, at, list(masks.items()), frozenset(devices), sliced, starving, until)
        held = self.holds.get(chip)
        if held is None:
            self.holds[chip] = [hold]
        else:
            hold.place = len(held)
            held.append(hold)
        if starving:
            self._starving_count[chip] = self._starving_count.get(chip, 0) + 1
            kept = self._claimed_on.get(chip)
            if kept is not None and kept.version == self._claims_version.get(chip, 0):
                self._claim(kept, hold.devices, until, True)
        self._held_on.pop(chip, None)
        self.shadow_memo.changed(chip)
        self._shadows = sorted([h.shadow for chip_holds in self.holds.values() for h in chip_holds])
        self.free_memo.epoch += 1

    def _claimed(self, chip: str, starving: list[Hold]) -> _Claimed:
        """The claimed cards on ``chip`` as :meth:`replay` reads them, with the running jobs on them marked.

        Only this chip model's cards are replayed: the claims on them (a plan's or a promise's
        cards are all of one model, as are a hold's). Kept until ``_claims`` changes; a starving
        hold adds its cards in place (:meth:`hold`).
        """
        kept = _Claimed(self._claims_version.get(chip, 0))
        where = self.state.where
        for devices, free_at in self._claims.values():
            spot = where.get(devices[0]) if devices else None
            if spot is not None and spot[0].chip == chip:
                self._claim(kept, devices, free_at, False)
        for starved in starving:  # busy until the held job would end (max: a promise too)
            self._claim(kept, starved.devices, starved.until, True)
        return kept

    def _claim(self, kept: _Claimed, devices: Iterable[int], free_at: float, latest: bool) -> None:
        """Claim ``devices`` until ``free_at`` (``latest``: unless claimed until later already) and mark
        the running jobs on them (``Occupant.claimed_in``): their releases are split in a replay."""
        cards = kept.cards
        mark = kept.mark
        # (Ids read and looked up as the objects they are: no int built again per look-up.)
        card_jobs = cast("dict[object, list[object]]", self.state.card_jobs)
        occupants = cast("dict[object, Occupant]", self.state.occupants)
        for dev in cast("Iterable[object]", devices):
            if latest and cards.get(dev, -math.inf) >= free_at:
                continue
            cards[dev] = free_at
            for jid in card_jobs.get(dev, ()):
                occ = occupants.get(jid)
                if occ is not None:
                    occ.claimed_in = mark

    def replay(self, need: Need, chip: str, floor: float = -math.inf) -> tuple[float, list[int]] | None:
        """:func:`backfill.shadow` of ``need`` on ``chip`` over the chip's expected card releases.

        The releases come in time order, ties in this order:

        * the running jobs on the chip, sorted by expected end once per chip and tick and built
          as far as a replay reads (:class:`_Releases`), less those whose release moved in this
          tick (``Occupant.moved_in``);
        * this tick's starts and newly leaving jobs, in their order;
        * free cards held for promises or starving holds, which come free when the last claim
          on them ends.

        A claimed card (a plan's or a promise's, or a starving hold's, busy until the held job
        would end) comes free at the claim's end: it is split off its release into a piece at
        that time, right after the release at equal times. The walk reads all of this in one
        loop (:func:`_walk`) and stops at the first fit, as the shadow replay does.
        """
        state = self.state
        starving = [h for h in self.holds.get(chip, ()) if h.starving]
        kept = self._claimed_on.get(chip)
        if kept is None or kept.version != self._claims_version.get(chip, 0):
            kept = self._claimed_on[chip] = self._claimed(chip, starving)
        claimed = kept.cards
        mark = kept.mark if claimed else None
        now = self.now
        bases = self._base_releases
        if not bases:  # the running jobs per chip, by expected end (stable): once per tick
            bases.update(state.by_end(self.snapshot.running))
        base = self._base_rels.get(chip)
        if base is None:
            base = self._base_rels[chip] = _Releases(bases.get(chip, []), now)
        first = float(1 << 40)  # positions of this tick's releases come after every running job's
        extra: list[tuple[float, float, Release]] = []
        for k, occ in enumerate(self._changed_on.get(chip, [])):
            rel = _release(now, occ)
            if claimed and any(c[0].keys[c[1]] in claimed for c in rel.cards):
                now_part, late_parts = _pieces(rel, claimed)
                extra.append((rel.at, first + k, now_part))
                extra.extend((late_part.at, first + k + 0.5, late_part) for late_part in late_parts)
            else:
                extra.append((rel.at, first + k, rel))
        if claimed:
            held = [
                Release(self._claims[jid][1], [(pool, i, 0, 0, 0, True) for i in range(pool.size) if mask >> i & 1])
                for jid, kept_promise in self.promised.items()
                for pool, mask in kept_promise.free_now
                if pool.chip == chip
            ]
            if starving:
                # A free card held now comes free when the last claim on it ends: a later starving
                # job's hold may have claimed it after the job it is held for (``claimed`` is the latest).
                # (Looked up, not ``setdefault``: that builds an empty list for every card.)
                late: dict[float, list[tuple[Pool, int, int, int, int, bool]]] = {}
                for rel in held:
                    for card in rel.cards:
                        at = claimed[card[0].keys[card[1]]]
                        piece = late.get(at)
                        if piece is None:
                            piece = late[at] = []
                        piece.append(card)
                for starved in starving:
                    for pool, mask in starved.free_now:
                        if pool.chip == chip:
                            keys = pool.keys
                            while mask:
                                low = mask & -mask
                                i = low.bit_length() - 1
                                mask ^= low
                                at = claimed[keys[i]]
                                piece = late.get(at)
                                if piece is None:
                                    piece = late[at] = []
                                piece.append((pool, i, 0, 0, 0, True))
                held = [Release(at, cards) for at, cards in sorted(late.items())]
            # Free cards held for a promise come free when its job would end; after everything else.
            extra.extend((rel.at, 2 * first + k, rel) for k, rel in enumerate(held))
        extra.sort()  # (positions are distinct: two releases are never compared)
        return _walk(Replay(state, need, chip, floor), base, self._token, mark, claimed, extra)


def _call_off(snapshot: Snapshot, out: Decisions) -> None:
    """At a victim's deadline, let it run on if no waiting job needs it any more (``Decisions.called_off``).

    A victim runs through its grace period. If meanwhile the job it was chosen for
    started on other cards (backfill, cards freed early) or was cancelled, and no
    promise in force counts on its cards (another plan may have taken them as
    leaving cards), stopping it would only lose its work: its cards would go to
    whichever job comes first. Its preemption is then called off instead of
    evicting it. It is done at the deadline, not as soon as the job starts: until
    then its leaving cards count first for any other plan of the ticks between
    (calling them off early only made later searches pick victims that had run
    longer; see docs/engine.md). Only for a caller that keeps promises and says
    which job each preemption was for (``JobState.preempted_for``). The job's
    ``preempt_deadline`` and ``preempted_for`` are cleared here, so the whole tick
    sees it running as any other; the caller clears its own copy too.
    """
    now = snapshot.now.timestamp()
    candidates = [
        job
        for job in snapshot.running
        if job.preempted_for is not None and job.preempt_deadline is not None and job.preempt_deadline <= now
    ]
    if not candidates:
        return
    pending = {job.id for job in snapshot.pending}
    promises = snapshot.promises or {}
    claimed = {dev for jid, promise in promises.items() if jid in pending for dev in promise.devices}
    for job in candidates:
        if job.preempted_for in pending:
            continue
        if any(slot.device_id in claimed for slot in job.slots):
            continue
        job.preempt_deadline = None
        job.preempted_for = None
        out.called_off.append(job.id)


class _Claimed:
    """One chip model's claimed cards as a replay reads them (``Tick._claimed``)."""

    __slots__ = ("cards", "mark", "version")

    def __init__(self, version: int) -> None:
        #: ``Tick._claims_version`` of its chip model when built.
        self.version = version
        #: Device id -> when it comes free (keyed by the ints of ``Pool.keys``: read without building one).
        self.cards: dict[object, float] = {}
        #: The running jobs on these cards carry it (``Occupant.claimed_in``).
        self.mark = object()


class _Releases:
    """The releases of one chip model's running jobs by expected end, built as far as read.

    A tick's starving jobs replay the same running jobs' ends many times over: each replay
    reads them from here instead of building them again.
    """

    __slots__ = ("built", "now", "occupants")

    def __init__(self, occupants: list[Occupant], now: float) -> None:
        self.occupants = occupants
        self.now = now
        self.built: list[Release] = []

    def at(self, i: int) -> Release:
        """The release of the ``i``-th running job (built on first read)."""
        built = self.built
        if i == len(built):
            built.append(_release(self.now, self.occupants[i]))
        return built[i]


def _walk(
    replay: Replay,
    base: _Releases,
    moved: object,
    mark: object | None,
    claimed: dict[object, float],
    extra: list[tuple[float, float, Release]],
) -> tuple[float, list[int]] | None:
    """Feed ``replay`` the releases in time order until the job fits: ``(time, devices)``, or ``None``.

    The order is that of a sort by ``(time, position)`` of: the running jobs' releases
    (``base``, already in time order, at their index), less those ``moved`` in this tick, each
    split into the cards free then and a piece per time its claimed cards come free (at the
    index + 0.5), and ``extra`` (this tick's releases and held cards, sorted, at positions after
    every running job's). Pieces wait in a heap until the running jobs' stream passes them.
    One loop and no generator between: a replay reads a few dozen releases, many times a tick.
    """
    occupants = base.occupants
    n = len(occupants)
    heap: list[tuple[float, float, Release]] = []
    ne = len(extra)
    i = 0
    k = 0
    while True:
        rel: Release | None = None
        while i < n:
            candidate = base.at(i)
            occ = candidate.occupant
            if occ is not None and occ.moved_in is moved:
                i += 1
                continue
            rel = candidate
            break
        source = 0
        at = math.inf
        pos = math.inf
        if rel is not None:
            source, at, pos = 1, rel.at, float(i)
        if heap:
            top = heap[0]
            if top[0] < at or (top[0] == at and top[1] < pos):
                source, at, pos = 2, top[0], top[1]
        if k < ne:
            item = extra[k]
            if item[0] < at or (item[0] == at and item[1] < pos):
                source, at, pos = 3, item[0], item[1]
        if source == 0:
            return None
        if source == 1:
            assert rel is not None
            i += 1
            cards = rel.cards
            occ = rel.occupant
            if (
                mark is not None
                and occ is not None
                and occ.claimed_in is mark
                and any(c[0].keys[c[1]] in claimed for c in cards)
            ):
                now_part, late_parts = _pieces(rel, claimed)
                cards = now_part.cards
                for late_part in late_parts:  # (distinct times: the heap never compares two releases)
                    heapq.heappush(heap, (late_part.at, pos + 0.5, late_part))
        elif source == 2:
            cards = heapq.heappop(heap)[2].cards
        else:
            cards = extra[k][2].cards
            k += 1
        found = replay.step(at, cards)
        if found is not None:
            return at, found


class _HeldOn:
    """One chip model's holds as waiting jobs ask for them (``Tick._usable_holds``), until a hold
    is added: one look-up per ask, where three dictionaries were read."""

    __slots__ = ("lists", "ordinary", "ranked_on", "shadows", "table")

    def __init__(self, held: list[Hold]) -> None:
        #: The holds' shadow times in order.
        self.shadows = sorted(h.shadow for h in held)
        #: Whether one of them is an ordinary hold (jobs within their guarantee may use those).
        self.ordinary = any(not h.starving for h in held)
        #: The usable holds by 2 × shadow times passed + within guarantee.
        self.lists: list[_Usable | None] = [None] * (2 * len(self.shadows) + 2)
        #: The list of all chip models' shadow times ``table`` was made for, and the table: how
        #: many of this model's own lie before an end that passes each count of them.
        self.ranked_on: list[float] | None = None
        self.table: list[int] = []


class _Usable:
    """The holds on one chip model whose cards some jobs may use (``Tick._usable_holds``)."""

    __slots__ = ("holds", "in_place", "which")

    def __init__(self, holds: list[Hold], which: int) -> None:
        self.holds = holds
        #: Their places in the chip model's list of holds, as a mask (the failed-try memo's key).
        self.which = which
        #: The chip's ``moves`` when these holds' pools were last where a failed try on them
        #: leaves them (``Tick._tried_in_vain``; -1: not known).
        self.in_place = -1


def _pieces(rel: Release, claimed: dict[object, float]) -> tuple[Release, list[Release]]:
    """The cards of ``rel`` free at its time, and its claimed ones, one piece per time they come free.

    Nearly always a release's claimed cards are one hold's, free at one time: when all its cards
    are, the piece is the release's own list; else the claimed ones are gathered in a list, and a
    dictionary by time made only when a second time shows.
    """
    rel_at = rel.at
    occ = rel.occupant
    cards = rel.cards
    # Most often all its cards are one hold's: the piece is the release's own list of cards.
    n = len(cards)
    first_at = rel_at
    j = 0
    while j < n:
        c = cards[j]
        free_at = claimed.get(c[0].keys[c[1]])
        if free_at is None:
            break
        at = free_at if free_at > rel_at else rel_at
        if j == 0:
            first_at = at
        elif at != first_at:
            break
        j += 1
    if n and j == n:
        return Release(rel_at, [], occ), [Release(first_at, cards, occ)]
    now_cards = []
    first: list[tuple[Pool, int, int, int, int, bool]] = []
    first_at = rel_at
    late: dict[float, list[tuple[Pool, int, int, int, int, bool]]] | None = None
    for c in cards:
        free_at = claimed.get(c[0].keys[c[1]])
        if free_at is None:
            now_cards.append(c)
            continue
        at = free_at if free_at > rel_at else rel_at
        if not first:
            first_at = at
            first.append(c)
        elif at == first_at and late is None:
            first.append(c)
        else:
            if late is None:
                late = {first_at: first}
            piece = late.get(at)
            if piece is None:
                late[at] = [c]
            else:
                piece.append(c)
    now_part = Release(rel_at, now_cards, occ)
    if late is None:
        return now_part, [Release(first_at, first, occ)] if first else []
    return now_part, [Release(at, piece, occ) for at, piece in sorted(late.items())]


def _release(now: float, occ: Occupant) -> Release:
    cards = occ.release_cards
    if cards is None:  # an occupant's cards never change: built once (kept across ticks with it)
        cards = occ.release_cards = [
            (
                pool,
                i,
                tmpl.ai_cores if tmpl else 0,
                tmpl.memory_mb if tmpl else 0,
                tmpl.ai_cpus if tmpl else 0,
                tmpl is None,
            )
            for pool, i, tmpl in occ.cards
        ]
    return Release(end_of(occ, now), cards, occ)
