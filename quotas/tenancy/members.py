"""Team self-service: a lead adds and removes members, sets their role and their limits. Audited.

A team the policy runs from the directory (``teams[].directory``) takes its membership from the
directory's groups: adding, removing and roles are refused there (the directory is where to change
them), while the limits on a member stay the lead's. An invitation by e-mail waits until someone
signs in with that address (through the directory, single sign-on or a local account an admin
made), then makes them a member: :func:`accept_invitations`, run at every sign-in.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone

from quotas.directory.apply import is_directory_team
from quotas.models import AuditEvent, Membership, Team
from quotas.models.tenancy import TeamInvitation
from quotas.policies.versions import active_policy

log = logging.getLogger(__name__)

MAX_LIMIT_CARDS = 100_000
MAX_LIMIT_JOBS = 100_000


class MemberError(ValueError):
    """A refused change, every field at once: ``errors`` maps the field to why.

    ``conflict``: the request was well formed but the team's state refuses it (its only lead, someone
    already in it, a team the directory runs); the API answers 409 to those, 400 to the rest.
    ``gone``: the member is not (or no longer) in the team, as when another request removed them a
    moment before; the API answers 404, as it does to a member it never found.
    """

    def __init__(self, errors: dict[str, str], *, conflict: bool = False, gone: bool = False) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors
        self.conflict = conflict
        self.gone = gone


def may_manage(user: Any, team: Team) -> bool:
    """Leads of the team and admins run it."""
    if getattr(user, "is_staff", False):
        return True
    return Membership.objects.filter(user=user, team=team, role=Membership.Role.LEAD).exists()


def _check(actor: Any, team: Team, *, membership: bool) -> None:
    if not may_manage(actor, team):
        raise MemberError({"team": f"only the leads of {team.name} (and admins) may change its members"})
    if membership and is_directory_team(team.name):
        raise MemberError(
            {"team": f"{team.name}'s members come from the directory; change its group there, not here"},
            conflict=True,
        )


def _audit(actor: Any, action: str, team: Team, detail: str) -> None:
    AuditEvent.objects.create(actor=actor, action=action, target=team.name, detail=detail[:2000])


def add_member(
    actor: AbstractBaseUser,
    team: Team,
    who: str,
    role: str = Membership.Role.MEMBER,
    *,
    link_for: Callable[[str], str] | None = None,
) -> str:
    """Add an existing account (by username) or invite an e-mail address; the outcome in words.

    ``link_for`` makes the invitation's absolute link from its secret (the view knows the host).
    """
    _check(actor, team, membership=True)
    who = (who or "").strip()
    if role not in Membership.Role.values:
        raise MemberError({"role": "lead or member"})
    if not who:
        raise MemberError({"who": "a username, or an e-mail address to invite"})
    users = get_user_model().objects
    user = users.filter(username__iexact=who).first()
    if user is None and "@" in who:
        user = users.filter(email__iexact=who, is_active=True).first()
        if user is None:
            return invite(actor, team, who, role, link_for=link_for)
    if user is None:
        raise MemberError({"who": f"no account {who!r}; give an e-mail address to invite someone new"})
    if not user.is_active:
        raise MemberError({"who": f"{user.get_username()} is inactive"})
    with transaction.atomic():
        _, created = Membership.objects.get_or_create(user=user, team=team, defaults={"role": role})
        if not created:
            raise MemberError({"who": f"{user.get_username()} is already in {team.name}"}, conflict=True)
        _audit(actor, "team.member_add", team, f"added {user.get_username()} as {role}")
    return f"{user.get_username()} is now a {role} of {team.name}."


def invite(
    actor: AbstractBaseUser, team: Team, email: str, role: str, *, link_for: Callable[[str], str] | None = None
) -> str:
    """Invite ``email``: they join at their first sign-in with that address, or through the link.

    The link (``/invite/<secret>/``, valid :data:`INVITATION_DAYS` days) lets someone without an
    account make one where the site has no directory; it is e-mailed where mail is configured, and
    shown to the lead either way so they can pass it on.
    """
    try:
        validate_email(email)
    except ValidationError as exc:
        raise MemberError({"who": f"{email!r} is not an e-mail address"}) from exc
    secret = secrets.token_urlsafe(24)
    with transaction.atomic():
        _, created = TeamInvitation.objects.get_or_create(
            team=team,
            email=email.lower(),
            accepted_at=None,
            defaults={"role": role, "invited_by": actor, "token_hash": token_hash(secret)},
        )
        if not created:
            raise MemberError({"who": f"{email} is already invited to {team.name}"}, conflict=True)
        _audit(actor, "team.invite", team, f"invited {email} as {role}")
    text = f"{email} is invited: they join {team.name} as {role} when they first sign in with that address."
    if link_for is None:
        return text
    link = link_for(secret)
    if getattr(settings, "EMAIL_HOST", ""):
        body = (
            f"{actor.get_username()} invites you to the team {team.name} on npuportal, as {role}.\n\n"
            f"Open {link} within {INVITATION_DAYS} days to join."
        )
        try:
            send_mail(f"npuportal: join the team {team.name}", body, None, [email])
        except OSError as exc:  # mail down: the lead has the link on the page
            log.warning("could not e-mail the invitation to %s: %s", email, exc)
    return f"{text} Their link, to pass on (valid {INVITATION_DAYS} days): {link}"


INVITATION_DAYS = 14


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def open_invitation(secret: str) -> TeamInvitation | None:
    """The invitation this link's secret opens, if it is unused and not older than :data:`INVITATION_DAYS` days."""
    if not secret or len(secret) > 100:
        return None
    since = timezone.now() - timedelta(days=INVITATION_DAYS)
    return (
        TeamInvitation.objects.select_related("team")
        .filter(token_hash=token_hash(secret), accepted_at__isnull=True, created__gte=since)
        .first()
    )


