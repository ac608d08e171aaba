"""One filter set for the job lists: the API and the console answer a query string with the same jobs.

``scheduling/filters.py`` holds :class:`JobFilterSet`; ``GET /api/v1/jobs/`` and the console's
``/jobs/`` (and its live region) both read it, so each combination below must list the same job ids
in the same order in all three places, for an admin and for a member, and no filter may show a
member another team's jobs or tell them whether another team's names exist.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from quotas.models import Team
from scheduling.models import Job

pytestmark = pytest.mark.django_db

#: A fixed week, far from today: nothing here depends on the date the tests run.
BASE = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
NAMES = ("bert-pretrain", "BERT-finetune", "resnet", "llama-sweep")
CHIPS = ("910B4", "910A", "310P3", "")
CLASSES = ("normal", "high", "low")
TEAMS = ("training", "research", "inference")


@pytest.fixture
def people(demo, user_factory):
    return {
        "admin": user_factory("root", staff=True),
        "lead": user_factory("lena", team="training", role="lead"),
        "member": user_factory("max", team="training"),
        "olga": user_factory("olga", team="research", role="lead"),
        "ines": user_factory("ines", team="inference", role="lead"),
    }


@pytest.fixture
def jobs(people) -> list[Job]:
    """48 jobs over three teams, every state, four names, chips and three classes, 2 h apart."""
    teams = {name: Team.objects.get(name=name) for name in TEAMS}
    submitters = {"training": people["lead"], "research": people["olga"], "inference": people["ines"]}
    states = Job.State.values
    made = []
    for i in range(48):
        team = TEAMS[i % 3]
        made.append(
            Job(
                team=teams[team],
                submitter=submitters[team],
                name=f"{NAMES[i % 4]}-{i}",
                command="true",
                priority_class=CLASSES[(i // 3) % 3],
                chip_model=CHIPS[(i // 2) % 4],
                state=states[i % len(states)],
                submitted_at=BASE + timedelta(hours=2 * i),
                array_id="A900" if i in (4, 7, 10) else "",
            )
        )
    return Job.objects.bulk_create(made)


def _client(user: object) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'href="/jobs/(\d+)/"', html)]


def _api_ids(api, user: object, query: str) -> list[int]:
    resp = api(user).get(f"/api/v1/jobs/?limit=1000&{query}")
    assert resp.status_code == 200, (query, resp.content)
    return [job["id"] for job in resp.json()["results"]]


def _console_ids(user: object, query: str, *, live: bool = False) -> list[int]:
    resp = _client(user).get(f"/{'live/' if live else ''}jobs/?{query}")
    assert resp.status_code == 200, (query, resp.status_code)
    return _ids(resp.content.decode())


QUERIES = [
    "",
    "state=pending&state=running",
    "state=pending,running",
    "state=completed,failed&name=bert",
    "name=BERT",
    "name=sweep&chip_model=910A",
    "user=olga",
    "user=lena&state=pending",
    "team=research",
    "team=training&priority_class=high",
    "priority_class=low&chip_model=310P3",
    "array_id=A900",
    "submitted_after=2026-11-29",
    "submitted_after=2026-11-29&submitted_before=2026-12-01",
    "submitted_before=2026-11-29T06:00:00Z&state=pending,completed",
    "submitted_after=2026-11-28T20:00&name=resnet",
    "team=no-such-team",
]


@pytest.mark.parametrize("role", ["admin", "member"])
@pytest.mark.parametrize("query", QUERIES)
def test_the_api_and_the_console_list_the_same_jobs_for_a_query_string(people, jobs, api, role, query) -> None:
    user = people[role]
    expected = _api_ids(api, user, query)
    assert _console_ids(user, query) == expected[:100]
    assert _console_ids(user, query, live=True) == expected[:100], "the live region keeps the filters"


def test_several_states_mean_any_of_them_repeated_or_by_commas(people, jobs, api) -> None:
    admin = people["admin"]
    repeated = _api_ids(api, admin, "state=pending&state=running&name=-")
    assert repeated == _api_ids(api, admin, "state=pending,running&name=-")
    assert repeated == _api_ids(api, admin, "state=pending&state=running,pending&name=-")
    states = set(Job.objects.filter(pk__in=repeated).values_list("state", flat=True))
    assert states == {"pending", "running"}
    assert len(repeated) == Job.objects.filter(name__contains="-", state__in=["pending", "running"]).count()


def test_each_filter_narrows_as_it_says(people, jobs, api) -> None:
    mine = {job.pk for job in jobs}
    admin = people["admin"]

    def listed(query: str) -> set[int]:
        return set(_api_ids(api, admin, query)) & mine

    assert listed("name=bErT") == {j.pk for j in jobs if "bert" in j.name.lower()}
    assert listed("user=olga") == {j.pk for j in jobs if j.submitter == people["olga"]}
    assert listed("team=inference") == {j.pk for j in jobs if j.team.name == "inference"}
    assert listed("priority_class=high") == {j.pk for j in jobs if j.priority_class == "high"}
    assert listed("chip_model=310P3") == {j.pk for j in jobs if j.chip_model == "310P3"}
    assert listed("state=failed,cancelled") == {j.pk for j in jobs if j.state in ("failed", "cancelled")}
    after = BASE + timedelta(hours=30)
    assert listed(f"submitted_after={after:%Y-%m-%dT%H:%MZ}") == {j.pk for j in jobs if j.submitted_at >= after}
    assert listed(f"submitted_before={after:%Y-%m-%dT%H:%MZ}") == {j.pk for j in jobs if j.submitted_at < after}


@pytest.mark.clock
def test_a_date_is_that_day_on_the_policy_clock(people, api) -> None:
    """``submitted_after=D`` starts at midnight of D where the policy's clock is, not in UTC."""
    from npuportal.display_time import policy_zone_name
    from scheduling.engine.policy import zone

    midnight = datetime(2026, 12, 2, tzinfo=zone(policy_zone_name()))
    team = Team.objects.get(name="training")
    before, after = Job.objects.bulk_create(
        Job(
            team=team,
            submitter=people["lead"],
            name=name,
            command="true",
            priority_class="normal",
            submitted_at=midnight + offset,
        )
        for name, offset in (("late-on-the-1st", -timedelta(minutes=30)), ("early-on-the-2nd", timedelta(minutes=30)))
    )
    for user in (people["admin"], people["member"]):
        for query, expected in [
            ("submitted_after=2026-12-02&name=-on-the-", [after.pk]),
            ("submitted_before=2026-12-02&name=-on-the-", [before.pk]),
            ("submitted_after=2026-12-01&submitted_before=2026-12-03&name=-on-the-", [after.pk, before.pk]),
            ("submitted_after=2026-12-01T23:45&name=-on-the-", [after.pk]),  # a wall-clock time there
        ]:
            assert _api_ids(api, user, query) == expected, query
            assert _console_ids(user, query) == expected, query
            assert _console_ids(user, query, live=True) == expected, query


