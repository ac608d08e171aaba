"""Filters that refuse what they cannot read, as the schema documents them, instead of ignoring it.

django-filter drops a value it cannot read: ``?reachable=maybe`` and ``?submitted_after=``
filtered nothing and answered every row, which looks like an answer to the question
asked. Here such a value is a 400 naming the parameter, like every other bad input.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db import models


class BooleanField(forms.Field):
    """``true`` or ``false`` (any case), as OpenAPI writes a boolean in a query string."""

    default_error_messages = {"invalid": "must be true or false"}

    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        text = str(value).strip().lower()
        if text not in ("true", "false"):
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        return text == "true"


class BooleanFilter(django_filters.BooleanFilter):
    field_class = BooleanField


class FilterSet(django_filters.FilterSet):
    """A FilterSet whose booleans are strict and whose typed filters refuse an empty value.

    An empty value of a free-text filter (``?chip_model=``) still means "no filter";
    of a boolean, choice or time filter it is a 400, since no row could match it.
    """

    # Model boolean fields named in ``Meta.fields`` get the strict filter too.
    FILTER_DEFAULTS = {**django_filters.FilterSet.FILTER_DEFAULTS, models.BooleanField: {"filter_class": BooleanFilter}}

    def is_valid(self) -> bool:
        super().is_valid()
        for name, field in self.form.fields.items():
            if isinstance(field, forms.CharField) or name not in self.data:
                continue
            values = self.data.getlist(name) if hasattr(self.data, "getlist") else [self.data.get(name)]
            if any(value == "" for value in values) and name not in self.form.errors:
                self.form.add_error(name, "must not be empty")
        return not self.form.errors
