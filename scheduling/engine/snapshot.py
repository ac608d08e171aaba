"""What the engine is given and what it gives back.

Times inside the engine are floats (seconds since the Unix epoch, UTC): the tick
compares and sorts tens of thousands of them, and float arithmetic keeps that
cheap. ``Snapshot.now`` is also given as an aware ``datetime`` because the
time-of-day quota schedules need the wall clock of the policy's timezone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from scheduling.engine.policy import Policy
from scheduling.engine.record import Record


@dataclass
class DeviceState(Record):
    """One accelerator chip. ``usable`` folds health, ``schedulable`` and node state."""

    id: int
    node: str
    index: int
    chip_model: str
    topology_group: str
    hbm_mb: int = 0
    ai_cores: int = 0
    ai_cpus: int = 0
    usable: bool = True
    health: str = "healthy"

    # Written out, not generated: see record.py.
    def __init__(
        self,
        id: int,
        node: str,
        index: int,
        chip_model: str,
        topology_group: str,
        hbm_mb: int = 0,
        ai_cores: int = 0,
        ai_cpus: int = 0,
        usable: bool = True,
        health: str = "healthy",
    ) -> None:
        self.id = id
        self.node = node
        self.index = index
        self.chip_model = chip_model
        self.topology_group = topology_group
        self.hbm_mb = hbm_mb
        self.ai_cores = ai_cores
        self.ai_cpus = ai_cpus
        self.usable = usable
        self.health = health


@dataclass
class NodeState(Record):
    name: str
    devices: list[DeviceState]
    #: ``False`` for cordoned, draining or down nodes: running work stays, new work does not come.
    schedulable: bool = True
    state: str = "ready"

    # Written out, not generated: see record.py.
    def __init__(self, name: str, devices: list[DeviceState], schedulable: bool = True, state: str = "ready") -> None:
        self.name = name
        self.devices = devices
        self.schedulable = schedulable
        self.state = state


@dataclass(frozen=True, slots=True)
class VnpuTemplate(Record):
    """A vNPU slice shape of one chip model (``vir05_1c_8g`` on 910B4, ``vir02`` on 310P3)."""

    chip_model: str
    name: str
    memory_mb: int
    ai_cores: int
    ai_cpus: int


@dataclass(frozen=True)
class Slot(Record):
    """One device given to a job: the whole card, or a vNPU slice of it."""

    device_id: int
    vnpu_template: str | None = None

    # Written out, not generated: see record.py.
    def __init__(self, device_id: int, vnpu_template: str | None = None) -> None:
        object.__setattr__(self, "device_id", device_id)
        object.__setattr__(self, "vnpu_template", vnpu_template)


@dataclass
class JobState(Record):
    """A pending or running job.

    A whole-card job asks for ``num_devices`` cards; a vNPU job has
    ``vnpu_template`` set and ``num_devices == 1``.
    """

    id: int
    team: str
    user: str
    priority_class: str
    num_devices: int
    submitted_at: float
    estimated_duration_s: float
    vnpu_template: str | None = None
    chip_model: str | None = None
    max_duration_s: float | None = None
    # Running jobs only:
    started_at: float | None = None
    slots: tuple[Slot, ...] = ()
    #: Set once a preemption was decided: the job must be off its devices at this time.
    preempt_deadline: float | None = None
    #: The waiting job that preemption was for (``Preemption.for_job``), when the caller knows it:
    #: once that job no longer waits, ``decide`` calls the preemption off (``Decisions.called_off``).
    preempted_for: int | None = None
    #: The job saves its state every that many seconds from its start (``None``: it does not):
    #: stopped, it loses only the work since its last checkpoint (:mod:`work_lost`).
    checkpoint_interval_s: float | None = None
    #: Seconds of its wait so far that its own team's limits explain (it waited with a quota
    #: reason: ``reasons.QUOTA_REASONS``), as the caller counted them from earlier ticks' waits.
    #: The starvation guard counts only the rest (:mod:`starvation`).
    own_limits_s: float = 0.0

    # Written out, not generated: see record.py.
    def __init__(
        self,
        id: int,
        team: str,
        user: str,
        priority_class: str,
        num_devices: int,
        submitted_at: float,
        estimated_duration_s: float,
        vnpu_template: str | None = None,
        chip_model: str | None = None,
        max_duration_s: float | None = None,
        started_at: float | None = None,
        slots: tuple[Slot, ...] = (),
        preempt_deadline: float | None = None,
        preempted_for: int | None = None,
        checkpoint_interval_s: float | None = None,
        own_limits_s: float = 0.0,
    ) -> None:
        self.id = id
        self.team = team
        self.user = user
        self.priority_class = priority_class
        self.num_devices = num_devices
        self.submitted_at = submitted_at
        self.estimated_duration_s = estimated_duration_s
        self.vnpu_template = vnpu_template
        self.chip_model = chip_model
        self.max_duration_s = max_duration_s
        self.started_at = started_at
        self.slots = slots
        self.preempt_deadline = preempt_deadline
        self.preempted_for = preempted_for
        self.checkpoint_interval_s = checkpoint_interval_s
        self.own_limits_s = own_limits_s


@dataclass(slots=True, frozen=True)
class RunningDelta(Record):
    """Optional promise from a caller that keeps its job objects: how ``running`` changed.

    ``running`` holds the previous snapshot's running jobs (that snapshot carried a
    delta whose ``version`` is ``since``) minus ``ended`` plus ``started``, the same
    job objects; fields of the jobs still running did not change, except
    ``preempt_deadline``. A job that started and ended in between is in neither
    list; one that ended and started again (a requeued victim) is in both. With
    it the core's tick starts from the last tick's free state and touches only
    what changed; when it cannot use the promise (another ``since``, a vNPU
    slice, a card claimed twice) it counts the running jobs the long way, with
    the same decisions. Versions belong to one chain of snapshots: a caller that
    runs several (two replays in one process) gives each its own ``inventory_key``.
    """

    since: int
    version: int
    ended: tuple[JobState, ...] = ()
    started: tuple[JobState, ...] = ()
    #: Also promised: the jobs still running keep their order in ``running`` and ``started``
    #: come after them, in this order (no swap-remove). Lets the core keep the running jobs
    #: sorted by expected end from tick to tick (ties go by that order).
    in_order: bool = False


@dataclass(frozen=True)
class Promise(Record):
    """Cards a waiting job was promised when jobs were asked to leave for it.

    ``until`` is when the last of those jobs must be gone (the plan's expected
    start). The tick that chose the victims returns it in
    ``Decisions.promises``; the caller hands it back in ``Snapshot.promises``
    until the job starts, so that cards freed at the deadline go to the job
    they were freed for and no other job's victim search counts them. Whole
    cards only; a promise lapses one grace period after ``until``.
    """

    job_id: int
    devices: tuple[int, ...]
    until: float

    # Written out, not generated: see record.py.
    def __init__(self, job_id: int, devices: tuple[int, ...], until: float) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "until", until)


@dataclass(frozen=True)
class Dependencies(Record):
    """Where a waiting job's unsatisfied dependencies stand, as the caller found them (:mod:`dependency`)."""

    #: They can never be satisfied (a job depended on ended the other way).
    never: bool
    #: What it waits for, or why it never can be, in words ("waits for job 12 to complete").
    detail: str

    # Written out, not generated: see record.py.
    def __init__(self, never: bool, detail: str) -> None:
        object.__setattr__(self, "never", never)
        object.__setattr__(self, "detail", detail)


