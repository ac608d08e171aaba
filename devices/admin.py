"""The devices app in the Django admin. A change here that moves a card's status writes its inventory history."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from devices.models import Device, HealthEvent, InventoryEvent, Node, VnpuTemplate
from devices.services import inventory
from devices.services.registration import agent_url_problem, token_problem


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


class WriteOnlyField(forms.CharField):
    """A secret typed in, never shown: the page gets an empty password box; empty means "keep it"."""

    widget = forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"})

    def has_changed(self, initial: Any, data: Any) -> bool:
        return bool((data or "").strip())


class NodeAdminForm(forms.ModelForm):
    """The node's agent token is write-only here, and checked as ``manage.py nodes add`` checks it.

    Showing the token let anyone who can open the admin page (or look over a shoulder) call the
    agent as the portal. The stored token is never put in the page; typing a new one replaces it.
    """

    agent_token = WriteOnlyField(
        required=False,
        max_length=200,
        strip=True,
        label="Agent token",
        help_text="write-only: the current token is never shown; leave empty to keep it, type a new one to replace it",
    )

    class Meta:
        model = Node
        fields = "__all__"

    def clean_agent_token(self) -> str:
        typed = self.cleaned_data.get("agent_token") or ""
        if not typed:
            return self.instance.agent_token if self.instance.pk else ""
        problem = token_problem(typed)
        if problem:
            raise forms.ValidationError(problem)
        return typed

    def clean_agent_url(self) -> str:
        url = self.cleaned_data.get("agent_url") or ""
        problem = agent_url_problem(url) if url else None
        if problem:
            raise forms.ValidationError(problem)
        return url


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    form = NodeAdminForm
    list_display = ("name", "state", "reachable", "device_count", "agent_url", "last_heartbeat")
    list_filter = ("state", "reachable")
    search_fields = ("name", "agent_url")
    inlines = [DeviceInline]
    exclude = ()
    #: Removing is ``manage.py nodes remove`` (refused while jobs run there), never a field typed in here.
    readonly_fields = ("removed_at", "agent_token_state")

    @admin.display(description="agent token")
    def agent_token_state(self, obj: Node | None) -> str:
        if obj is None or not obj.agent_token:
            return "not set"
        return "set (write-only: never shown)"

    def get_fields(self, request: HttpRequest, obj: Node | None = None) -> list[Any]:
        """Whoever may only view a node sees whether its token is set, never the token itself."""
        fields = list(super().get_fields(request, obj))
        if not self.has_change_permission(request, obj):
            fields = [f for f in fields if f != "agent_token"]
        return fields

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
