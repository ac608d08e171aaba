"""One team's place in the scheduling policy: its weight, base quota and fair share — read and changed.

Admins change a team's weight (``shares``) and base ``guaranteed``/``max``
quota on the console's Teams page and with ``PATCH /api/v1/teams/{name}/``,
without editing YAML. Both come here, so the input rules and their messages
are written once.

A change is made on the *parsed* policy — the team's ``TeamPolicy`` is
replaced, nothing else is touched — and written back with ``dump_policy``,
then stored and activated by :func:`quotas.policies.versions.create_version` like any
other version: it is validated against the cluster, kept in the history with
its comment, audited, and diffable. Editing the text instead (a search and
replace on ``shares: 50``) could hit another team, a department or a comment;
the typed policy cannot. The price is that the new version is the canonical
export, so comments in the previous YAML are not carried over.

The fair-share figures (normalised shares and the classic factor) are computed
the way the tick and ``manage.py sshare`` compute them, so what the Teams page
shows after a change is what the scheduler will use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from quotas.models import AuditEvent, Membership, Policy, Team
from quotas.policies.versions import active_policy, cluster_facts, create_version, parsed
from scheduling.engine.fairshare import fair_share_table, tree_from_usage
from scheduling.engine.policy import (
    DEVICES,
    PolicyError,
    PolicyIssue,
    TeamPolicy,
    dump_policy,
    load_policy,
    semantic_diff,
)
from scheduling.engine.policy import Policy as ParsedPolicy

#: Largest weight accepted. Shares only matter relative to the siblings', so a
#: bigger number is a typo (or a unit mix-up), not a wish.
MAX_SHARES = 1_000_000.0
#: Largest guaranteed/max amount accepted, in device units (cards).
MAX_DEVICE_UNITS = 100_000.0
#: Longest comment; the policy version stores at most this many characters.
MAX_COMMENT_CHARS = 500
#: Error key for a problem that belongs to no single field (Django's ``NON_FIELD_ERRORS``).
NON_FIELD = "__all__"

_DECIMAL = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class TeamChangeError(ValueError):
    """A team change that cannot be made; nothing was stored.

    ``errors`` maps each offending field (``shares``, ``guaranteed.devices``,
    ``max.devices/910B4``, ``comment``, ``base_version`` or :data:`NON_FIELD`)
    to the reason, so a form can put each message next to its field and the
    API can name the first one.
    """

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{k}: {v}" if k != NON_FIELD else v for k, v in self.errors.items()))

    @property
    def field(self) -> str | None:
        """The first offending field, ``None`` when the problem is not one field's."""
        first = next(iter(self.errors))
        return None if first == NON_FIELD else first


