"""Job use cases: submit and cancel, each owning its transaction; the state changes are ``scheduling.transitions``.

The API, the console, the admin and the CLI all come through here, so a rule
(who may submit what, how a cancel is recorded) is written once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.utils import timezone

from devices.agent.environment import check_submitted_env, env_bytes
from devices.models import Device, Node, VnpuTemplate
from npuportal import row_reads
from npuportal.limits import in_words
from quotas.models import Membership, Team
from quotas.policies.versions import active_policy
from quotas.tenancy.visibility import sees_team
from scheduling import transitions
from scheduling.engine import run_time
from scheduling.engine.feasibility import Request
from scheduling.engine.policy import policy_clock, quota_at
from scheduling.engine.words import duration_words
from scheduling.models import Job
from scheduling.services import feasibility, job_insert
from scheduling.services.dependencies import DependencyError, resolve

log = logging.getLogger(__name__)

#: Upper bound on any duration, so a typo of extra zeros is caught (one year).
MAX_DURATION_S = 366 * 86400
#: What a transition writes lives in ``scheduling.transitions``; these names stay importable from here.
RETRY_BUDGET = transitions.RETRY_BUDGET
END_STATES = transitions.END_STATES
REQUEUE_OUTCOMES = transitions.REQUEUE_OUTCOMES


class SubmissionError(ValueError):
    """Bad input for a job; ``field`` names the offending field for the API's error body."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class PermissionDenied(PermissionError):
    pass


@dataclass
class JobSpec:
    name: str
    command: str
    priority_class: str | None = None
    num_devices: int = 1
    vnpu_template: str | None = None
    chip_model: str | None = None
    estimated_duration_s: int = 3600
    max_duration_s: int | None = None
    #: The job saves its state this often, in seconds (``None``: it does not); see ``engine.work_lost``.
    checkpoint_interval_s: int | None = None
    #: Variables for the job's environment (docs/agent.md#environment); checked by :func:`check_run_settings`.
    env: dict[str, str] = field(default_factory=dict)
    #: Directory the job starts in, and a file its output is also appended to, on its nodes ("": defaults).
    cwd: str = ""
    output: str = ""
    #: Jobs it waits for, as Slurm's ``--dependency`` (a string or a list; ``scheduling.services.dependencies``);
    #: checked and resolved for the submitter at submission.
    depends_on: object = ""


#: Longest ``cwd`` or ``output`` path (the agent takes the same).
MAX_PATH_CHARS = 1024


def check_run_settings(spec: JobSpec) -> None:
    """Check the job's ``env``, ``cwd`` and ``output`` as a node agent takes them; ``SubmissionError`` names the field.

    The agent applies the same rules (``devices.agent.environment``), so a job refused here would
    never have started; what only a node can check (the account may enter ``cwd``) is its to say.
    """
    try:
        spec.env = check_submitted_env(spec.env)
    except ValueError as exc:
        raise SubmissionError("env", str(exc)) from None
    for name in ("cwd", "output"):
        value = getattr(spec, name) or ""
        if not isinstance(value, str):
            raise SubmissionError(name, "must be a string")
        if value and not value.startswith("/"):
            raise SubmissionError(name, "must be an absolute path (starting with /)")
        if len(value) > MAX_PATH_CHARS:
            raise SubmissionError(name, f"must be at most {MAX_PATH_CHARS} characters")
        if value and not value.isprintable():
            raise SubmissionError(name, "must be printable text on one line")
        setattr(spec, name, value)
    if spec.output.endswith("/"):
        raise SubmissionError("output", "must name a file, not a directory")


