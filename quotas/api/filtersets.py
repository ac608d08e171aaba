"""FilterSets of the quotas API (query parameters of the list endpoints)."""

from __future__ import annotations

import django_filters

from npuportal.api import filters as api_filters
from quotas.models import Policy, Team


class TeamFilterSet(api_filters.FilterSet):
    department = django_filters.CharFilter(field_name="department__name")

    class Meta:
        model = Team
        fields = ["department"]


class PolicyFilterSet(api_filters.FilterSet):
    active = api_filters.BooleanFilter(field_name="is_active")
    author = django_filters.CharFilter(field_name="author__username")

    class Meta:
        model = Policy
        fields = ["active", "author"]
