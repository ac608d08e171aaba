"""Serializer fields that take only the JSON type the schema documents for them.

DRF's fields coerce: ``CharField`` takes ``0`` as ``"0"``, ``IntegerField`` takes
``"5"`` and ``5.0``. A client that sends the wrong type has a bug it should hear
about, and the OpenAPI schema says ``string``/``integer``: these refuse anything
else with a 400 naming the field, so what is accepted is what is documented.
"""

from __future__ import annotations

from typing import Any

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