def test_a_member_cannot_see_or_probe_other_teams_through_any_filter(people, jobs, api) -> None:
    member = people["member"]
    training = set(Job.objects.filter(team__name="training").values_list("pk", flat=True))
    research_job = next(j for j in jobs if j.team.name == "research")
    probes = [
        "team=research",
        "team=research&state=pending,running",
        "user=olga",
        f"name={research_job.name}",
        f"name={research_job.name}&team=research&user=olga",
        "chip_model=910A&team=inference",
        "priority_class=high&user=ines",
        "array_id=A900&team=research",
        "submitted_after=2026-11-27&team=research",
    ]
    for query in probes:
        for ids in (_api_ids(api, member, query), _console_ids(member, query), _console_ids(member, query, live=True)):
            assert set(ids) <= training, query
    # Another team's name, or another team's user, answers exactly what a name that does not exist does.
    for real, unknown in [("team=research", "team=no-such-team"), ("user=olga", "user=no-such-user")]:
        assert api(member).get(f"/api/v1/jobs/?{real}").json() == api(member).get(f"/api/v1/jobs/?{unknown}").json()
        for prefix in ("/jobs/", "/live/jobs/"):
            # The pages differ only in the value asked for, echoed in the form (and the per-request CSRF token).
            seen, nothing = (
                re.sub(
                    r'csrfmiddlewaretoken" value="\w+"', "", _client(member).get(f"{prefix}?{q}").content.decode()
                ).replace(q.split("=")[1], "X")
                for q in (real, unknown)
            )
            assert seen == nothing, (prefix, real)
    page = _client(member).get("/jobs/").content.decode()
    assert research_job.name not in page
    assert "research" not in page and "inference" not in page, "the form lists no other team"


def _form(resp: object) -> str:
    """The filter form of a ``/jobs/`` page."""
    return resp.content.decode().split('id="job-filters"')[1].split("</form>")[0]


def test_the_form_is_the_filter_sets_own_and_shows_what_filters_the_list(people, jobs) -> None:
    form = _form(_client(people["admin"]).get("/jobs/?state=pending,running&name=bert&team=research"))
    for name in ("name", "state", "team", "user", "priority_class", "chip_model", "submitted_after"):
        assert f'name="{name}"' in form, name
    for state in Job.State.values:  # every state the model has, whatever they are
        assert f'value="{state}"' in form
    assert re.search(r'value="pending"[^>]*checked', form) and re.search(r'value="running"[^>]*checked', form)
    assert not re.search(r'value="failed"[^>]*checked', form)
    assert 'value="bert"' in form and re.search(r'<option value="research" selected>', form)
    assert 'href="/jobs/">Clear' in form
    # An admin chooses among every team; a member of one team gets no team field at all.
    assert all(f'<option value="{team}"' in form for team in TEAMS)
    member_form = _form(_client(people["member"]).get("/jobs/"))
    assert 'name="team"' not in member_form and 'name="user"' in member_form
    # A filter the form does not offer still shows, so none applies unseen.
    arrays = _form(_client(people["admin"]).get("/jobs/?array_id=A900"))
    assert 'name="array_id"' in arrays and 'value="A900"' in arrays


