"""The devices app in the Django admin. A change here that moves a card's status writes its inventory history."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from devices.models import Device, HealthEvent, InventoryEvent, Node, VnpuTemplate
from devices.services import inventory


def _record_admin_change(request: HttpRequest, devices: list[Device], node: Node, *, added: bool = False) -> None:
    for device in devices:
        device.node = node
    inventory.record(
        devices, cause=f"joined: added in the admin by {request.user}" if added else f"admin: changed by {request.user}"
    )


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0
    fields = ("index", "chip_model", "topology_group", "health", "schedulable", "temp_c", "ecc_errors")
    readonly_fields = ("temp_c", "ecc_errors")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "reachable", "device_count", "agent_url", "last_heartbeat")
    list_filter = ("state", "reachable")
    search_fields = ("name", "agent_url")
    inlines = [DeviceInline]
    exclude = ()
    #: Removing is ``manage.py nodes remove`` (refused while jobs run there), never a field typed in here.
    readonly_fields = ("removed_at",)

    @admin.display(description="devices")
    def device_count(self, obj: Node) -> int:
        return obj.devices.count()

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """After the node and its device rows are saved (same transaction): their history."""
        super().save_related(request, form, formsets, change)
        node = form.instance
        _record_admin_change(request, list(node.devices.all()), node, added=not change)


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "chip_model",
        "topology_group",
        "health",
        "schedulable",
        "temp_c",
        "ecc_errors",
        "last_seen",
    )
    list_filter = ("chip_model", "health", "schedulable", "node")
    search_fields = ("node__name", "chip_model", "topology_group")
    list_select_related = ("node",)

    def save_model(self, request: HttpRequest, obj: Device, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        _record_admin_change(request, [obj], Node.objects.get(pk=obj.node_id))


@admin.register(VnpuTemplate)
class VnpuTemplateAdmin(admin.ModelAdmin):
    list_display = ("name", "chip_model", "memory_mb", "ai_cores", "ai_cpus")
    list_filter = ("chip_model",)
    search_fields = ("name", "chip_model")


@admin.register(HealthEvent)
class HealthEventAdmin(admin.ModelAdmin):
    list_display = ("at", "node", "device", "from_health", "to_health", "reason")
    list_filter = ("to_health", "node")
    search_fields = ("node__name", "reason")
    list_select_related = ("node", "device__node")
    date_hierarchy = "at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(InventoryEvent)
class InventoryEventAdmin(admin.ModelAdmin):
    """Read only: the history chargeback counts capacity from is written by the portal, never edited."""

    list_display = ("at", "node_name", "device", "chip_model", "status", "cause")
    list_filter = ("status", "chip_model", "node_name")
    search_fields = ("node_name", "cause")
    list_select_related = ("device__node",)
    date_hierarchy = "at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
