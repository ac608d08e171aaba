"""Console pages. Thin: they pick the rows the user may see and render them.

Each live page has a ``*_live`` twin that renders only the region that changes (templates/live/),
which the page polls with htmx every few seconds: one small request, never the whole page.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh, HttpResponseStopPolling

from devices.models import Node
from devices.services.health import Thresholds
from devices.services.overview import cluster_overview, node_cards
from npuportal.confirmation import confirmation_page, confirmed
from quotas.models import AuditEvent, Membership, Team, posix_account
from quotas.policies.requests import dashboard_notices
from quotas.policies.versions import active_policy
from quotas.tenancy.roles import admin_required, job_user_required, roles_of
from quotas.tenancy.visibility import visible_team_ids, visible_teams
from scheduling.engine.policy import quota_at, zone
from scheduling.filters import visible_jobs
from scheduling.forms import JobSubmitForm
from scheduling.models import Job
from scheduling.services import console
from scheduling.services import jobs as job_service

#: htmx stops polling an element whose request answers this status (and still shows the answer).
HTMX_STOP_POLLING = HttpResponseStopPolling.status_code


def live_region(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``login_required`` for a live region: a signed-out poll reloads the page instead of swapping in a login form."""
    page = login_required(view)

    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.user.is_authenticated and getattr(request, "htmx", False):
            return HttpResponseClientRefresh()  # the page itself then goes to the sign-in form
        return page(request, *args, **kwargs)

    return wrapped


def _visible_teams(user: object) -> set[int] | None:
    """Team ids whose jobs ``user`` may see by name; None for admins (every team)."""
    ids = visible_team_ids(user)
    return None if ids is None else set(ids)


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    if roles_of(request.user).finance_only:  # no team, no jobs: finance starts on the reports
        return redirect("reports")
    context = {
        "rows": console.dashboard_queue(request.user),
        "cards": team_cards(request.user),
        "notices": dashboard_notices(request.user),
    }
    return render(request, "dashboard.html", context)


@live_region
def dashboard_live(request: HttpRequest) -> HttpResponse:
    """The dashboard's queue alone, for its live region."""
    return render(request, "live/dashboard.html", {"rows": console.dashboard_queue(request.user)})


@job_user_required
def job_list(request: HttpRequest) -> HttpResponse:
    """The job list with its filter form; the filters live in the address (a form left blank is dropped)."""
    if any(value == "" for _, values in request.GET.lists() for value in values):
        clean = console.filter_params(request.GET)
        if cursor := request.GET.get("cursor"):
            clean["cursor"] = cursor
        return redirect(f"{request.path}?{clean.urlencode()}" if clean else request.path)
    page = console.job_list_page(request.user, request.GET)
    context = {
        **page,
        "filter_fields": console.filter_form(page["filters"], request.user),
        "paged": "cursor" in request.GET,
    }
    return render(request, "jobs.html", context)


@live_region
def job_list_live(request: HttpRequest) -> HttpResponse:
    """The rows of the job list for the same filters and page (the page's own query string)."""
    return render(request, "live/jobs.html", console.job_list_page(request.user, request.GET))


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request.user).select_related("submitter__profile"), pk=pk)
    context = {
        **console.job_live(job, request.user),
        "explain": _explain(job),
        "posix_user": posix_account(job.submitter),
        "env": sorted((job.env or {}).items()),
        "command_lines": "\n" in job.command.rstrip("\n"),  # a batch script: shown as it is written
    }
    return render(request, "job_detail.html", context)


@live_region
def job_detail_live(request: HttpRequest, pk: int) -> HttpResponse:
    """State, reason, estimated start, devices and events of one job (another team's job is a 404)."""
    job = get_object_or_404(visible_jobs(request.user).defer("command"), pk=pk)  # the region shows no command
    response = render(request, "live/job.html", console.job_live(job, request.user))
    if job.is_final:
        response.status_code = HTMX_STOP_POLLING  # nothing here changes any more
    return response


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    return render(request, "cluster.html", {"overview": cluster_overview(_visible_teams(request.user))})