def submission_team(user: AbstractBaseUser, name: str | None) -> Team:
    """The team a submission goes to: the named one when ``user`` may act for it, else their only team.

    The same answer for "no such team" and "not yours", so names cannot be probed.
    One read through the user's memberships (an admin may name any team), written
    out (``npuportal.row_reads``): it runs on every API submission, where the ORM
    would spend more CPU compiling the join than the database takes to answer it.
    """
    team_id, team_name = row_reads.column(Team, "id"), row_reads.column(Team, "name")
    sql = f"SELECT {row_reads.columns(Team, 't')} FROM {row_reads.table(Team)} t"
    params: list[object] = []
    if not (name and user.is_staff):
        sql += (
            f" JOIN {row_reads.table(Membership)} m ON m.{row_reads.column(Membership, 'team')} = t.{team_id}"
            f" AND m.{row_reads.column(Membership, 'user')} = %s"
        )
        params.append(user.pk)
    if name:
        sql += f" WHERE t.{team_name} = %s"
        params.append(name)
    teams = [team for (team,) in row_reads.rows(sql + " LIMIT 2", params, Team)]
    if name:
        if not teams:
            raise SubmissionError("team", f"no team {name!r} that you belong to")
        return teams[0]
    if len(teams) != 1:
        raise SubmissionError("team", "required: you belong to several teams or none")
    return teams[0]


def _text_bytes(field_name: str, value: str) -> int:
    """Bytes of ``value`` in UTF-8, as the database and the agent take it; NUL and lone surrogates refused.

    Neither PostgreSQL nor a process's arguments can hold them, so they are bad input here,
    not a failure later in the database or on a node.
    """
    if "\x00" in value:
        raise SubmissionError(field_name, "must not contain NUL characters")
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise SubmissionError(field_name, "must be valid text (it holds a lone surrogate)") from None


def check_size(spec: JobSpec, count: int = 1) -> int:
    """Refuse a submission larger than the limits (docs/api.md#limits) before anything is read or written.

    ``count`` is the number of copies (a job array). Returns the bytes of one copy: its command,
    name, ``env``, ``cwd`` and ``output``, everything of a job that grows with what is sent.
    Settings are read at each call, so a deployment's limits apply at once.
    """
    if not isinstance(spec.name, str) or not spec.name.strip():
        raise SubmissionError("name", "must be a non-empty string")
    if len(spec.name) > 200:
        raise SubmissionError("name", "must be at most 200 characters")
    if not isinstance(spec.command, str) or not spec.command.strip():
        raise SubmissionError("command", "must be a non-empty string")
    command_bytes = _text_bytes("command", spec.command)
    if command_bytes > settings.MAX_COMMAND_BYTES:
        raise SubmissionError(
            "command",
            f"is {in_words(command_bytes)}; at most {in_words(settings.MAX_COMMAND_BYTES)} are allowed "
            "(put a long script in a file on the cluster and run that)",
        )
    if count > settings.MAX_ARRAY:
        raise SubmissionError("array", f"asks for {count:,} copies; at most {settings.MAX_ARRAY:,} in one array")
    check_run_settings(spec)  # env, cwd and output each within its own limit, so counting them is cheap
    parts = {
        "command": command_bytes,
        "env": env_bytes(spec.env),
        "cwd": _text_bytes("cwd", spec.cwd),
        "output": _text_bytes("output", spec.output),
    }
    job_bytes = sum(parts.values()) + _text_bytes("name", spec.name)
    if count * job_bytes > settings.MAX_SUBMIT_BYTES:
        most = f"one submission may write at most {in_words(settings.MAX_SUBMIT_BYTES)}"
        if count == 1:  # a limit set below one job's size: the largest part is what to shorten
            raise SubmissionError(
                max(parts, key=parts.__getitem__),
                f"with its name, env, cwd and output, the job is {in_words(job_bytes)}; {most}",
            )
        raise SubmissionError(
            "array",
            f"{count:,} copies of {job_bytes:,} bytes each (command, name, env, cwd and output) make "
            f"{in_words(count * job_bytes)}; " + most,
        )
    return job_bytes


