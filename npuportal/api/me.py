"""``GET /api/v1/me/``: who the request is signed in as, so a client can say "my jobs" (``npuctl queue --me``).

A token names its user only on the server; ``squeue --me`` needs the name to filter on, and asks here.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from npuportal.api.errors import error_responses


class MeView(APIView):
    """The signed-in user: username, whether an admin, and the teams they belong to."""

    @extend_schema(
        summary="Who you are signed in as: your username, admin or not, and your teams",
        responses={
            200: inline_serializer(
                "Me",
                {
                    "username": serializers.CharField(help_text="the name jobs list as their submitter"),
                    "is_admin": serializers.BooleanField(),
                    "teams": serializers.ListField(child=serializers.CharField(), help_text="your teams, by name"),
                },
            ),
            **error_responses(401),
        },
    )
    def get(self, request: Request) -> Response:
        from quotas.models import Membership

        user = request.user
        teams = sorted(Membership.objects.filter(user=user).values_list("team__name", flat=True))
        return Response({"username": user.get_username(), "is_admin": bool(user.is_staff), "teams": teams})
