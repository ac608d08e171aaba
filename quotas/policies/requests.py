"""Quota change requests: a lead files one, an admin sees its dry run and approves or refuses it.

Approval is a policy change like any other: a new version (validated, audited, in the history, its
comment naming the request, the lead and the approver) whose only difference is a dated schedule on
the team, ``request-<id>``, in force from the first to the last day of the request on the policy's
clock, first among the team's schedules so it wins on those dates. Views, the API and ``npuctl``
only collect input and call these functions.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import date
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AbstractUser
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from quotas.models import AuditEvent, Membership, QuotaRequest, Team
from quotas.policies.dryrun import dry_run
from quotas.policies.versions import active_policy, cluster_facts, create_version
from quotas.tenancy.roles import roles_of
from scheduling.engine.policy import (
    DEVICES,
    Policy,
    PolicyError,
    Schedule,
    TeamPolicy,
    as_policy_time,
    dump_policy,
    merge_quota,
    parse_policy,
)

log = logging.getLogger(__name__)

MAX_DAYS = 366
MAX_CHANGE = 100_000
MAX_TEXT = 2000


class RequestError(ValueError):
    """Bad input, every field at once: ``errors`` maps the field to why."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def may_request(user: Any, team: Team) -> bool:
    """A team's leads and admins may ask for its quota to change."""
    if user.is_staff:
        return True
    return Membership.objects.filter(user=user, team=team, role=Membership.Role.LEAD).exists()


def _today(policy: Policy) -> date:
    return as_policy_time(policy, timezone.now()).date()


def _read_day(value: object, field: str, errors: dict[str, str]) -> date | None:
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value or "").strip())
    except ValueError:
        errors[field] = f"a date like 2026-12-10, got {value!r}" if value else "required: a date like 2026-12-10"
        return None


def _base_team(policy: Policy, team: str) -> TeamPolicy:
    found = policy.teams.get(team)
    if found is not None:
        return found
    base = policy.defaults
    return TeamPolicy(team, None, base.shares, base.quota, base.schedules)


def _target(team: TeamPolicy, field: str, resource: str, change: float) -> float:
    """The value the request sets: the team's base quota for ``resource`` plus the change."""
    if field == QuotaRequest.Field.MAX:
        current = team.quota.max.get(resource)
        if current is None:
            raise RequestError({"resource": f"the team has no cap on {resource}: there is no maximum to change"})
    else:
        current = team.quota.guaranteed.get(resource, 0.0)
    value = current + change
    if value < 0:
        raise RequestError({"change": f"the team's {field} {resource} is {current:g}; it cannot go below 0"})
    return value


def candidate_policy(policy: Policy, request: QuotaRequest, *, dated: bool = True) -> Policy:
    """``policy`` with the request's change as the team's first schedule (undated for a dry run).

    A dry run replays the last days, before the request's dates; undated, its change applies to
    the whole replay, which is what "its effect on other teams" asks.
    """
    team = _base_team(policy, request.team.name)
    value = _target(team, request.field, request.resource, request.change)
    override: dict[str, object] = {request.field: {request.resource: value}}
    schedule = Schedule(
        name=request.schedule_name,
        days=None,
        start_min=0,
        end_min=1440,
        quota=override,
        resolved_quota=merge_quota(team.quota, override),
        dates=(request.first_day, request.last_day) if dated else None,
    )
    kept = tuple(s for s in team.schedules if s.name != schedule.name)
    teams = dict(policy.teams)
    teams[team.name] = replace(team, schedules=(schedule, *kept))
    text = dump_policy(replace(policy, teams=teams))
    chips, _ = cluster_facts()
    try:
        return parse_policy(text, chip_models=chips or None)
    except PolicyError as exc:
        raise RequestError({"change": "; ".join(str(i) for i in exc.issues if i.severity == "error")}) from exc


