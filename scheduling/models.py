"""Jobs, the devices they hold, and the append-only record of what happened to them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from devices.models import Device, VnpuTemplate
from quotas.models import Policy, Team


class Job(models.Model):
    class State(models.TextChoices):
        """Slurm's job states, by the names ``sacct`` prints in lower case.

        A job ends in one of the final states. A run the system ended (its node failed, or it was
        preempted under ``onPreempt: requeue``) does not end the job: it goes back to ``pending``,
        and that run's own outcome is ``node_fail`` or ``preempted`` (``scheduling.services.runs``).
        ``node_fail`` ends a job only when node faults used up its retries; ``preempted`` only
        under ``onPreempt: cancel``.
        """

        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        TIMEOUT = "timeout", "Timeout"
        OUT_OF_MEMORY = "out_of_memory", "Out of memory"
        NODE_FAIL = "node_fail", "Node failure"
        CANCELLED = "cancelled", "Cancelled"
        PREEMPTED = "preempted", "Preempted"

    #: States a job never leaves.
    FINAL_STATES = frozenset(
        {
            State.COMPLETED,
            State.FAILED,
            State.TIMEOUT,
            State.OUT_OF_MEMORY,
            State.NODE_FAIL,
            State.CANCELLED,
            State.PREEMPTED,
        }
    )
    #: Final states other than success: what ``afternotok`` waits for and ``afterok`` never gets past.
    UNSUCCESSFUL_STATES = FINAL_STATES - {State.COMPLETED}

    # Not indexed on its own: the (team, …) indexes in Meta start with it.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    submitter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    command = models.TextField()
    priority_class = models.CharField(max_length=50)
    num_devices = models.PositiveIntegerField(default=1, help_text="Whole cards; 1 for a vNPU job")
    vnpu_template = models.ForeignKey(VnpuTemplate, null=True, blank=True, on_delete=models.PROTECT)
    chip_model = models.CharField(max_length=50, blank=True)
    estimated_duration_s = models.PositiveIntegerField(default=3600)
    max_duration_s = models.PositiveIntegerField(null=True, blank=True)
    checkpoint_interval_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The job saves its state this often (seconds from its start): preempted, it loses only the work "
        "since its last checkpoint, and victims are chosen to lose the least work",
    )
    #: Seconds this job has waited with a reason of its own team's limits (its team at its max,
    #: out of budget, ...), and since when it waits so now: the starvation guard counts only the
    #: rest of its wait (scheduling/engine/starvation.py). Kept by the tick.
    own_limits_s = models.FloatField(default=0.0, editable=False)
    own_limits_since = models.DateTimeField(null=True, blank=True, editable=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    submitted_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    pending_reason = models.CharField(max_length=40, blank=True)
    pending_detail = models.CharField(max_length=300, blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    preempt_deadline = models.DateTimeField(null=True, blank=True)
    preempted_for = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The waiting job this job's preemption was decided for"
    )
    exit_code = models.IntegerField(null=True, blank=True)
    retries = models.PositiveIntegerField(default=0)
    launched = models.BooleanField(default=False, help_text="The agent accepted the job")
    agent_job_id = models.CharField(
        max_length=64,
        blank=True,
        help_text="Id of the latest attempt on the agents, '<job id>.<attempt>': a new one on every start",
    )
    array_id = models.CharField(max_length=40, blank=True)
    array_index = models.PositiveIntegerField(null=True, blank=True)
    array_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="At most this many copies of its array run at once (Slurm's --array=...%N)"
    )
    depends_on = models.TextField(
        blank=True,
        help_text="Jobs it waits for, as Slurm's --dependency: 'afterok:12:A14,afterany:15' "
        "(scheduling.services.dependencies)",
    )
    env = models.JSONField(
        default=dict, blank=True, help_text="Variables the submitter asked for (docs/agent.md#environment)"
    )
    cwd = models.CharField(
        max_length=1024, blank=True, help_text="Directory the job starts in on its nodes (default: the account's home)"
    )
    output = models.CharField(
        max_length=1024, blank=True, help_text="File on its nodes the job's output is also appended to"
    )
    ran_as = models.CharField(
        max_length=200,
        blank=True,
        help_text="The POSIX account its node agents report running its latest run as ('root'; 'ana on n1, "
        "root on n2' when they differ); empty until an agent has reported it",
    )

    class Meta:
        ordering = ["-submitted_at", "-id"]
        # Lists page newest first by (submitted_at, id) with no COUNT (npuportal/api/pagination.py):
        # each index below is that ordering behind the filters lists use, so a page is one range scan.
        # (team, state, …) also serves the per-team counts of pending and running jobs.
        indexes = [
            models.Index(fields=["submitted_at", "id"], name="job_submitted_id"),
            models.Index(fields=["state", "submitted_at", "id"], name="job_state_submitted_id"),
            models.Index(fields=["team", "submitted_at", "id"], name="job_team_submitted_id"),
            models.Index(fields=["team", "state", "submitted_at", "id"], name="job_team_state_submitted_id"),
            models.Index(fields=["array_id"], condition=~Q(array_id=""), name="job_array"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES


class JobPromise(models.Model):
    """Cards promised to a waiting job when running jobs were asked to leave for it (the engine's Promise).

    Scheduling state the tick hands from one tick to the next, not part of the job: a
    table of its own (a few rows) keeps the job row, which every submission writes, as
    it is. The tick writes and deletes these rows; a promise ends when its job starts,
    is no longer waiting, or lapses.
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="promise")
    devices = models.JSONField(help_text="Device ids promised to the job")
    until = models.DateTimeField(help_text="When the last job leaving those cards must be gone")

    def __str__(self) -> str:
        return f"promise to job #{self.job_id}: {len(self.devices)} device(s)"


