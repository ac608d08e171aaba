"""Roles and pages as people expect: menus per role, console 403/404, confirmations, PRG, one clock, the form."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone
from django.utils.html import escape

from devices.models import Node
from quotas.models import ApiToken, Policy
from quotas.policies.versions import active_policy, create_version
from scheduling.models import Job
from scheduling.services.jobs import JobSpec, submit_job

pytestmark = pytest.mark.django_db

MENU = 'nav aria-label="main"'


def _finance() -> object:
    user = get_user_model().objects.create_user("fiona", password="pw-fiona")
    user.groups.add(Group.objects.get(name="finance"))
    return user


def _nav(html: str) -> str:
    return html[html.index(MENU) : html.index("</nav>")]


def _pending(lead: object, name: str = "sweep") -> Job:
    return submit_job(team=lead.memberships.get().team, user=lead, spec=JobSpec(name=name, command="true"))


# -- the demo's finance login -----------------------------------------------------------------


def test_the_demo_has_a_finance_login_in_the_logins_file(demo, settings) -> None:
    from scheduling.demo import logins_file

    finance = get_user_model().objects.get(username="finance")
    assert finance.groups.filter(name="finance").exists() and not finance.is_staff
    assert not finance.memberships.exists()  # no team: no jobs
    names = [line.split("\t")[0] for line in logins_file().read_text().splitlines() if line.strip()]
    assert "finance" in names


# -- menus follow the role ---------------------------------------------------------------------


def test_finance_menu_has_reports_and_statements_but_no_submission(demo, client) -> None:
    client.force_login(_finance())
    assert client.get("/").url == "/reports/"  # finance starts on the reports
    page = client.get("/reports/")
    nav = _nav(page.content.decode())
    assert "Reports" in nav and "Statements" in nav and "Rate cards" in nav
    for absent in ("Submit", "Jobs", "Policy", "Teams", "Audit"):
        assert absent not in nav
    submit = client.get("/jobs/new/")
    assert submit.status_code == 403 and "Not allowed" in submit.content.decode()


def test_lead_menu_has_jobs_submit_quota_tokens_and_no_admin_pages(demo, client, user_factory) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    nav = _nav(client.get("/").content.decode())
    for present in ("Jobs", "Submit", "Quota", "Tokens", "Reports"):
        assert present in nav
    for absent in ("Policy", "Teams", "Audit", "Admin", "Rate cards"):
        assert absent not in nav


def test_a_member_who_leads_no_team_sees_no_costs_in_the_menu(demo, client, user_factory) -> None:
    client.force_login(user_factory("mia", team="inference"))
    nav = _nav(client.get("/").content.decode())
    assert "Submit" in nav and "Reports" not in nav and "Policy" not in nav


def test_admin_menu_has_everything(demo, client, user_factory) -> None:
    client.force_login(user_factory("ops", staff=True))
    nav = _nav(client.get("/").content.decode())
    for present in ("Jobs", "Submit", "Cluster", "Reports", "Rate cards", "Teams", "Policy", "Audit", "Admin"):
        assert present in nav


# -- 403 and 404 are console pages; the API keeps its JSON -------------------------------------


@pytest.mark.parametrize("path", ["/policy/", "/policy/history/", "/teams/", "/audit/", "/policy/v1/"])
def test_a_lead_on_an_admin_page_gets_the_console_403_not_the_admin_login(demo, client, user_factory, path) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    response = client.get(path)
    assert response.status_code == 403  # not a 302 to /admin/login/
    html = response.content.decode()
    assert response["Content-Type"].startswith("text/html")
    assert "Not allowed" in html and "This page is for admins." in html
    assert MENU in html and "Submit" in _nav(html)  # the console's own page, with the lead's menu


def test_a_lead_cannot_cordon_a_node_even_by_hand(demo, client, user_factory) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    assert client.post("/nodes/ascend-a-01/cordon/", {"confirm": "yes"}).status_code == 403
    assert Node.objects.get(name="ascend-a-01").state == "ready"


def test_unknown_console_page_is_the_console_404(demo, client, user_factory) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    response = client.get("/no/such/page/")
    html = response.content.decode()
    assert response.status_code == 404 and "Not found" in html and "/no/such/page/" in html
    assert MENU in html
    other = client.get("/jobs/999999/")
    assert other.status_code == 404 and MENU in other.content.decode()


def test_api_403_and_404_stay_json(demo, client, user_factory) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    missing = client.get("/api/v1/no-such-endpoint/")
    assert missing.status_code == 404 and missing["Content-Type"].startswith("application/json")
    assert missing.json()["error"]
    forbidden = client.post("/api/v1/nodes/ascend-a-01/cordon/", {}, content_type="application/json")
    assert forbidden.status_code == 403 and forbidden["Content-Type"].startswith("application/json")
    assert set(forbidden.json()) >= {"error", "field"}


# -- confirmations -----------------------------------------------------------------------------


def test_cancel_without_confirmation_asks_and_changes_nothing(demo, client, user_factory) -> None:
    lead = user_factory("lena", team="inference", role="lead")
    job = _pending(lead)
    client.force_login(lead)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'data-confirm="Cancel job #{job.pk} (sweep)?"' in page and "js/confirm.js" in page
    asked = client.post(f"/jobs/{job.pk}/cancel/")
    html = asked.content.decode()
    assert asked.status_code == 200 and f"Cancel job #{job.pk} (sweep)?" in html
    assert 'name="confirm" value="yes"' in html
    job.refresh_from_db()
    assert job.state == "pending"
    done = client.post(f"/jobs/{job.pk}/cancel/", {"confirm": "yes"})
    assert done.status_code == 302
    job.refresh_from_db()
    assert job.state == "cancelled"


def test_cordon_drain_restore_and_revoke_ask_first(demo, client, user_factory) -> None:
    admin = user_factory("ops", staff=True)
    client.force_login(admin)
    page = client.get("/nodes/ascend-a-01/").content.decode()
    assert 'data-confirm="Cordon ascend-a-01?' in page and 'data-confirm="Drain ascend-a-01?' in page
    for action in ("cordon", "drain"):
        asked = client.post(f"/nodes/ascend-a-01/{action}/", {"reason": "fan"})
        assert asked.status_code == 200 and 'name="reason" value="fan"' in asked.content.decode()
        assert Node.objects.get(name="ascend-a-01").state == "ready"
    assert client.post("/nodes/ascend-a-01/cordon/", {"reason": "fan", "confirm": "yes"}).status_code == 302
    assert Node.objects.get(name="ascend-a-01").state == "cordoned"
    assert client.post("/nodes/ascend-a-01/uncordon/").status_code == 302  # putting it back asks nothing
    assert Node.objects.get(name="ascend-a-01").state == "ready"

    first = active_policy().version
    create_version(Policy.objects.get(version=first).yaml_text, author=admin, comment="again", activate=True)
    history = client.get("/policy/history/").content.decode()
    assert f'data-confirm="Restore policy v{first}?' in history
    assert client.post(f"/policy/v{first}/restore/").status_code == 200
    assert active_policy().version != first
    assert client.post(f"/policy/v{first}/restore/", {"confirm": "yes"}).status_code == 302
    assert active_policy().version == first

    client.post("/tokens/", {"name": "laptop"})
    token = ApiToken.objects.get(user=admin)
    assert "data-confirm=\"Revoke the token 'laptop'?" in client.get("/tokens/").content.decode()
    assert client.post("/tokens/", {"revoke": token.pk}).status_code == 200
    assert ApiToken.objects.filter(pk=token.pk).exists()
    assert client.post("/tokens/", {"revoke": token.pk, "confirm": "yes"}).status_code == 302
    assert not ApiToken.objects.filter(pk=token.pk).exists()


# -- every form answers with a redirect --------------------------------------------------------


def test_a_new_token_is_shown_once_after_a_redirect_and_a_reload_makes_no_second(demo, client, user_factory) -> None:
    client.force_login(user_factory("tina", team="training"))
    created = client.post("/tokens/", {"name": "laptop"})
    assert created.status_code == 302 and created.url == "/tokens/"
    shown = client.get("/tokens/")
    html = shown.content.decode()
    assert 'id="new-key"' in html and shown["Cache-Control"] == "no-store"
    key = html.split('id="new-key">')[1].split("<")[0]
    assert key.startswith("npu_")
    again = client.get("/tokens/").content.decode()  # the reload after the redirect
    assert 'id="new-key"' not in again and key not in again
    assert ApiToken.objects.filter(name="laptop").count() == 1


def test_a_bad_token_name_says_so_and_makes_nothing(demo, client, user_factory) -> None:
    client.force_login(user_factory("tina", team="training"))
    response = client.post("/tokens/", {"name": ""})
    assert response.status_code == 200 and "Name the token" in response.content.decode()
    assert not ApiToken.objects.exists()


# -- one display time zone, labelled -----------------------------------------------------------


def test_times_are_on_the_policys_clock_and_say_so(demo, client, user_factory) -> None:
    from zoneinfo import ZoneInfo

    lead = user_factory("lena", team="inference", role="lead")
    job = _pending(lead)
    client.force_login(lead)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    zone_name = active_policy().policy.timezone
    local = job.submitted_at.astimezone(ZoneInfo(zone_name))
    label = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"
    assert label in html
    assert f'<time datetime="{local.isoformat()}"' in html
    assert f"Times are {zone_name}, the policy's clock." in html
    listing = client.get("/jobs/").content.decode()
    assert label in listing
    tokens = client.get("/tokens/").content.decode()
    assert f"Times are {zone_name}" in tokens


def test_the_api_keeps_iso_times_with_their_offset(demo, api, user_factory) -> None:
    lead = user_factory("lena", team="inference", role="lead")
    job = _pending(lead)
    body = api(lead).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["submitted_at"].endswith(("Z", "+00:00"))  # unchanged by the console's display zone
    assert timezone.get_current_timezone_name() == "UTC"  # nothing leaks out of a request


# -- the job form: durations and arrays --------------------------------------------------------


FORM = {
    "name": "sweep",
    "command": "python train.py",
    "priority_class": "normal",
    "num_devices": "1",
    "chip_model": "",
    "vnpu_template": "",
}


def _form(team: str, **fields: str) -> dict[str, str]:
    from quotas.models import Team

    return {**FORM, "team": str(Team.objects.get(name=team).pk), **fields}


@pytest.mark.parametrize(
    ("typed", "seconds"), [("2h", 7200), ("30m", 1800), ("1h30m", 5400), ("90s", 90), ("600", 600)]
)
def test_durations_are_typed_as_on_the_cli(demo, client, user_factory, typed, seconds) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    response = client.post("/jobs/new/", _form("inference", estimated_duration_s=typed, max_duration_s="3h"))
    assert response.status_code == 302
    job = Job.objects.get(name="sweep")
    assert job.estimated_duration_s == seconds and job.max_duration_s == 3 * 3600


def test_the_form_takes_a_checkpoint_interval(demo, client, user_factory) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    response = client.post("/jobs/new/", _form("inference", estimated_duration_s="1h", checkpoint_interval_s="30m"))
    assert response.status_code == 302
    assert Job.objects.get(name="sweep").checkpoint_interval_s == 1800
    response = client.post("/jobs/new/", _form("inference", estimated_duration_s="1h", checkpoint_interval_s="0"))
    assert response.status_code == 200 and 'id="checkpoint_interval_s-error"' in response.content.decode()


def test_a_bad_duration_is_an_error_naming_the_field(demo, client, user_factory) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    response = client.post("/jobs/new/", _form("inference", estimated_duration_s="2x", max_duration_s=""))
    html = response.content.decode()
    assert response.status_code == 200 and 'id="estimated_duration_s-error"' in html
    assert "Estimated run time: &#x27;2x&#x27; is not a duration like 90s, 15m, 2h, 1h30m, 1d, 30:00," in html
    response = client.post("/jobs/new/", _form("inference", estimated_duration_s="1h", max_duration_s="400d"))
    assert "Maximum run time: &#x27;400d&#x27; is longer than 366 days" in response.content.decode()
    assert not Job.objects.filter(name="sweep").exists()


def test_a_job_array_from_the_form(demo, client, user_factory) -> None:
    client.force_login(user_factory("lena", team="inference", role="lead"))
    response = client.post("/jobs/new/", _form("inference", estimated_duration_s="10m", array="3"))
    assert response.status_code == 302 and response.url == "/jobs/"
    jobs = list(Job.objects.filter(name__startswith="sweep[").order_by("array_index"))
    assert [j.name for j in jobs] == ["sweep[0]", "sweep[1]", "sweep[2]"]
    assert len({j.array_id for j in jobs}) == 1 and jobs[0].array_id
    listing = client.get(response.url).content.decode()
    assert f"Job array {jobs[0].array_id} is queued: 3 jobs" in listing


def test_a_job_array_over_the_limit_is_refused_naming_the_field(demo, client, user_factory, settings) -> None:
    settings.MAX_ARRAY = 5
    client.force_login(user_factory("lena", team="inference", role="lead"))
    response = client.post("/jobs/new/", _form("inference", estimated_duration_s="10m", array="6"))
    html = response.content.decode()
    assert response.status_code == 200 and 'id="array-error"' in html
    assert "Copies (job array): 6 asked; at most 5 in one array" in html
    assert not Job.objects.filter(name__startswith="sweep").exists()


# -- a job that can never run ------------------------------------------------------------------


def test_a_never_runnable_job_says_why_and_offers_to_cancel(demo, client, user_factory) -> None:
    lead = user_factory("lena", team="inference", role="lead")
    job = _pending(lead)
    detail = "cannot run under the current policy: asks for 25 devices; the team's max is 24 under every schedule"
    Job.objects.filter(pk=job.pk).update(pending_reason="NeverRunnable", pending_detail=detail)
    client.force_login(lead)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="never-runnable"' in html and "This job will never start" in html
    assert "The job can never run under the current policy and cluster" in html and escape(detail) in html
    assert ">Cancel this job</button>" in html and html.count("Cancel job</button>") == 0
    assert f'data-confirm="Cancel job #{job.pk} (sweep)?"' in html
    listing = client.get("/jobs/").content.decode()
    assert "The job can never run under the current policy and cluster" in listing and escape(detail) in listing


def test_finance_sees_no_jobs_and_json_stays_json(demo, client) -> None:
    client.force_login(_finance())
    assert client.get("/jobs/").status_code == 403
    assert json.loads(client.get("/api/v1/nope/").content)["error"]
