"""Console pages of quota change requests: ``/quota/requests/`` (list, file one) and one request.

Leads file them for their teams; admins see each with its dry run and approve or refuse it. The
pages only gather input; :mod:`quotas.policies.requests` decides and stores.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from quotas.models import Membership, QuotaRequest
from quotas.policies import requests as service
from quotas.policies.dryrun import format_comparison
from quotas.policies.versions import cluster_facts


def _lead_teams(user: object) -> list[str]:
    if getattr(user, "is_staff", False):
        from quotas.models import Team

        return list(Team.objects.order_by("name").values_list("name", flat=True))
    return list(
        Membership.objects.filter(user=user, role=Membership.Role.LEAD)
        .order_by("team__name")
        .values_list("team__name", flat=True)
    )


@login_required
def request_list(request: HttpRequest) -> HttpResponse:
    teams = _lead_teams(request.user)
    if not teams and not request.user.is_staff:
        raise PermissionDenied("Quota requests are for team leads and admins.")
    errors: dict[str, str] = {}
    if request.method == "POST":
        data = request.POST
        try:
            filed = service.file_request(
                request.user,
                data.get("team"),
                field=data.get("field"),
                resource=data.get("resource"),
                change=data.get("change"),
                first_day=data.get("first_day"),
                last_day=data.get("last_day"),
                justification=data.get("justification"),
            )
        except service.RequestError as exc:
            errors = exc.errors
        else:
            messages.success(request, f"Request #{filed.pk} is filed: {filed.summary}. An admin decides on it.")
            return redirect("console-quota-request", pk=filed.pk)
    rows = service.visible_requests(request.user)
    if not request.user.is_staff:
        rows.filter(state__in=[QuotaRequest.State.APPROVED, QuotaRequest.State.REFUSED]).update(seen_by_lead=True)
    chips = sorted(cluster_facts()[0])
    context = {
        "rows": rows[:200],
        "teams": teams,
        "resources": ["devices", *(f"devices/{c}" for c in chips)],
        "errors": errors,
        "posted": request.POST if errors else {},
        "may_file": bool(teams),
    }
    return render(request, "quotas/quota_requests.html", context, status=400 if errors else 200)


@login_required
def request_detail(request: HttpRequest, pk: int) -> HttpResponse:
    found = service.visible_requests(request.user).filter(pk=pk).first()
    if found is None:
        raise Http404("No such request of your teams.")
    errors: dict[str, str] = {}
    if request.method == "POST":
        try:
            if request.POST.get("decision") == "approve":
                done = service.approve(found.pk, request.user, note=request.POST.get("note", ""))
                assert done.policy is not None
                messages.success(
                    request,
                    f"Approved: policy v{done.policy.version} is active; the change is in force from "
                    f"{done.first_day} to {done.last_day}.",
                )
            elif request.POST.get("decision") == "refuse":
                service.refuse(found.pk, request.user, reason=request.POST.get("reason", ""))
                messages.success(request, f"Refused; {found.requested_by.get_username()} is told why.")
            else:
                raise service.RequestError({"decision": "approve or refuse"})
        except service.RequestError as exc:
            errors = exc.errors
        else:
            return redirect("console-quota-request", pk=found.pk)
    dry = None
    dry_error = ""
    if request.user.is_staff and found.state == QuotaRequest.State.PENDING:
        try:
            dry = service.dry_run_of(found)
        except (ValueError, service.RequestError) as exc:
            dry_error = str(exc)
    context = {
        "r": found,
        "dry": dry,
        "dry_text": format_comparison(dry) if dry else "",
        "dry_error": dry_error,
        "errors": errors,
    }
    return render(request, "quotas/quota_request.html", context, status=400 if errors else 200)
