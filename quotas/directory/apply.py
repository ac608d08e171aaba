"""Put what the directory says on a user: their teams, roles, finance and admin, audited.

Sign-ins (LDAP and OIDC) and ``manage.py directory sync`` call :func:`apply_directory`; it changes
only what the directory decides: memberships of the teams the policy runs from the directory (a
membership of any other team is the lead's or an admin's to change, not the directory's), the
finance group and staff status when ``spec.directory`` names their groups, and never a superuser's
staff status (the break-glass account stays what it is).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractUser, Group
from django.db import transaction
from django.utils import timezone

from quotas.directory.groups import LEAD, Groups, directory_teams, roles_for
from quotas.models import AuditEvent, Membership, Team, UserProfile
from quotas.policies.versions import active_policy
from quotas.tenancy.roles import FINANCE_GROUP

log = logging.getLogger(__name__)


class DirectoryRefused(Exception):
    """The directory vouches for a name that a local account (a break-glass admin) already holds."""


@dataclass
class Applied:
    """What one application changed, one line per change (empty: it already matched)."""

    changes: list[str] = field(default_factory=list)


def claim_check(user: AbstractUser, source: str) -> None:
    """Refuse a directory sign-in that would take over a local admin account of the same name.

    Local staff accounts with a password are the break-glass way in when the directory is down;
    a directory (or an identity provider that vouches for any subject) must not become them.
    """
    profile = UserProfile.objects.filter(user=user).first()
    local = profile is None or profile.directory == UserProfile.Directory.LOCAL
    if local and (user.is_staff or user.is_superuser) and user.has_usable_password():
        raise DirectoryRefused(
            f"{user.get_username()!r} is a local admin account; a {source} sign-in does not take it over"
        )


def apply_directory(
    user: AbstractUser,
    *,
    source: str,
    directory_id: str,
    groups: Iterable[str],
    via: str,
) -> Applied:
    """Make ``user``'s teams and roles what ``groups`` give under the active policy.

    ``source`` is ``ldap`` or ``oidc``; ``via`` says in the audit log what applied it ("ldap sign-in",
    "directory sync"). Returns the changes made; each is also an audit event.
    """
    group_list = sorted({g for g in groups if g})
    policy = active_policy().policy
    wanted = roles_for(policy, Groups.of(group_list))
    managed = set(directory_teams(policy))
    applied = Applied()
    name = user.get_username()

    def audit(action: str, detail: str) -> None:
        applied.changes.append(detail)
        AuditEvent.objects.create(actor=None, action=action, target=name[:200], detail=f"{detail} ({via})"[:2000])

    with transaction.atomic():
        profile, _ = UserProfile.objects.select_for_update().get_or_create(user=user)
        if profile.directory_left is not None and not user.is_active:
            user.is_active = True
            user.save(update_fields=["is_active"])
            audit("directory.return", "back in the directory: active again")
        profile.directory = source
        profile.directory_id = directory_id[:500]
        profile.directory_groups = group_list
        profile.directory_seen = timezone.now()
        profile.directory_left = None
        profile.save()

        current = {
            m.team.name: m for m in Membership.objects.filter(user=user, team__name__in=managed).select_related("team")
        }
        for team_name, membership in current.items():
            if team_name not in wanted.teams:
                membership.delete()
                audit("directory.leave", f"left team {team_name}: not in its directory group")
        for team_name, role in sorted(wanted.teams.items()):
            membership = current.get(team_name)
            if membership is None:
                team, created = Team.objects.get_or_create(name=team_name)
                if created:
                    AuditEvent.objects.create(
                        actor=None,
                        action="team.create",
                        target=team_name,
                        detail=f"named by the policy's directory groups ({via})",
                    )
                Membership.objects.create(user=user, team=team, role=role)
                audit("directory.join", f"joined team {team_name} as {_role_word(role)}")
            elif membership.role != role:
                membership.role = role
                membership.save(update_fields=["role"])
                audit("directory.role", f"in team {team_name}: now {_role_word(role)}")

        if wanted.finance is not None:
            finance, _ = Group.objects.get_or_create(name=FINANCE_GROUP)
            has = user.groups.filter(pk=finance.pk).exists()
            if wanted.finance and not has:
                user.groups.add(finance)
                audit("directory.role", "now finance")
            elif has and not wanted.finance:
                user.groups.remove(finance)
                audit("directory.role", "no longer finance")
        if wanted.admin is not None and not user.is_superuser and user.is_staff != wanted.admin:
            user.is_staff = wanted.admin
            user.save(update_fields=["is_staff"])
            audit("directory.role", "now an admin" if wanted.admin else "no longer an admin")
    if applied.changes:
        log.info("directory: %s: %s", name, "; ".join(applied.changes))
    return applied


def _role_word(role: str) -> str:
    return "lead" if role == LEAD else "member"


def mark_left(user: AbstractUser, *, via: str) -> bool:
    """The directory no longer has ``user``: inactive, memberships of directory-run teams dropped.

    Jobs, outputs, usage and statements stay: they are the team's history. Returns whether
    anything changed (a user already marked is left alone).
    """
    with transaction.atomic():
        profile, _ = UserProfile.objects.select_for_update().get_or_create(user=user)
        if profile.directory_left is not None and not user.is_active:
            return False
        profile.directory_left = timezone.now()
        profile.save(update_fields=["directory_left"])
        was_active = user.is_active
        user.is_active = False
        user.save(update_fields=["is_active"])
        managed = set(directory_teams(active_policy().policy))
        dropped = sorted(
            Membership.objects.filter(user=user, team__name__in=managed).values_list("team__name", flat=True)
        )
        Membership.objects.filter(user=user, team__name__in=managed).delete()
        detail = "no longer in the directory: inactive" + (f"; left {', '.join(dropped)}" if dropped else "")
        AuditEvent.objects.create(
            actor=None, action="directory.left", target=user.get_username()[:200], detail=f"{detail} ({via})"
        )
        return was_active or bool(dropped)


def is_directory_team(team_name: str) -> bool:
    """Whether the active policy runs this team's membership from the directory."""
    team = active_policy().policy.teams.get(team_name)
    return team is not None and team.directory is not None
