"""Who may see what through the API: admins (``is_staff``), team leads, members.

The rule everywhere: another team's objects are *not found* (404), so ids and
names cannot be probed; an action your role may not take on something you can
see is *forbidden* (403).
"""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from quotas.models import Membership, Team
from quotas.tenancy import visibility
from quotas.tenancy.visibility import is_admin

ADMIN, LEAD, MEMBER = "admin", Membership.Role.LEAD.value, Membership.Role.MEMBER.value


def visible_teams(user: object) -> QuerySet[Team]:
    """Admins: every team; everyone else: the teams they belong to (:mod:`quotas.tenancy.visibility`)."""
    return visibility.visible_teams(user).select_related("department")


def role_in(user: object, team: Team) -> str | None:
    """``admin``, ``lead``, ``member`` or ``None`` (not in the team)."""
    if is_admin(user):
        return ADMIN
    return Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()


def require_lead(user: object, team: Team) -> None:
    """403 unless ``user`` leads ``team`` or is an admin (call after the team was found visible)."""
    if role_in(user, team) not in (ADMIN, LEAD):
        raise PermissionDenied(f"only the leads of team {team.name} and admins may see this")


class IsAdmin(BasePermission):
    """Admins only; everyone else (signed in) gets 403."""

    message = "admins only"

    def has_permission(self, request: Request, view: object) -> bool:
        return is_admin(request.user)
