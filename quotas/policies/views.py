"""Console pages for policy: the admin's editor, history and Teams page, the team's quota view.

Views only gather input and call :mod:`quotas.policies.versions` and the pure policy
functions; what a change means is decided there, once.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from npuportal.confirmation import confirmation_page, confirmed
from quotas.models import Policy, Team
from quotas.policies.forms import TeamPolicyForm
from quotas.policies.team_policy import TeamChangeError, change_team, team_overview, team_settings
from quotas.policies.versions import activate_version, active_policy, cluster_facts, create_version
from quotas.tenancy.roles import admin_required, job_user_required
from quotas.tenancy.visibility import visible_teams
from scheduling.engine.policy import (
    PolicyError,
    diff_policies,
    effective_quotas,
    load_policy,
    parse_policy,
    semantic_diff,
    week_grid,
    zone,
)

MAX_POLICY_CHARS = 200_000


@admin_required
def policy_editor(request: HttpRequest) -> HttpResponse:
    """Edit the YAML; validate, diff, dry-run or apply it. Nothing is stored but on apply."""
    active = Policy.objects.filter(is_active=True).first()
    text = active.yaml_text if active else ""
    context: dict[str, object] = {"active": active}
    if request.method == "POST":
        text = request.POST.get("yaml_text", "").replace("\r\n", "\n")
        action = request.POST.get("action", "validate")
        comment = request.POST.get("comment", "").strip()[:500]
        context["comment"] = comment
        if len(text) > MAX_POLICY_CHARS:
            context["issues"] = [
                {
                    "path": "",
                    "message": f"policy is longer than {MAX_POLICY_CHARS} characters",
                    "severity": "error",
                    "line": None,
                }
            ]
        else:
            chips, capacity = cluster_facts()
            candidate, issues = load_policy(text, chip_models=chips or None, capacity=capacity if chips else None)
            context["issues"] = [
                {"path": i.path, "message": i.message, "severity": i.severity, "line": i.line} for i in issues
            ]
            context["valid"] = candidate is not None
            if candidate is not None:
                current = active_policy()
                context["changes"] = semantic_diff(current.policy, candidate) if current.record else ["first policy"]
                context["diff"] = diff_policies(
                    active.yaml_text if active else "",
                    text,
                    old_name=f"v{active.version}" if active else "none",
                    new_name="edited",
                )
                if action == "dryrun":
                    from quotas.policies.dryrun import dry_run

                    try:
                        days = min(max(int(request.POST.get("days", "7")), 1), 90)
                    except ValueError:
                        days = 7
                    context["dryrun"] = dry_run(current.policy, candidate, days=days)
                elif action == "apply":
                    if not comment:
                        context["comment_error"] = "Say why you change the policy: the comment is kept in history."
                    else:
                        try:
                            record = create_version(text, author=request.user, comment=comment)
                        except PolicyError as exc:
                            context["issues"] = [
                                {"path": i.path, "message": i.message, "severity": i.severity, "line": i.line}
                                for i in exc.issues
                            ]
                        else:
                            messages.success(request, f"Policy v{record.version} is active from the next tick.")
                            return redirect("console-policy-history")
    context["yaml_text"] = text
    return render(request, "quotas/policy_editor.html", context)


@admin_required
def policy_history(request: HttpRequest) -> HttpResponse:
    versions = Policy.objects.select_related("author").order_by("-version")
    return render(request, "quotas/policy_history.html", {"versions": versions})


@admin_required
def policy_version(request: HttpRequest, version: int) -> HttpResponse:
    record = get_object_or_404(Policy, version=version)
    active = Policy.objects.filter(is_active=True).first()
    changes: list[str] = []
    diff = ""
    if active and active.pk != record.pk:
        try:
            changes = semantic_diff(parse_policy(active.yaml_text), parse_policy(record.yaml_text))
        except PolicyError:
            changes = ["(one of the versions no longer parses)"]
        diff = diff_policies(
            active.yaml_text, record.yaml_text, old_name=f"v{active.version} (active)", new_name=f"v{record.version}"
        )
    return render(
        request, "quotas/policy_version.html", {"record": record, "active": active, "changes": changes, "diff": diff}
    )


@admin_required
@require_POST
def policy_restore(request: HttpRequest, version: int) -> HttpResponse:
    record = get_object_or_404(Policy, version=version)
    if not confirmed(request):
        return confirmation_page(
            request,
            restore_question(record),
            action=f"restore v{record.version}",
            back=reverse("console-policy-history"),
        )
    try:
        activate_version(record.version, actor=request.user, comment="restored in the console")
    except PolicyError as exc:
        messages.error(request, f"v{record.version} no longer validates and stays inactive: {exc.issues[0]}")
    else:
        messages.success(request, f"Policy v{record.version} is active again from the next tick.")
    return redirect("console-policy-history")


def restore_question(record: Policy) -> str:
    """Asked before ``record`` becomes the active policy again (also its forms' ``data-confirm``)."""
    return f"Restore policy v{record.version}? It becomes the active policy from the next tick."


@admin_required
def team_list(request: HttpRequest) -> HttpResponse:
    """Every team with its weight, fair share, members and base quota under the active policy."""
    active = Policy.objects.filter(is_active=True).first()
    return render(request, "quotas/teams.html", {"rows": team_overview(), "active": active})


@admin_required
def team_edit(request: HttpRequest, name: str) -> HttpResponse:
    """Change one team's weight and base quota; a valid change is a new active policy version."""
    team = get_object_or_404(Team, name=name)
    active = active_policy()
    chips = sorted(cluster_facts()[0])
    form = TeamPolicyForm(
        request.POST or None,
        current=team_settings(active.policy, team.name),
        chip_models=chips,
        base_version=active.version,
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        before = team_overview([team.name])[0]
        try:
            result = change_team(
                team.name,
                shares=form.shares_sent(),
                guaranteed=form.resources("guaranteed"),
                maximum=form.resources("max"),
                comment=data["comment"],
                author=request.user,
                base_version=data["base_version"],
            )
        except TeamChangeError as exc:
            form.add_service_errors(exc.errors)
        else:
            after = team_overview([team.name])[0]
            messages.success(
                request,
                f"Saved: {'; '.join(result.changes)}. Policy v{result.record.version} is active from the next tick. "
                f"Share of the cluster {before.norm_percent:.1f} % → {after.norm_percent:.1f} %, "
                f"fair-share factor {before.fair_share:.3f} → {after.fair_share:.3f}.",
            )
            for warning in result.warnings:
                messages.warning(request, warning)
            return redirect("console-teams")
    row = team_overview([team.name])[0]
    return render(request, "quotas/team_edit.html", {"team": team, "row": row, "form": form, "active": active})


@job_user_required
def team_quota(request: HttpRequest) -> HttpResponse:
    """A team's quota in force now and over the week, for its members; admins see every team."""
    user = request.user
    teams = visible_teams(user)
    names = list(teams.values_list("name", flat=True))
    policy = active_policy().policy
    now = timezone.now()
    effective = effective_quotas(policy, now, names) if names else {"at": now.isoformat(), "teams": {}}
    local = now.astimezone(zone(policy.timezone))
    week_start = (local - timedelta(days=local.weekday())).date()
    heatmaps = {}
    for name in names:
        grid = week_grid(policy, name, week_start)
        z = [[cell["max"] if cell["max"] is not None else None for cell in row] for row in grid]
        caps = {v for row in z for v in row}
        heatmaps[name] = {
            "z": z,
            "g": [[cell["guaranteed"] for cell in row] for row in grid],
            "text": [[cell["schedule"] or "base" for cell in row] for row in grid],
            "y": [f"{row[0]['weekday']} {row[0]['date']}" for row in grid],
            # One value all week (or no cap at all): said in words, and the colour scale starts at 0
            # either way, so a constant 24 is not drawn as the bottom of a scale from 23.5 to 24.5.
            "constant": next(iter(caps)) if len(caps) == 1 else "varies",
        }
    return render(
        request,
        "quotas/team_quota.html",
        {
            "fair_share": team_overview(names, now=now) if names else [],
            "effective": effective,
            "timezone": policy.timezone,
            "at_display": local.strftime("%Y-%m-%d %H:%M"),
            "heatmaps": heatmaps,
            "names": names,
        },
    )