def file_request(
    actor: AbstractBaseUser,
    team_name: object,
    *,
    field: object,
    resource: object,
    change: object,
    first_day: object,
    last_day: object,
    justification: object,
) -> QuotaRequest:
    """Store a request after checking every field; nothing is stored when one is wrong."""
    errors: dict[str, str] = {}
    team = Team.objects.filter(name=str(team_name or "")).first()
    if team is None:
        raise RequestError({"team": f"no team {team_name!r}"})
    if not may_request(actor, team):
        raise RequestError({"team": f"only the leads of {team.name} (and admins) may ask for its quota to change"})
    field_text = str(field or "").strip()
    if field_text not in QuotaRequest.Field.values:
        errors["field"] = "guaranteed or max"
    resource_text = str(resource or "").strip()
    chips, _ = cluster_facts()
    if resource_text != DEVICES:
        chip = resource_text.removeprefix(f"{DEVICES}/")
        if not resource_text.startswith(f"{DEVICES}/") or not chip:
            errors["resource"] = "devices, or devices/<chip model> such as devices/910B4"
        elif chips and chip not in chips:
            errors["resource"] = f"the cluster has no chip model {chip!r} (it has {', '.join(sorted(chips))})"
    amount: float | None = None
    try:
        amount = float(str(change).strip().replace("+", "", 1)) if change not in (None, "") else None
    except ValueError:
        pass
    if amount is None or amount != amount or abs(amount) > MAX_CHANGE:
        errors["change"] = "a number of cards, e.g. 16 for sixteen more or -8 for eight fewer"
    elif amount == 0:
        errors["change"] = "a change of 0 changes nothing"
    first = _read_day(first_day, "first_day", errors)
    last = _read_day(last_day, "last_day", errors)
    policy = active_policy().policy
    if first and last:
        if last < first:
            errors["last_day"] = f"{last} is before the first day ({first})"
        elif last < _today(policy):
            errors["last_day"] = f"{last} has passed (today is {_today(policy)} on the policy's clock)"
        elif (last - first).days + 1 > MAX_DAYS:
            errors["last_day"] = f"at most {MAX_DAYS} days; for longer, ask for a change of the base quota"
    why = str(justification or "").strip()
    if not why:
        errors["justification"] = "say why: the admin decides on it, and it is kept in the policy history"
    elif len(why) > MAX_TEXT:
        errors["justification"] = f"at most {MAX_TEXT} characters, got {len(why)}"
    if errors:
        raise RequestError(errors)
    assert amount is not None and first is not None and last is not None
    request = QuotaRequest(
        team=team,
        requested_by=actor,
        field=field_text,
        resource=resource_text,
        change=amount,
        first_day=first,
        last_day=last,
        justification=why,
    )
    request.pk = 0  # the schedule's name while checking; replaced by the stored id
    candidate_policy(policy, request)  # refuses now what approval could not write (e.g. max below guaranteed)
    request.pk = None
    with transaction.atomic():
        request.save()
        AuditEvent.objects.create(
            actor=actor, action="quota.request", target=team.name, detail=f"#{request.pk}: {request.summary}: {why}"
        )
    return request


def dry_run_of(request: QuotaRequest, *, days: int = 7) -> dict[str, Any]:
    """The change replayed over the last ``days`` days against the policy in force (kept on the request)."""
    if request.dry_run is not None:
        return dict(request.dry_run)
    current = active_policy().policy
    result = dry_run(current, candidate_policy(current, request, dated=False), days=days)
    request.dry_run = {"source": result["source"], "jobs": result["jobs"], "comparison": result["comparison"]}
    QuotaRequest.objects.filter(pk=request.pk).update(dry_run=request.dry_run)
    return dict(request.dry_run)


def _decide(request_id: int, admin: AbstractBaseUser) -> QuotaRequest:
    if not admin.is_staff:
        raise RequestError({"request": "only admins decide on quota requests"})
    request = QuotaRequest.objects.select_for_update().select_related("team", "requested_by").get(pk=request_id)
    if request.state != QuotaRequest.State.PENDING:
        raise RequestError({"request": f"#{request.pk} is already {request.get_state_display().lower()}"})
    return request


