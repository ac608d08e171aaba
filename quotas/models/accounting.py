"""Usage accounting and chargeback (docs/chargeback.md; the logic is in ``quotas/accounting/``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from quotas.models.tenancy import Team


class UsageRecord(models.Model):
    """One allocation's time inside one calendar month (on the policy's clock), written once.

    ``(allocation_id, month)`` is unique, so the sweep that writes these can be
    retried any number of times without counting an interval twice. The
    allocation is referenced by id, not by a foreign key: a bill must outlive a
    deleted job. ``device_share`` is the card equivalent (1 for a whole card, the
    slice's share for a vNPU), rounded to a millionth of a card.
    """

    allocation_id = models.BigIntegerField()
    month = models.CharField(max_length=7, help_text="YYYY-MM on the policy's clock")
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="usage_records")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="usage_records"
    )
    job = models.ForeignKey(
        "scheduling.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="usage_records"
    )
    chip_model = models.CharField(max_length=50)
    vnpu_template = models.CharField(max_length=50, blank=True)
    device_share = models.DecimalField(max_digits=9, decimal_places=6)
    priority_class = models.CharField(max_length=50)
    start = models.DateTimeField()
    end = models.DateTimeField()
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["start", "id"]
        constraints = [
            models.UniqueConstraint(fields=["allocation_id", "month"], name="usagerecord_one_per_allocation_month"),
        ]
        indexes = [models.Index(fields=["month", "team"], name="usagerecord_month_team")]

    def __str__(self) -> str:
        return f"{self.month} {self.team} allocation {self.allocation_id}"


class RateCard(models.Model):
    """Prices and charging rules in force from ``effective_from`` (00:00 on the policy's clock) until the next card."""

    class IdleMode(models.TextChoices):
        HIDE = "hide", "Hide: idle capacity is not charged"
        SEPARATE = "separate", "Separate: an idle line on the cluster statement"
        SHARE_BY_USAGE = "share-by-usage", "Share among teams by their usage"
        SHARE_BY_GUARANTEE = "share-by-guarantee", "Share among teams by their guaranteed devices"

    class ReservedMode(models.TextChoices):
        HIDE = "hide", "Hide: unused reservations count as idle"
        TO_CLASS_USERS = "to-class-users", "Charge the reserved classes' users"
        SHARE_BY_USAGE = "share-by-usage", "Share among teams by their usage of the reserved chips"

    effective_from = models.DateField(unique=True)
    currency = models.CharField(max_length=3, default="CNY")
    idle_mode = models.CharField(max_length=20, choices=IdleMode.choices, default=IdleMode.SEPARATE)
    reserved_mode = models.CharField(max_length=20, choices=ReservedMode.choices, default=ReservedMode.HIDE)
    comment = models.CharField(max_length=500, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-effective_from"]

    def __str__(self) -> str:
        return f"rate card from {self.effective_from} ({self.currency})"


class Rate(models.Model):
    """Price of one card-equivalent hour of a chip model (optionally of one vNPU template) on a rate card."""

    rate_card = models.ForeignKey(RateCard, on_delete=models.CASCADE, related_name="rates")
    chip_model = models.CharField(max_length=50)
    vnpu_template = models.CharField(
        max_length=50, blank=True, help_text="Empty: whole cards, and slices without a rate of their own"
    )
    price_per_device_hour = models.DecimalField(max_digits=12, decimal_places=4)

    class Meta:
        ordering = ["chip_model", "vnpu_template"]
        constraints = [
            models.UniqueConstraint(
                fields=["rate_card", "chip_model", "vnpu_template"], name="rate_one_per_card_chip_template"
            )
        ]

    def __str__(self) -> str:
        what = f"{self.chip_model}/{self.vnpu_template}" if self.vnpu_template else self.chip_model
        return f"{what}: {self.price_per_device_hour}/device-hour"


class ClassMultiplier(models.Model):
    """Factor on the price of usage in one priority class (a class without one pays ×1)."""

    rate_card = models.ForeignKey(RateCard, on_delete=models.CASCADE, related_name="multipliers")
    priority_class = models.CharField(max_length=50)
    multiplier = models.DecimalField(max_digits=6, decimal_places=3)

    class Meta:
        ordering = ["priority_class"]
        constraints = [
            models.UniqueConstraint(fields=["rate_card", "priority_class"], name="multiplier_one_per_card_class")
        ]

    def __str__(self) -> str:
        return f"{self.priority_class} ×{self.multiplier}"


class Budget(models.Model):
    """A team's monthly spending budget; e-mails its leads when month-to-date cost crosses each threshold."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="budget")
    monthly_amount = models.DecimalField(max_digits=14, decimal_places=2)
    alert_thresholds = models.CharField(
        max_length=100, default="50,80,100", help_text="Percentages of the monthly amount, comma-separated"
    )

    class Meta:
        ordering = ["team__name"]

    def __str__(self) -> str:
        return f"{self.team}: {self.monthly_amount}/month"

    def thresholds(self) -> list[int]:
        """The thresholds as whole percentages, ascending; unparsable parts are ignored."""
        found = set()
        for part in self.alert_thresholds.split(","):
            part = part.strip()
            if part.isdigit() and 0 < int(part) <= 1000:
                found.add(int(part))
        return sorted(found)


class BudgetAlert(models.Model):
    """A budget alert that was sent: at most one per team, month and threshold."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="budget_alerts")
    month = models.CharField(max_length=7)
    threshold = models.PositiveIntegerField()
    amount = models.DecimalField(max_digits=14, decimal_places=2, help_text="Month-to-date cost when it was sent")
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-sent_at"]
        constraints = [
            models.UniqueConstraint(fields=["team", "month", "threshold"], name="budgetalert_once_per_threshold")
        ]

    def __str__(self) -> str:
        return f"{self.team} {self.month} {self.threshold}%"


class ClosedStatementError(ValueError):
    """A closed statement (or one of its lines) was about to be changed or deleted."""


class StatementQuerySet(models.QuerySet):
    def update(self, **kwargs: object) -> int:
        if self.filter(closed_at__isnull=False).exists():
            raise ClosedStatementError("closed statements are immutable: add an adjustment line instead")
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        if self.filter(closed_at__isnull=False).exists():
            raise ClosedStatementError("closed statements cannot be deleted")
        return super().delete()


class Statement(models.Model):
    """A team's bill for one month, frozen at the monthly close; ``team`` empty is the cluster's own statement.

    Everything needed to explain it is stored on it: the rules (idle and reserved
    modes), the rate cards and policy version that priced it, the timezone its
    month is on. Once ``closed_at`` is set nothing changes but ``total``, and only
    to the sum of its lines when an adjustment line is added.
    """

    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="statements")
    month = models.CharField(max_length=7)
    currency = models.CharField(max_length=3)
    idle_mode = models.CharField(max_length=20)
    reserved_mode = models.CharField(max_length=20)
    rate_card_ids = models.JSONField(default=list)
    policy_version = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64)
    total = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    #: The cluster statement's record of the month's balance per chip model (provisioned = used +
    #: unused reservations + unavailable + idle; what was charged and what was not), frozen at the
    #: close as decimal strings; empty on team statements. ``quotas.accounting.statements.ChipStats``.
    balance = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    objects = StatementQuerySet.as_manager()

    class Meta:
        ordering = ["-month", "team__name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "month"], name="statement_one_per_team_month"),
            models.UniqueConstraint(
                fields=["month"], condition=Q(team__isnull=True), name="statement_one_cluster_per_month"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team.name if self.team_id else 'cluster'} {self.month}"

    @property
    def is_closed(self) -> bool:
        return self.closed_at is not None

    def lines_total(self) -> object:
        """The sum of the stored lines' amounts (a ``Decimal``), added up exactly in Python."""
        from decimal import Decimal

        amounts = self.lines.values_list("amount", flat=True)
        return sum((Decimal(a) for a in amounts), Decimal("0.00"))

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            stored = type(self).objects.filter(pk=self.pk).values_list("closed_at", flat=True).first()
            if stored is not None:
                fields = kwargs.get("update_fields")
                if not fields or set(fields) != {"total"} or self.total != self.lines_total():
                    raise ClosedStatementError(
                        f"statement {self} is closed: it is immutable (add an adjustment line instead)"
                    )
        super().save(*args, **kwargs)

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        if self.pk is not None and type(self).objects.filter(pk=self.pk, closed_at__isnull=False).exists():
            raise ClosedStatementError(f"statement {self} is closed and cannot be deleted")
        return super().delete(*args, **kwargs)


class StatementLineQuerySet(models.QuerySet):
    def update(self, **kwargs: object) -> int:
        if self.filter(statement__closed_at__isnull=False).exists():
            raise ClosedStatementError("lines of closed statements are immutable")
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        if self.filter(statement__closed_at__isnull=False).exists():
            raise ClosedStatementError("lines of closed statements cannot be deleted")
        return super().delete()


class StatementLine(models.Model):
    """One priced line: ``device_hours`` × ``rate`` × ``multiplier``, rounded half-up to the cent.

    Capacity lines (unused reservation, unavailable, idle) of a chip share the month's rounding
    remainder, so a month charges provisioned × rate to the cent: their amount may differ from
    ``device_hours × rate`` by a cent (docs/chargeback.md, "Rounding").
    """

    class Kind(models.TextChoices):
        USAGE = "usage", "Usage"
        IDLE = "idle", "Idle capacity"
        RESERVED = "reserved", "Unused reservation"
        UNAVAILABLE = "unavailable", "Unavailable capacity"  # paid for, not usable: cordoned, down, unhealthy
        ADJUSTMENT = "adjustment", "Adjustment"

    statement = models.ForeignKey(Statement, on_delete=models.PROTECT, related_name="lines")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    chip_model = models.CharField(max_length=50, blank=True)
    vnpu_template = models.CharField(max_length=50, blank=True)
    priority_class = models.CharField(max_length=50, blank=True)
    device_hours = models.DecimalField(max_digits=18, decimal_places=6, default=0)
    rate = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    multiplier = models.DecimalField(max_digits=6, decimal_places=3, default=1)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    rate_card = models.ForeignKey(RateCard, null=True, blank=True, on_delete=models.PROTECT, related_name="lines")
    description = models.CharField(max_length=300, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created = models.DateTimeField(auto_now_add=True)

    objects = StatementLineQuerySet.as_manager()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.statement} {self.kind} {self.chip_model} {self.amount}"

    def save(self, *args: object, **kwargs: object) -> None:
        closed = Statement.objects.filter(pk=self.statement_id, closed_at__isnull=False).exists()
        if closed and (self.pk is not None or self.kind != self.Kind.ADJUSTMENT):
            raise ClosedStatementError(
                f"statement {self.statement} is closed: only new adjustment lines may be added to it"
            )
        super().save(*args, **kwargs)

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        if Statement.objects.filter(pk=self.statement_id, closed_at__isnull=False).exists():
            raise ClosedStatementError(f"lines of closed statement {self.statement} cannot be deleted")
        return super().delete(*args, **kwargs)
