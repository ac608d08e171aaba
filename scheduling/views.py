"""Console pages. Thin: they pick the rows the user may see and render them."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from devices.models import Node
from quotas.models import Team
from scheduling.api.views import visible_jobs
from scheduling.models import Allocation, Job
from scheduling.reason_text import reason_text


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    user = request.user
    teams = Team.objects.all() if user.is_staff else Team.objects.filter(memberships__user=user)
    teams = teams.annotate(
        running=Count("jobs", filter=Q(jobs__state=Job.State.RUNNING)),
        pending=Count("jobs", filter=Q(jobs__state=Job.State.PENDING)),
    )
    active = (
        visible_jobs(user)
        .filter(state__in=[Job.State.PENDING, Job.State.RUNNING])
        .order_by("state", "submitted_at")[:100]
    )
    rows = [(job, reason_text(job.pending_reason) if job.pending_reason else "") for job in active]
    return render(request, "dashboard.html", {"teams": teams, "rows": rows})


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    qs = visible_jobs(request.user).order_by("-submitted_at", "-id")
    state = request.GET.get("state")
    if state in Job.State.values:
        qs = qs.filter(state=state)
    rows = [(job, reason_text(job.pending_reason) if job.pending_reason else "") for job in qs[:200]]
    return render(request, "jobs.html", {"rows": rows, "state": state, "states": Job.State.choices})


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    allocations = job.allocations.select_related("device__node", "vnpu_template")
    return render(
        request,
        "job_detail.html",
        {
            "job": job,
            "allocations": allocations,
            "events": job.events.all(),
            "reason": reason_text(job.pending_reason) if job.pending_reason else "",
        },
    )


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    nodes = list(Node.objects.prefetch_related("devices"))
    busy: dict[int, list[str]] = {}
    mine = None if request.user.is_staff else set(visible_jobs(request.user).values_list("id", flat=True))
    for device_id, job_id, template in Allocation.objects.filter(end__isnull=True).values_list(
        "device_id", "job_id", "vnpu_template__name"
    ):
        # Other teams' jobs show as "in use": nobody learns another team's job ids here.
        label = f"#{job_id}" if mine is None or job_id in mine else "in use"
        busy.setdefault(device_id, []).append(label + (f" ({template})" if template else ""))
    grid = [(node, [(d, busy.get(d.pk, [])) for d in node.devices.all()]) for node in nodes]
    return render(request, "cluster.html", {"grid": grid})
