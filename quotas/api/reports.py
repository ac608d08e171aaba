"""Closed monthly statements through the API (``/api/v1/reports/``), as JSON or CSV (``?format=csv``).

Visibility as in the console (``quotas.accounting.views``): staff and the
``finance`` group see every statement, the cluster's (``@cluster``) included; a
team lead sees their teams'; a member sees none. Another team's statement is
404; your own team's, when you are not its lead, 403. The CSV is byte for byte
what the console and ``manage.py chargeback export`` write.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from npuportal.api.errors import error_responses
from npuportal.csv_export import csv_text
from quotas.accounting.exports import statement_dict, to_csv
from quotas.accounting.statements import previous_month
from quotas.accounting.views import is_finance, led_teams, visible_statement
from quotas.models import Statement
from quotas.policies.versions import active_policy
from scheduling.services.usage import MONTH_PATTERN, UsageError, month_of


class CSVRenderer(BaseRenderer):
    """``text/csv``: the view hands over the CSV text; an error body becomes a one-column CSV."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if isinstance(data, str):
            return data.encode()
        if isinstance(data, dict) and "error" in data:  # it may echo what was asked: through the same writer
            return csv_text([["error"], [str(data["error"]).replace(chr(10), " ")]]).encode()
        return b""


class StatementLineSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["usage", "reserved", "unavailable", "idle", "adjustment"])
    chip_model = serializers.CharField()
    vnpu_template = serializers.CharField()
    priority_class = serializers.CharField()
    device_hours = serializers.CharField(help_text="Decimal, 6 places")
    rate = serializers.CharField(help_text="Price per device-hour, decimal")
    multiplier = serializers.CharField(help_text="Priority-class multiplier, decimal")
    amount = serializers.CharField(
        help_text="device_hours × rate × multiplier, rounded half up to the cent "
        "(capacity lines: their share of provisioned × rate, split to the cent)"
    )
    description = serializers.CharField()
    rate_card_id = serializers.IntegerField(allow_null=True)


class ChipBalanceSerializer(serializers.Serializer):
    provisioned_hours = serializers.CharField(help_text="Device-hours the chip's cards were in the inventory")
    used_hours = serializers.CharField(help_text="Device-hours jobs held (vNPU slices at their card share)")
    reserved_unused_hours = serializers.CharField(help_text="Unused reservations charged (0 when reserved_mode=hide)")
    unavailable_hours = serializers.CharField(help_text="Free time of cards not usable (cordoned, down, unhealthy…)")
    unavailable_by_status = serializers.DictField(child=serializers.CharField(), help_text="Status → device-hours")
    unavailable_by_cause = serializers.DictField(child=serializers.CharField(), help_text="Cause → device-hours")
    idle_hours = serializers.CharField(help_text="Usable and unused device-hours")
    rate = serializers.CharField(allow_null=True, help_text="The chip's rate; null when it changed in the month")
    rates = serializers.ListField(child=serializers.CharField(), help_text="The rates in force, in order")
    amount = serializers.CharField(help_text="provisioned × rate, per rate-card period, to the cent")
    pricing_difference = serializers.CharField(help_text="What class multipliers and template rates add to usage")
    charged = serializers.CharField(help_text="What the month's statements charge for the chip")
    not_charged = serializers.CharField(help_text="What no statement charges (idle and unavailable in hide)")


class StatementSerializer(serializers.Serializer):
    team = serializers.CharField(help_text="Team name, or @cluster for the cluster's own statement")
    month = serializers.CharField(help_text="YYYY-MM on the policy's clock")
    currency = serializers.CharField()
    idle_mode = serializers.CharField()
    reserved_mode = serializers.CharField()
    rate_card_ids = serializers.ListField(child=serializers.IntegerField())
    policy_version = serializers.IntegerField(allow_null=True)
    timezone = serializers.CharField()
    total = serializers.CharField(help_text="The sum of the lines' amounts, decimal")
    closed_at = serializers.DateTimeField(allow_null=True)
    lines = StatementLineSerializer(many=True)
    balance = serializers.DictField(
        child=ChipBalanceSerializer(),
        help_text="The cluster statement's: per chip model, charged + not_charged = amount + pricing_difference; "
        "empty on a team's",
    )
    not_charged = serializers.CharField(help_text="The month's not-charged total (cluster statement), decimal")


MONTH = OpenApiParameter(
    "month",
    OpenApiTypes.STR,
    description="YYYY-MM on the policy's clock; default: last month",
    pattern=MONTH_PATTERN,
)
FORMAT = OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"], description="csv: the statement as CSV")


def _month(label: str | None) -> str:
    if label is None:
        return previous_month()
    if label == "":
        raise ValidationError({"month": ["must be a month like 2026-11 (leave it out for last month)"]})
    try:
        return month_of(active_policy().policy, timezone.now(), label).label
    except UsageError as exc:
        raise ValidationError({exc.field: [exc.message]}) from exc


class _ReportView(APIView):
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, CSVRenderer]
    pagination_class = None

    def _respond(self, request: Request, statements: list[Statement], body: Any) -> Response:
        if getattr(request.accepted_renderer, "format", "") == "csv":
            return Response(to_csv(statements), content_type="text/csv; charset=utf-8")
        return Response(body)


class StatementListView(_ReportView):
    @extend_schema(
        summary="The closed statements of a month you may see (finance and admins: all; leads: their teams')",
        parameters=[MONTH, FORMAT],
        responses={
            (200, "application/json"): StatementSerializer(many=True),
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="CSV, one row per line"),
            **error_responses(400, 401),
        },
    )
    def get(self, request: Request) -> Response:
        label = _month(request.query_params.get("month"))
        statements = Statement.objects.filter(month=label, closed_at__isnull=False).select_related("team")
        if not is_finance(request.user):
            statements = statements.filter(team__in=led_teams(request.user))
        found = sorted(statements.prefetch_related("lines"), key=lambda s: (s.team_id is None, str(s)))
        return self._respond(request, found, [statement_dict(s, s.lines.all()) for s in found])


class StatementDetailView(_ReportView):
    @extend_schema(
        summary="One closed statement with its lines (leads of the team, finance, admins)",
        parameters=[
            FORMAT,
            OpenApiParameter("month", OpenApiTypes.STR, OpenApiParameter.PATH, pattern=MONTH_PATTERN),
        ],
        responses={
            (200, "application/json"): StatementSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="CSV, one row per line"),
            **error_responses(400, 401, 403, 404),
        },
    )
    def get(self, request: Request, team: str, month: str) -> Response:
        label = _month(month)
        statement = visible_statement(request.user, team, label)
        return self._respond(request, [statement], statement_dict(statement))
