"""Who may use which console page: admin, team lead, team member, finance.

One place answers it, so the menu (:func:`menu`, a context processor) offers
exactly the pages a person may open, and a page they may not use answers the
console's own 403 page (``templates/403.html``, via ``handler403``) instead of
sending them to the Django admin's sign-in.

- **admin** (staff): every page, the policy, teams, nodes' operations and the audit log;
- **lead**: their team's jobs, submission, quota, reports and statements, tokens;
- **member**: the team's jobs, submission, quota, tokens (no costs);
- **finance** (the ``finance`` group, no team needed): reports, statements, rate cards; no jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from quotas.models import Membership

FINANCE_GROUP = "finance"

View = TypeVar("View", bound=Callable[..., Any])


@dataclass(frozen=True)
class Roles:
    """What one signed-in user is; the menu and the page checks read it."""

    admin: bool = False
    lead: bool = False
    member: bool = False
    finance: bool = False

    @property
    def works_with_jobs(self) -> bool:
        """Jobs, submission, the cluster and the quota pages: admins and anyone in a team."""
        return self.admin or self.member

    @property
    def sees_costs(self) -> bool:
        """Reports and statements: admins, finance and team leads."""
        return self.admin or self.finance or self.lead

    @property
    def finance_only(self) -> bool:
        """Finance and nothing else: the console opens on the reports."""
        return self.finance and not (self.admin or self.member)


def roles_of(user: Any) -> Roles:
    """Two small queries (memberships' roles, the finance group); none for an admin or an anonymous user.

    An admin may use every page, so what else they are changes nothing the console offers.
    """
    if not getattr(user, "is_authenticated", False):
        return Roles()
    if user.is_staff:
        return Roles(admin=True)
    team_roles = set(Membership.objects.filter(user=user).values_list("role", flat=True))
    return Roles(
        lead=Membership.Role.LEAD in team_roles,
        member=bool(team_roles),
        finance=user.groups.filter(name=FINANCE_GROUP).exists(),
    )


def admin_required(view: View) -> View:
    """Admins only; anyone else signed in gets the console's 403 page (anonymous: the sign-in page)."""

    @login_required
    @wraps(view)
    def check(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if not request.user.is_staff:
            raise PermissionDenied("This page is for admins.")
        return view(request, *args, **kwargs)

    return check  # type: ignore[return-value]


def job_user_required(view: View) -> View:
    """Admins and team members: a finance-only user has no jobs to see or submit."""

    @login_required
    @wraps(view)
    def check(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if not roles_of(request.user).works_with_jobs:
            raise PermissionDenied("Jobs are for the members of a team; you belong to none.")
        return view(request, *args, **kwargs)

    return check  # type: ignore[return-value]


def menu(request: HttpRequest) -> dict[str, object]:
    """Context processor: ``roles`` for ``base.html``'s menu, read only when a page uses it."""
    return {"roles": SimpleLazyObject(lambda: roles_of(getattr(request, "user", None)))}