class Allocation(models.Model):
    """A job's hold on one device (whole card or a vNPU slice) from ``start`` to ``end``.

    ``device_share`` is the card equivalent charged: 1 for a whole card, the
    template's share of the card's AI cores for a slice. Storing it keeps
    accounting exact even if a template is later edited.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="allocations")
    vnpu_template = models.ForeignKey(VnpuTemplate, null=True, blank=True, on_delete=models.PROTECT)
    device_share = models.FloatField(default=1.0)
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["start"]
        indexes = [models.Index(fields=["end"], name="allocation_end")]
        constraints = [
            # Backstop under the tick's lock: a card is never held whole by two open allocations.
            models.UniqueConstraint(
                fields=["device"],
                condition=Q(end__isnull=True, vnpu_template__isnull=True),
                name="allocation_one_open_whole_card",
            )
        ]

    def __str__(self) -> str:
        return f"{self.job} on {self.device}"


class JobEvent(models.Model):
    """Append-only history: every state change of a job with its reason.

    A job's timeline is in the order the portal wrote its events (``recorded_at``, then id), which is
    the order things were decided in. ``at`` is the time the change counts from (usage is charged up
    to it); for a change an agent reported it may be earlier than what the portal did in between (an
    agent's end time arrives with the next poll), so it is not the timeline's order. ``reported_at``
    keeps the time the agent gave, as it gave it.

    ``detail`` never names another job: the job an event concerns (the waiting job a preemption was
    for) is ``other_job``, and each reader is told about it as they may know (``scheduling.disclosure``).
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=True)
    recorded_at = models.DateTimeField(default=timezone.now, help_text="When the portal wrote the event")
    reported_at = models.DateTimeField(
        null=True, blank=True, help_text="When the node agent says it happened, for a change an agent reported"
    )
    other_job = models.ForeignKey(
        Job,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The other job the event concerns (the waiting job a preemption was for)",
    )
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=40, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    policy_version = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["recorded_at", "id"]

    def __str__(self) -> str:
        return f"{self.job}: {self.from_state or '-'} → {self.to_state} ({self.reason})"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            raise ValueError("job events are append-only")
        super().save(*args, **kwargs)


class TickRecord(models.Model):
    """One scheduling tick: when, how long, under which policy, what it decided."""

    started_at = models.DateTimeField(db_index=True)
    duration_ms = models.FloatField()
    decide_ms = models.FloatField()
    policy = models.ForeignKey(Policy, null=True, blank=True, on_delete=models.SET_NULL)
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    pending = models.PositiveIntegerField(default=0)
    running = models.PositiveIntegerField(default=0)
    starts = models.PositiveIntegerField(default=0)
    preemptions = models.PositiveIntegerField(default=0)
    evictions = models.PositiveIntegerField(default=0)
    #: Time of the planning pass that estimated the later waiting jobs' starts; ``None``: it did not
    #: run in this tick (it runs every ``ESTIMATE_INTERVAL_S``, see ``services.tick``).
    estimate_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"tick {self.started_at:%Y-%m-%d %H:%M:%S} ({self.starts} starts)"


class JobOutput(models.Model):
    """The end of one run's output on one node, kept when the run ended.

    The agent holds each run's whole output while it keeps the run (``--keep-finished-days``); this
    copy answers once the node is gone or has forgotten it. ``offset`` is the byte offset in the
    run's log where ``data`` begins, so offsets read from the agent and from here agree.
    """

    #: How much of a run's output is kept here (its last bytes, cut at a line start).
    KEPT_BYTES = 64 * 1024

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="outputs")
    attempt = models.PositiveIntegerField()
    node = models.CharField(max_length=200)
    offset = models.PositiveBigIntegerField(default=0)
    size = models.PositiveBigIntegerField(default=0, help_text="Bytes of the whole log on the node")
    lines = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Lines of the whole log on the node (null: its agent did not say)"
    )
    data = models.TextField(blank=True)
    saved_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "node"], name="joboutput_job_attempt_node"),
        ]

    def __str__(self) -> str:
        return f"{self.job} run {self.attempt} on {self.node}"
