"""Serializers of the devices API. Agent tokens are never serialized; agent URLs only to admins."""

from __future__ import annotations

from rest_framework import serializers

from devices.models import Device, Node
from devices.services import registration
from npuportal.api import fields


class DeviceSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    busy = serializers.BooleanField(read_only=True, help_text="Holds at least one running allocation")
    usable = serializers.BooleanField(
        read_only=True, help_text="May take new work (schedulable, healthy, not in use outside npuportal)"
    )

    class Meta:
        model = Device
        fields = [
            "id",
            "node",
            "index",
            "chip_model",
            "hbm_mb",
            "ai_cores",
            "ai_cpus",
            "topology_group",
            "health",
            "health_detail",
            "schedulable",
            "outside_use",
            "usable",
            "busy",
            "temp_c",
            "power_w",
            "aicore_pct",
            "hbm_used_mb",
            "ecc_errors",
            "last_seen",
        ]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    agent_url = serializers.SerializerMethodField(help_text="Admins only; null for everyone else")
    chip_models = serializers.SerializerMethodField()
    devices_total = serializers.SerializerMethodField()
    devices_free = serializers.SerializerMethodField(help_text="Usable and holding no allocation")
    devices_busy = serializers.SerializerMethodField()
    devices_unhealthy = serializers.SerializerMethodField(help_text="Degraded, failed or unknown health")

    class Meta:
        model = Node
        fields = [
            "name",
            "state",
            "reachable",
            "missed_polls",
            "answered_polls",
            "last_heartbeat",
            "labels",
            "agent_url",
            "chip_models",
            "devices_total",
            "devices_free",
            "devices_busy",
            "devices_unhealthy",
            "removed_at",
        ]
        read_only_fields = fields

    def _devices(self, obj: Node) -> list[Device]:
        return list(obj.devices.all())  # prefetched by the view

    def get_agent_url(self, obj: Node) -> str | None:
        request = self.context.get("request")
        return obj.agent_url if request is not None and request.user.is_staff else None

    def get_chip_models(self, obj: Node) -> list[str]:
        return sorted({d.chip_model for d in self._devices(obj)})

    def get_devices_total(self, obj: Node) -> int:
        return len(self._devices(obj))

    def get_devices_free(self, obj: Node) -> int:
        return sum(1 for d in self._devices(obj) if d.usable and not getattr(d, "busy", False))

    def get_devices_busy(self, obj: Node) -> int:
        return sum(1 for d in self._devices(obj) if getattr(d, "busy", False))

    def get_devices_unhealthy(self, obj: Node) -> int:
        return sum(1 for d in self._devices(obj) if d.health not in Device.USABLE_HEALTH)


class NodeDetailSerializer(NodeSerializer):
    devices = DeviceSerializer(many=True, read_only=True)

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "devices"]
        read_only_fields = fields


class NodeCreateSerializer(fields.InputSerializer):
    """``POST /api/v1/nodes/``: the portal asks the agent at ``agent_url`` for the node's devices."""

    name = fields.CharField(
        max_length=100,
        help_text="Letters, digits, '-', '_' or '.'",
        validators=[fields.Rule(r"^[-a-zA-Z0-9_.]{1,100}$", registration.name_problem)],
    )
    agent_url = fields.CharField(
        max_length=200,
        help_text="The agent's base URL, e.g. http://10.0.0.5:8471: http or https, a host, a port from 1 to "
        "65535 and a path if any; visible ASCII only (a host name in its xn-- form); no user, password, "
        "query or fragment",
        validators=[fields.Rule(registration.AGENT_URL_PATTERN, registration.agent_url_problem)],
    )
    token = fields.CharField(
        max_length=200,
        write_only=True,
        help_text="The agent's token (its --token-file): visible ASCII characters, no spaces (it travels in an "
        "HTTP header)",
        validators=[fields.Rule(r"^[!-~]{1,200}$", registration.token_problem)],
    )


class NodeOperationSerializer(fields.InputSerializer):
    reason = fields.CharField(max_length=300, required=False, allow_blank=True, default="")
