"""Quota change requests: a team lead asks for more (or less) quota for a period; an admin decides."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from quotas.models.policies import Policy
from quotas.models.tenancy import Team


class QuotaRequest(models.Model):
    """ "+16 x 910B4 max, 2026-12-10 to 2026-12-20, for the paper deadline": filed, then approved or refused.

    Approval writes a new policy version with a dated schedule on the team (named ``request-<id>``),
    so the change is in force on those dates only and the policy history says who asked and who approved.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Waiting for an admin"
        APPROVED = "approved", "Approved"
        REFUSED = "refused", "Refused"
        WITHDRAWN = "withdrawn", "Withdrawn"

    class Field(models.TextChoices):
        GUARANTEED = "guaranteed", "guaranteed"
        MAX = "max", "max"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quota_requests")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    field = models.CharField(max_length=10, choices=Field.choices)
    #: ``devices`` or ``devices/<chip model>``, as in the policy.
    resource = models.CharField(max_length=60)
    #: Cards more (or, negative, fewer) than the team's base quota, over the period.
    change = models.FloatField()
    first_day = models.DateField()
    last_day = models.DateField()
    justification = models.TextField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    #: The admin's reason for a refusal, or their note on an approval.
    decision_note = models.TextField(blank=True)
    #: The policy version the approval wrote.
    policy = models.ForeignKey(Policy, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    #: The dry run shown to the admin (``quotas.policies.dryrun``), kept so the page is quick.
    dry_run = models.JSONField(null=True, blank=True)
    #: Whether the lead has seen the decision on their dashboard.
    seen_by_lead = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"quota request #{self.pk} of {self.team}: {self.summary}"

    @property
    def schedule_name(self) -> str:
        return f"request-{self.pk}"

    @property
    def summary(self) -> str:
        sign = "+" if self.change >= 0 else "−"
        amount = abs(self.change)
        amount_text = f"{amount:g}"
        return f"{sign}{amount_text} {self.resource} {self.field}, {self.first_day} to {self.last_day}"
