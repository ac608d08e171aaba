"""Console page of a team's members (``/team/<name>/``): who is in it, their roles and limits.

Leads (and admins) change them here; the changes are :mod:`quotas.tenancy.members`', audited.
Members see the list; other teams' people never do (``visible_teams``).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from quotas.directory import ldap, oidc
from quotas.directory.apply import is_directory_team
from quotas.models import AuditEvent, Membership, UserProfile
from quotas.models.tenancy import TeamInvitation
from quotas.policies.versions import active_policy
from quotas.tenancy import members
from quotas.tenancy.visibility import visible_teams


@login_required
def my_team(request: HttpRequest) -> HttpResponse:
    """The first team the person leads (else belongs to); admins go to the teams list."""
    mine = Membership.objects.filter(user=request.user).order_by("-role", "team__name").select_related("team")
    # "member" sorts after "lead" reversed: leads' teams first.
    first = min(mine, key=lambda m: (m.role != Membership.Role.LEAD, m.team.name), default=None)
    if first is not None:
        return redirect("console-team-members", name=first.team.name)
    if request.user.is_staff:
        return redirect("console-teams")
    raise Http404("You belong to no team.")


@login_required
def team_members(request: HttpRequest, name: str) -> HttpResponse:
    team = visible_teams(request.user).filter(name=name).first()
    if team is None:
        raise Http404("No such team of yours.")
    manage = members.may_manage(request.user, team)
    errors: dict[str, str] = {}
    if request.method == "POST":
        action = request.POST.get("action", "")
        try:
            if not manage:
                raise members.MemberError({"team": f"only the leads of {team.name} (and admins) may change it"})
            if action == "add":
                done = members.add_member(
                    request.user,
                    team,
                    request.POST.get("who", ""),
                    request.POST.get("role", "member"),
                    link_for=lambda secret: request.build_absolute_uri(reverse("team-invitation", args=[secret])),
                )
            elif action == "remove":
                done = members.remove_member(request.user, team, request.POST.get("member"))
            elif action == "role":
                done = members.set_role(request.user, team, request.POST.get("member"), request.POST.get("role"))
            elif action == "limits":
                done = members.set_limits(
                    request.user,
                    team,
                    request.POST.get("member"),
                    request.POST.get("max_devices"),
                    request.POST.get("max_jobs"),
                )
            else:
                raise members.MemberError({"action": "add, remove, role or limits"})
        except members.MemberError as exc:
            errors = exc.errors
        else:
            messages.success(request, done)
            return redirect("console-team-members", name=team.name)
    team_policy = active_policy().policy.teams.get(team.name)
    rows = []
    for m in team.memberships.select_related("user").order_by("user__username"):
        profile = UserProfile.objects.filter(user=m.user).first()
        rows.append(
            {
                "m": m,
                "source": profile.get_directory_display() if profile else "Local account",
                "limits": members.limits_text(m),
            }
        )
    context = {
        "team": team,
        "rows": rows,
        "manage": manage,
        "directory": team_policy.directory if is_directory_team(team.name) and team_policy else None,
        "invitations": TeamInvitation.objects.filter(team=team, accepted_at__isnull=True) if manage else [],
        "errors": errors,
        "posted": request.POST if errors else {},
        "teams": visible_teams(request.user).order_by("name"),
    }
    return render(request, "quotas/team_members.html", context, status=400 if errors else 200)


def invitation(request: HttpRequest, secret: str) -> HttpResponse:
    """An invitation's link: join the team with the account you are signed in with, or make one.

    Where the site signs people in with its directory, accounts come from there: the page asks to
    sign in first. A used, expired or unknown link is a page that says so (410), not an error.
    """
    found = members.open_invitation(secret)
    if found is None:
        return render(request, "quotas/invitation.html", {"gone": True}, status=410)
    directory_signin = ldap.enabled() or oidc.enabled()
    form = UserCreationForm(request.POST or None) if not request.user.is_authenticated else None
    if request.method == "POST":
        if request.user.is_authenticated:
            messages.success(request, members.join_by_invitation(found, request.user))
            return redirect("console-team-members", name=found.team.name)
        if directory_signin:
            return redirect(f"{reverse('login')}?next={request.path}")
        assert form is not None
        if form.is_valid():
            with transaction.atomic():
                user = form.save(commit=False)
                user.email = found.email
                user.save()
                AuditEvent.objects.create(
                    actor=None,
                    action="user.create",
                    target=user.get_username(),
                    detail=f"by the invitation of {found.email}",
                )
                done = members.join_by_invitation(found, user)
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            messages.success(request, done)
            return redirect("console-team-members", name=found.team.name)
    context = {"invitation": found, "form": form, "directory_signin": directory_signin}
    return render(request, "quotas/invitation.html", context, status=400 if form is not None and form.errors else 200)
