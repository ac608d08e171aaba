"""Serializers of the quotas API: teams with quota/usage/members, policy versions, API tokens."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from npuportal.api import fields
from quotas.models import ApiToken, Membership, Policy, QuotaRequest, Team
from quotas.policies.team_policy import MAX_COMMENT_CHARS, MAX_DEVICE_UNITS, MAX_SHARES, read_amount

#: The longest policy text the API accepts (the console uses the same bound).
MAX_POLICY_CHARS = 200_000


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON: dataclasses and tuples unpacked, NaN/∞ as null, times as ISO text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [json_safe(v) for v in items]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, datetime | date):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# -- teams --------------------------------------------------------------------


class TeamSerializer(serializers.ModelSerializer):
    department = serializers.CharField(source="department.name", default=None, read_only=True)
    my_role = serializers.SerializerMethodField(help_text="Your role in the team: admin, lead or member")

    class Meta:
        model = Team
        fields = ["name", "department", "description", "my_role"]
        read_only_fields = fields

    def get_my_role(self, obj: Team) -> str | None:
        user = self.context["request"].user
        if user.is_staff:
            return "admin"
        return getattr(obj, "member_role", None)


class TeamQuotaSerializer(serializers.Serializer):
    """The team's quota in force now (the shape of ``policy effective``) and what it holds now."""

    at = serializers.CharField(help_text="Now, on the policy's clock")
    timezone = serializers.CharField()
    policy_version = serializers.IntegerField(allow_null=True)
    schedule = serializers.CharField(allow_null=True, help_text="The schedule in force; null for the base quota")
    guaranteed = serializers.DictField(child=serializers.FloatField())
    max = serializers.DictField(child=serializers.FloatField(), help_text="A resource not listed has no cap")
    maxConcurrentJobs = serializers.IntegerField(allow_null=True)
    deviceHoursPerMonth = serializers.FloatField(allow_null=True)
    maxJobDuration = serializers.CharField(allow_null=True)
    allowedPriorityClasses = serializers.ListField(child=serializers.CharField(), allow_null=True)
    in_use = serializers.DictField(child=serializers.FloatField(), help_text="Card equivalents held right now")


class TeamCostSerializer(serializers.Serializer):
    month = serializers.CharField()
    currency = serializers.CharField(help_text="The rate card's currency (empty when no rate card exists)")
    amount = serializers.CharField(help_text="Decimal, to the cent")
    by_chip = serializers.DictField(child=serializers.CharField(), help_text="Amount per chip model, decimal")
    basis = serializers.ChoiceField(
        ["statement", "usage so far"],
        help_text="statement: the closed month's statement; usage so far: usage priced live, running jobs up to "
        "now (idle and reservation shares are added at the close)",
    )
    warnings = serializers.ListField(child=serializers.CharField(), help_text="e.g. a chip no rate card prices")


class TeamUsageSerializer(serializers.Serializer):
    team = serializers.CharField()
    month = serializers.CharField(help_text="YYYY-MM on the policy's clock")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(help_text="End of the counted window: the month's end, or now")
    device_hours = serializers.DictField(child=serializers.FloatField(), help_text="Card-equivalent hours per chip")
    total_device_hours = serializers.FloatField()
    device_hours_per_month = serializers.FloatField(allow_null=True, help_text="The team's monthly budget, if any")
    running_jobs = serializers.IntegerField()
    pending_jobs = serializers.IntegerField()
    cost = TeamCostSerializer(required=False, help_text="Only in GET /teams/{name}/usage/")


class MemberSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")
    full_name = serializers.SerializerMethodField()
    max_devices = serializers.FloatField(
        allow_null=True, help_text="at most this many cards at once (null: no limit beyond the team's)"
    )
    max_jobs = serializers.IntegerField(allow_null=True, help_text="at most this many jobs at once (null: no limit)")
    limits = serializers.SerializerMethodField(help_text="the limits in words")

    class Meta:
        model = Membership
        fields = ["username", "full_name", "role", "max_devices", "max_jobs", "limits"]
        read_only_fields = fields

    def get_full_name(self, obj: Membership) -> str:
        return obj.user.get_full_name()

    def get_limits(self, obj: Membership) -> str:
        from quotas.tenancy.members import limits_text

        return limits_text(obj)


class MemberAddSerializer(fields.InputSerializer):
    """Checked by the service (``quotas.tenancy.members``); typed here for the schema."""

    who = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="a username, or an e-mail address to invite"
    )
    role = serializers.CharField(required=False, default="member", help_text="member (default) or lead")


class MemberAddedSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="what was done, in words")
    member = MemberSerializer(allow_null=True, help_text="the new member (null when an e-mail address was invited)")
    invited = serializers.CharField(allow_null=True, help_text="the e-mail address invited, if one was")