@dataclass(slots=True)
class Snapshot:
    now: datetime
    policy: Policy
    nodes: list[NodeState]
    pending: list[JobState]
    running: list[JobState]
    templates: Mapping[tuple[str, str], VnpuTemplate] = field(default_factory=dict)
    #: Decayed usage (device-hours) per (team, user), for fair share.
    usage: Mapping[tuple[str, str], float] = field(default_factory=dict)
    #: Device-hours used this calendar month per team, for ``deviceHoursPerMonth``.
    month_device_hours: Mapping[str, float] = field(default_factory=dict)
    #: Optional promise from the caller: snapshots with equal keys have the same inventory
    #: (nodes and device values). Lets the core reuse its layout without comparing every
    #: device (the simulator, whose inventory never changes, passes one); ``None``: compare.
    inventory_key: object | None = None
    #: Optional, with ``inventory_key``: the running jobs' changes since the last snapshot.
    running_delta: RunningDelta | None = None
    #: Promises in force, by waiting job id: what the last tick returned in ``Decisions.promises``
    #: (empty at first). ``None``: the caller keeps no promises, and the tick does not hold the
    #: free cards of a plan for its job either (the decisions of an engine without promises).
    promises: Mapping[int, Promise] | None = None
    #: Optional: the inventory as the caller read it (the database tick passes its node and
    #: device rows), any value that is equal between two snapshots only if their nodes and
    #: devices are. The core compares it, instead of reading every device, to find the
    #: layout it kept from the last tick (``capacity.Layout``); ``None``: it reads the devices.
    inventory_values: object | None = None
    #: Waiting jobs whose dependencies are not all satisfied, by id (:mod:`dependency`); a job
    #: absent has none left to wait for. ``None`` or empty: no job depends on another.
    dependencies: Mapping[int, Dependencies] | None = None
    #: The copies, pending and running, of job arrays that may run only so many at once, by job
    #: id: ``(array id, at most this many running)`` (:mod:`array_throttle`). ``None``: none.
    array_limits: Mapping[int, tuple[str, int]] | None = None
    #: A team lead's limits on a member, by ``(team, user)``: ``(whole cards at once, jobs at once)``,
    #: each ``None`` when unset (:mod:`member_limits`). ``None`` or empty: no member has limits.
    member_limits: Mapping[tuple[str, str], tuple[float | None, int | None]] | None = None


