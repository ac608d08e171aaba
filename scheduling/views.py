"""Console pages. Thin: they pick the rows the user may see and render them."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from devices.models import Node
from devices.services.health import Thresholds
from npuportal.api_pagination import InvalidCursor, Keyset
from npuportal.confirmation import confirmation_page, confirmed
from quotas.models import AuditEvent, Membership, Team
from quotas.roles import admin_required, job_user_required, roles_of
from quotas.services import active_policy
from scheduling.api.views import JobPagination, visible_jobs
from scheduling.disclosure import Viewer, event_detail, events_of, preempted_for_text
from scheduling.engine.policy import quota_at, zone
from scheduling.forms import JobSubmitForm
from scheduling.models import Allocation, Job
from scheduling.reason_text import reason_text
from scheduling.services import jobs as job_service


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    user = request.user
    if roles_of(user).finance_only:  # no team, no jobs: finance starts on the reports
        return redirect("reports")
    active = (
        visible_jobs(user)
        .defer("command")  # the rows show no command, and one may be tens of KiB
        .filter(state__in=[Job.State.PENDING, Job.State.RUNNING])
        .order_by("state", "submitted_at")[:100]
    )
    rows = [(job, reason_text(job.pending_reason) if job.pending_reason else "") for job in active]
    return render(request, "dashboard.html", {"rows": rows, "cards": team_cards(user)})


#: Rows per page of the console's job list.
JOB_LIST_PAGE = 100


@job_user_required
def job_list(request: HttpRequest) -> HttpResponse:
    """Newest jobs first, a page at a time by cursor: one indexed query, never a COUNT of the table."""
    qs = visible_jobs(request.user).defer("command")  # the rows show no command, and one may be tens of KiB
    state = request.GET.get("state")
    if state in Job.State.values:
        qs = qs.filter(state=state)
    keyset = Keyset(JobPagination.ordering)
    try:
        page = keyset.page(qs, limit=JOB_LIST_PAGE, cursor=request.GET.get("cursor") or None)
    except InvalidCursor:
        page = keyset.page(qs, limit=JOB_LIST_PAGE)  # a stale or edited link: start from the newest
    rows = [(job, reason_text(job.pending_reason) if job.pending_reason else "") for job in page.rows]
    return render(
        request,
        "jobs.html",
        {
            "rows": rows,
            "state": state,
            "states": Job.State.choices,
            "older": page.next_cursor,
            "newer": page.previous_cursor,
            "paged": "cursor" in request.GET,
        },
    )


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    allocations = job.allocations.select_related("device__node", "vnpu_template")
    viewer = Viewer.of(request.user)
    events = [(event, event_detail(event, viewer)) for event in events_of(job)]
    return render(
        request,
        "job_detail.html",
        {
            "job": job,
            "allocations": allocations,
            "events": events,
            "preempted_for": preempted_for_text(job, viewer) if job.preempt_deadline else "",
            "reason": reason_text(job.pending_reason) if job.pending_reason else "",
            "explain": _explain(job),
        },
    )


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    nodes = list(Node.objects.prefetch_related("devices"))
    busy: dict[int, list[str]] = {}
    mine = None if request.user.is_staff else set(job_service.teams_of(request.user))
    for device_id, job_id, team_id, template in Allocation.objects.filter(end__isnull=True).values_list(
        "device_id", "job_id", "job__team_id", "vnpu_template__name"
    ):
        # Other teams' jobs show as "in use": nobody learns another team's job ids here.
        label = f"#{job_id}" if mine is None or team_id in mine else "in use"
        busy.setdefault(device_id, []).append(label + (f" ({template})" if template else ""))
    grid = [(node, [(d, busy.get(d.pk, [])) for d in node.devices.all()]) for node in nodes]
    return render(request, "cluster.html", {"grid": grid})


def _is_lead(user: object, team: Team) -> bool:
    return (
        bool(getattr(user, "is_staff", False))
        or Membership.objects.filter(user=user, team=team, role=Membership.Role.LEAD).exists()
    )


def team_cards(user: object) -> list[dict[str, object]]:
    """Per team: quota now (guaranteed / max / used / borrowed per resource), today's windows, usage."""
    from scheduling.engine.schedules import DAY_NAMES
    from scheduling.services.usage import devices_in_use, team_usage

    policy = active_policy().policy
    now = timezone.now()
    teams = Team.objects.all() if getattr(user, "is_staff", False) else Team.objects.filter(memberships__user=user)
    cards = []
    local = now.astimezone(zone(policy.timezone))
    for team in teams.order_by("name"):
        quota, schedule = quota_at(policy, team.name, now)
        used = devices_in_use(team)
        keys = sorted(set(quota.guaranteed) | set(quota.max) | set(used), key=lambda k: (k != "devices", k))
        rows = []
        for key in keys:
            g = quota.guaranteed.get(key, 0.0)
            u = used.get(key, 0.0)
            rows.append(
                {"resource": key, "guaranteed": g, "max": quota.max.get(key), "used": u, "borrowed": max(0.0, u - g)}
            )
        today = []
        for sched in policy.team(team.name).schedules:
            if sched.days is None or local.weekday() in sched.days:
                today.append(
                    f"{sched.name} {sched.start_min // 60:02d}:{sched.start_min % 60:02d}–"
                    f"{sched.end_min // 60:02d}:{sched.end_min % 60:02d}"
                )
        card: dict[str, object] = {
            "team": team,
            "schedule": schedule,
            "rows": rows,
            "today": today,
            "weekday": DAY_NAMES[local.weekday()],
            "lead": _is_lead(user, team),
        }
        if card["lead"]:
            usage = team_usage(team, policy, now=now)
            card["usage"] = usage
            card["budget"] = quota.device_hours_per_month
            card["members"] = list(team.memberships.select_related("user").order_by("user__username"))
        cards.append(card)
    return cards