def _validate(spec: JobSpec, team: Team, now: datetime) -> tuple[str, VnpuTemplate | None, int | None, str]:
    """Check a spec against the cluster and the team's quota in force now.

    Returns the priority class, vNPU template, max duration and chip model to store.
    The sizes are checked by the callers (``check_size``), with the array's count.
    """
    policy = active_policy().policy
    classes = {c.name for c in policy.priority_classes}
    pclass = spec.priority_class or policy.default_class.name
    if pclass not in classes:
        raise SubmissionError("priority_class", f"unknown class {pclass!r}; one of {', '.join(sorted(classes))}")
    quota, _ = quota_at(policy, team.name, now)
    if quota.allowed_priority_classes is not None and pclass not in quota.allowed_priority_classes:
        allowed = ", ".join(sorted(quota.allowed_priority_classes))
        raise SubmissionError("priority_class", f"team {team.name} may not use {pclass!r} (allowed: {allowed})")
    for field_name, value in (
        ("estimated_duration_s", spec.estimated_duration_s),
        ("max_duration_s", spec.max_duration_s),
        ("checkpoint_interval_s", spec.checkpoint_interval_s),
    ):
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SubmissionError(field_name, "must be a positive whole number of seconds")
        if value > MAX_DURATION_S:
            raise SubmissionError(field_name, f"must be at most {MAX_DURATION_S // 86400} days")
    max_s = spec.max_duration_s
    if quota.max_job_duration_s is not None:
        limit = duration_words(quota.max_job_duration_s)
        if max_s is not None and max_s > quota.max_job_duration_s:
            raise SubmissionError(
                "max_duration_s", f"{duration_words(max_s)} is more than team {team.name}'s {limit} limit on run time"
            )
        if spec.estimated_duration_s > quota.max_job_duration_s:
            raise SubmissionError(
                "estimated_duration_s",
                f"an estimate of {duration_words(spec.estimated_duration_s)} is more than team {team.name}'s "
                f"{limit} limit on run time",
            )
        max_s = max_s or int(quota.max_job_duration_s)
    if max_s is not None and spec.estimated_duration_s > max_s:
        raise SubmissionError(
            "estimated_duration_s",
            f"{duration_words(spec.estimated_duration_s)} is more than the job's maximum run time "
            f"({duration_words(max_s)})",
        )

    chip = (spec.chip_model or "").strip()
    # One indexed count answers "is there such a chip?"; the list of known chips is read only
    # to word the error. Whether there are enough cards is the engine's to say (below).
    if chip and not _device_count(chip):
        chips = sorted(
            set(
                Device.objects.filter(node__removed_at__isnull=True)
                .order_by()
                .values_list("chip_model", flat=True)
                .distinct()
            )
        )
        raise SubmissionError("chip_model", f"no device of model {chip!r} in the cluster; known: {', '.join(chips)}")
    template = None
    if spec.vnpu_template:
        candidates = VnpuTemplate.objects.filter(name=spec.vnpu_template)
        if chip:
            candidates = candidates.filter(chip_model=chip)
        found = list(candidates[:2])
        if not found:
            raise SubmissionError(
                "vnpu_template", f"unknown vNPU template {spec.vnpu_template!r}" + (f" for {chip}" if chip else "")
            )
        if len(found) > 1:
            raise SubmissionError(
                "chip_model", f"template {spec.vnpu_template!r} exists on several chip models; name one"
            )
        template = found[0]
        chip = template.chip_model
        if spec.num_devices != 1:
            raise SubmissionError("num_devices", "must be 1 for a vNPU job")
    else:
        if not isinstance(spec.num_devices, int) or isinstance(spec.num_devices, bool) or spec.num_devices < 1:
            raise SubmissionError("num_devices", "must be a whole number >= 1")
    # More cards than any pool holds, a shape no server offers, a quota that never allows it:
    # one rule (scheduling/engine/feasibility.py), the one the tick and the simulator apply.
    impossible = feasibility.check(
        policy,
        Request(
            team=team.name,
            num_devices=spec.num_devices,
            chip_model=chip or None,
            vnpu_template=template.name if template else None,
            priority_class=pclass,
            duration_s=float(run_time.limit_of(spec.max_duration_s, spec.estimated_duration_s)),
            estimated_duration_s=float(spec.estimated_duration_s),
            today=policy_clock(policy, now)[2],
        ),
    )
    if impossible is not None:
        raise SubmissionError(impossible.field, f"this job can never run here: {impossible.reason}")
    return pclass, template, max_s, chip


