"""One display time zone for the whole console: the policy's clock, labelled on every time.

Quota schedules, months and statements already run on the policy's ``timezone``;
job pages used to print UTC beside them, unlabelled, so "08:15" meant two
different instants on two pages. Now every console page renders in the policy's
zone (:class:`DisplayZoneMiddleware`), every time says which zone it is in
(the ``when`` filter, a template builtin), and the page footer names the zone once.

The API is left alone: it answers ISO 8601 with an explicit offset, which needs no label.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django import template
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html

#: Paths that render no console page: they keep the server's own zone and skip the policy read.
NOT_CONSOLE = ("/api/", "/static/", "/healthz", "/metrics")

#: ``when``'s formats by name: the default is to the minute.
FORMATS = {"": "%Y-%m-%d %H:%M", "s": "%Y-%m-%d %H:%M:%S", "time": "%H:%M:%S"}


def policy_zone_name() -> str:
    """The active policy's ``timezone`` (the built-in defaults' when none was ever applied)."""
    from quotas.policies.versions import active_policy

    return active_policy().policy.timezone


class DisplayZoneMiddleware:
    """Console pages render in the policy's zone; one cached read of the active policy per page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(NOT_CONSOLE):
            return self.get_response(request)
        from npuportal.api.error_handling import DATABASE_DOWN, database_down
        from scheduling.engine.policy import zone

        try:
            name = policy_zone_name()
        except DATABASE_DOWN as exc:  # no page can be shown: say why, as the views would (one log line)
            return database_down(request, exc)
        timezone.activate(zone(name))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


def clock(request: HttpRequest) -> dict[str, str]:
    """Context processor: the zone pages are shown in, for the footer line."""
    return {"display_zone": timezone.get_current_timezone_name()}


register = template.Library()


@register.filter
def when(value: datetime | None, style: str = "") -> str:
    """``2026-12-02 08:15 CST`` in the display zone, in a ``<time>`` whose title is the ISO instant.

    ``style``: ``""`` to the minute, ``"s"`` to the second, ``"time"`` the time of day.
    ``None`` (or anything not a datetime) is ``""``,
    so ``{{ t|when|default:"—" }}`` works.
    """
    if not isinstance(value, datetime):
        return ""
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    text = f"{local.strftime(FORMATS.get(style, FORMATS['']))} {local.tzname() or ''}".strip()
    return format_html('<time datetime="{}" title="{}">{}</time>', local.isoformat(), local.isoformat(), text)


@register.filter
def seconds(value: float | None) -> str:
    """A length of time in seconds as the policy writes durations (``90m`` → ``1h30m``); ``""`` for none."""
    from scheduling.engine.durations import format_duration

    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    return format_duration(value)


def clock_text(value: datetime, style: str = "") -> str:
    """``value`` as plain text on the policy's clock, labelled (``2026-12-02 08:15 CST``), for words that embed
    a time outside a page: an event's detail, an error message. ``style`` as :func:`when`'s."""
    from scheduling.engine.policy import zone

    local = value.astimezone(zone(policy_zone_name()))
    return f"{local.strftime(FORMATS.get(style, FORMATS['']))} {local.tzname() or ''}".strip()


def as_shown(value: datetime | None, style: str = "") -> str:
    """``value`` exactly as a console page shows it, from outside a request (tests, e-mails)."""
    from scheduling.engine.policy import zone

    with timezone.override(zone(policy_zone_name())):
        return when(value, style)