@job_user_required
def job_submit(request: HttpRequest) -> HttpResponse:
    """One job, or a job array of ``copies`` (as the API's ``array``), under the same rules and limits."""
    form = JobSubmitForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        spec = job_service.JobSpec(
            name=data["name"],
            command=data["command"],
            priority_class=data["priority_class"],
            num_devices=data["num_devices"],
            chip_model=data["chip_model"] or None,
            vnpu_template=data["vnpu_template"] or None,
            estimated_duration_s=data["estimated_duration_s"],
            max_duration_s=data["max_duration_s"],
        )
        copies = data["array"]
        try:
            if copies:
                jobs = job_service.submit_array(team=data["team"], user=request.user, spec=spec, count=copies)
            else:
                jobs = [job_service.submit_job(team=data["team"], user=request.user, spec=spec)]
        except job_service.SubmissionError as exc:
            form.add_error(form.field_for(exc.field), exc.message)
        except job_service.PermissionDenied as exc:
            form.add_error("team", str(exc))
        else:
            first = jobs[0]
            if not copies:
                messages.success(request, f"Job #{first.pk} is queued; the scheduler looks at it within seconds.")
                return redirect("console-job-detail", pk=first.pk)
            messages.success(
                request,
                f"Job array {first.array_id} is queued: {len(jobs)} jobs, #{first.pk} to #{jobs[-1].pk}.",
            )
            return redirect("console-job-list")
    return render(request, "job_submit.html", {"form": form})


@login_required
@require_POST
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    if not confirmed(request):
        return confirmation_page(
            request, cancel_question(job), action="cancel it", back=reverse("console-job-detail", args=[job.pk])
        )
    try:
        job_service.cancel_job(job.pk, actor=request.user)
    except (job_service.SubmissionError, job_service.PermissionDenied) as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job #{job.pk} is cancelled.")
    return redirect("console-job-detail", pk=job.pk)


def cancel_question(job: Job) -> str:
    """The question the console asks before cancelling ``job`` (also its form's ``data-confirm``)."""
    return f"Cancel job #{job.pk} ({job.name})?"