def _device_count(chip: str) -> int:
    """Cards in the inventory, of ``chip`` when given (one indexed count; removed nodes left out).

    Every submission asks, so it is written as SQL: the ORM spends several times
    longer compiling this count than the database takes to answer it.
    """
    meta, node_meta = Device._meta, Node._meta
    quote = connection.ops.quote_name
    sql = (
        f"SELECT COUNT(*) FROM {quote(meta.db_table)} d JOIN {quote(node_meta.db_table)} n "
        f"ON n.{quote(node_meta.pk.column)} = d.{quote(meta.get_field('node').column)} "
        f"WHERE n.{quote(node_meta.get_field('removed_at').column)} IS NULL"
    )
    params: list[str] = []
    if chip:
        sql += f" AND d.{quote(meta.get_field('chip_model').column)} = %s"
        params.append(chip)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0])


def submit_job(
    *,
    team: Team,
    user: AbstractBaseUser,
    spec: JobSpec,
    now: datetime | None = None,
    array_id: str = "",
    array_index: int | None = None,
    member_checked: bool = False,
) -> Job:
    """Validate and queue one job; the next tick considers it.

    ``member_checked=True`` says the caller found ``team`` through ``user``'s own
    memberships (or the user is an admin) a moment ago, so the same check is not
    read twice on the API's hottest path; every other caller leaves it ``False``.
    The job and its ``Submitted`` event are written atomically: in one statement
    on PostgreSQL (``job_insert``), in one transaction elsewhere.
    """
    check_size(spec)
    if not member_checked and not sees_team(user, team):
        raise PermissionDenied(f"{user} is not a member of team {team.name}")
    now = now or timezone.now()
    pclass, template, max_s, chip = _validate(spec, team, now)
    spec = _with_dependencies(spec, user)
    job = _new_job(team, user, spec, now, pclass, template, max_s, chip, name=spec.name.strip())
    job.array_id = array_id
    job.array_index = array_index
    event = _submitted_event(job, actor=user)
    if job_insert.available():
        job_insert.insert_with_event(job, event)
    else:
        with transaction.atomic():
            job.save(force_insert=True)
            event.job = job
            event.save()
    return job


def _with_dependencies(spec: JobSpec, user: AbstractBaseUser) -> JobSpec:
    """``spec`` with its ``depends_on`` checked for ``user`` and in its stored form (``SubmissionError`` naming it)."""
    try:
        return replace(spec, depends_on=resolve(spec.depends_on, user))
    except DependencyError as exc:
        raise SubmissionError("depends_on", str(exc)) from None


def submit_array(
    *,
    team: Team,
    user: AbstractBaseUser,
    spec: JobSpec,
    count: int | None = None,
    indices: Sequence[int] | None = None,
    limit: int | None = None,
    now: datetime | None = None,
    member_checked: bool = False,
) -> list[Job]:
    """Queue copies of one spec as a job array: ``count`` of them (indices 0 to count-1, Slurm's
    ``--array=0-(N-1)``), or one per index of ``indices`` (``--array=1,3,5``; ``scheduling.services.arrays``).
    ``limit``: at most this many run at once (``%N``).

    The copies differ only in name (``name[i]``, or ``name`` for an array of the one index 0)
    and index, so the spec is validated once, against the longest name, and the
    jobs and their events are written in bulk: one statement on PostgreSQL
    (``job_insert``), a transaction of bulk inserts elsewhere. The array id is
    ``A<id of its first job>``: unique without a lock, and it says where the array starts.
    """
    if indices is None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise SubmissionError("array", "must be a whole number >= 1")
        indices = range(count)
    elif not indices:
        raise SubmissionError("array", "names no index")
    count = len(indices)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise SubmissionError("array_limit", "must be a whole number >= 1")
    suffixed = list(indices[:2]) != [0]
    # Sized before anything is built for the copies: the count itself may be the abuse.
    check_size(replace(spec, name=f"{spec.name}[{max(indices)}]" if suffixed else spec.name), count)
    if not member_checked and not sees_team(user, team):
        raise PermissionDenied(f"{user} is not a member of team {team.name}")
    now = now or timezone.now()
    names = [f"{spec.name}[{index}]" for index in indices] if suffixed else [spec.name]
    pclass, template, max_s, chip = _validate(spec, team, now)
    spec = _with_dependencies(spec, user)
    if job_insert.available():
        # The database names and numbers the copies; the same rows as the path below.
        # ``name[i]`` stripped is the name stripped on the left, then ``[i]``.
        first_name = spec.name.lstrip() if suffixed else spec.name.strip()
        pattern = _new_job(team, user, spec, now, pclass, template, max_s, chip, name=first_name, array_limit=limit)
        made = job_insert.insert_array(pattern, _submitted_event(pattern, actor=user), list(indices), suffixed)
        jobs = []
        for (pk, index, array_id), name in zip(made, names, strict=True):
            job = _new_job(
                team, user, spec, now, pclass, template, max_s, chip, name=name.strip(), array_index=index,
                array_limit=limit,
            )  # fmt: skip
            job.pk, job.array_id = pk, array_id
            job._state.adding = False
            job._state.db = connection.alias
            jobs.append(job)
        return jobs
    with transaction.atomic():
        return _submit_array_orm(user, spec, now, list(zip(indices, names, strict=True)), limit,
                                 (team, pclass, template, max_s, chip))  # fmt: skip


