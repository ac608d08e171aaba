"""The event loop: trace replay through the decision core, in simulated time.

See :mod:`scheduling.sim` for the rules the replay adds around the core.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from scheduling.engine import reasons
from scheduling.engine.policy import DEVICES, Policy, Quota, quota_at
from scheduling.engine.snapshot import (
    Decisions,
    JobState,
    Promise,
    RunningDelta,
    Slot,
    Snapshot,
    Wait,
)
from scheduling.engine.starvation import Guard
from scheduling.engine.work_lost import device_hours_lost, last_checkpoint
from scheduling.sim.baselines import BASELINES, EasyBaseline, FifoBaseline, parse_baselines
from scheduling.sim.jobs import EPS as _EPS
from scheduling.sim.jobs import SKIP_NEVER_RUNNABLE, SimJob, prepare_jobs
from scheduling.sim.metrics import (
    DecayedMeter,
    Meter,
    compare,
    entitlements,
    jain_index,
    percentile,
    summary,
    with_input,
)
from scheduling.sim.occupancy import JobList, Occupancy, OrderedJobs, SimulationError
from scheduling.sim.traces import ClusterSpec, TraceRow, parse_cluster
from scheduling.sim.traces import trace_rows as normalise_rows

DecideFn = Callable[[Snapshot], Decisions]
#: ``progress(done_jobs, total_jobs)``; called at most every few hundred events.
ProgressFn = Callable[[int, int], None]

#: Simulated wall clock of trace second 0 unless the caller gives another (a Monday, UTC midnight).
DEFAULT_START = datetime(2024, 1, 1, tzinfo=UTC)
#: Fairness sampling window.
FAIRNESS_WINDOW_S = 3600.0
#: After the last submission, end and deadline, policy clock edges are still followed this long
#: for jobs a quota window or a monthly budget may yet admit; then they count as never started.
CLOCK_TAIL_S = 35 * 86400.0
#: Guard against a core that keeps evicting at one timestamp.
MAX_DECIDES_PER_INSTANT = 50
#: Jobs a sampled planning pass estimates (``estimates_every``): the database tick's default
#: ``ESTIMATE_MAX_JOBS``, so the replay measures the estimates users are shown.
ESTIMATE_LIMIT = 2000


# --- policy clock -----------------------------------------------------------------------------


class PolicyClock:
    """Times at which the quota in force may change: schedule edges and month starts."""

    def __init__(self, policy: Policy) -> None:
        self.tz = ZoneInfo(policy.timezone)
        teams = [*policy.teams.values(), policy.defaults]
        #: Minutes after local midnight at which some window opens or closes (any day: an
        #: extra edge only costs one decide call).
        self.minutes = sorted({m % 1440 for tp in teams for s in tp.schedules for m in (s.start_min, s.end_min)})
        self.monthly = any(tp.quota.device_hours_per_month is not None for tp in teams) or any(
            "deviceHoursPerMonth" in s.quota for tp in teams for s in tp.schedules
        )

    @property
    def active(self) -> bool:
        return bool(self.minutes) or self.monthly

    def next_after(self, t: float) -> float:
        """The first edge strictly after ``t`` (epoch seconds); ``inf`` if the policy has none."""
        best = math.inf
        local = datetime.fromtimestamp(t, tz=self.tz)
        if self.minutes:
            midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
            for day in range(2):
                base = (midnight + timedelta(days=day)).replace(tzinfo=None)
                for minute in self.minutes:
                    # wall-clock arithmetic, then localised (DST-safe enough for edges)
                    edge = (base + timedelta(minutes=minute)).replace(tzinfo=self.tz).timestamp()
                    if edge > t:
                        best = min(best, edge)
                        break
                if best < math.inf:
                    break
        if self.monthly:
            best = min(best, self.month_end(t))
        return best

    def month_start(self, t: float) -> float:
        local = datetime.fromtimestamp(t, tz=self.tz)
        return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()

    def month_end(self, t: float) -> float:
        local = datetime.fromtimestamp(t, tz=self.tz)
        year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
        return datetime(year, month, 1, tzinfo=self.tz).timestamp()


def _quota_in_force(policy: Policy, team: str, at: datetime) -> Quota:
    return quota_at(policy, team, at)[0]


# --- the simulation ---------------------------------------------------------------------------


@dataclass
class _TeamStats:
    jobs: int = 0
    started: int = 0
    preemptions: int = 0
    lost_device_h: float = 0.0
    waits: list[float] = field(default_factory=list)


class Simulation:
    """One replay of prepared jobs through one decide function."""

    def __init__(
        self,
        jobs: list[SimJob],
        cluster: ClusterSpec,
        policy: Policy,
        *,
        decide_fn: DecideFn | None = None,
        fifo: bool = False,
        baseline: str | None = None,
        epoch: float = DEFAULT_START.timestamp(),
        progress: ProgressFn | None = None,
        check_quota: bool = True,
        promises: bool = True,
        estimates_every: float = 0.0,
    ) -> None:
        """``promises=False`` does not hand the core's promises back (what a caller without them gets).

        ``baseline`` (one of :data:`BASELINES`) replays under that fixed reference scheduler
        instead of ``decide``; ``fifo=True`` is ``baseline="fifo"``.

        ``estimates_every`` > 0: every that many simulated seconds, the first decide
        after it is followed by the tick's planning pass (``estimate.estimate_starts``,
        ``ESTIMATE_LIMIT`` jobs), and each job's first estimate is compared with its
        start (``metrics["estimates"]``): how far the time a user was shown was off.
        """
        self.jobs = jobs
        self.by_id = {j.state.id: j for j in jobs}
        self.cluster = cluster
        self.policy = policy
        self.epoch = epoch
        self.progress = progress
        self.nodes = cluster.build_nodes()
        self.templates = cluster.templates()
        self.occ = Occupancy(self.nodes, self.templates)
        #: Nothing in a replay changes the inventory: one key for all its snapshots (see Snapshot).
        self.inventory_key = object()
        self.pending: dict[int, JobState] = {}
        #: Cards promised to waiting jobs by the last decide, handed back to the next (``Snapshot.promises``).
        self.promises: dict[int, Promise] = {}
        self.keep_promises = promises
        self.running_list = OrderedJobs()
        if fifo:
            baseline = "fifo"
        if baseline is not None and baseline not in BASELINES:
            raise ValueError(f"unknown baseline {baseline!r} (known: {', '.join(BASELINES)})")
        #: Which scheduler decides: ``"engine"`` or the name of a baseline.
        self.scheduler = baseline or "engine"
        self.fifo_baseline = FifoBaseline(self.occ, self.pending) if baseline == "fifo" else None
        self.easy_baseline = EasyBaseline(self.occ, self.pending, self.running_list) if baseline == "easy" else None
        if self.fifo_baseline is not None:
            self.decide_fn: DecideFn = self.fifo_baseline
        elif self.easy_baseline is not None:
            self.decide_fn = self.easy_baseline
        elif decide_fn is not None:
            self.decide_fn = decide_fn
        else:
            from scheduling.engine.decide import decide

            self.decide_fn = decide
        #: A fixed reference scheduler: no quotas checked, no fair-share usage, no preemption.
        self.reference = reference = baseline is not None
        self.check_quota = check_quota and not reference
        self.clock = PolicyClock(policy)
        all_teams = [*policy.teams.values(), policy.defaults]
        self.may_preempt = not reference and (
            any(pc.preempts for pc in policy.priority_classes)
            or any(tp.quota.guaranteed for tp in all_teams)
            or any(s.quota.get("guaranteed") for tp in all_teams for s in tp.schedules)
        )

        #: ``self.pending`` (set above): pending jobs in queue order (submission, requeues at the end).
        #: The same jobs as the lists handed to every snapshot, kept in place (no copy per event).
        self.pending_list = JobList()
        #: What changed in ``running_list`` since the last snapshot (see ``RunningDelta``): runs
        #: the core saw end, runs it has not seen yet; the last snapshot's delta version.
        self.delta_ended: dict[int, JobState] = {}
        self.delta_started: dict[int, JobState] = {}
        self.delta_version = 0
        self.ends: list[tuple[float, int, int]] = []  # (end time, job id, run token)
        self.deadlines: list[tuple[float, int, int]] = []
        self.next_clock = math.inf

        self.busy = Meter()  # key None: all teams, card equivalents
        self.team_use = Meter()
        self.team_chip_units: dict[tuple[str, str], float] = defaultdict(float)
        self.team_units: dict[str, float] = defaultdict(float)
        self.fair_usage = DecayedMeter(policy.ordering.usage_half_life_s)
        self.month_base: dict[str, float] = {}
        self.month_start = -math.inf

        teams = sorted({j.state.team for j in jobs})
        self.teams = teams
        #: The priority classes of the replayed jobs.
        self.classes = sorted({j.state.priority_class for j in jobs})
        self.team_stats = {t: _TeamStats() for t in teams}
        self.class_waits: dict[str, list[float]] = defaultdict(list)
        self.waits: list[float] = []
        #: Each started job's wait less the time its own team's limits held it (``wait_s.beyond_own_limits``).
        self.waits_beyond: list[float] = []
        #: Jobs the last decide left waiting for their own team's limits, and since when.
        self._own_waiting: list[SimJob] = []
        self._own_since = 0.0
        self.team_pending: dict[str, int] = defaultdict(int)
        self.entitled = entitlements(policy, teams)

        # fairness windows
        self.window_start = -math.inf
        self.window_used: dict[str, float] = {}
        self.window_active: set[str] = set()
        self.jain: list[float] = []
        self.windows = 0
        # backlogged fairness: Jain's index of the current holdings among teams with waiting jobs,
        # integrated over time (``_advance``); recomputed only after the holdings or the queue changed
        self.backlog_dirty = True
        self.backlog_index: float | None = None
        self.backlog_integral = 0.0
        self.backlog_s = 0.0

        # quota overrun
        self.over: dict[str, float] = {}  # team -> device units above max, since ``over_since``
        self.over_since = 0.0
        self.overrun_device_s = 0.0
        self.quota_violations = 0
        self.violation_examples: list[str] = []

        self.n_started = self.n_completed = self.n_cancelled = self.n_requeued = 0
        self.n_preemptions = self.n_stopped = self.n_forced = self.n_finished_in_grace = 0
        self.n_called_off = 0
        self.lost_device_h = 0.0
        #: Device-hours lost by the victims of each priority class.
        self.class_lost: dict[str, float] = defaultdict(float)
        #: ``(start, planned end)`` of every run in start order (the guard's bound, :meth:`_guard_bound`).
        self.run_spans: list[tuple[float, float]] = []
        #: Preemptions and device-hours lost by the preemption's reason (``GuaranteeReclaim``, ...).
        self.reason_preemptions: dict[str, int] = defaultdict(int)
        self.reason_lost: dict[str, float] = defaultdict(float)
        self.decide_calls = self.decide_skipped = 0
        self.decide_s = 0.0
        self.last_waiting: dict[int, Wait] = {}
        self.done = 0
        self.now = 0.0
        self.estimates_every = estimates_every if not reference else 0.0
        self.next_estimate = -math.inf
        self.estimate_passes = 0
        self.estimate_s = 0.0
        #: Start minus first estimate, per job that had one and started.
        self.estimate_errors: list[float] = []

    # -- event loop ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        jobs = self.jobs
        n_jobs = len(jobs)
        sub = 0
        first = jobs[0].state.submitted_at if jobs else self.epoch
        self.now = first
        self._open_window(first)
        if self.clock.active:
            self.next_clock = self.clock.next_after(first - 1e-6)
            self.month_start = self.clock.month_start(first)
        last_activity = first
        events = 0
        while True:
            t = math.inf
            if sub < n_jobs:
                t = jobs[sub].state.submitted_at
            end_t = self._peek(self.ends)
            dead_t = self._peek(self.deadlines)
            t = min(t, end_t, dead_t)
            if t == math.inf and not self.pending:
                break
            clock_t = self.next_clock if self.pending or t < math.inf else math.inf
            if clock_t <= t:
                if t == math.inf and clock_t > last_activity + CLOCK_TAIL_S:
                    break
                t = clock_t
            if t == math.inf:
                break
            self._advance(t)
            freed = False
            while self.ends and self.ends[0][0] <= t:
                _, job_id, token = heapq.heappop(self.ends)
                sj = self.by_id[job_id]
                if sj.status == "running" and sj.run_token == token:
                    self._finish(sj, t)
                    freed = True
            submitted = False
            while sub < n_jobs and jobs[sub].state.submitted_at <= t:
                self._submit(jobs[sub])
                sub += 1
                submitted = True
            deadline_due = self._peek(self.deadlines) <= t
            clock_edge = False
            if self.next_clock <= t:
                clock_edge = True
                self._month_roll(t)
                self.next_clock = self.clock.next_after(t)
            if freed or submitted or deadline_due:
                last_activity = t
            if self._decide_needed(freed, deadline_due, clock_edge):
                if self._decide_at(t):
                    last_activity = t
            else:
                self.decide_skipped += 1
            events += 1
            if self.progress is not None and events % 256 == 0:
                self.progress(self.done, n_jobs)
        end = max(self.now, first)
        self._advance(end)
        self._close_window(end, final=True)
        if self.progress is not None:
            self.progress(n_jobs, n_jobs)
        return self._metrics(first, end, time.perf_counter() - wall0)

    def _peek(self, heap: list[tuple[float, int, int]]) -> float:
        """Time of the heap's first live entry (an end or deadline of a run that is still on)."""
        by_id = self.by_id
        while heap:
            _, job_id, token = heap[0]
            sj = by_id[job_id]
            if sj.status == "running" and sj.run_token == token:
                return heap[0][0]
            heapq.heappop(heap)
        return math.inf

    def _decide_needed(self, freed: bool, deadline_due: bool, clock_edge: bool) -> bool:
        """Whether ``decide`` could change anything now.

        Provably not, when nothing was freed, no grace deadline or quota clock
        edge is due, no device has any room left (so no start can be placed: a
        start must fit in free capacity) and the policy cannot preempt (no
        priority class preempts another and no team has a guarantee to reclaim).
        """
        if not self.pending:
            return deadline_due
        if freed or deadline_due or clock_edge or self.may_preempt:
            return True
        if self.fifo_baseline is not None and self.fifo_baseline.blocked:
            return False  # strict FIFO: the blocked head still does not fit
        return self.occ.devices_with_room > 0

    def _decide_at(self, t: float) -> bool:
        """Call decide at ``t`` (again while stops free cards it did not plan with); True if anything started."""
        started_any = False
        for _ in range(MAX_DECIDES_PER_INSTANT):
            self._charge_own_limits(t)
            snapshot = Snapshot(
                now=datetime.fromtimestamp(t, tz=UTC),
                policy=self.policy,
                nodes=self.nodes,
                pending=self.pending_list.items,
                running=self.running_list.items,
                templates=self.templates,
                usage=self.fair_usage.snapshot(t) if not self.reference else {},
                month_device_hours=self._month_hours(t) if self.clock.monthly else {},
                inventory_key=self.inventory_key,
                running_delta=self._running_delta(),
                promises=self.promises if self.keep_promises else None,
            )
            c0 = time.perf_counter()
            decisions = self.decide_fn(snapshot)
            self.decide_s += time.perf_counter() - c0
            self.decide_calls += 1
            if self.estimates_every > 0 and t >= self.next_estimate and decisions.waiting:
                self._sample_estimates(snapshot, decisions, t)
            if self.keep_promises:
                self.promises = decisions.promises
            self._count_own_limits(decisions, t)
            again, started_teams = self._apply(decisions, t, snapshot.now)
            started_any = started_any or bool(started_teams)
            self.last_waiting = decisions.waiting
            if self.check_quota and (started_teams or self.over):
                self._check_quota(started_teams, snapshot.now)
            if not again or not self.pending:
                break
        return started_any

    def _charge_own_limits(self, t: float) -> None:
        """Charge the time since the last decide to the jobs it left waiting for their own team's limits.

        A wait holds until the next decide (nothing changes in between), so each such
        job's ``own_limits_s`` grows by the time between the two calls. Charged before each
        decide, so the core sees the count up to now (``JobState.own_limits_s``: the starvation
        guard leaves that time out, as the database tick does).
        """
        since = self._own_since
        if t > since:
            for sj in self._own_waiting:
                sj.own_limits_s += t - since
                sj.state.own_limits_s = sj.own_limits_s
        self._own_since = t

    def _count_own_limits(self, decisions: Decisions, t: float) -> None:
        """Remember which jobs the decide at ``t`` left waiting for their own team's limits."""
        self._charge_own_limits(t)
        by_id = self.by_id
        self._own_waiting = [
            by_id[jid] for jid, wait in decisions.waiting.items() if wait.reason in reasons.QUOTA_REASONS
        ]
        self._own_since = t

    def _sample_estimates(self, snapshot: Snapshot, decisions: Decisions, t: float) -> None:
        """Run the planning pass on a copy of the waits; remember each job's first estimate."""
        from scheduling.engine.estimate import estimate_starts

        self.next_estimate = t + self.estimates_every
        waiting = dict(decisions.waiting)  # the decisions stay as decided (the pass replaces waits, never edits)
        copy = Decisions(decisions.starts, decisions.preemptions, decisions.evictions, waiting, decisions.promises)
        c0 = time.perf_counter()
        estimate_starts(snapshot, copy, ESTIMATE_LIMIT)
        self.estimate_s += time.perf_counter() - c0
        self.estimate_passes += 1
        by_id = self.by_id
        for job_id, wait in copy.waiting.items():
            if wait.estimated_start is not None:
                sj = by_id[job_id]
                if sj.first_estimate is None and sj.first_start is None:
                    sj.first_estimate = wait.estimated_start

    def _running_delta(self) -> RunningDelta:
        """The running list's changes since the last snapshot (and start counting anew)."""
        delta = RunningDelta(
            self.delta_version,
            self.delta_version + 1,
            tuple(self.delta_ended.values()),
            tuple(self.delta_started.values()),
            in_order=True,
        )
        self.delta_version += 1
        self.delta_ended.clear()
        self.delta_started.clear()
        return delta

    def _apply(self, decisions: Decisions, t: float, now: datetime) -> tuple[bool, set[str]]:
        """Apply evictions, starts, preemptions; returns (decide again now?, teams that started)."""
        # ``again``: cards were freed (or a victim requeued) that this decide did not see as such.
        again = False
        for job_id in decisions.evictions:
            sj = self.by_id.get(job_id)
            if sj is None or sj.status != "running":
                raise SimulationError(f"decide evicted job {job_id}, which is not running")
            self._stop_victim(sj, t)
            # decide already re-planned the evicted cards; only a requeued victim is new to it
            again = again or sj.status == "pending"
        started_teams: set[str] = set()
        for start in decisions.starts:
            sj = self.by_id.get(start.job_id)
            if sj is None or sj.status != "pending":
                raise SimulationError(f"decide started job {start.job_id}, which is not pending")
            self._start(sj, start.slots, t)
            started_teams.add(sj.state.team)
        for job_id in decisions.called_off:  # decide cleared the deadline on our object already
            sj = self.by_id.get(job_id)
            if sj is None or sj.status != "running":
                raise SimulationError(f"decide called off the preemption of job {job_id}, which is not running")
            sj.state.preempt_deadline = None
            sj.state.preempted_for = None
            self.n_called_off += 1
        preempted_now: set[int] = set()
        for pre in decisions.preemptions:
            sj = self.by_id.get(pre.job_id)
            if sj is None or sj.status != "running":
                raise SimulationError(f"decide preempted job {pre.job_id}, which is not running")
            if sj.state.preempt_deadline is not None:
                continue  # already leaving; the first deadline stands (as in the tick)
            sj.state.preempt_deadline = pre.grace_deadline
            sj.state.preempted_for = pre.for_job
            sj.preempt_reason = pre.reason
            self.reason_preemptions[pre.reason] += 1
            preempted_now.add(pre.job_id)
            sj.preempted += 1
            self.n_preemptions += 1
            self.team_stats[sj.state.team].preemptions += 1
            heapq.heappush(self.deadlines, (pre.grace_deadline, sj.state.id, sj.run_token))
        # Safety net: a victim whose grace is over leaves even if decide forgot to evict it.
        while self.deadlines and self.deadlines[0][0] <= t:
            deadline, job_id, token = heapq.heappop(self.deadlines)
            sj = self.by_id[job_id]
            # (a preemption called off and decided again later has another deadline)
            if sj.status == "running" and sj.run_token == token and sj.state.preempt_deadline == deadline:
                if job_id not in preempted_now:
                    self.n_forced += 1  # its grace ran out before this decide, which did not evict it
                self._stop_victim(sj, t)
                again = True
        return again and self.occ.devices_with_room > 0, started_teams

    # -- job transitions -----------------------------------------------------------------------

    def _submit(self, sj: SimJob) -> None:
        js = sj.state
        self.pending[js.id] = js
        self.pending_list.add(js)
        self.team_pending[js.team] += 1
        self.window_active.add(js.team)
        self.team_stats[js.team].jobs += 1
        self.backlog_dirty = True

    def _start(self, sj: SimJob, slots: tuple[Slot, ...], t: float) -> None:
        js = sj.state
        sj.chip = self.occ.take(js, slots)
        del self.pending[js.id]
        self.pending_list.remove(js)
        self.team_pending[js.team] -= 1
        js.slots = tuple(slots)
        js.started_at = t
        js.preempt_deadline = None
        js.preempted_for = None
        self.running_list.add(js)
        self.delta_started[js.id] = js
        sj.status = "running"
        sj.run_token += 1
        heapq.heappush(self.ends, (t + sj.duration - sj.saved, js.id, sj.run_token))
        self.run_spans.append((t, t + sj.duration - sj.saved))
        self._rate(sj, +sj.units, t)
        if sj.first_start is None:
            sj.first_start = t
            if sj.first_estimate is not None:
                self.estimate_errors.append(t - sj.first_estimate)
            wait = t - js.submitted_at
            self.waits.append(wait)
            sj.beyond_s = wait - sj.own_limits_s
            self.waits_beyond.append(sj.beyond_s)
            self.class_waits[js.priority_class].append(wait)
            stats = self.team_stats[js.team]
            stats.waits.append(wait)
            stats.started += 1
            self.n_started += 1

    def _release(self, sj: SimJob, t: float) -> None:
        js = sj.state
        self.occ.give_back(js)
        self.running_list.remove(js)
        if self.delta_started.pop(js.id, None) is None:  # a run no snapshot has shown needs no word
            self.delta_ended[js.id] = js
        self._rate(sj, -sj.units, t)
        if js.team in self.over:
            self._check_quota(set(), datetime.fromtimestamp(t, tz=UTC))

    def _finish(self, sj: SimJob, t: float) -> None:
        if sj.state.preempt_deadline is not None:
            self.n_finished_in_grace += 1
        self._release(sj, t)
        sj.status = "completed"
        sj.end = t
        sj.state.preempt_deadline = None
        sj.state.preempted_for = None
        self.n_completed += 1
        self.done += 1

    def _stop_victim(self, sj: SimJob, t: float) -> None:
        js = sj.state
        assert js.started_at is not None
        lost = device_hours_lost(sj.units, js.started_at, t, js.checkpoint_interval_s)
        self.lost_device_h += lost
        self.team_stats[js.team].lost_device_h += lost
        self.class_lost[js.priority_class] += lost
        self.reason_lost[sj.preempt_reason] += lost
        sj.lost_dh += lost
        saved = last_checkpoint(js.started_at, t, js.checkpoint_interval_s) - js.started_at
        if saved > 0:
            # Its work up to its last checkpoint is kept: a restart runs the rest, and says so.
            sj.saved += saved
            js.estimated_duration_s = sj.duration - sj.saved
        self.n_stopped += 1
        self._release(sj, t)
        js.slots = ()
        js.started_at = None
        js.preempt_deadline = None
        js.preempted_for = None
        if self.policy.on_preempt == "cancel":
            sj.status = "cancelled"
            sj.end = t
            self.n_cancelled += 1
            self.done += 1
        else:
            sj.status = "pending"
            self.pending[js.id] = js
            self.pending_list.add(js)
            self.team_pending[js.team] += 1
            self.window_active.add(js.team)
            self.n_requeued += 1
            self.backlog_dirty = True

    def _rate(self, sj: SimJob, delta: float, t: float) -> None:
        js = sj.state
        self.busy.add(None, delta, t)
        self.team_use.add(js.team, delta, t)
        self.fair_usage.add((js.team, js.user), delta, t)
        self.team_units[js.team] += delta
        self.backlog_dirty = True
        self.team_chip_units[(js.team, sj.chip)] += delta

    # -- quota ---------------------------------------------------------------------------------

    def _check_quota(self, started_teams: set[str], now: datetime) -> None:
        """After a decide: a team that started a job must not be above its max in force."""
        for team in started_teams | set(self.over):
            quota = _quota_in_force(self.policy, team, now)
            excess = 0.0
            for key, cap in quota.max.items():
                if key == DEVICES:
                    used = self.team_units[team]
                elif key.startswith(DEVICES + "/"):
                    used = self.team_chip_units.get((team, key[len(DEVICES) + 1 :]), 0.0)
                else:
                    continue
                excess = max(excess, used - cap)
            if excess > _EPS:
                if team in started_teams and team not in self.over:
                    self.quota_violations += 1
                    if len(self.violation_examples) < 5:
                        self.violation_examples.append(f"{now.isoformat()}: team {team} {excess:g} devices over max")
                if team in started_teams or team in self.over:
                    self.over[team] = excess
            else:
                self.over.pop(team, None)

    def _month_hours(self, t: float) -> dict[str, float]:
        return {team: (self.team_use.value(team, t) - self.month_base.get(team, 0.0)) / 3600.0 for team in self.teams}

    def _month_roll(self, t: float) -> None:
        if not self.clock.monthly:
            return
        start = self.clock.month_start(t)
        if start > self.month_start:
            self.month_start = start
            self.month_base = {team: self.team_use.value(team, start) for team in self.teams}

    # -- time and fairness windows -------------------------------------------------------------

    def _advance(self, t: float) -> None:
        if self.backlog_dirty:
            self.backlog_index = self._backlogged_index()
            self.backlog_dirty = False
        if self.backlog_index is not None and t > self.now:
            self.backlog_integral += self.backlog_index * (t - self.now)
            self.backlog_s += t - self.now
        if self.over:
            self.overrun_device_s += sum(self.over.values()) * (t - self.now)
        while t >= self.window_start + FAIRNESS_WINDOW_S:
            self._close_window(self.window_start + FAIRNESS_WINDOW_S)
        self.now = t

    def _backlogged_index(self) -> float | None:
        """Jain's index, among the teams with a waiting job now, of cards held ÷ entitled fraction.

        ``None`` (the instant does not count) with fewer than two such teams (with an
        entitlement) or when none of them holds a card.
        """
        entitled = self.entitled
        backlogged = [team for team, n in self.team_pending.items() if n > 0 and entitled.get(team, 0.0) > 0]
        if len(backlogged) < 2:
            return None
        units = self.team_units
        return jain_index([max(units[team], 0.0) / entitled[team] for team in backlogged])

    def _open_window(self, t: float) -> None:
        self.window_start = t
        self.window_used = {team: self.team_use.value(team, t) for team in self.teams}
        self.window_active = {
            team for team in self.teams if self.team_pending[team] > 0 or self.team_units[team] > _EPS
        }

    def _close_window(self, t: float, final: bool = False) -> None:
        active = self.window_active
        if len(active) >= 2 and (not final or t > self.window_start):
            xs = [
                (self.team_use.value(team, t) - self.window_used[team]) / self.entitled[team]
                for team in active
                if self.entitled.get(team, 0) > 0
            ]
            index = jain_index(xs)
            if index is not None:
                self.jain.append(index)
                self.windows += 1
        if not final:
            self._open_window(t)

    # -- results -------------------------------------------------------------------------------

    def _guard_bound(self) -> dict[str, Any] | None:
        """How the starvation guard's promise held (``None`` when the policy has no guard).

        The promise, EASY backfill's: no job waits beyond its own team's limits longer than
        the threshold ``after`` plus the longest a job running when it started to starve still
        had to run. A job starts to starve at ``submitted + own limits + after`` (its time at its
        own limits counted as if all of it came first: that moment is the latest it can be, so
        the bound read here is, if anything, looser than the true one); the running jobs then are
        the runs started before that moment, whose planned ends (start + the rest of the run)
        bound when their cards come free. A job that preempts waits out the grace period too: that
        much over is allowed.
        """
        guard = Guard(self.policy) if not self.reference else None
        if guard is None or not guard.on:
            return None
        starts = [span[0] for span in self.run_spans]
        latest: list[float] = []
        top = -math.inf
        for _, end in self.run_spans:
            top = max(top, end)
            latest.append(top)
        starved = over = 0
        worst = 0.0
        for sj in self.jobs:
            if sj.first_start is None or sj.beyond_s is None:
                continue
            after = guard.after(sj.state.priority_class)
            if after is None:
                continue
            wait = sj.first_start - sj.state.submitted_at
            since = sj.state.submitted_at + (wait - sj.beyond_s) + after
            if sj.first_start <= since:
                continue
            starved += 1
            k = bisect_right(starts, since)
            longest = max(0.0, latest[k - 1] - since) if k else 0.0
            excess = sj.beyond_s - (after + longest + self.policy.grace_period_s)
            if excess > 0:
                over += 1
                worst = max(worst, excess)
        return {"starved": starved, "over_bound": over, "worst_over_s": round(worst, 3)}

    def job_records(self) -> list[dict[str, Any]]:
        """One row per replayed job (for ``--jobs-out``): times relative to the start of the trace clock."""
        epoch = self.epoch
        out = []
        for sj in self.jobs:
            js = sj.state
            out.append(
                {
                    "job_id": sj.key,
                    "team": js.team,
                    "priority_class": js.priority_class,
                    "num_devices": js.num_devices,
                    "vnpu_template": js.vnpu_template or "",
                    "submit_time_s": js.submitted_at - epoch,
                    "first_start_s": "" if sj.first_start is None else sj.first_start - epoch,
                    "wait_s": "" if sj.first_start is None else sj.first_start - js.submitted_at,
                    "end_s": "" if sj.end is None else sj.end - epoch,
                    "status": sj.status,
                    "preemptions": sj.preempted,
                    "wait_beyond_own_limits_s": "" if sj.beyond_s is None else sj.beyond_s,
                    "device_hours_lost": round(sj.lost_dh, 6),
                }
            )
        return out

    def _metrics(self, first: float, end: float, wall_s: float) -> dict[str, Any]:
        span = max(end - first, 0.0)
        total_devices = sum(1 for n in self.nodes for d in n.devices if d.usable)
        busy_s = self.busy.value(None, end)
        never: Counter[str] = Counter()
        unfinished = 0
        for js in self.pending.values():
            if self.by_id[js.id].first_start is not None:
                unfinished += 1  # requeued after a preemption, never restarted
                continue
            w = self.last_waiting.get(js.id)
            never[w.reason if w is not None else "NotConsidered"] += 1
        team_hours = {team: self.team_use.value(team, end) / 3600.0 for team in self.teams}
        all_hours = sum(team_hours.values())
        teams: dict[str, Any] = {}
        for team in self.teams:
            st = self.team_stats[team]
            used = team_hours[team] / all_hours if all_hours > 0 else 0.0
            ent = self.entitled.get(team, 0.0)
            teams[team] = {
                "jobs": st.jobs,
                "started": st.started,
                "device_hours": round(team_hours[team], 3),
                "usage_fraction": round(used, 6),
                "entitled_fraction": round(ent, 6),
                "usage_over_entitlement": round(used / ent, 6) if ent > 0 else None,
                "wait_s": summary(st.waits),
                "preemptions": st.preemptions,
                "device_hours_lost": round(st.lost_device_h, 3),
            }
        jain_sorted = sorted(self.jain)
        return {
            "scheduler": self.scheduler,
            "policy": self.policy.name if not self.reference else None,
            "jobs": {
                "eligible": len(self.jobs),
                "started": self.n_started,
                "completed": self.n_completed,
                "cancelled": self.n_cancelled,
                "never_started": sum(never.values()),
                "never_started_by_reason": dict(sorted(never.items())),
                "requeued_not_restarted": unfinished,
            },
            "devices": {
                "total": total_devices,
                "utilisation": round(busy_s / (total_devices * span), 6) if span > 0 and total_devices else 0.0,
                "busy_device_hours": round(busy_s / 3600.0, 3),
            },
            "wait_s": {
                "overall": summary(self.waits),
                "beyond_own_limits": summary(self.waits_beyond),
                "guard_bound": self._guard_bound(),
                "by_class": {c: summary(w) for c, w in sorted(self.class_waits.items())},
                "by_team": {team: teams[team]["wait_s"] for team in self.teams},
            },
            "teams": teams,
            "fairness": {
                "window_s": FAIRNESS_WINDOW_S,
                "windows": self.windows,
                "jain_mean": round(sum(self.jain) / len(self.jain), 6) if self.jain else None,
                "jain_p10": round(percentile(jain_sorted, 10), 6) if jain_sorted else None,
                "jain_min": round(jain_sorted[0], 6) if jain_sorted else None,
                "backlogged": round(self.backlog_integral / self.backlog_s, 6) if self.backlog_s > 0 else None,
                "backlogged_s": round(self.backlog_s, 3),
            },
            "quota": {
                "checked": self.check_quota,
                "overrun_device_s": round(self.overrun_device_s, 3),
                "violations": self.quota_violations,
                "examples": self.violation_examples,
            },
            "preemption": {
                "preemptions": self.n_preemptions,
                "victims_stopped": self.n_stopped,
                "forced_stops": self.n_forced,
                "finished_in_grace": self.n_finished_in_grace,
                "called_off": self.n_called_off,
                "requeued": self.n_requeued,
                "cancelled": self.n_cancelled,
                "device_hours_lost": round(self.lost_device_h, 3),
                "device_hours_lost_by_team": {team: teams[team]["device_hours_lost"] for team in self.teams},
                "device_hours_lost_by_class": {c: round(self.class_lost[c], 3) for c in self.classes},
                "preemptions_by_reason": dict(sorted(self.reason_preemptions.items())),
                "device_hours_lost_by_reason": {r: round(v, 3) for r, v in sorted(self.reason_lost.items())},
                "lost_share_of_busy": round(self.lost_device_h * 3600.0 / busy_s, 6) if busy_s > 0 else 0.0,
            },
            "decide": {
                "calls": self.decide_calls,
                "skipped": self.decide_skipped,
                "seconds": round(self.decide_s, 3),
            },
            **({"estimates": self._estimate_metrics()} if self.estimates_every > 0 else {}),
            "start": datetime.fromtimestamp(first, tz=UTC).isoformat(),
            "end": datetime.fromtimestamp(end, tz=UTC).isoformat(),
            "span_s": round(span, 3),
            "wall_s": round(wall_s, 3),
        }

    def _estimate_metrics(self) -> dict[str, Any]:
        """How far started jobs' first estimates were off (start minus estimate: > 0 is late)."""
        errors = sorted(self.estimate_errors)
        late = [e for e in errors if e > 60.0]
        early = [-e for e in errors if e < -60.0]
        absolute = sorted(abs(e) for e in errors)
        n = len(errors)
        return {
            "every_s": self.estimates_every,
            "passes": self.estimate_passes,
            "seconds": round(self.estimate_s, 3),
            "jobs": n,
            "error_s": {f"p{q}": round(percentile(errors, q), 3) if errors else None for q in (5, 25, 50, 75, 95)},
            "abs_error_s": summary(absolute),
            "within_60s": round(sum(1 for e in absolute if e <= 60.0) / n, 6) if n else None,
            "within_1h": round(sum(1 for e in absolute if e <= 3600.0) / n, 6) if n else None,
            "started_later": {"share": round(len(late) / n, 6) if n else None, "by_s": summary(late)},
            "started_sooner": {"share": round(len(early) / n, 6) if n else None, "by_s": summary(early)},
        }


