"""Sign-in locks (django-axes): the page a locked-out person sees, the admins' unlock, the audit.

Axes counts failed sign-ins per account and per client address in the database and refuses the
next one past ``AXES_FAILURE_LIMIT`` until ``AXES_COOLOFF_TIME`` has passed since the last counted
failure. This module is what the project adds around it: a console page that says when to try
again (not axes' bare text), unlocking that leaves a trace in the audit log, and an audit event
when a lock starts, so admins see brute force on the same page as every other change.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.views import LoginView
from django.db.models import Max, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from npuportal.client_ip import client_address
from quotas.models import AuditEvent

logger = logging.getLogger(__name__)


def retry_at(username: str | None, ip_address: str | None) -> datetime:
    """When sign-in is certainly open again for this account and address.

    Failures count for the cool-off after each one, and refused attempts are not counted
    (``AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False``), so the last counted failure
    plus the cool-off is when every failure behind the lock has lapsed.
    """
    match = Q(pk__in=[])
    if username:
        match |= Q(username=username)
    if ip_address:
        match |= Q(ip_address=ip_address)
    last = AccessAttempt.objects.filter(match).aggregate(last=Max("attempt_time"))["last"]
    return (last or timezone.now()) + settings.AXES_COOLOFF_TIME


def login_context() -> dict[str, int]:
    """What the sign-in page says about the lock, from the settings in force."""
    return {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "cooloff_minutes": max(1, round(settings.AXES_COOLOFF_TIME.total_seconds() / 60)),
    }


class ConsoleLoginView(LoginView):
    """Django's sign-in view; its page also says how many failures lock sign-in, and for how long,
    offers "Sign in with …" when single sign-on is configured, and says why one did not sign the
    person in (the reason the OIDC backend left in the session)."""

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        from quotas.directory import oidc
        from quotas.directory.ldap import DIRECTORY_ERROR_ATTR

        context = {**super().get_context_data(**kwargs), **login_context()}
        context["directory_error"] = getattr(self.request, DIRECTORY_ERROR_ATTR, "")
        if oidc.enabled():
            context["sso_name"] = settings.NPUPORTAL_OIDC_NAME
            if self.request.GET.get("sso") == "failed":
                context["sso_error"] = self.request.session.pop(oidc.SSO_ERROR_KEY, "") or (
                    "the identity provider did not confirm who you are"
                )
        return context


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: dict[str, Any] | None = None
) -> HttpResponse:
    """The console's "sign-in locked" page (HTTP 429 with ``Retry-After``), for /login/ and /admin/login/."""
    username = get_client_username(request, credentials)
    ip_address = getattr(request, "axes_ip_address", None) or client_address(request)
    until = retry_at(username, ip_address)
    wait_s = max(0, math.ceil((until - timezone.now()).total_seconds()))
    context = {
        "retry_at": until,
        "wait_minutes": max(1, math.ceil(wait_s / 60)),
        **login_context(),
    }
    response = render(request, "registration/locked_out.html", context, status=429)
    response["Retry-After"] = str(wait_s)
    return response


def _unlock(actor: AbstractBaseUser | None, field: str, values: Iterable[str | None], what: str) -> int:
    """Forget the failed sign-ins of these accounts (or addresses), audited; the number of rows cleared."""
    wanted = sorted({v for v in values if v})
    if not wanted:
        return 0
    count, _ = AccessAttempt.objects.filter(**{f"{field}__in": wanted}).delete()
    AuditEvent.objects.create(
        actor=actor,
        action=f"signin.unlock_{what}",
        target=", ".join(wanted)[:200],
        detail=f"cleared {count} failed sign-in record(s)",
    )
    return count


def unlock_accounts(actor: AbstractBaseUser | None, usernames: Iterable[str | None]) -> int:
    """Sign-in opens again for these accounts, from any address not locked on its own."""
    return _unlock(actor, "username", usernames, "account")


def unlock_addresses(actor: AbstractBaseUser | None, addresses: Iterable[str | None]) -> int:
    """Sign-in opens again from these client addresses, for any account not locked on its own."""
    return _unlock(actor, "ip_address", addresses, "address")


def record_lockout(
    sender: object, request: HttpRequest, username: str | None, ip_address: str | None, **_: Any
) -> None:
    """Audit the failure that starts a lock (axes' ``user_locked_out``); refused attempts are only logged.

    Axes sends the signal for both. Only the failure that was counted carries
    ``axes_failures_since_start``, so one lock makes one audit event however long it is hammered.
    """
    if getattr(request, "axes_failures_since_start", None) is None:
        logger.warning("sign-in refused while locked: username=%r address=%s", username, ip_address)
        return
    until = retry_at(username, ip_address)
    AuditEvent.objects.create(
        actor=None,
        action="signin.locked",
        target=f"{username or '?'} from {ip_address or '?'}"[:200],
        detail=(
            f"{request.axes_failures_since_start} failed sign-ins (limit {settings.AXES_FAILURE_LIMIT}) "
            f"on {request.path}; refused until {timezone.localtime(until):%Y-%m-%d %H:%M:%S %Z}"
        ),
    )