def approve(request_id: int, admin: AbstractBaseUser, *, note: str = "") -> QuotaRequest:
    """Write the policy version that puts the request in force on its dates; notify the lead."""
    with transaction.atomic():
        request = _decide(request_id, admin)
        candidate = candidate_policy(active_policy().policy, request)
        lead = request.requested_by.get_username()
        comment = (
            f"quota request #{request.pk} ({request.summary}) by {lead}, approved by {admin.get_username()}: "
            f"{request.justification}"
        )[:500]
        record = create_version(dump_policy(candidate), author=admin, comment=comment)
        request.state = QuotaRequest.State.APPROVED
        request.decided_by = admin
        request.decided_at = timezone.now()
        request.decision_note = note.strip()[:MAX_TEXT]
        request.policy = record
        request.save()
        AuditEvent.objects.create(
            actor=admin,
            action="quota.approve",
            target=request.team.name,
            detail=f"#{request.pk}: {request.summary}; policy v{record.version}",
        )
    _notify(request)
    return request


def refuse(request_id: int, admin: AbstractBaseUser, *, reason: str) -> QuotaRequest:
    """Refuse with a reason the lead reads; the policy does not change."""
    reason = (reason or "").strip()
    if not reason:
        raise RequestError({"reason": "say why: the lead reads it"})
    with transaction.atomic():
        request = _decide(request_id, admin)
        request.state = QuotaRequest.State.REFUSED
        request.decided_by = admin
        request.decided_at = timezone.now()
        request.decision_note = reason[:MAX_TEXT]
        request.save()
        AuditEvent.objects.create(
            actor=admin, action="quota.refuse", target=request.team.name, detail=f"#{request.pk}: {reason}"
        )
    _notify(request)
    return request


def _notify(request: QuotaRequest) -> None:
    """E-mail the lead where the site configured mail; the dashboard shows the decision in any case."""
    lead = request.requested_by
    if not getattr(settings, "EMAIL_HOST", "") or not getattr(lead, "email", ""):
        return
    verdict = request.get_state_display().lower()
    body = f"Your quota request #{request.pk} for team {request.team.name} ({request.summary}) was {verdict}."
    if request.decision_note:
        body += f"\n\n{request.decision_note}"
    if request.policy is not None:
        body += (
            f"\n\nIt is in policy v{request.policy.version}, in force from {request.first_day} to {request.last_day}."
        )
    try:
        send_mail(f"npuportal: quota request #{request.pk} {verdict}", body, None, [lead.email])
    except OSError as exc:  # mail down: the dashboard still says it
        log.warning("could not e-mail %s about quota request #%s: %s", lead.email, request.pk, exc)


def visible_requests(user: AbstractUser) -> Any:
    """Admins see every request; a lead their teams'."""
    rows = QuotaRequest.objects.select_related("team", "requested_by", "decided_by", "policy")
    if user.is_staff:
        return rows
    if not roles_of(user).lead:
        return rows.none()
    teams = Membership.objects.filter(user=user, role=Membership.Role.LEAD).values("team")
    return rows.filter(team__in=teams)


def dashboard_notices(user: AbstractUser) -> list[dict[str, Any]]:
    """What the dashboard tells about quota requests: a lead's decided ones not yet seen, an admin's pending."""
    if not getattr(user, "is_authenticated", False):
        return []
    if user.is_staff:
        waiting = QuotaRequest.objects.filter(state=QuotaRequest.State.PENDING).count()
        return [{"text": f"{waiting} quota request(s) wait for your decision.", "pk": None}] if waiting else []
    out = []
    for r in visible_requests(user).filter(
        state__in=[QuotaRequest.State.APPROVED, QuotaRequest.State.REFUSED], seen_by_lead=False
    )[:10]:
        text = f"Quota request #{r.pk} for {r.team.name} ({r.summary}) was {r.get_state_display().lower()}"
        if r.state == QuotaRequest.State.APPROVED and r.policy is not None:
            text += f": policy v{r.policy.version}, in force from {r.first_day} to {r.last_day}."
        else:
            text += f": {r.decision_note}"
        out.append({"text": text, "pk": r.pk})
    return out