class MemberChangeSerializer(fields.InputSerializer):
    """Any of the three; a limit left out stays as it is, null lifts it."""

    role = serializers.CharField(required=False, help_text="member or lead")
    max_devices = serializers.JSONField(
        required=False, allow_null=True, help_text="cards at once, from 1 to the team's maximum; null for no limit"
    )
    max_jobs = serializers.JSONField(
        required=False, allow_null=True, help_text="jobs at once, a whole number; null for no limit"
    )


class MemberChangedSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="what was done, in words")
    member = MemberSerializer()


class TeamDetailSerializer(TeamSerializer):
    quota = TeamQuotaSerializer(read_only=True)
    usage = TeamUsageSerializer(read_only=True, allow_null=True, help_text="Leads and admins only; null otherwise")
    members = MemberSerializer(many=True, read_only=True, allow_null=True, help_text="Leads and admins only")

    class Meta(TeamSerializer.Meta):
        fields = [*TeamSerializer.Meta.fields, "quota", "usage", "members"]
        read_only_fields = fields


@extend_schema_field(OpenApiTypes.NUMBER)
class AmountField(serializers.Field):
    """A number >= 0 up to ``limit``, checked by :func:`quotas.policies.team_policy.read_amount`.

    The same words as the console.
    """

    def __init__(self, *, limit: float, **kwargs: Any) -> None:
        self.limit = limit
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> float:
        try:
            return read_amount(data, limit=self.limit)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def to_representation(self, value: Any) -> Any:
        return value


class TeamPolicyChangeSerializer(fields.InputSerializer):
    """``PATCH /api/v1/teams/{name}/``: any of the weight and the base quota, and why."""

    shares = AmountField(limit=MAX_SHARES, required=False, help_text="Fair-share weight among the team's siblings")
    guaranteed = serializers.DictField(
        child=AmountField(limit=MAX_DEVICE_UNITS, allow_null=True),
        required=False,
        help_text="Base guarantee per resource key (devices, devices/<chip>); null removes the key; others keep theirs",
    )
    max = serializers.DictField(
        child=AmountField(limit=MAX_DEVICE_UNITS, allow_null=True),
        required=False,
        help_text="Base cap per resource key; null removes the cap; keys not given keep theirs",
    )
    comment = fields.CharField(
        max_length=MAX_COMMENT_CHARS, help_text="Required: why; kept with the new policy version"
    )
    base_version = fields.IntegerField(
        required=False,
        allow_null=True,
        help_text="Refuse the change unless this is still the active version (someone else may have changed it)",
    )


class TeamFairShareSerializer(serializers.Serializer):
    shares = serializers.FloatField(help_text="The team's weight")
    norm_shares = serializers.FloatField(help_text="Its share of the cluster down the department → team tree")
    fair_share = serializers.FloatField(help_text="The classic fair-share factor its jobs' priority gets now, 0 to 1")
    usage_hours = serializers.FloatField(help_text="Decayed device-hours the factor is computed from")


class TeamPolicyChangedSerializer(serializers.Serializer):
    team = serializers.CharField()
    policy_version = serializers.IntegerField(help_text="The new version, active from the next tick")
    changes = serializers.ListField(child=serializers.CharField(), help_text="What changed in meaning")
    warnings = serializers.ListField(child=serializers.CharField(), help_text="The validator's warnings, if any")
    guaranteed = serializers.DictField(child=serializers.FloatField(), help_text="The base guarantee now")
    max = serializers.DictField(child=serializers.FloatField(), help_text="The base caps now")
    fair_share = TeamFairShareSerializer()


# -- policies -----------------------------------------------------------------


class PolicySerializer(serializers.ModelSerializer):
    active = serializers.BooleanField(source="is_active", read_only=True)
    author = serializers.CharField(source="author.username", default=None, read_only=True)

    class Meta:
        model = Policy
        fields = ["version", "active", "author", "comment", "created", "activated_at"]
        read_only_fields = fields


class PolicyDetailSerializer(PolicySerializer):
    class Meta(PolicySerializer.Meta):
        fields = [*PolicySerializer.Meta.fields, "yaml_text"]
        read_only_fields = fields


class PolicyIssueSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="Where in the document, e.g. spec.teams[0].quota.max")
    message = serializers.CharField()
    severity = serializers.ChoiceField(choices=["error", "warning"])
    line = serializers.IntegerField(allow_null=True)


class PolicyTextSerializer(fields.InputSerializer):
    yaml = fields.CharField(
        max_length=MAX_POLICY_CHARS, trim_whitespace=False, help_text="The policy document as YAML text"
    )


class PolicyValidationSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    issues = PolicyIssueSerializer(many=True)


class PolicyDryRunRequestSerializer(PolicyTextSerializer):
    days = fields.IntegerField(min_value=1, max_value=90, default=7, help_text="Replay this many days of jobs")


