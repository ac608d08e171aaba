from django.contrib import admin

from devices.models import Device, HealthEvent, Node, VnpuTemplate


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

    @admin.display(description="devices")
    def device_count(self, obj: Node) -> int:
        return obj.devices.count()


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