def join_by_invitation(invitation: TeamInvitation, user: Any) -> str:
    """``user`` takes up ``invitation``: a member of its team in its role; audited."""
    team = invitation.team
    with transaction.atomic():
        _, created = Membership.objects.get_or_create(user=user, team=team, defaults={"role": invitation.role})
        invitation.accept(user)
        if created:
            _audit(None, "team.invite_accepted", team, f"{user.get_username()} joined as {invitation.role} (link)")
    return f"You are a {invitation.role} of {team.name}." if created else f"You are already in {team.name}."


def accept_invitations(user: Any) -> list[str]:
    """Turn the open invitations for ``user``'s e-mail into memberships (at sign-in); the teams joined."""
    email = (getattr(user, "email", "") or "").strip().lower()
    if not email:
        return []
    joined = []
    with transaction.atomic():
        for invitation in TeamInvitation.objects.select_for_update().filter(email=email, accepted_at__isnull=True):
            team = invitation.team
            if not is_directory_team(team.name):
                _, created = Membership.objects.get_or_create(user=user, team=team, defaults={"role": invitation.role})
                if created:
                    joined.append(team.name)
                    _audit(None, "team.invite_accepted", team, f"{user.get_username()} joined as {invitation.role}")
            invitation.accept(user)
    return joined


def remove_member(actor: AbstractBaseUser, team: Team, membership_id: object) -> str:
    _check(actor, team, membership=True)
    membership = _membership(team, membership_id)
    name = membership.user.get_username()
    if membership.role == Membership.Role.LEAD and not team.memberships.filter(role="lead").exclude(pk=membership.pk):
        raise MemberError({"member": f"{name} is the team's only lead; make someone else lead first"}, conflict=True)
    with transaction.atomic():
        membership.delete()
        _audit(actor, "team.member_remove", team, f"removed {name} (their jobs and history stay the team's)")
    return f"{name} is no longer in {team.name}."


