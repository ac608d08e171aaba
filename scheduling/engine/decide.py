"""Entry point of the decision core: ``decide(snapshot) -> Decisions``.

This docstring is the one place where the policy features are put together
(``docs/engine.md`` says the same with examples). Like a Kueue scheduling cycle
or a Volcano session, a tick is a fixed pipeline over an in-memory copy of the
free state; nothing here does I/O and the same snapshot always gives the same
decisions.

1. **Evict** running jobs whose preemption grace deadline has passed
   (``Decisions.evictions``); their devices are free for this tick.
2. **Capacity** (:mod:`capacity`): free cards per node, topology group and chip
   model; vNPU slices per card; every team's usage in device units
   (:mod:`quota` ledgers, quota in force at ``now``); reservation counters
   (:mod:`reservations`); jobs already leaving (a set ``preempt_deadline``).
3. **Order** the pending jobs (:mod:`priority`): Slurm multifactor priority
   from class, fair share (:mod:`fairshare`, classic algorithm), age and size;
   ties by submission time, then id.
4. **For each job in that order**, first failure wins:

   a. *admission* (:mod:`quota`): class allowed, max job duration, monthly
      device-hours, max concurrent jobs, ``max`` devices overall and per chip
      model (which also narrows the chip models the job may use);
   b. *static shape* (:mod:`placement`): chip model exists
      (``ChipModelUnavailable``), enough healthy devices for the shape
      (``NodeUnhealthy``), shape fits the servers at all (``Topology``);
   c. *reservation* (:mod:`reservations`): free devices minus the job stay at
      or above what is held for other classes (``ReservedCapacity`` when
      devices are free but held);
   d. *queue position*: without backfill, a pool (chip model) whose first
      blocked job is waiting takes no lower job (``Priority``) — except a job
      within its team's guarantee, which is entitled to that capacity;
   e. *placement* (:mod:`placement`): exact cards or a slice → ``Start``; with
      backfill on, only on cards not held for the pool's blocked job unless
      the job ends before that job's shadow time (``Start.backfilled``);
   f. *no fit → preemption* (:mod:`preemption`): guarantee reclaim from
      borrowing teams, or preemption of lower classes the job's class may
      preempt; cards of jobs already leaving count first. Found →
      ``Preemption`` per victim (deadline ``now + grace``) and the job waits
      with ``PreemptionGrace``, estimated start = the deadline. At most
      ``preemption.MAX_SEARCHES_PER_TICK`` searches run per tick (Kueue-like:
      only queue heads plan preemption), the rest wait for a later tick;
   g. *still no room* (:mod:`backfill`): the first blocked job of each pool
      gets its shadow time as estimated start and (with backfill) a hold on
      the cards it will take; it waits with ``Resources``. Later blocked jobs
      wait with ``Resources`` (backfill on) or ``Priority`` (off).

Quota reasons never block the jobs behind: a job stopped by its own team's
limits holds no place (Slurm does the same with association limits).
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduling.engine import reasons
from scheduling.engine.backfill import Hold, Release, ends_before, shadow
from scheduling.engine.capacity import EPS, ClusterState, Occupant, Pool
from scheduling.engine.fairshare import fair_share_factors, tree_from_usage, user_leaf
from scheduling.engine.placement import Need, Placement, commit, find, need_of
from scheduling.engine.preemption import MAX_SEARCHES_PER_TICK, Plan, Preemptor
from scheduling.engine.priority import class_factors, order_pending
from scheduling.engine.quota import TeamLedger, admit, quota_in_force
from scheduling.engine.reservations import ReservationLedger
from scheduling.engine.snapshot import (
    Decisions,
    JobState,
    Preemption,
    Snapshot,
    Start,
    VnpuTemplate,
    Wait,
)

#: ``Wait`` objects of the previous tick, reused when a job waits for the same
#: reason again: the value is immutable, and building 10k frozen dataclasses is
#: a third of a tick. Replaced (not grown) every tick, so it never outlives the queue.
_previous_waits: dict[tuple[int, str, str, float | None], Wait] = {}


def decide(snapshot: Snapshot) -> Decisions:
    """Starts, preemptions, evictions and a reason for every waiting job."""
    return Tick(snapshot).run()


class Tick:
    """One run of the pipeline; holds the tick's mutable state."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.policy = policy = snapshot.policy
        self.now = now = snapshot.now.timestamp()
        self.out = Decisions()
        self.out.evictions = [
            job.id for job in snapshot.running if job.preempt_deadline is not None and job.preempt_deadline <= now
        ]
        evicted = set(self.out.evictions)
        self.state = state = ClusterState(snapshot, policy.placement_strategy, now)
        state.occupy(snapshot.running, evicted)
        self.ledgers: dict[str, TeamLedger] = {}
        for occ in state.occupants.values():
            ledger = self.ledger(occ.job.team)
            ledger.add(occ.chip, occ.units)
            ledger.jobs += 1
        self.reservations = ReservationLedger(policy.reservations, state.chips, state.occupants.values())
        self.class_rank = {pc.name: pc.rank for pc in policy.priority_classes}
        self._preemptor: Preemptor | None = None
        self.need_cache: dict[tuple, Need] = {}
        #: Backfill holds (backfill on) per chip model.
        self.holds: dict[str, Hold] = {}
        #: Pools with a blocked job in front (backfill off).
        self.blocked: set[str] = set()
        self._claims: list[tuple[list[int], float]] = []
        #: Bumped whenever the free state changes; keys the memo of waits.
        self.version = 0
        self._memo: dict[tuple, tuple[int, str, str, float | None]] = {}
        self.need_by_id: dict[int, Need] = {}
        self._hold_fail: dict[tuple[int, str], int] = {}
        #: Occupants started or newly leaving in this tick (their releases move).
        self._changed: list[Occupant] = [occ for occ in self.state.occupants.values() if occ.leaving is not None]
        self._base_releases: dict[str, list[Release]] = {}
        self._waits: dict[tuple[int, str, str, float | None], Wait] = {}

    # -- helpers -------------------------------------------------------------

    def ledger(self, team: str) -> TeamLedger:
        ledger = self.ledgers.get(team)
        if ledger is None:
            quota, schedule = quota_in_force(self.policy, team, self.snapshot.now)
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
            self._preemptor = Preemptor(self.policy, self.state, self.ledgers, self.now)
        return self._preemptor

    def wait(self, job_id: int, reason: str, detail: str = "", estimated: float | None = None) -> None:
        key = (job_id, reason, detail, estimated)
        w = _previous_waits.get(key)
        if w is None:
            w = Wait(job_id, reason, detail, estimated)
        self._waits[key] = w
        self.out.waiting[job_id] = w

    def fair_share_of(self) -> dict[tuple[str, str], float]:
        snap = self.snapshot
        users = {(job.team, job.user) for job in snap.pending}
        tree = tree_from_usage(self.policy, snap.usage, users)
        factors = fair_share_factors(tree)
        return {pair: factors[user_leaf(*pair)] for pair in users}

    # -- the pipeline ------------------------------------------------------------

    def run(self) -> Decisions:
        global _previous_waits
        snap = self.snapshot
        policy = self.policy
        fair = self.fair_share_of()
        state = self.state
        need_cache = self.need_cache

        need_by_id = self.need_by_id
        for job in snap.pending:
            need_by_id[job.id] = need_of(state, job, need_cache)

        def size_units(job: JobState) -> float:
            need = need_by_id[job.id]
            return need.units[need.chips[0]] if need.chips else float(job.num_devices)

        ordered = order_pending(
            snap.pending,
            policy.ordering,
            class_factors(policy),
            lambda team, user: fair[(team, user)],
            self.now,
            size_units,
            state.largest_node,
        )
        for job in ordered:
            self.consider(job)
        for hold in self.holds.values():  # the hold only lives inside the tick
            for pool, mask in hold.free_now:
                state.release_whole(pool, mask)
        _previous_waits = self._waits
        return self.out

    def consider(self, job: JobState) -> None:
        """Steps 4a-4g for one job."""
        need = self.need_by_id.get(job.id) or need_of(self.state, job, self.need_cache)
        ledger = self.ledgers.get(job.team) or self.ledger(job.team)
        if job.priority_class not in self.class_rank:
            self.wait(job.id, reasons.QUOTA_CLASS_NOT_ALLOWED, f"class {job.priority_class} is not in the policy")
            return
        reason, detail, chips = admit(ledger, job, need.chips, need.units)
        if reason is not None:
            self.wait(job.id, reason, detail)
            return
        if not need.chips:
            self.wait(job.id, need.reason or reasons.TOPOLOGY, need.detail)
            return
        # Steps 4c-4g give the same answer to every job of the same team, class
        # and shape until the free state changes (a start, a hold, a preemption):
        # the long tail of a full queue is answered from this memo.
        holds = self.holds
        if holds:
            duration = job.estimated_duration_s or job.max_duration_s or 0.0
            short = tuple(ends_before(self.now, duration, h.shadow) for h in holds.values())
        else:
            short = ()
        key = (job.team, job.priority_class, id(need), short, tuple(chips))
        hit = self._memo.get(key)
        version = self.version
        if hit is not None and hit[0] == version:
            self.wait(job.id, hit[1], hit[2], hit[3])
            return
        outcome = self.place(job, need, ledger, chips)
        if outcome is not None:
            self.wait(job.id, *outcome)
            if self.version == version:
                self._memo[key] = (version, *outcome)

    def place(
        self, job: JobState, need: Need, ledger: TeamLedger, chips: list[str]
    ) -> tuple[str, str, float | None] | None:
        """Steps 4c-4g; ``None`` when the job started or got room by preemption, else its wait."""
        state = self.state
        # 4c reservations
        headroom: dict[str, float] = {}
        held_back = ""
        if self.reservations.held:
            fit_chips = []
            for chip in chips:
                room = self.reservations.headroom(job.priority_class, chip)
                if need.units[chip] <= room + EPS:
                    fit_chips.append(chip)
                    continue
                headroom[chip] = room
                if state.chips[chip].free_units + EPS >= need.units[chip]:
                    held_back = self.reservations.describe(job.priority_class, chip)
                else:  # short of devices anyway: preemption may still make room
                    fit_chips.append(chip)
            if not fit_chips:
                return reasons.RESERVED_CAPACITY, held_back, None
            chips = fit_chips
        # 4d queue position (backfill off)
        open_chips = chips
        if self.blocked:
            open_chips = [c for c in chips if c not in self.blocked or ledger.within_guarantee(c, need.units[c])]
            if not open_chips:
                if self.may_preempt(job, need, chips) and self.try_preempt(job, need, chips, headroom):
                    return None
                return reasons.PRIORITY, "a higher-priority job waits for these devices", None
        # 4e placement
        for chip in open_chips:
            if chip in headroom:
                continue  # needs preemption to stay within the reservation
            placement = find(state, need, chip)
            hold = self.holds.get(chip)
            if placement is None and hold is not None:
                duration = job.estimated_duration_s or (job.max_duration_s or 0.0)
                if ends_before(self.now, duration, hold.shadow) or ledger.within_guarantee(chip, need.units[chip]):
                    placement = self.find_with_hold(need, chip, hold)
            if placement is not None:
                self.start(job, ledger, need, placement, backfilled=hold is not None)
                return None
        # 4f preemption
        if self.may_preempt(job, need, chips) and self.try_preempt(job, need, chips, headroom):
            return None
        # 4g blocked
        if held_back and all(c in headroom for c in chips):
            return reasons.RESERVED_CAPACITY, held_back, None
        return self.blocked_job(job, need, open_chips)

    def find_with_hold(self, need: Need, chip: str, hold: Hold) -> Placement | None:
        """Placement that may use the held cards (the job ends before the shadow time)."""
        key = (id(need), chip)
        if self._hold_fail.get(key) == self.version:
            return None
        state = self.state
        for pool, mask in hold.free_now:
            state.release_whole(pool, mask)
        placement = find(state, need, chip)
        taken: dict[Pool, int] = {}
        if placement is not None:
            for pool, i in placement.cards:
                taken[pool] = taken.get(pool, 0) | (1 << i)
        kept = []
        for pool, mask in hold.free_now:
            rest = mask & ~taken.get(pool, 0) & pool.free
            if rest:
                state.take_whole(pool, rest)
                kept.append((pool, rest))
        hold.free_now = kept
        if placement is None:
            self._hold_fail[key] = self.version
        return placement

    def start(self, job: JobState, ledger: TeamLedger, need: Need, placement: Placement, backfilled: bool) -> None:
        state = self.state
        chip = placement.chip
        units = need.units[chip]
        slots = commit(state, placement, units)
        ledger.add(chip, units)
        ledger.jobs += 1
        ledger.month_hours += units * job.estimated_duration_s / 3600.0
        self.reservations.on_start(job.priority_class, chip, units)  # also clears its memo
        tmpl = placement.template
        cards: list[tuple[Pool, int, VnpuTemplate | None]] = [(pool, i, tmpl) for pool, i in placement.cards]
        duration = job.estimated_duration_s or job.max_duration_s or 0.0
        occ = state.occupants[job.id] = Occupant(job, chip, units, cards, units, self.now + duration)
        self._changed.append(occ)
        for slot in slots:
            state.card_jobs.setdefault(slot.device_id, []).append(job.id)
        if self._preemptor is not None:
            self._preemptor.version += 1
        self.out.starts.append(Start(job.id, slots, backfilled))
        self.version += 1

    def try_preempt(self, job: JobState, need: Need, chips: list[str], headroom: dict[str, float]) -> bool:
        plan: Plan | None = self.preemptor.plan(job, need, chips, headroom)
        if plan is None:
            return False
        self.preemptor.commit(plan)
        deadline = self.now + self.policy.grace_period_s
        for occ, why in plan.victims:
            self.out.preemptions.append(Preemption(occ.job.id, why, deadline, job.id))
            self._changed.append(occ)
        duration = job.estimated_duration_s or job.max_duration_s or 0.0
        self._claims.append((plan.devices, plan.start_at + duration))
        detail = f"{len(plan.victims)} job(s) preempted" if plan.victims else "waiting for jobs already leaving"
        self.wait(job.id, reasons.PREEMPTION_GRACE, detail, plan.start_at)
        self.version += 1
        return True

    def blocked_job(self, job: JobState, need: Need, chips: list[str]) -> tuple[str, str, float | None]:
        """4g: first blocked job of a pool gets a shadow time (and a hold); others wait."""
        backfill = self.policy.backfill
        fresh = [c for c in chips if c not in self.holds and c not in self.blocked]
        if not fresh:
            if backfill:
                return reasons.RESOURCES, "", None
            return reasons.PRIORITY, "a higher-priority job waits for these devices", None
        best: tuple[float, str, list[int]] | None = None
        for chip in fresh:
            found = shadow(self.state, need, chip, self.releases(chip))
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], chip, found[1])
        if best is None:
            return reasons.RESOURCES, "does not fit even when running jobs end", None
        at, chip, devices = best
        if backfill:
            self.hold(job, chip, at, devices)
        else:
            self.blocked.update(c for c in fresh)
        self.version += 1
        return reasons.RESOURCES, "", at

    def hold(self, job: JobState, chip: str, at: float, devices: list[int]) -> None:
        state = self.state
        masks: dict[Pool, int] = {}
        for dev in devices:
            pool, i = state.where[dev]
            if pool.free >> i & 1:
                masks[pool] = masks.get(pool, 0) | (1 << i)
        for pool, mask in masks.items():
            state.take_whole(pool, mask)
        self.holds[chip] = Hold(chip, job.id, at, list(masks.items()), frozenset(devices))

    def releases(self, chip: str) -> Iterable[Release]:
        """Expected card releases on ``chip``, in time order (for the shadow time).

        The running jobs' releases are built and sorted once per chip and tick;
        jobs started in this tick and cards promised to jobs in their grace are
        merged in on each call (a handful).
        """
        claimed: dict[int, float] = {}
        for devices, free_at in self._claims:
            for dev in devices:
                claimed[dev] = free_at
        base = self._base_releases.get(chip)
        if base is None:
            base = []
            for occ in self.state.occupants.values():
                if occ.chip == chip and occ.cards and occ.job.started_at is not None:
                    base.append(_release(occ))
            base.sort(key=_at)
            self._base_releases[chip] = base
        extra = [_release(occ) for occ in self._changed if occ.chip == chip and occ.cards]
        if not extra and not claimed:
            return base
        moved = {id(r.occupant) for r in extra}
        merged = [r for r in base if id(r.occupant) not in moved] + extra
        if claimed:
            split: list[Release] = []
            for rel in merged:
                late = [c for c in rel.cards if c[0].devs[c[1]].id in claimed]
                if not late:
                    split.append(rel)
                    continue
                split.append(Release(rel.at, [c for c in rel.cards if c not in late], rel.occupant))
                free_at = max(claimed[c[0].devs[c[1]].id] for c in late)
                split.append(Release(max(rel.at, free_at), late, rel.occupant))
            merged = split
        merged.sort(key=_at)
        return merged


def _at(rel: Release) -> float:
    return rel.at


def _release(occ: Occupant) -> Release:
    end = occ.expected_end if occ.leaving is None else min(occ.expected_end, occ.leaving)
    cards = [
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
    return Release(end, cards, occ)
