"""Nodes, their accelerator devices and the vNPU slice shapes they offer."""

from __future__ import annotations

from django.db import models


class Node(models.Model):
    """An accelerator server with an agent that reports health and runs jobs."""

    class State(models.TextChoices):
        READY = "ready", "Ready"
        CORDONED = "cordoned", "Cordoned"  # no new work; running work stays
        DRAINING = "draining", "Draining"  # no new work; running work finishes
        DRAINED = "drained", "Drained"  # was draining and nothing runs any more: ready to be serviced
        DOWN = "down", "Down"

    name = models.CharField(max_length=100, unique=True)
    agent_url = models.URLField(blank=True, help_text="Base URL of the node agent, e.g. http://10.0.0.5:8470")
    agent_token = models.CharField(max_length=200, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.READY)
    #: The executor took the node out of service (Slurm drained it), not an operator: it follows the
    #: executor back to ``ready`` (``devices.slurm.health``); an operator's cordon or drain stays until uncordoned.
    state_from_executor = models.BooleanField(default=False)
    reachable = models.BooleanField(default=True)
    missed_polls = models.PositiveIntegerField(default=0)
    #: Polls answered in a row: an unreachable node takes work again only after ``AGENT_REJOIN_POLLS`` of them.
    answered_polls = models.PositiveIntegerField(default=0)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    last_poll_error = models.CharField(
        max_length=500, blank=True, help_text="Why the last agent poll failed or was partial; empty when it was clean"
    )
    created = models.DateTimeField(auto_now_add=True)
    #: When the node left the inventory (``manage.py nodes remove``). Its rows stay, because past
    #: allocations and statements point at its devices; a removed node is no longer scheduled or polled.
    removed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def accepts_work(self) -> bool:
        return self.state == self.State.READY and self.reachable

    @property
    def drained(self) -> bool:
        """A drain that has finished: nothing runs on the node any more, it can be serviced.

        Stored as a state of its own (``devices.services.draining`` sets it when the last allocation
        closes), so the console, the API and ``npuctl nodes`` read one field.
        """
        return self.state == self.State.DRAINED


class Device(models.Model):
    """One accelerator chip, the unit the scheduler hands out."""

    class Health(models.TextChoices):
        HEALTHY = "healthy", "Healthy"
        WARNING = "warning", "Warning"  # still takes work
        DEGRADED = "degraded", "Degraded"  # no new work
        FAILED = "failed", "Failed"  # work is evicted
        UNKNOWN = "unknown", "Unknown"

    #: Health states in which a device may take new work.
    USABLE_HEALTH = frozenset({Health.HEALTHY, Health.WARNING})

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveIntegerField()
    chip_model = models.CharField(max_length=50, db_index=True)
    hbm_mb = models.PositiveIntegerField(default=0)
    ai_cores = models.PositiveIntegerField(default=0)
    ai_cpus = models.PositiveIntegerField(default=0)
    topology_group = models.CharField(max_length=50, blank=True, help_text="HCCS ring or group inside the node")
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.HEALTHY)
    health_detail = models.CharField(max_length=300, blank=True)
    healthy_streak = models.PositiveIntegerField(default=0)
    schedulable = models.BooleanField(default=True)
    temp_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    aicore_pct = models.FloatField(null=True, blank=True)
    hbm_used_mb = models.PositiveIntegerField(null=True, blank=True)
    ecc_errors = models.PositiveIntegerField(default=0)
    last_seen = models.DateTimeField(null=True, blank=True)
    #: What holds the card outside npuportal, as its executor last saw it (a job submitted to Slurm
    #: directly: ``Slurm job 42 of alice``); empty when nothing does. The tick never gives such a card.
    outside_use = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="device_unique_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index} ({self.chip_model})"

    @property
    def usable(self) -> bool:
        return self.schedulable and self.health in self.USABLE_HEALTH and not self.outside_use


class VnpuTemplate(models.Model):
    """A vNPU slice shape, e.g. ``vir05_1c_8g`` on 910B4 or ``vir02`` on 310P3."""

    chip_model = models.CharField(max_length=50)
    name = models.CharField(max_length=50)
    memory_mb = models.PositiveIntegerField()
    ai_cores = models.PositiveIntegerField()
    ai_cpus = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["chip_model", "ai_cores", "name"]
        constraints = [
            models.UniqueConstraint(fields=["chip_model", "name"], name="vnpu_template_unique_name_per_chip")
        ]

    def __str__(self) -> str:
        return f"{self.name} on {self.chip_model}"


class HealthEvent(models.Model):
    """Append-only history of health: every transition of a device, and a node going unreachable or back.

    Device transitions use the ``Device.Health`` values; node-level events (``device`` empty) go between
    ``reachable`` and ``unreachable``.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_events")
    device = models.ForeignKey(Device, null=True, blank=True, on_delete=models.CASCADE, related_name="health_events")
    at = models.DateTimeField(db_index=True)
    from_health = models.CharField(max_length=16, blank=True)
    to_health = models.CharField(max_length=16)
    reason = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            models.Index(fields=["node", "at"], name="healthevent_node_at"),
            models.Index(fields=["device", "at"], name="healthevent_device_at"),
        ]

    def __str__(self) -> str:
        what = str(self.device) if self.device_id else self.node.name
        return f"{what}: {self.from_health or '-'} → {self.to_health} ({self.reason})"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            raise ValueError("health events are append-only")
        super().save(*args, **kwargs)


class InventoryEvent(models.Model):
    """Append-only history of the inventory: from ``at`` on, ``device`` is in ``status`` (until its next event).

    Chargeback counts capacity from it: a card is provisioned from its first event to its ``removed``
    one, and each stretch is used (by jobs), unavailable (any status but ``usable``: paid for, not
    usable, with its ``cause``) or idle. ``devices.services.inventory`` writes it; every path that
    changes a node's state, a device's health or schedulability, or adds or removes a node calls it.
    ``chip_model`` and ``node_name`` are copies, so a statement reads the history without joins.
    """

    class Status(models.TextChoices):
        USABLE = "usable", "Usable"  # in service: schedulable, healthy, its node ready and reachable
        CORDONED = "cordoned", "Cordoned"
        DRAINING = "draining", "Draining"
        DRAINED = "drained", "Drained"
        DOWN = "down", "Node down or unreachable"
        UNHEALTHY = "unhealthy", "Unhealthy"  # degraded, failed or unknown
        OUTSIDE = "outside", "In use outside npuportal"  # a job submitted to Slurm directly holds it
        DISABLED = "disabled", "Disabled"  # the card is marked unschedulable
        REMOVED = "removed", "Removed"  # left the inventory

    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="inventory_events")
    node_name = models.CharField(max_length=100)
    chip_model = models.CharField(max_length=50)
    at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices)
    cause = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            models.Index(fields=["device", "at"], name="inventoryevent_device_at"),
            models.Index(fields=["at"], name="inventoryevent_at"),
        ]

    def __str__(self) -> str:
        return f"{self.node_name}/{self.device_id} {self.status} from {self.at:%Y-%m-%d %H:%M} ({self.cause})"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            raise ValueError("inventory events are append-only")
        super().save(*args, **kwargs)
