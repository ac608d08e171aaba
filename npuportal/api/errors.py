"""The API's one error body, for the schema and for views that answer an error themselves.

``npuportal.api.error_handling`` turns every DRF exception into this shape; views that
must attach structured detail (a policy's list of issues) build it here, so
the shape is written down in one place for both.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.response import Response


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="One sentence saying what is wrong")
    field = serializers.CharField(allow_null=True, help_text="The first offending input field, when there is one")
    details = serializers.JSONField(required=False, help_text="Every problem, keyed by field")


_DESCRIPTIONS = {
    400: "Bad input: `field` names the first offending field",
    401: "Not signed in (no or a bad token)",
    403: "Signed in, but your role may not do this",
    404: "No such object, or it belongs to another team",
    409: "The object's current state does not allow this (a job already ended, a newer policy version)",
    413: "The request body is larger than the server takes (`field` is `body`; NPUPORTAL_MAX_REQUEST_BYTES)",
    501: "Not available on this server",
    502: "A service the portal called (a node's agent) did not give the answer it needed",
}


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """Schema entries for the given error statuses, all with :class:`ErrorSerializer`."""
    return {code: OpenApiResponse(ErrorSerializer, description=_DESCRIPTIONS[code]) for code in codes}


def error_response(status: int, message: str, *, field: str | None = None, details: Any = None) -> Response:
    body: dict[str, Any] = {"error": f"{field}: {message}" if field else message, "field": field}
    if details is not None:
        body["details"] = details
    return Response(body, status=status)
