"""Which jobs a job list shows — whose, in what order, filtered how — for the API and the console alike.

One filter set serves both lists (NetBox's way: the filterset is shared by the UI list and the API),
so ``/jobs/?state=pending,running&name=bert`` and ``/api/v1/jobs/?state=pending,running&name=bert``
answer the same jobs, and a filter added here is at once a query parameter of the API, a field of the
console's filter form and a line of the OpenAPI schema. The API answers a value it cannot read with a
400 naming the parameter; the console shows the same words beside the field.

Every list starts from :func:`visible_jobs`, so no filter can reach another team's jobs: a member who
names another team, or another team's user, gets what a name that does not exist gets — nothing.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, tzinfo
from typing import Any

import django_filters
from django import forms
from django.contrib.auth import get_user_model
from django.db.models import QuerySet, Subquery
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django_filters.fields import IsoDateTimeField

from npuportal.api import filters as api_filters
from quotas.models import Team
from quotas.tenancy.visibility import only_visible
from scheduling.models import Job

#: Newest first; the last column is unique, so a cursor is a total position (the (team, state,)
#: submitted_at, id indexes serve it).
JOB_ORDERING = ("-submitted_at", "-id")


def visible_jobs(user: object) -> QuerySet[Job]:
    """Admins see all jobs; everyone else only their teams' jobs.

    The user's team ids are read first (one small query) and filtered on as values:
    the database then walks the (team, …, submitted_at, id) indexes newest first and
    stops at the page's end, where a join through memberships sorts every row of the teams.
    """
    return only_visible(Job.objects.select_related("team", "submitter", "vnpu_template"), user)


class PolicyClock:
    """The zone of the policy's clock, read once when first asked: the dates of one filter set share it."""

    def __init__(self) -> None:
        self._zone: tzinfo | None = None

    @property
    def zone(self) -> tzinfo:
        if self._zone is None:
            from npuportal.display_time import policy_zone_name
            from scheduling.engine.policy import zone

            self._zone = zone(policy_zone_name())
        return self._zone


class UtcDateTimeField(IsoDateTimeField):
    """An ISO 8601 time or date, as UTC: any offset Python reads (up to ±23:59) becomes one the database takes.

    A value without an offset is on the policy's clock, as quota windows and months are: a date
    (``2026-12-01``) is the first instant of that day there, a bare time (``2026-12-01T08:00``) that
    wall-clock time there. So a date typed in the console means the day its pages show, and the API
    reads the same query string the same way whatever the server's own zone.
    """

    def __init__(self, *args: Any, clock: PolicyClock | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock = clock or PolicyClock()

    def to_python(self, value: object) -> datetime | None:
        if value in self.empty_values:
            return None
        text = str(value).strip()
        if len(text) in (8, 10):  # 2026-12-01, 20261201
            try:
                day = date.fromisoformat(text)
            except ValueError:
                pass
            else:
                return datetime(day.year, day.month, day.day, tzinfo=self.clock.zone)
        try:
            moment = parse_datetime(text)
        except ValueError:
            moment = None
        if moment is not None and timezone.is_aware(moment):
            return moment  # its offset says where it is: no zone to read
        with timezone.override(self.clock.zone):
            return super().to_python(value)

    def clean(self, value: object) -> datetime | None:
        moment = super().clean(value)
        if moment is None:
            return None
        try:
            return moment.astimezone(UTC)
        except OverflowError as exc:
            raise forms.ValidationError("out of range", code="invalid") from exc


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField


class StatesField(forms.MultipleChoiceField):
    """States given repeated (``?state=pending&state=running``) or by commas (``?state=pending,running``).

    Both mean "any of these". A piece that is no state (an empty one too) is refused, naming it.
    """

    def to_python(self, value: Any) -> list[str]:
        return split_states(super().to_python(value))

    def prepare_value(self, value: Any) -> Any:
        """The form shows ``?state=pending,running`` as two ticked states, as it filters."""
        return split_states(value) if isinstance(value, list | tuple) else value


def split_states(values: Any) -> list[str]:
    """``["pending,running", "failed"]`` → ``["pending", "running", "failed"]``."""
    return [piece.strip() for given in values for piece in str(given).split(",")]


class StateFilter(django_filters.MultipleChoiceFilter):
    field_class = StatesField


class JobFilterSet(api_filters.FilterSet):
    """The job list's filters: query parameters of ``GET /api/v1/jobs/`` and the console's ``/jobs/`` form.

    Each filter is a plain condition on the job row, so the list stays one range scan of an index:
    no DISTINCT (nothing here can repeat a row), and names resolved to ids inside the query — no
    filter adds a query of its own (a date or a time without an offset has the policy's zone read, once).
    """

    name = django_filters.CharFilter(
        lookup_expr="icontains", label="Name contains", help_text="Jobs whose name contains this text (any case)"
    )
    # The choices are the model's, whatever states it has.
    state = StateFilter(
        choices=Job.State.choices,
        label="State",
        help_text="Any of several: repeat it (?state=pending&state=running) or separate by commas "
        "(?state=pending,running)",
        distinct=False,
    )
    team = django_filters.CharFilter(method="filter_team", label="Team", help_text="The team's name")
    user = django_filters.CharFilter(method="filter_user", label="User", help_text="The submitter's user name")
    submitted_after = UtcDateTimeFilter(
        field_name="submitted_at",
        lookup_expr="gte",
        label="Submitted from",
        help_text="Jobs submitted at or after this time (ISO 8601; a date or a time without an offset is on "
        "the policy's clock)",
    )
    submitted_before = UtcDateTimeFilter(
        field_name="submitted_at",
        lookup_expr="lt",
        label="Submitted before",
        help_text="Jobs submitted before this time (ISO 8601; a date or a time without an offset is on the "
        "policy's clock)",
    )
    # ``npuctl history`` (like sacct's --starttime/--endtime): jobs that ended in [ended_after, ended_before).
    ended_after = UtcDateTimeFilter(
        field_name="ended_at",
        lookup_expr="gte",
        label="Ended from",
        help_text="Jobs that ended at or after this time (ISO 8601)",
    )
    ended_before = UtcDateTimeFilter(
        field_name="ended_at",
        lookup_expr="lt",
        label="Ended before",
        help_text="Jobs that ended before this time (ISO 8601)",
    )

    class Meta:
        model = Job
        fields = ["name", "state", "priority_class", "team", "user", "chip_model", "array_id"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        clock = PolicyClock()  # one read of the policy's zone for all the dates, and only if one needs it
        for date_filter in self.filters.values():
            if isinstance(date_filter, UtcDateTimeFilter):
                date_filter.field.clock = clock

    def filter_team(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        """Jobs of the team named ``value``: ``team_id = (SELECT id …)``, which the (team, …) indexes serve."""
        return queryset.filter(team_id=Subquery(Team.objects.filter(name=value).values("pk")[:1]))

    def filter_user(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        """Jobs submitted by the user named ``value`` (matched by id, without a join)."""
        users = get_user_model().objects.filter(username=value).values("pk")[:1]
        return queryset.filter(submitter_id=Subquery(users))