# --- public entry points ----------------------------------------------------------------------


def run_simulation(
    trace_rows: Iterable[TraceRow | Mapping[str, Any]],
    cluster: ClusterSpec | Mapping[str, Any],
    policy: Policy,
    *,
    baseline: str | Sequence[str] | None = None,
    progress: ProgressFn | None = None,
    start: datetime = DEFAULT_START,
    class_map: Mapping[str, str] | None = None,
    job_records: bool = False,
    decide_fn: DecideFn | None = None,
    promises: bool = True,
    estimates_every: float = 0.0,
) -> dict[str, Any]:
    """Replay ``trace_rows`` on ``cluster`` under ``policy`` through ``decide``.

    Returns ``{"input": {...}, "policy": metrics}``; with ``baseline="fifo"``
    also ``"baseline"`` (the same jobs under strict FIFO) and ``"comparison"``
    (:func:`compare` of policy against baseline). ``baseline`` may name several of
    :data:`BASELINES` (a list, or ``"fifo,easy"``): ``"baseline"`` and ``"comparison"``
    are then the first one's, and ``"baselines"`` / ``"comparisons"`` hold every one by
    name (a single baseline adds neither, so ``baseline="fifo"`` reads as it always did).
    ``progress`` is called as ``progress(done_jobs, total_jobs)``; with baselines the
    runs report in turn. ``start`` is the wall-clock time of trace second 0 (time-of-day quotas and
    monthly budgets follow it). ``class_map`` gives rows without a ``priority_class``
    one by tenant. ``job_records`` adds ``"job_records": {"policy": [...], "baseline": [...]}``,
    one dict per job (:meth:`Simulation.job_records`; a further baseline's under ``"baseline-<name>"``).
    ``decide_fn`` replaces the core (tests only);
    ``promises=False`` drops the promises ``decide`` returns instead of handing them back
    (``snapshot.Promise``; for comparing with a core that has none). ``estimates_every`` > 0
    samples the planning pass of estimated starts and adds ``"estimates"`` to the metrics
    (see :class:`Simulation`).
    """
    names = parse_baselines(baseline)
    rows = normalise_rows(trace_rows)
    spec = cluster if isinstance(cluster, ClusterSpec) else parse_cluster(cluster)
    epoch = start.timestamp()
    jobs, skipped = prepare_jobs(rows, spec, policy, epoch, class_map)
    info = {
        "jobs_total": len(rows),
        "jobs_eligible": len(jobs),
        "skipped": sum(skipped.values()),
        "skipped_by_reason": dict(sorted(skipped.items())),
        "never_runnable": skipped[SKIP_NEVER_RUNNABLE],
        "devices": spec.total_devices,
        "policy": policy.name,
        "start": start.isoformat(),
        "class_map": dict(class_map or {}),
    }
    out: dict[str, Any] = {"input": info}
    sim = Simulation(
        jobs,
        spec,
        policy,
        decide_fn=decide_fn,
        epoch=epoch,
        progress=progress,
        promises=promises,
        estimates_every=estimates_every,
    )
    out["policy"] = with_input(sim.run(), info)
    records = {"policy": sim.job_records()} if job_records else {}
    runs: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        fresh, _ = prepare_jobs(rows, spec, policy, epoch, class_map)
        ref = Simulation(fresh, spec, policy, baseline=name, epoch=epoch, progress=progress)
        runs[name] = with_input(ref.run(), info)
        if job_records:
            records["baseline" if i == 0 else f"baseline-{name}"] = ref.job_records()
    if names:
        out["baseline"] = runs[names[0]]
        out["comparison"] = compare(out["baseline"], out["policy"])
    if len(names) > 1:
        out["baselines"] = runs
        out["comparisons"] = {name: compare(m, out["policy"]) for name, m in runs.items()}
    if job_records:
        out["job_records"] = records
    return out
