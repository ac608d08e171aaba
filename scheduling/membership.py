"""Which teams a user acts for: what submitting, cancelling, dependencies and disclosure all ask.

Its own small module, below the services, so each of them asks it without importing the others.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from quotas.models import Membership, Team


def teams_of(user: AbstractBaseUser) -> list[int]:
    """Ids of the teams ``user`` belongs to (unordered: no join for the memberships' default ordering)."""
    return list(Membership.objects.filter(user=user).order_by().values_list("team_id", flat=True))


def can_act_for_team(user: AbstractBaseUser, team: Team) -> bool:
    return bool(user.is_staff) or Membership.objects.filter(user=user, team=team).exists()
