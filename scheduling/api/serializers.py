from __future__ import annotations

import shlex
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from devices.agent.environment import MAX_ENV_BYTES, MAX_ENV_VARS
from npuportal.api import fields
from quotas.models import posix_account
from scheduling.disclosure import Viewer, event_detail
from scheduling.models import Allocation, Job, JobEvent
from scheduling.reason_text import event_name, exit_reason, reason_text
from scheduling.services.jobs import MAX_DURATION_S
from scheduling.services.runs import job_runs


class AllocationSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="device.node.name")
    device_index = serializers.IntegerField(source="device.index")
    chip_model = serializers.CharField(source="device.chip_model")
    vnpu_template = serializers.CharField(source="vnpu_template.name", default=None, allow_null=True)

    class Meta:
        model = Allocation
        fields = ["node", "device_index", "chip_model", "vnpu_template", "device_share", "start", "end"]


class JobEventSerializer(serializers.ModelSerializer):
    """One event of a job's timeline; ``detail`` is worded for the reader (``scheduling.disclosure``)."""

    detail = serializers.SerializerMethodField()
    reason_text = serializers.SerializerMethodField(
        help_text="The event in words ('Preemption scheduled' for PreemptionScheduled); `reason` keeps the code"
    )

    class Meta:
        model = JobEvent
        fields = [
            "recorded_at",
            "at",
            "reported_at",
            "from_state",
            "to_state",
            "reason",
            "reason_text",
            "detail",
            "policy_version",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "recorded_at": {"help_text": "When the portal recorded it; a job's events are in this order"},
            "at": {"help_text": "When the change took effect (usage is charged up to it)"},
            "reported_at": {"help_text": "The time the node agent reported for it, when it came from an agent"},
        }

    def get_reason_text(self, obj: JobEvent) -> str:
        return event_name(obj.reason)

    def get_detail(self, obj: JobEvent) -> str:
        viewer = self.context.get("viewer")
        if viewer is None:
            request = self.context.get("request")
            viewer = self.context["viewer"] = Viewer.of(getattr(request, "user", None))
        return event_detail(obj, viewer)


class JobSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name", read_only=True)
    submitter = serializers.CharField(source="submitter.username", read_only=True)
    vnpu_template = serializers.CharField(source="vnpu_template.name", default=None, read_only=True, allow_null=True)
    pending_reason_text = serializers.SerializerMethodField()
    exit_reason = serializers.SerializerMethodField(
        help_text="How the job ended, in words (exit code 3, killed by signal SIGKILL, cancelled...); "
        "null while it has not ended"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "team",
            "submitter",
            "command",
            "priority_class",
            "num_devices",
            "vnpu_template",
            "chip_model",
            "estimated_duration_s",
            "max_duration_s",
            "checkpoint_interval_s",
            "state",
            "submitted_at",
            "started_at",
            "ended_at",
            "pending_reason",
            "pending_reason_text",
            "pending_detail",
            "estimated_start",
            "preempt_deadline",
            "exit_code",
            "exit_reason",
            "retries",
            "array_id",
            "array_index",
            "array_limit",
            "depends_on",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "array_limit": {"help_text": "At most this many copies of its array run at once (the %N of array)"},
            "depends_on": {
                "help_text": "Jobs it waits for, as stored: 'afterok:12:A14,afterany:15' (A14: every copy of "
                "array A14); '' for none"
            },
        }

    def get_exit_reason(self, obj: Job) -> str | None:
        return exit_reason(str(obj.state), obj.exit_code)

    def get_pending_reason_text(self, obj: Job) -> str:
        return reason_text(obj.pending_reason) if obj.pending_reason else ""

    def to_representation(self, instance: Job) -> dict[str, Any]:
        # Jobs are the API's hottest rows (every submission answers one, lists answer hundreds):
        # written out directly, the same keys and values as the declared fields would give.
        return job_representation(instance)


#: One unbound DRF field, so datetimes read exactly as every other DRF field writes them
#: (ISO 8601 in the current time zone, ``Z`` for UTC).
_DATETIME = serializers.DateTimeField()


def api_time(value: datetime | None) -> str | None:
    """A time as every field of the API gives it (ISO 8601; ``None`` stays ``None``)."""
    return None if value is None else _DATETIME.to_representation(value)


def job_representation(job: Job) -> dict[str, Any]:
    """What :class:`JobSerializer` answers for ``job``, without building a serializer per job.

    Reads ``job.team``, ``job.submitter`` and ``job.vnpu_template``: load them
    with ``select_related`` (or pass objects already in hand) to keep it query-free.
    tests/test_api_endpoints.py checks it against DRF's own field-by-field rendering.
    """
    return _representation(job, "command", job.command)