def _submit_array_orm(
    user: AbstractBaseUser,
    spec: JobSpec,
    now: datetime,
    names: list[tuple[int, str]],
    limit: int | None,
    checked: tuple[Team, str, VnpuTemplate | None, int | None, str],
) -> list[Job]:
    """``submit_array``'s writes through the ORM, for databases without INSERT in a CTE."""
    team, pclass, template, max_s, chip = checked
    jobs = [
        _new_job(
            team,
            user,
            spec,
            now,
            pclass,
            template,
            max_s,
            chip,
            name=name.strip(),
            array_index=index,
            array_limit=limit,
        )
        for index, name in names
    ]
    first, rest = jobs[0], jobs[1:]
    first.save(force_insert=True)
    array_id = f"A{first.pk}"
    Job.objects.filter(pk=first.pk).update(array_id=array_id)
    for job in jobs:
        job.array_id = array_id
    Job.objects.bulk_create(rest)
    if any(job.pk is None for job in rest):  # a database that cannot return ids from a bulk insert
        ids = dict(Job.objects.filter(array_id=array_id).values_list("array_index", "id"))
        for job in rest:
            job.pk = ids[job.array_index]
    transitions.record_submissions(jobs, actor=user)
    return jobs


def _new_job(
    team: Team,
    user: AbstractBaseUser,
    spec: JobSpec,
    now: datetime,
    pclass: str,
    template: VnpuTemplate | None,
    max_s: int | None,
    chip: str,
    *,
    name: str,
    array_index: int | None = None,
    array_limit: int | None = None,
) -> Job:
    """An unsaved pending job of a validated spec (its ``depends_on`` resolved), as every submission path stores it."""
    return Job(
        team=team,
        submitter=user,
        name=name,
        command=spec.command,
        priority_class=pclass,
        num_devices=spec.num_devices,
        vnpu_template=template,
        chip_model=chip,
        estimated_duration_s=spec.estimated_duration_s,
        max_duration_s=max_s,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        submitted_at=now,
        pending_reason="Submitted",
        pending_detail="waiting for the next scheduling tick",
        array_index=array_index,
        array_limit=array_limit,
        depends_on=str(spec.depends_on or ""),
        env=dict(spec.env or {}),
        cwd=spec.cwd or "",
        output=spec.output or "",
    )


#: The job-state transitions, under the names the callers know (``scheduling.transitions`` writes them).
record_submission = transitions.record_submission
_submitted_event = transitions.submitted_event
finish_job = transitions.finish
fail_job = transitions.fail
requeue_job = transitions.requeue
cancel_waiting = transitions.cancel_waiting_many


@transaction.atomic
def cancel_job(job_id: int, *, actor: AbstractBaseUser | None, reason: str = "Cancelled by user") -> Job:
    """Cancel a pending or running job; its devices are free at the next tick, its run is stopped after the commit."""
    job = Job.objects.select_for_update().select_related("team").get(pk=job_id)
    if actor is not None and not sees_team(actor, job.team):
        raise PermissionDenied("not your team's job")
    if job.is_final:
        raise SubmissionError("state", f"job is already {job.state}")
    transitions.cancel(job, actor=actor, detail=reason)
    return job
