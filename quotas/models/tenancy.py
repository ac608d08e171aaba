"""Tenancy: departments, teams, who belongs to them in which role, and the account jobs run as."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models


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
    #: The lead's limits on this member, inside the team's quota (``None``: only the team's apply):
    #: cards (card equivalents) their running jobs hold at once, and jobs they run at once. The
    #: engine enforces them (:mod:`scheduling.engine.member_limits`, reason ``MemberLimit``).
    max_devices = models.FloatField("cards at once", null=True, blank=True)
    max_jobs = models.PositiveIntegerField("jobs at once", null=True, blank=True)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="membership_unique_user_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class TeamInvitation(models.Model):
    """A lead's invitation of an e-mail address; whoever first signs in with it joins the team."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=10, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    #: SHA-256 of the secret in the invitation's link (``/invite/<secret>/``); the secret is not kept.
    token_hash = models.CharField(max_length=64, blank=True, default="", db_index=True, editable=False)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["team__name", "email"]

    def __str__(self) -> str:
        return f"{self.email} invited to {self.team} as {self.role}"

    def accept(self, user: object) -> None:
        from django.utils import timezone

        self.accepted_at = timezone.now()
        self.accepted_by = user  # type: ignore[assignment]
        self.save(update_fields=["accepted_at", "accepted_by"])


#: What ``posix_user`` may hold: a portable POSIX account name, as ``useradd`` takes it.
POSIX_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$"


class UserProfile(models.Model):
    """What the portal knows of a person beyond Django's user: the POSIX account their jobs run as.

    Jobs run on the nodes as their submitter's account (docs/agent.md#accounts): the portal
    username unless an admin sets ``posix_user`` here (a portal name with ``@``, or a site whose
    accounts are named differently).
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    posix_user = models.CharField(
        "POSIX account",
        max_length=32,
        blank=True,
        validators=[RegexValidator(POSIX_NAME_PATTERN, "letters, digits, '_', '.', '-'; at most 32")],
        help_text="The account this user's jobs run as on the nodes; empty: the portal username",
    )

    class Directory(models.TextChoices):
        LOCAL = "", "Local account"
        LDAP = "ldap", "LDAP directory"
        OIDC = "oidc", "Single sign-on (OIDC)"

    #: Where the account comes from: a directory account's teams and roles follow its groups
    #: (:mod:`quotas.directory`), and ``directory sync`` marks it inactive once it leaves.
    directory = models.CharField(max_length=8, choices=Directory.choices, blank=True, default="", editable=False)
    #: Its name in the directory: the LDAP entry's DN, or the OIDC subject (``sub``).
    directory_id = models.CharField(max_length=500, blank=True, default="", editable=False)
    #: The directory groups seen at its last sign-in or sync, as the policy would name them.
    directory_groups = models.JSONField(default=list, blank=True, editable=False)
    directory_seen = models.DateTimeField(null=True, blank=True, editable=False)
    #: When ``directory sync`` found the account gone from the directory and made it inactive;
    #: it is active again when the directory has it back (an admin's own deactivation stays).
    directory_left = models.DateTimeField(null=True, blank=True, editable=False)

    def __str__(self) -> str:
        return f"{self.user} runs as {self.posix_user or self.user.get_username()}"


def posix_account(user: object) -> str:
    """The POSIX account a user's jobs run as: their ``posix_user``, else their portal username."""
    profile = getattr(user, "profile", None) if user is not None else None
    try:
        name = profile.posix_user if profile is not None else ""
    except UserProfile.DoesNotExist:  # pragma: no cover - getattr above already turns it into None
        name = ""
    return name or str(getattr(user, "username", ""))