# The decisions below are values. ``Start`` and ``Preemption`` are not frozen (a
# frozen class's ``__init__`` costs more interpreted); ``Wait`` is, as one is shared
# by every job that waits for the same reason.


@dataclass
class Start(Record):
    job_id: int
    slots: tuple[Slot, ...]
    backfilled: bool = False

    # Written out, not generated: see record.py.
    def __init__(self, job_id: int, slots: tuple[Slot, ...], backfilled: bool = False) -> None:
        self.job_id = job_id
        self.slots = slots
        self.backfilled = backfilled


@dataclass
class Preemption(Record):
    """A running job asked to give its devices back by ``grace_deadline``."""

    job_id: int
    reason: str
    grace_deadline: float
    for_job: int | None = None

    # Written out, not generated: see record.py.
    def __init__(self, job_id: int, reason: str, grace_deadline: float, for_job: int | None = None) -> None:
        self.job_id = job_id
        self.reason = reason
        self.grace_deadline = grace_deadline
        self.for_job = for_job


@dataclass(frozen=True)
class Wait(Record):
    """Why a pending job did not start. ``reason`` is one of :mod:`reasons`' codes.

    A value, keyed by job id in ``Decisions.waiting``: the jobs of a queue's long tail
    that wait for the same reason share one (a tick of 10,000 jobs makes a handful).
    """

    reason: str
    detail: str = ""
    estimated_start: float | None = None

    # Written out, not generated: see record.py.
    def __init__(self, reason: str, detail: str = "", estimated_start: float | None = None) -> None:
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "detail", detail)
        object.__setattr__(self, "estimated_start", estimated_start)


@dataclass(slots=True)
class Decisions:
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    #: Running jobs whose preemption grace has run out: stop them now.
    evictions: list[int] = field(default_factory=list)
    waiting: dict[int, Wait] = field(default_factory=dict)
    #: Promises in force after this tick, by waiting job id (new ones and those still held):
    #: give them back in the next snapshot. A job that started or whose promise lapsed has none.
    promises: dict[int, Promise] = field(default_factory=dict)
    #: Running jobs whose preemption this tick withdrew at its deadline, instead of evicting
    #: them: the job it was for no longer waits (it started on other cards, or was cancelled)
    #: and no promise counts on their cards. Clear their ``preempt_deadline`` (and
    #: ``preempted_for``): they run on as if never chosen.
    called_off: list[int] = field(default_factory=list)
    #: Waiting jobs to cancel, with why in words: their dependencies can never be satisfied
    #: (reason ``DependencyNeverSatisfied``, :mod:`dependency`). They are not in ``waiting``.
    cancelled: dict[int, str] = field(default_factory=dict)