class PolicyDryRunSerializer(serializers.Serializer):
    changes = serializers.ListField(child=serializers.CharField(), help_text="What changes in meaning")
    issues = PolicyIssueSerializer(many=True, help_text="Warnings about the candidate")
    source = serializers.CharField()
    jobs = serializers.IntegerField(help_text="Jobs replayed")
    current = serializers.JSONField(help_text="Metrics under the active policy")
    candidate = serializers.JSONField(help_text="Metrics under the candidate")
    comparison = serializers.JSONField(help_text="Per team and overall: a (current), b (candidate), delta")


class PolicyCreateSerializer(PolicyTextSerializer):
    comment = fields.CharField(max_length=500, help_text="Why: kept in the history")


class PolicyCreatedSerializer(PolicyDetailSerializer):
    changes = serializers.ListField(child=serializers.CharField(), read_only=True)
    issues = PolicyIssueSerializer(many=True, read_only=True, help_text="Warnings (errors would have refused it)")

    class Meta(PolicyDetailSerializer.Meta):
        fields = [*PolicyDetailSerializer.Meta.fields, "changes", "issues"]
        read_only_fields = fields


class PolicyActivateSerializer(fields.InputSerializer):
    comment = fields.CharField(max_length=500, required=False, allow_blank=True, default="")


_REF_HELP = "A version number or 'active'"


class PolicyDiffRequestSerializer(fields.InputSerializer):
    """Each side is a stored version (``a``/``b``) or a text (``a_yaml``/``b_yaml``)."""

    a = fields.RegexField(r"^(v?\d{1,9}|active)$", required=False, help_text=_REF_HELP)
    b = fields.RegexField(r"^(v?\d{1,9}|active)$", required=False, help_text=_REF_HELP)
    a_yaml = fields.CharField(required=False, max_length=MAX_POLICY_CHARS, trim_whitespace=False)
    b_yaml = fields.CharField(required=False, max_length=MAX_POLICY_CHARS, trim_whitespace=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for side in ("a", "b"):
            given = [k for k in (side, f"{side}_yaml") if attrs.get(k) is not None]
            if len(given) != 1:
                raise serializers.ValidationError({side: [f"give exactly one of {side} (a version) or {side}_yaml"]})
        return attrs


class PolicyDiffSerializer(serializers.Serializer):
    a = serializers.CharField(help_text="Label of the old side, e.g. v3")
    b = serializers.CharField()
    changes = serializers.ListField(child=serializers.CharField(), help_text="What changed in meaning")
    diff = serializers.CharField(help_text="Unified diff of the texts; empty when equal")


# -- tokens -------------------------------------------------------------------


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created", "last_used"]
        read_only_fields = fields


class ApiTokenCreateSerializer(fields.InputSerializer):
    name = fields.CharField(max_length=100, help_text="What the token is for, e.g. 'laptop' or 'ci'")


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    key = serializers.CharField(read_only=True, help_text="The secret; shown this once, never again")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key"]
        read_only_fields = fields


class QuotaRequestSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name", read_only=True)
    requested_by = serializers.CharField(source="requested_by.username", read_only=True)
    decided_by = serializers.CharField(source="decided_by.username", read_only=True, allow_null=True, default=None)
    policy_version = serializers.IntegerField(source="policy.version", read_only=True, allow_null=True, default=None)
    summary = serializers.CharField(read_only=True)
    schedule = serializers.CharField(source="schedule_name", read_only=True)

    class Meta:
        model = QuotaRequest
        fields = [
            "id",
            "team",
            "field",
            "resource",
            "change",
            "first_day",
            "last_day",
            "justification",
            "summary",
            "state",
            "requested_by",
            "created",
            "decided_by",
            "decided_at",
            "decision_note",
            "policy_version",
            "schedule",
        ]
        read_only_fields = fields


class QuotaRequestCreateSerializer(fields.InputSerializer):
    """Checked by the service (every field at once, named); typed here only for the schema."""

    team = serializers.CharField(required=False, allow_blank=True, default="", help_text="the team (you must lead it)")
    field = serializers.CharField(required=False, allow_blank=True, default="", help_text="guaranteed or max")
    resource = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="devices, or devices/<chip model> such as devices/910B4"
    )
    change = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="cards more (16, +16) or fewer (-8) than the team's base quota",
    )
    first_day = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="first day, e.g. 2026-12-10 (the policy's clock)"
    )
    last_day = serializers.CharField(required=False, allow_blank=True, default="", help_text="last day, included")
    justification = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="why; the admin decides on it and the policy history keeps it",
    )


class QuotaRequestDecisionSerializer(fields.InputSerializer):
    note = serializers.CharField(required=False, allow_blank=True, help_text="approve: a note to the lead")
    reason = serializers.CharField(required=False, allow_blank=True, help_text="refuse: why (required)")
