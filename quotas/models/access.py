"""Access: API tokens and the append-only audit log of configuration changes."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """Who changed what in the cluster's configuration, and when: append-only.

    Policy activations, rollbacks, node cordons and drains all land here, so an
    admin asking "who changed this?" reads one list.
    """

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=50, db_index=True)
    target = models.CharField(max_length=200, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.action} {self.target}"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None:
            raise ValueError("audit events are append-only")
        super().save(*args, **kwargs)


class ApiToken(models.Model):
    """A named API token of one user; several per user, each revocable on its own.

    Only a SHA-256 of the key is stored: the key itself is shown once, when the
    token is made. ``prefix`` (the key's first characters) lets a user tell
    their tokens apart in a list.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.user} · {self.name} ({self.prefix}…)"
