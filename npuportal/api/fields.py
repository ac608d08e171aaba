"""Serializer fields that take only the JSON type the schema documents for them.

DRF's fields coerce: ``CharField`` takes ``0`` as ``"0"``, ``IntegerField`` takes
``"5"`` and ``5.0``. A client that sends the wrong type has a bug it should hear
about, and the OpenAPI schema says ``string``/``integer``: these refuse anything
else with a 400 naming the field, so what is accepted is what is documented.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from rest_framework import serializers


class CharField(serializers.CharField):
    default_error_messages = {"invalid": "must be a string"}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class RegexField(serializers.RegexField):
    default_error_messages = {"invalid": "must be a string"}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class IntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "must be a whole number"}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class Rule(RegexValidator):
    """A field's check that lives in a service (``problem``: the reason, or ``None``), with its pattern.

    The OpenAPI schema shows ``pattern`` (drf-spectacular reads it off a ``RegexValidator``);
    the value is judged by ``problem`` alone, so the API, the command line and the admin give
    the same reason for the same value. The pattern is what a client can check up front; the
    service may refuse more (a port past 65535), never less.
    """

    def __init__(self, pattern: str, problem: Callable[[str], str | None]) -> None:
        super().__init__(pattern)
        self.problem = problem

    def __call__(self, value: Any) -> None:
        found = self.problem(str(value))
        if found:
            raise ValidationError(found)


class InputSerializer(serializers.Serializer):
    """A request body: a JSON object with only the documented fields (the schema says so too).

    A misspelt field (``"share": 60``) was ignored, and the request did something else
    than asked without a word; here it is a 400 naming it.
    """

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in data if key not in self.fields)
            if unknown:
                known = ", ".join(self.fields)
                raise serializers.ValidationError({unknown[0]: [f"unknown field; this body takes {known}"]})
        return super().to_internal_value(data)
