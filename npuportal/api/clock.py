"""``GET /api/v1/clock/``: the clock people read times on, so a client prints them as the console does.

Every time the console shows is on the active policy's ``timezone``, labelled; the API's JSON keeps
ISO 8601 instants. A client that prints times for people (``npuctl``) asks here which zone that is.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from npuportal.api.errors import error_responses
from npuportal.display_time import policy_zone_name


class ClockView(APIView):
    """The policy's clock: its zone name, its abbreviation and offset now, and the time now on it."""

    @extend_schema(
        summary="The clock times are shown on: the policy's time zone, and now on it",
        responses={
            200: inline_serializer(
                "Clock",
                {
                    "timezone": serializers.CharField(help_text="IANA name of the policy's zone, e.g. Asia/Shanghai"),
                    "abbreviation": serializers.CharField(help_text="the zone's short name now, e.g. CST"),
                    "utc_offset": serializers.CharField(help_text="its offset from UTC now, e.g. +08:00"),
                    "now": serializers.DateTimeField(help_text="now, on that clock (ISO 8601 with its offset)"),
                },
            ),
            **error_responses(401),
        },
    )
    def get(self, request: Request) -> Response:
        from scheduling.engine.policy import zone

        name = policy_zone_name()
        now = timezone.now().astimezone(zone(name))
        offset = now.strftime("%z")
        return Response(
            {
                "timezone": name,
                "abbreviation": now.tzname() or "",
                "utc_offset": f"{offset[:3]}:{offset[3:]}",
                "now": now.isoformat(),
            }
        )
