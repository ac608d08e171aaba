"""FilterSets of the devices API (query parameters of the list endpoints)."""

from __future__ import annotations

import django_filters

from devices.models import Device, Node
from npuportal.api import filters as api_filters


class NodeFilterSet(api_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=Node.State.choices)
    chip_model = django_filters.CharFilter(field_name="devices__chip_model", distinct=True)
    removed = api_filters.BooleanFilter(
        field_name="removed_at",
        lookup_expr="isnull",
        exclude=True,
        label="true: the nodes removed from the inventory (kept for their history); default false",
    )

    class Meta:
        model = Node
        fields = ["state", "reachable", "chip_model", "removed"]


class DeviceFilterSet(api_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__name")
    health = django_filters.MultipleChoiceFilter(choices=Device.Health.choices)

    class Meta:
        model = Device
        fields = ["node", "chip_model", "health", "schedulable", "topology_group"]