@live_region
def cluster_live(request: HttpRequest) -> HttpResponse:
    """The summary and the card grid of /cluster/."""
    return render(request, "live/cluster.html", {"overview": cluster_overview(_visible_teams(request.user))})


def _is_lead(user: object, team: Team) -> bool:
    return (
        bool(getattr(user, "is_staff", False))
        or Membership.objects.filter(user=user, team=team, role=Membership.Role.LEAD).exists()
    )


def team_cards(user: object) -> list[dict[str, object]]:
    """Per team: quota now (guaranteed / max / used / borrowed per resource), today's windows, usage."""
    from scheduling.engine.policy_model import in_dates
    from scheduling.engine.schedules import DAY_NAMES
    from scheduling.services.usage import devices_in_use, team_usage

    policy = active_policy().policy
    now = timezone.now()
    teams = visible_teams(user)
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
            if (sched.days is None or local.weekday() in sched.days) and in_dates(sched.dates, local.date()):
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
    form = JobSubmitForm(request.POST or None, request.FILES or None, user=request.user)
    submission = form.submission() if request.method == "POST" and form.is_valid() else None
    if submission is not None:
        spec, copies = submission.spec, submission.copies
        try:
            if copies:
                jobs = job_service.submit_array(team=submission.team, user=request.user, spec=spec, count=copies)
            else:
                jobs = [job_service.submit_job(team=submission.team, user=request.user, spec=spec)]
        except job_service.SubmissionError as exc:
            form.add_error(form.field_for(exc.field), exc.message)
        except job_service.PermissionDenied as exc:
            form.add_error("team", str(exc))
        else:
            if submission.warning:
                messages.warning(request, f"Batch script: {submission.warning}.")
            first = jobs[0]
            if not copies:
                messages.success(
                    request,
                    f"Job #{first.pk} is queued; the scheduler looks at it within seconds.",
                    extra_tags="job-queued",  # shown only while the job waits (templates/job_detail.html)
                )
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
        checkpoint_interval_s=job.checkpoint_interval_s,
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
    from scheduling.services.explain import explain_job

    try:
        return explain_job(job)
    except KeyError:
        return None


def _node_live(request: HttpRequest, name: str) -> dict[str, object]:
    node = get_object_or_404(Node.objects.prefetch_related("devices"), name=name)
    return {
        "node": node,
        "rows": node_cards(node, _visible_teams(request.user)),
        "rejoin_polls": Thresholds.from_settings().node_rejoin_polls,
    }


@login_required
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    context = _node_live(request, name)
    node = context["node"]
    assert isinstance(node, Node)
    context["audit"] = (
        AuditEvent.objects.filter(target=node.name).select_related("actor")[:20] if request.user.is_staff else []
    )
    context["health"] = node.health_events.select_related("device").order_by("-at", "-id")[:HEALTH_ROWS]
    context["health_limit"] = HEALTH_ROWS
    return render(request, "node_detail.html", context)


@live_region
def node_detail_live(request: HttpRequest, name: str) -> HttpResponse:
    """The node's state line and device table."""
    return render(request, "live/node.html", _node_live(request, name))


#: Health events a node's page lists, newest first.
HEALTH_ROWS = 20

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
    node = get_object_or_404(Node, name=name)
    if node.removed_at is not None:  # read-only; asked before any question (the page offers no button)
        messages.error(request, str(operations.NodeRemoved(node)))
        return redirect("console-node-detail", name=name)
    if action in NODE_QUESTIONS and not confirmed(request):
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
    except operations.NodeRemoved as exc:  # removed between the page and the click
        messages.error(request, str(exc))
        return redirect("console-node-detail", name=name)
    if result.changed:
        messages.success(request, f"{name}: {result.previous} → {result.node.state}.")
    else:
        messages.info(request, f"{name} is already {result.node.state}.")
    return redirect("console-node-detail", name=name)


@admin_required
def audit_log(request: HttpRequest) -> HttpResponse:
    events = AuditEvent.objects.select_related("actor")[:300]
    return render(request, "audit_log.html", {"events": events})
