"""Policy versions: the scheduling policy as its authors wrote it, one version active."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Policy(models.Model):
    """One version of the scheduling policy, kept exactly as its author wrote it.

    Versions are never edited: a change is a new version, so history, diff and
    rollback are plain reads. Exactly one version is active.
    """

    version = models.PositiveIntegerField(unique=True)
    yaml_text = models.TextField()
    is_active = models.BooleanField(default=False)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    comment = models.CharField(max_length=500, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-version"]
        verbose_name_plural = "policies"
        constraints = [
            models.UniqueConstraint(fields=["is_active"], condition=Q(is_active=True), name="policy_one_active")
        ]

    def __str__(self) -> str:
        return f"policy v{self.version}{' (active)' if self.is_active else ''}"