@login_required
@require_POST
def job_resubmit(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    spec = job_service.JobSpec(
        name=job.name,
        command=job.command,
        priority_class=job.priority_class,
        num_devices=job.num_devices,
        chip_model=job.chip_model or None,
        vnpu_template=job.vnpu_template.name if job.vnpu_template else None,
        estimated_duration_s=job.estimated_duration_s,
        max_duration_s=job.max_duration_s,
    )
    try:
        new = job_service.submit_job(team=job.team, user=request.user, spec=spec)
    except (job_service.SubmissionError, job_service.PermissionDenied) as exc:
        messages.error(request, f"Could not resubmit: {exc}")
        return redirect("console-job-detail", pk=job.pk)
    messages.success(request, f"Resubmitted as job #{new.pk}.")
    return redirect("console-job-detail", pk=new.pk)


def _explain(job: Job) -> dict[str, object] | None:
    """The engine's own breakdown of a pending job, or None when it cannot say."""
    if job.state != Job.State.PENDING:
        return None
    from scheduling.engine.explain import explain
    from scheduling.services.snapshot import load_snapshot

    snapshot, _ = load_snapshot(timezone.now(), active_policy().policy)
    try:
        return explain(snapshot, job.pk)
    except KeyError:
        return None


@login_required
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    node = get_object_or_404(Node, name=name)
    devices = list(node.devices.all())
    slices: dict[int, list[tuple[str, str]]] = {}
    cores: dict[int, int] = {}
    mine = None if request.user.is_staff else set(visible_jobs(request.user).values_list("id", flat=True))
    for a in Allocation.objects.filter(device__node=node, end__isnull=True).select_related("vnpu_template"):
        # Other teams' jobs show as "in use": nobody learns another team's job ids here.
        label = f"#{a.job_id}" if mine is None or a.job_id in mine else "in use"
        slices.setdefault(a.device_id, []).append((label, a.vnpu_template.name if a.vnpu_template else "whole card"))
        if a.vnpu_template is not None:
            cores[a.device_id] = cores.get(a.device_id, 0) + a.vnpu_template.ai_cores
    rows = [{"device": d, "held": slices.get(d.pk, []), "cores_used": cores.get(d.pk, 0)} for d in devices]
    audit = AuditEvent.objects.filter(target=node.name).select_related("actor")[:20] if request.user.is_staff else []
    health = node.health_events.select_related("device").order_by("-at")[:20] if hasattr(node, "health_events") else []
    context = {
        "node": node,
        "rows": rows,
        "audit": audit,
        "health": health,
        "rejoin_polls": Thresholds.from_settings().node_rejoin_polls,
    }
    return render(request, "node_detail.html", context)


#: Node operations that take cards out of service: asked before they are done.
NODE_QUESTIONS = {
    "cordon": "Cordon {name}? No new job starts on it; running jobs go on.",
    "drain": "Drain {name}? No new job starts on it, and it is drained when its jobs end.",
}


@admin_required
@require_POST
def node_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    from devices.services import operations

    ops = {"cordon": operations.cordon_node, "drain": operations.drain_node, "uncordon": operations.uncordon_node}
    if action not in ops:
        raise Http404("unknown action")
    if action in NODE_QUESTIONS and not confirmed(request):
        get_object_or_404(Node, name=name)
        return confirmation_page(
            request,
            NODE_QUESTIONS[action].format(name=name),
            action=action,
            back=reverse("console-node-detail", args=[name]),
        )
    try:
        result = ops[action](name, actor=request.user, reason=request.POST.get("reason", ""))
    except Node.DoesNotExist as exc:
        raise Http404("no such node") from exc
    if result.changed:
        messages.success(request, f"{name}: {result.previous} → {result.node.state}.")
    else:
        messages.info(request, f"{name} is already {result.node.state}.")
    return redirect("console-node-detail", name=name)


@admin_required
def audit_log(request: HttpRequest) -> HttpResponse:
    events = AuditEvent.objects.select_related("actor")[:300]
    return render(request, "audit_log.html", {"events": events})