def read_amount(value: object, *, limit: float) -> float:
    """``value`` (a number, or the text of one) as a float in ``[0, limit]``.

    Raises ``ValueError`` whose message is the reason, worded like the policy
    validator's (``must be a number >= 0, got 'abc'``) so the console, the API
    and ``policy validate`` read alike. Text is read strictly: no ``nan``,
    ``inf`` or ``1_000``, which ``float()`` would accept.
    """
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, str):
        text = value.strip()
        if not _DECIMAL.match(text):
            raise ValueError(f"must be a number >= 0, got {value!r}")
        shown = text
        number = float(text)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ValueError(f"must be a number >= 0, got {shown}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"must be a number >= 0, got {shown}")
    if number > limit:
        raise ValueError(f"must be at most {limit:.15g}, got {shown}")
    return number


# -- what a team has now --------------------------------------------------------


@dataclass(frozen=True)
class TeamSettings:
    """What an admin edits for one team: the weight and the base quota's guaranteed/max per resource."""

    shares: float
    guaranteed: Mapping[str, float]
    max: Mapping[str, float]
    #: Whether the policy names the team; if not, it runs on ``spec.defaults``.
    named: bool


def team_settings(policy: ParsedPolicy, name: str) -> TeamSettings:
    team = policy.team(name)
    return TeamSettings(team.shares, dict(team.quota.guaranteed), dict(team.quota.max), name in policy.teams)


def resource_keys(settings: TeamSettings, chip_models: Collection[str]) -> list[str]:
    """The resource keys a form offers: ``devices``, one per chip model of the cluster, any already set."""
    keys = {DEVICES} | {f"{DEVICES}/{chip}" for chip in chip_models} | set(settings.guaranteed) | set(settings.max)
    return sorted(keys, key=lambda k: (k != DEVICES, k))


@dataclass(frozen=True)
class TeamRow:
    """One team as the Teams page shows it: who is in it, its weight, its share and its quota."""

    name: str
    department: str | None  # the fair-share parent in the policy (None: under the root)
    members: int
    leads: int
    named: bool
    shares: float
    norm_shares: float  # the team's share of the whole cluster, down the department → team tree
    fair_share: float  # the classic factor the tick gives the team's priority, in [0, 1]
    usage_hours: float  # decayed device-hours the factor is computed from
    guaranteed: Mapping[str, float]
    max: Mapping[str, float]
    schedules: tuple[str, ...] = field(default=())

    @property
    def norm_percent(self) -> float:
        return 100.0 * self.norm_shares


def team_overview(names: Collection[str] | None = None, *, now: datetime | None = None) -> list[TeamRow]:
    """Every team (or those in ``names``) with its weight, fair share and base quota under the active policy.

    The fair-share tree is always built over the whole cluster — a team's
    share depends on its siblings' — even when only some rows are asked for.
    """
    from scheduling.services.snapshot import _usage  # the tick's own usage sums, as `manage.py sshare` uses

    policy = active_policy().policy
    now = now or timezone.now()
    teams = Team.objects.annotate(
        n_members=Count("memberships"),
        n_leads=Count("memberships", filter=Q(memberships__role=Membership.Role.LEAD)),
    ).order_by("name")
    if names is not None:
        teams = teams.filter(name__in=list(names))
    teams = list(teams)
    usage, _ = _usage(now, policy)
    tree = tree_from_usage(policy, usage)
    for team in teams:
        tree.setdefault(team.name, {"parent": None, "shares": float(policy.team(team.name).shares)})
    by_name = {row.name: row for row in fair_share_table(tree)}
    rows = []
    for team in teams:
        fs = by_name[team.name]
        tp = policy.team(team.name)
        rows.append(
            TeamRow(
                name=team.name,
                department=fs.parent,
                members=team.n_members,
                leads=team.n_leads,
                named=team.name in policy.teams,
                shares=tp.shares,
                norm_shares=fs.norm_shares,
                fair_share=fs.fair_share,
                usage_hours=fs.raw_usage,
                guaranteed=dict(sorted(tp.quota.guaranteed.items(), key=lambda kv: (kv[0] != DEVICES, kv[0]))),
                max=dict(sorted(tp.quota.max.items(), key=lambda kv: (kv[0] != DEVICES, kv[0]))),
                schedules=tuple(s.name for s in tp.schedules),
            )
        )
    return rows


# -- changing it ----------------------------------------------------------------


def team_changed_yaml(
    policy: ParsedPolicy,
    name: str,
    *,
    shares: float | None = None,
    guaranteed: Mapping[str, float | None] | None = None,
    maximum: Mapping[str, float | None] | None = None,
) -> str:
    """The YAML of ``policy`` with team ``name``'s weight and base quota changed; nothing else differs.

    ``guaranteed``/``maximum`` merge key by key onto the base quota, ``None``
    removing a key (no guarantee / no cap), as a schedule override does; a
    key not given keeps its value. A team the policy does not name gets its
    own entry, a copy of ``spec.defaults`` (same quota and schedules, no
    department), so only what was asked changes for it. The result is not
    validated here: parse it (``create_version`` does).
    """
    current = policy.teams.get(name)
    if current is None:
        base = policy.defaults
        current = TeamPolicy(name=name, department=None, shares=base.shares, quota=base.quota, schedules=base.schedules)
    quota = replace(
        current.quota,
        guaranteed=_merged(current.quota.guaranteed, guaranteed),
        max=_merged(current.quota.max, maximum),
    )
    team = replace(current, shares=current.shares if shares is None else float(shares), quota=quota)
    teams = dict(policy.teams)
    teams[name] = team
    return dump_policy(replace(policy, teams=teams))


def _merged(base: Mapping[str, float], change: Mapping[str, float | None] | None) -> dict[str, float]:
    out = dict(base)
    for key, value in (change or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = float(value)
    return out


@dataclass(frozen=True)
class TeamChange:
    """A stored change: the new active version, what it changed, and what the validator warned about."""

    record: Policy
    before: TeamSettings
    after: TeamSettings
    changes: list[str]
    warnings: list[str]


def change_team(
    team: str,
    *,
    comment: object,
    author: AbstractBaseUser | None,
    shares: object = None,
    guaranteed: Mapping[str, object] | None = None,
    maximum: Mapping[str, object] | None = None,
    base_version: int | None = None,
) -> TeamChange:
    """Change ``team``'s weight and/or base quota as a new, active policy version.

    Values may be numbers or their text, as a form or a JSON body sends them;
    in ``guaranteed``/``maximum`` an empty text or ``None`` removes the key. Every
    bad field is reported at once in a :class:`TeamChangeError` and nothing is
    stored. ``base_version`` (the version the admin was looking at) refuses
    the change if another admin activated a newer one meanwhile, so nobody
    silently undoes someone else's edit.
    """
    errors: dict[str, str] = {}
    new_shares: float | None = None
    if isinstance(shares, str) and not shares.strip():
        errors["shares"] = "required: the team's fair-share weight, a number >= 0"
    elif shares is not None:
        try:
            new_shares = read_amount(shares, limit=MAX_SHARES)
        except ValueError as exc:
            errors["shares"] = str(exc)
    new_guaranteed = _read_resources("guaranteed", guaranteed, errors)
    new_max = _read_resources("max", maximum, errors)
    text_comment = comment.strip() if isinstance(comment, str) else ""
    if not text_comment:
        errors["comment"] = "say why you change the team: the comment is kept in the policy history"
    elif len(text_comment) > MAX_COMMENT_CHARS:
        errors["comment"] = f"must be at most {MAX_COMMENT_CHARS} characters, got {len(text_comment)}"
    if errors:
        raise TeamChangeError(errors)

    with transaction.atomic():
        # Lock the active row so two admins changing teams at once apply one after the other.
        current = Policy.objects.select_for_update().filter(is_active=True).first()
        current_version = current.version if current else None
        if base_version is not None and base_version != current_version:
            now_active = f"v{current_version}" if current else "none"
            raise TeamChangeError(
                {
                    "base_version": f"the active policy is now {now_active}, not v{base_version}: "
                    "someone changed it meanwhile; reload and try again"
                }
            )
        if current is None:
            base = active_policy().policy  # the built-in defaults
        else:
            try:
                base = parsed(current)
            except PolicyError as exc:
                raise TeamChangeError(
                    {
                        NON_FIELD: f"the active policy v{current.version} no longer validates ({exc.issues[0]}); "
                        "fix it in the policy editor first"
                    }
                ) from exc
        text = team_changed_yaml(base, team, shares=new_shares, guaranteed=new_guaranteed, maximum=new_max)
        chips, capacity = cluster_facts()
        candidate, issues = load_policy(text, chip_models=chips or None, capacity=capacity if chips else None)
        if candidate is None:
            raise TeamChangeError(_field_errors(issues, team, candidate_order(base, team)))
        changes = semantic_diff(base, candidate)
        if not changes:
            raise TeamChangeError(
                {NON_FIELD: f"nothing to change: these are team {team}'s values in the active policy"}
            )
        record = create_version(text, author=author, comment=text_comment)
        AuditEvent.objects.create(
            actor=author,
            action="team.change",
            target=f"team {team}",
            detail=f"policy v{record.version}: " + "; ".join(changes),
        )
    return TeamChange(
        record=record,
        before=team_settings(base, team),
        after=team_settings(candidate, team),
        changes=changes,
        warnings=[str(i) for i in issues if i.severity == "warning"],
    )


def candidate_order(policy: ParsedPolicy, team: str) -> int:
    """Index of ``team`` in the changed policy's ``spec.teams`` (a new entry goes last)."""
    names = list(policy.teams)
    return names.index(team) if team in names else len(names)


def _read_resources(kind: str, values: Mapping[str, object] | None, errors: dict[str, str]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, raw in (values or {}).items():
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            out[key] = None
            continue
        try:
            out[key] = read_amount(raw, limit=MAX_DEVICE_UNITS)
        except ValueError as exc:
            errors[f"{kind}.{key}"] = str(exc)
    return out


def _field_errors(issues: list[PolicyIssue], team: str, index: int) -> dict[str, str]:
    """The validator's errors as form fields: the team's own fields by name, anything else whole."""
    prefix = f"spec.teams[{index}]."
    errors: dict[str, str] = {}
    for issue in issues:
        if issue.severity != "error":
            continue
        key = NON_FIELD
        message = str(issue)
        if issue.path.startswith(prefix):
            rest = issue.path[len(prefix) :]
            if rest == "shares":
                key, message = "shares", issue.message
            elif rest.startswith(("quota.guaranteed.", "quota.max.")):
                key, message = rest[len("quota.") :], issue.message
            else:
                message = f"team {team}: {rest}: {issue.message}"
        errors[key] = f"{errors[key]}; {message}" if key in errors else message
    return errors