#: Characters of its command a job carries in a list; the job itself (``GET /jobs/{id}/``) has all of it.
COMMAND_PREVIEW_CHARS = 200
#: What the list query reads of a command instead of the whole text (one more, to know it was cut).
COMMAND_HEAD = "command_head"


def command_preview(text: str) -> str:
    """The start of a command, ``…`` ending it when it was cut: at most ``COMMAND_PREVIEW_CHARS`` characters."""
    if len(text) <= COMMAND_PREVIEW_CHARS:
        return text
    return text[: COMMAND_PREVIEW_CHARS - 1] + "…"


#: What the list query annotates: the nodes a job holds now (comma-joined) and its device time so far.
HELD_NODES = "held_nodes"
HELD_DEVICE_TIME = "held_device_time"
_NOT_READ = object()


def held_nodes(job: Job) -> list[str]:
    """The nodes the job holds now (its open allocations), sorted: squeue's NODELIST; empty unless it runs.

    From the list query's annotation when there is one; a job that never started holds none
    (no query); otherwise its allocations are read.
    """
    names = getattr(job, HELD_NODES, _NOT_READ)
    if names is _NOT_READ:
        if job.started_at is None:
            return []
        return sorted({a.device.node.name for a in job.allocations.all() if a.end is None})
    return sorted(set(str(names).split(","))) if names else []


def device_hours(job: Job) -> float:
    """Card-equivalent hours the job has held (all its runs; a running one up to now), as usage counts them."""
    held = getattr(job, HELD_DEVICE_TIME, _NOT_READ)
    if held is _NOT_READ:
        if job.started_at is None:
            return 0.0
        now = timezone.now()
        held = sum(
            (((a.end or now) - a.start) * a.device_share for a in job.allocations.all()),
            timedelta(),
        )
    if not held:
        return 0.0
    return round(held.total_seconds() / 3600.0, 3)


def job_summary_representation(job: Job) -> dict[str, Any]:
    """What :class:`JobSummarySerializer` answers: a job as a list shows it, ``command_preview`` for its command.

    Lists carry what a list needs, so a page's bytes do not grow with what users put in
    their commands. Takes the command's start from the list query's ``command_head``
    annotation when there is one (the command itself is then not read at all), else from the job.
    """
    head = getattr(job, COMMAND_HEAD, None)
    body = _representation(job, "command_preview", command_preview(job.command if head is None else head))
    body["nodes"] = held_nodes(job)
    body["device_hours"] = device_hours(job)
    return body


def _representation(job: Job, command_key: str, command: str) -> dict[str, Any]:
    template = job.vnpu_template
    return {
        "id": job.pk,
        "name": job.name,
        "team": job.team.name,
        "submitter": job.submitter.username,
        command_key: command,
        "priority_class": job.priority_class,
        "num_devices": job.num_devices,
        "vnpu_template": template.name if template is not None else None,
        "chip_model": job.chip_model,
        "estimated_duration_s": job.estimated_duration_s,
        "max_duration_s": job.max_duration_s,
        "checkpoint_interval_s": job.checkpoint_interval_s,
        "state": str(job.state),
        "submitted_at": api_time(job.submitted_at),
        "started_at": api_time(job.started_at),
        "ended_at": api_time(job.ended_at),
        "pending_reason": job.pending_reason,
        "pending_reason_text": reason_text(job.pending_reason) if job.pending_reason else "",
        "pending_detail": job.pending_detail,
        "estimated_start": api_time(job.estimated_start),
        "preempt_deadline": api_time(job.preempt_deadline),
        "exit_code": job.exit_code,
        "exit_reason": exit_reason(str(job.state), job.exit_code),
        "retries": job.retries,
        "array_id": job.array_id,
        "array_index": job.array_index,
        "array_limit": job.array_limit,
        "depends_on": job.depends_on,
    }


class JobSummarySerializer(JobSerializer):
    """A job as lists and job arrays' answers carry it: `command_preview` instead of the whole command."""

    command_preview = serializers.SerializerMethodField(
        help_text=f"The command's first characters (at most {COMMAND_PREVIEW_CHARS}, ending in … when cut); "
        "the job itself has the whole command"
    )

    nodes = serializers.SerializerMethodField(
        help_text="The nodes the job holds now (a running job's, like squeue's NODELIST); empty otherwise"
    )
    device_hours = serializers.SerializerMethodField(
        help_text="Card-equivalent hours held so far, all runs (a vNPU slice at its share of a card); "
        "a running job's up to now"
    )

    class Meta(JobSerializer.Meta):
        fields = [
            *(name if name != "command" else "command_preview" for name in JobSerializer.Meta.fields),
            "nodes",
            "device_hours",
        ]
        read_only_fields = fields

    def get_command_preview(self, obj: Job) -> str:
        return command_preview(obj.command)

    def get_nodes(self, obj: Job) -> list[str]:
        return held_nodes(obj)

    def get_device_hours(self, obj: Job) -> float:
        return device_hours(obj)

    def to_representation(self, instance: Job) -> dict[str, Any]:
        return job_summary_representation(instance)