def set_role(actor: AbstractBaseUser, team: Team, membership_id: object, role: object) -> str:
    _check(actor, team, membership=True)
    membership = _membership(team, membership_id)
    if role not in Membership.Role.values:
        raise MemberError({"role": "lead or member"})
    if membership.role == role:
        return f"{membership.user.get_username()} is already {role}."
    if role == Membership.Role.MEMBER and not team.memberships.filter(role="lead").exclude(pk=membership.pk):
        raise MemberError({"role": "the team would have no lead; make someone else lead first"}, conflict=True)
    with transaction.atomic():
        before = membership.role
        membership.role = str(role)
        membership.save(update_fields=["role"])
        _audit(actor, "team.member_role", team, f"{membership.user.get_username()}: {before} → {role}")
    return f"{membership.user.get_username()} is now {role}."


def _read_limit(value: object, field: str, *, whole: bool, top: float, errors: dict[str, str]) -> float | None:
    text = str(value if value is not None else "").strip()
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        errors[field] = f"a number, or empty for no limit; got {text!r}"
        return None
    if not math.isfinite(number) or number <= 0 or number > top or (whole and number != int(number)):
        kind = "a whole number" if whole else "a number"
        errors[field] = f"{kind} from 1 to {top:g}, or empty for no limit; got {text}"
        return None
    return number


def set_limits(actor: AbstractBaseUser, team: Team, membership_id: object, cards: object, jobs: object) -> str:
    """A member's cards and jobs at once (empty: no limit beyond the team's); the engine enforces them."""
    _check(actor, team, membership=False)
    membership = _membership(team, membership_id)
    errors: dict[str, str] = {}
    max_cards = _read_limit(cards, "max_devices", whole=False, top=MAX_LIMIT_CARDS, errors=errors)
    max_jobs = _read_limit(jobs, "max_jobs", whole=True, top=MAX_LIMIT_JOBS, errors=errors)
    team_cards, team_jobs = team_ceiling(team.name)
    if max_cards is not None and team_cards is not None and max_cards > team_cards:
        errors["max_devices"] = f"{max_cards:g} is above the team's own maximum of {team_cards:g} cards"
    if max_jobs is not None and team_jobs is not None and max_jobs > team_jobs:
        errors["max_jobs"] = f"{max_jobs:g} is above the team's own maximum of {team_jobs} jobs at once"
    if errors:
        raise MemberError(errors)
    with transaction.atomic():
        membership.max_devices = max_cards
        membership.max_jobs = int(max_jobs) if max_jobs is not None else None
        membership.save(update_fields=["max_devices", "max_jobs"])
        _audit(actor, "team.member_limits", team, f"{membership.user.get_username()}: {limits_text(membership)}")
    return f"{membership.user.get_username()}: {limits_text(membership)}."


def team_ceiling(team_name: str) -> tuple[float | None, int | None]:
    """The most cards and jobs at once the team may have from today on (base quota or any schedule); ``None``: no cap.

    A member's limits live inside these: a limit above them would never bite.
    """
    from scheduling.engine.feasibility import quota_variants
    from scheduling.engine.policy import DEVICES, policy_clock

    policy = active_policy().policy
    quotas = quota_variants(policy.team(team_name), policy_clock(policy, timezone.now())[2])
    caps = [q.max.get(DEVICES) for q in quotas]
    jobs = [q.max_concurrent_jobs for q in quotas]
    return (
        None if any(c is None for c in caps) else max(c for c in caps if c is not None),
        None if any(j is None for j in jobs) else max(j for j in jobs if j is not None),
    )


def limits_text(membership: Membership) -> str:
    parts = []
    if membership.max_devices is not None:
        parts.append(f"at most {membership.max_devices:g} cards at once")
    if membership.max_jobs is not None:
        parts.append(f"at most {membership.max_jobs} jobs at once")
    return ", ".join(parts) or "no limit beyond the team's"


def _membership(team: Team, membership_id: object) -> Membership:
    try:
        return Membership.objects.select_related("user").get(team=team, pk=int(str(membership_id)))
    except (ValueError, Membership.DoesNotExist) as exc:
        raise MemberError({"member": f"no such member of {team.name}"}, gone=True) from exc
