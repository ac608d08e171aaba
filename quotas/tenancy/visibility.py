"""Who sees which team's things: the one rule behind every list, page, fragment and API answer.

An admin (``is_staff``) sees every team; anyone else the teams they are a member of; someone not
signed in, none. Jobs, their events and outputs, devices in use, quotas, statements: whatever
belongs to a team is shown through these functions, so the console, its live fragments and the API
cannot disagree about what a member of another team may learn. A thing the user may not see is
answered like one that does not exist (the callers' 404s), so names cannot be probed.
"""

from __future__ import annotations

from typing import TypeVar

from django.db.models import Model, QuerySet

from quotas.models import Membership, Team

M = TypeVar("M", bound=Model)


def is_admin(user: object) -> bool:
    """A signed-in admin (staff): sees every team."""
    return bool(getattr(user, "is_authenticated", False) and getattr(user, "is_staff", False))


def visible_team_ids(user: object) -> frozenset[int] | None:
    """Ids of the teams ``user`` sees; ``None`` for an admin, who sees all (one small query otherwise).

    Read as values rather than joined: a list filtered on them walks the (team, …) indexes and stops
    at the page's end, where a join through memberships sorts every row of the teams.
    """
    if is_admin(user):
        return None
    if not getattr(user, "is_authenticated", False):
        return frozenset()
    return frozenset(Membership.objects.filter(user=user).order_by().values_list("team_id", flat=True))


def sees_team(user: object, team: Team) -> bool:
    """Whether ``user`` sees (and may act for) ``team``."""
    if is_admin(user):
        return True
    if not getattr(user, "is_authenticated", False):
        return False
    return Membership.objects.filter(user=user, team=team).exists()


def visible_teams(user: object) -> QuerySet[Team]:
    """The teams ``user`` sees, as a query (joined, so it costs nothing until read)."""
    if is_admin(user):
        return Team.objects.all()
    if not getattr(user, "is_authenticated", False):
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user)


def only_visible(rows: QuerySet[M], user: object, team_field: str = "team") -> QuerySet[M]:
    """``rows`` cut to those of the teams ``user`` sees (``team_field`` names their team)."""
    ids = visible_team_ids(user)
    if ids is None:
        return rows
    return rows.filter(**{f"{team_field}_id__in": sorted(ids)})