class JobRunSerializer(serializers.Serializer):
    """One run of a job (``scheduling.services.runs``): a requeued one ended ``node_fail`` or ``preempted``."""

    attempt = serializers.IntegerField(help_text="1 for the first start (the log's ?attempt=)")
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True, help_text="null while it runs")
    state = serializers.CharField(
        help_text="running; the job's final state for the run that ended it; node_fail or preempted for a run "
        "the system ended and requeued"
    )
    reason = serializers.CharField(help_text="The code of the event that ended it ('' while it runs)")
    detail = serializers.CharField(help_text="That event's detail")
    exit_code = serializers.IntegerField(allow_null=True, help_text="The job's exit code, on the run that ended it")
    exit_reason = serializers.CharField(allow_null=True, help_text="How the run ended, in words")
    nodes = serializers.ListField(child=serializers.CharField())


class JobDetailSerializer(JobSerializer):
    allocations = AllocationSerializer(many=True, read_only=True)
    events = JobEventSerializer(many=True, read_only=True)
    runs = serializers.SerializerMethodField(
        help_text="Every start of the job and how it ended, like sacct --duplicates: a run its node's failure or "
        "a preemption ended, requeued, says node_fail or preempted"
    )
    env = serializers.DictField(
        child=serializers.CharField(), read_only=True, help_text="Variables the submitter asked for"
    )
    posix_user = serializers.SerializerMethodField(
        help_text="The POSIX account the portal asks its nodes to run the job as (docs/agent.md#accounts); "
        "`ran_as` says what they did"
    )
    ran_as = serializers.CharField(
        read_only=True,
        help_text="The account its node agents report running its latest run as ('root'; 'ana on n1, root on n2' "
        "when they differ); empty until an agent has reported it",
    )

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "env",
            "cwd",
            "output",
            "posix_user",
            "ran_as",
            "allocations",
            "events",
            "runs",
        ]
        read_only_fields = fields

    def get_posix_user(self, obj: Job) -> str:
        return posix_account(obj.submitter)

    @extend_schema_field(JobRunSerializer(many=True))
    def get_runs(self, obj: Job) -> list[dict[str, Any]]:
        viewer = self.context.get("viewer")
        if viewer is None:
            request = self.context.get("request")
            viewer = self.context["viewer"] = Viewer.of(getattr(request, "user", None))
        return [
            {
                "attempt": run.attempt,
                "started_at": api_time(run.started_at),
                "ended_at": api_time(run.ended_at),
                "state": run.state,
                "reason": run.reason,
                "detail": event_detail(run.end_event, viewer) if run.end_event is not None else "",
                "exit_code": run.exit_code,
                "exit_reason": run.exit_reason,
                "nodes": list(run.nodes),
            }
            for run in job_runs(obj)
        ]

    def to_representation(self, instance: Job) -> dict[str, Any]:
        # One job at a time: DRF's field-by-field rendering, nested allocations and events included.
        return serializers.ModelSerializer.to_representation(self, instance)


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class EnvField(serializers.Field):
    """A job's ``env`` as sent: checked whole by the service (``devices.agent.environment``), so every
    problem (a number for a value, a reserved name, the sizes) is one 400 naming ``env``."""

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field(
    {
        "oneOf": [
            {"type": "integer", "minimum": 1},
            {"type": "string", "pattern": r"^\s*\d[\d,:\- ]*(%\d+)?\s*$", "example": "0-15%4"},
        ]
    }
)
class ArrayField(serializers.Field):
    """``array``: a count, or Slurm's index list; read whole by ``scheduling.services.arrays`` (one 400 naming it)."""

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "example": "afterok:12:13,afterany:14"},
            {
                "type": "array",
                "items": {
                    "oneOf": [
                        {"type": "integer", "minimum": 1},
                        {"type": "string", "example": "afternotok:12"},
                        {
                            "type": "object",
                            "properties": {
                                "type": {"type": "string", "enum": ["afterok", "afterany", "afternotok"]},
                                "job": {"oneOf": [{"type": "integer"}, {"type": "string", "example": "A14"}]},
                            },
                            "required": ["job"],
                        },
                    ]
                },
            },
        ]
    }
)
class DependsOnField(serializers.Field):
    """``depends_on``: read whole by ``scheduling.services.dependencies`` (one 400 naming it)."""

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class JobSubmitSerializer(fields.InputSerializer):
    """What a submission may carry; the service checks it against cluster and quota."""

    team = fields.CharField(required=False, help_text="Team name; optional when you belong to one team")
    name = fields.CharField(max_length=200)
    command = fields.CharField(
        required=False,
        help_text="The command line, run by the node's /bin/sh -c; at most NPUPORTAL_MAX_COMMAND_BYTES bytes of "
        "UTF-8 (default 64 KiB). Give this or argv",
    )
    argv = serializers.ListField(
        child=fields.CharField(allow_blank=True, trim_whitespace=False),
        required=False,
        allow_empty=False,
        help_text="The program and its arguments, each kept exactly: stored as the command that runs them "
        "(each quoted as the shell needs, like Python's shlex.join). Give this or command",
    )
    priority_class = fields.CharField(required=False, allow_blank=True)
    num_devices = fields.IntegerField(min_value=1, max_value=100000, default=1)
    vnpu_template = fields.CharField(required=False, allow_blank=True, allow_null=True)
    chip_model = fields.CharField(required=False, allow_blank=True, allow_null=True)
    estimated_duration_s = fields.IntegerField(min_value=1, max_value=MAX_DURATION_S, default=3600)
    max_duration_s = fields.IntegerField(min_value=1, max_value=MAX_DURATION_S, required=False, allow_null=True)
    checkpoint_interval_s = fields.IntegerField(
        min_value=1,
        max_value=MAX_DURATION_S,
        required=False,
        allow_null=True,
        help_text="Seconds between the job's checkpoints, if it saves its state: preempted, it loses only the work "
        "since its last one, and the scheduler picks victims that lose the least work",
    )
    env = EnvField(
        required=False,
        help_text=f"Variables for the job's environment: NAME: value, at most {MAX_ENV_VARS} and "
        f"{MAX_ENV_BYTES // 1024} KiB; names the node agent sets (PATH, HOME, NPUPORTAL_*, ...) are refused",
    )
    cwd = fields.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Absolute directory the job starts in on its nodes (default: the account's home), like --chdir",
    )
    output = fields.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Absolute path of a file on its nodes the output is also appended to, like --output",
    )
    array = ArrayField(
        required=False,
        help_text="A job array: N copies (indices 0 to N-1), or Slurm's index list: '0-15', '1,3,5', '0-15:4', "
        "with '%4' at the end for at most 4 copies running at once ('0-15%4'); at most NPUPORTAL_MAX_ARRAY copies "
        "(default 1000) and NPUPORTAL_MAX_SUBMIT_BYTES of commands, names, env, cwd and output in all (default 8 MiB)",
    )
    array_limit = fields.IntegerField(
        min_value=1,
        required=False,
        allow_null=True,
        help_text="At most this many copies of the array run at once (the same as '%N' in array)",
    )
    depends_on = DependsOnField(
        required=False,
        help_text="Jobs this one waits for, as Slurm's --dependency: 'afterok:12:13,afterany:14,afternotok:15' "
        "(all must hold); a job id, an array (A12, or the id of its first job: every copy) or one copy (12_3). "
        "Or a list of job ids (afterok), such strings, or {type, job} objects. Only your teams' jobs",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """``command`` or ``argv``, exactly one; ``argv`` becomes the command line that runs it as given."""
        if "argv" in attrs and "command" in attrs:
            raise serializers.ValidationError({"argv": ["give command or argv, not both"]})
        if "argv" in attrs:
            attrs["command"] = shlex.join(attrs.pop("argv"))
        elif "command" not in attrs:
            raise serializers.ValidationError(
                {"command": ["required: the command line to run (or argv, the program and its arguments)"]}
            )
        return attrs


class JobOutputSerializer(serializers.Serializer):
    """One answer of ``GET /api/v1/jobs/{id}/log/`` (documentation only: the service builds the dict)."""

    offset = serializers.IntegerField(help_text="byte offset in the run's log where data begins")
    next_offset = serializers.IntegerField(help_text="ask again from here to continue")
    data = serializers.CharField(allow_blank=True, help_text="the output, UTF-8 (undecodable bytes as U+FFFD)")
    complete = serializers.BooleanField(help_text="the run has ended and this reaches the end of its output")
    note = serializers.CharField(allow_null=True, help_text="why output is missing or comes from the kept copy")
    size = serializers.IntegerField(
        allow_null=True, help_text="bytes of the run's whole log on the node, when known (null: not known)"
    )
    lines = serializers.IntegerField(
        allow_null=True,
        help_text="lines of the run's whole log, in answers to tail (and from the kept copy); null when not known",
    )
    attempt = serializers.IntegerField(allow_null=True, help_text="which run (1: the first start)")
    attempts = serializers.IntegerField(help_text="how many runs the job has had")
    node = serializers.CharField(allow_null=True, help_text="which node's output this is")
    nodes = serializers.ListField(child=serializers.CharField(), help_text="the nodes of this run")
    source = serializers.ChoiceField(
        ["agent", "saved", "none"], help_text="read from the node, the kept copy, or nothing"
    )