def test_a_submitted_form_leaves_no_empty_fields_in_the_address(people, jobs) -> None:
    client = _client(people["admin"])
    resp = client.get("/jobs/?name=bert&state=pending&state=running&team=&user=&submitted_after=&chip_model=")
    assert resp.status_code == 302 and resp["Location"] == "/jobs/?name=bert&state=pending&state=running"
    assert client.get("/jobs/?name=&team=")["Location"] == "/jobs/"


def test_a_bad_filter_value_is_named_and_the_others_still_apply(people, jobs, api) -> None:
    admin = people["admin"]
    resp = api(admin).get("/api/v1/jobs/?state=pending,sleeping")
    assert resp.status_code == 400 and resp.json()["field"] == "state" and "sleeping" in resp.json()["error"]
    assert api(admin).get("/api/v1/jobs/?state=pending,").json()["field"] == "state"
    assert api(admin).get("/api/v1/jobs/?submitted_after=2026-13-01").json()["field"] == "submitted_after"
    html = _client(admin).get("/jobs/?state=sleeping&name=resnet&submitted_after=soon").content.decode()
    errors = html.split('id="filter-errors"')[1].split("</div>")[0]
    assert "State (state)" in errors and "sleeping" in errors and "Submitted from (submitted_after)" in errors
    assert _ids(html) == _api_ids(api, admin, "name=resnet")[:100]


def test_pages_of_a_filtered_list_keep_the_filters(people, jobs, monkeypatch) -> None:
    from scheduling.services import console

    monkeypatch.setattr(console, "JOB_LIST_PAGE", 4)
    client = _client(people["admin"])
    query = "state=pending,completed&name=e"
    expected = list(
        Job.objects.filter(state__in=["pending", "completed"], name__icontains="e")
        .order_by("-submitted_at", "-id")
        .values_list("pk", flat=True)
    )
    html, seen = client.get(f"/jobs/?{query}").content.decode(), []
    while True:
        seen += _ids(html)
        assert f'hx-get="/live/jobs/?{query}' in html.replace("&amp;", "&").replace("%2C", ",")
        older = re.search(r'href="\?([^"]*)">Older', html)
        if not older:
            break
        link = older.group(1).replace("&amp;", "&")
        assert link.replace("%2C", ",").startswith(query + "&cursor="), link
        html = client.get(f"/jobs/?{link}").content.decode()
    assert seen == expected and len(seen) > 8


@pytest.mark.parametrize("role", ["admin", "member"])
def test_a_filtered_list_is_a_fixed_number_of_queries(people, api, role, django_assert_max_num_queries) -> None:
    """Every filter at once: the same queries for 6 jobs and for 60 (no query per row, no COUNT)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    query = (
        "state=pending,running&state=completed&name=job&user=lena&team=training&priority_class=normal"
        "&chip_model=910B4&submitted_after=2026-11-01&submitted_before=2026-12-31"
    )
    team, lead = Team.objects.get(name="training"), people["lead"]
    user, client = people[role], _client(people[role])
    api(user).get("/api/v1/jobs/")  # the token's first use
    sizes: dict[str, list[int]] = {}
    for count in (6, 60):
        Job.objects.bulk_create(
            Job(
                team=team,
                submitter=lead,
                name=f"job-{count}-{i}",
                command="true",
                priority_class="normal",
                chip_model="910B4",
                state=("pending", "running", "completed")[i % 3],
                submitted_at=BASE + timedelta(minutes=i),
            )
            for i in range(count)
        )
        for label, get in [
            ("api", lambda: api(user).get(f"/api/v1/jobs/?{query}")),
            ("page", lambda: client.get(f"/jobs/?{query}")),
            ("live", lambda: client.get(f"/live/jobs/?{query}")),
        ]:
            with CaptureQueriesContext(connection) as ctx:
                assert get().status_code == 200
            assert not [q for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()], label
            sizes.setdefault(label, []).append(len(ctx.captured_queries))
    assert all(len(set(counts)) == 1 for counts in sizes.values()), sizes
    # The live region, polled every 3 s: its five (session, user, display clock, team ids, page), plus
    # the policy's zone for the dates.
    assert sizes["live"][0] <= 6, sizes
