from __future__ import annotations

from datetime import datetime
from typing import Any

from rest_framework import serializers

from npuportal import api_fields as fields
from scheduling.models import Allocation, Job, JobEvent
from scheduling.reason_text import reason_text
from scheduling.services.jobs import MAX_DURATION_S


class AllocationSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="device.node.name")
    device_index = serializers.IntegerField(source="device.index")
    chip_model = serializers.CharField(source="device.chip_model")
    vnpu_template = serializers.CharField(source="vnpu_template.name", default=None, allow_null=True)

    class Meta:
        model = Allocation
        fields = ["node", "device_index", "chip_model", "vnpu_template", "device_share", "start", "end"]


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "from_state", "to_state", "reason", "detail", "policy_version"]
        read_only_fields = fields


class JobSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name", read_only=True)
    submitter = serializers.CharField(source="submitter.username", read_only=True)
    vnpu_template = serializers.CharField(source="vnpu_template.name", default=None, read_only=True, allow_null=True)
    pending_reason_text = serializers.SerializerMethodField()

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
            "retries",
            "array_id",
            "array_index",
        ]
        read_only_fields = fields

    def get_pending_reason_text(self, obj: Job) -> str:
        return reason_text(obj.pending_reason) if obj.pending_reason else ""

    def to_representation(self, instance: Job) -> dict[str, Any]:
        # Jobs are the API's hottest rows (every submission answers one, lists answer hundreds):
        # written out directly, the same keys and values as the declared fields would give.
        return job_representation(instance)


#: One unbound DRF field, so datetimes read exactly as every other DRF field writes them
#: (ISO 8601 in the current time zone, ``Z`` for UTC).
_DATETIME = serializers.DateTimeField()


def _when(value: datetime | None) -> str | None:
    return None if value is None else _DATETIME.to_representation(value)


def job_representation(job: Job) -> dict[str, Any]:
    """What :class:`JobSerializer` answers for ``job``, without building a serializer per job.

    Reads ``job.team``, ``job.submitter`` and ``job.vnpu_template``: load them
    with ``select_related`` (or pass objects already in hand) to keep it query-free.
    tests/test_api_endpoints.py checks it against DRF's own field-by-field rendering.
    """
    template = job.vnpu_template
    return {
        "id": job.pk,
        "name": job.name,
        "team": job.team.name,
        "submitter": job.submitter.username,
        "command": job.command,
        "priority_class": job.priority_class,
        "num_devices": job.num_devices,
        "vnpu_template": template.name if template is not None else None,
        "chip_model": job.chip_model,
        "estimated_duration_s": job.estimated_duration_s,
        "max_duration_s": job.max_duration_s,
        "state": str(job.state),
        "submitted_at": _when(job.submitted_at),
        "started_at": _when(job.started_at),
        "ended_at": _when(job.ended_at),
        "pending_reason": job.pending_reason,
        "pending_reason_text": reason_text(job.pending_reason) if job.pending_reason else "",
        "pending_detail": job.pending_detail,
        "estimated_start": _when(job.estimated_start),
        "preempt_deadline": _when(job.preempt_deadline),
        "exit_code": job.exit_code,
        "retries": job.retries,
        "array_id": job.array_id,
        "array_index": job.array_index,
    }


class JobDetailSerializer(JobSerializer):
    allocations = AllocationSerializer(many=True, read_only=True)
    events = JobEventSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "allocations", "events"]
        read_only_fields = fields

    def to_representation(self, instance: Job) -> dict[str, Any]:
        # One job at a time: DRF's field-by-field rendering, nested allocations and events included.
        return serializers.ModelSerializer.to_representation(self, instance)


class JobSubmitSerializer(fields.InputSerializer):
    """What a submission may carry; the service checks it against cluster and quota."""

    team = fields.CharField(required=False, help_text="Team name; optional when you belong to one team")
    name = fields.CharField(max_length=200)
    command = fields.CharField()
    priority_class = fields.CharField(required=False, allow_blank=True)
    num_devices = fields.IntegerField(min_value=1, max_value=100000, default=1)
    vnpu_template = fields.CharField(required=False, allow_blank=True, allow_null=True)
    chip_model = fields.CharField(required=False, allow_blank=True, allow_null=True)
    estimated_duration_s = fields.IntegerField(min_value=1, max_value=MAX_DURATION_S, default=3600)
    max_duration_s = fields.IntegerField(min_value=1, max_value=MAX_DURATION_S, required=False, allow_null=True)
    array = fields.IntegerField(
        min_value=1, max_value=1000, required=False, help_text="Submit this many copies, like Slurm's --array=0-(N-1)"
    )
