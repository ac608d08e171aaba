"""Teams, who belongs to them, and the versioned scheduling policy."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Department(models.Model):
    """The level above teams in the fair-share tree."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Team(models.Model):
    """A group that owns jobs, quota and a bill. Its ``name`` is how the policy refers to it."""

    name = models.SlugField(max_length=100, unique=True)
    department = models.ForeignKey(Department, null=True, blank=True, on_delete=models.SET_NULL, related_name="teams")
    description = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        LEAD = "lead", "Team lead"
        MEMBER = "member", "Member"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="membership_unique_user_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


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
