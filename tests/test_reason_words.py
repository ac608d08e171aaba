"""One sentence per reason code, everywhere; refusals and events in words a team lead reads.

The console, the API's ``pending_reason_text``, ``explain`` and ``manage.py sprio`` all read the
engine's one table (``scheduling.engine.reasons.TEXT``); the codes only the portal gives have theirs in
``scheduling.reason_text.PORTAL_TEXT``. A refusal names no policy key and counts no seconds.
"""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from quotas.models import Team
from scheduling.api.serializers import JobSerializer
from scheduling.engine import reasons
from scheduling.engine.words import a_run, duration_words, sized_job
from scheduling.models import Job, JobEvent
from scheduling.reason_text import EVENT_NAMES, PORTAL_TEXT, event_name, reason_text
from scheduling.services import console
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db

#: Every code the engine can give: the module's constants (``QUOTA_MAX_DEVICES = "QuotaMaxDevices"``).
ENGINE_CODES = sorted(
    value for name, value in vars(reasons).items() if name.isupper() and isinstance(value, str) and name != "TEXT"
)


def test_the_engine_codes_are_all_found() -> None:
    assert {"QuotaMaxDevices", "Resources", "NeverRunnable", "GuaranteeReclaim"} <= set(ENGINE_CODES)


@pytest.mark.parametrize("code", ENGINE_CODES)
def test_every_engine_code_has_one_sentence_for_the_console_the_api_explain_and_sprio(code: str) -> None:
    sentence = reasons.describe(code)  # what explain (and so sprio and the explain API) says
    assert sentence != code and sentence.endswith(".")
    assert reason_text(code) == sentence  # what the console and the API's pending_reason_text say
    assert code not in PORTAL_TEXT, "a code has one sentence, in one table"


@pytest.mark.parametrize("code", ENGINE_CODES)
def test_the_queue_the_job_page_and_the_api_show_explains_sentence_for_every_code(code: str) -> None:
    """Through the functions the console and the API call, not the table: a second copy would show here."""
    job = Job(pending_reason=code)
    assert console.job_rows([job]) == [(job, reasons.describe(code))]  # the queue and the job lists
    assert JobSerializer().get_pending_reason_text(job) == reasons.describe(code)  # the API, npuctl


@pytest.mark.parametrize("code", sorted(PORTAL_TEXT))
def test_the_portals_own_codes_have_words_too(code: str) -> None:
    assert reason_text(code) == PORTAL_TEXT[code] and code not in reasons.TEXT


def test_the_device_limit_reads_the_same_on_the_page_in_the_api_in_explain_and_in_sprio(
    demo, user_factory, api
) -> None:
    lead = user_factory("rita", team="research", role="lead")
    research = Team.objects.get(name="research")
    spec = job_service.JobSpec(name="first", command="sleep 60", num_devices=8, chip_model="910A")
    job_service.submit_job(team=research, user=lead, spec=spec)
    run_tick()
    spec = job_service.JobSpec(name="second", command="sleep 60", num_devices=8, chip_model="910A")
    waiting = job_service.submit_job(team=research, user=lead, spec=spec)
    run_tick()
    waiting.refresh_from_db()
    assert waiting.pending_reason == reasons.QUOTA_MAX_DEVICES
    sentence = reasons.TEXT[reasons.QUOTA_MAX_DEVICES]
    # The detail in words too: what the team holds, and its limit (research may hold 12 devices).
    assert waiting.pending_detail == (
        "your team is at its maximum of 12 devices: it holds 8 in 1 running job; this job needs 8 more"
    )

    client = Client()
    client.force_login(lead)
    page = client.get(f"/jobs/{waiting.pk}/").content.decode()
    assert escape(sentence) in page
    assert api(lead).get(f"/api/v1/jobs/{waiting.pk}/").json()["pending_reason_text"] == sentence
    explained = api(lead).get(f"/api/v1/jobs/{waiting.pk}/explain/").json()
    assert (explained["reason"], explained["reason_text"]) == (reasons.QUOTA_MAX_DEVICES, sentence)
    out = io.StringIO()
    call_command("sprio", str(waiting.pk), stdout=out)
    assert f"QuotaMaxDevices: {sentence}" in out.getvalue()


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("PreemptionScheduled", "Preemption scheduled"),
        ("PreemptionCalledOff", "Preemption called off"),
        ("Scheduled", "Started"),
        ("NonZeroExit", "Failed"),
        ("LostOnAgent", "Lost on its node"),
        ("SomethingNew", "Something new"),  # a code with no name yet still reads as words
        ("", ""),
    ],
)
def test_events_are_named_in_words(code: str, words: str) -> None:
    assert event_name(code) == words


def test_every_event_name_is_words_not_a_code() -> None:
    for code, name in EVENT_NAMES.items():
        assert name and not re.search(r"[a-z][A-Z]", name), (code, name)


def test_the_job_page_names_each_event_in_words_and_keeps_its_code(demo, user_factory, api) -> None:
    lead = user_factory("lena", team="training", role="lead")
    spec = job_service.JobSpec(name="words", command="sleep 60", num_devices=1, chip_model="910A")
    job = job_service.submit_job(team=Team.objects.get(name="training"), user=lead, spec=spec)
    JobEvent.objects.create(
        job=job, at=timezone.now(), from_state="running", to_state="running", reason="PreemptionScheduled",
        detail="ClassPreemption",
    )  # fmt: skip
    client = Client()
    client.force_login(lead)
    html = client.get(f"/live/jobs/{job.pk}/").content.decode()
    assert re.search(
        r'data-reason="PreemptionScheduled">Preemption scheduled <code[^>]*>PreemptionScheduled</code>', html
    )
    assert escape(reasons.TEXT[reasons.CLASS_PREEMPTION].rstrip(".")) in html, "the cause in words, not its code"
    assert ">Submitted <code" not in html, "a code that is already a word is not repeated"
    events = api(lead).get(f"/api/v1/jobs/{job.pk}/").json()["events"]
    scheduled = next(e for e in events if e["reason"] == "PreemptionScheduled")
    assert scheduled["reason_text"] == "Preemption scheduled", "the API keeps the code and adds the words"
    assert scheduled["detail"] == "ClassPreemption", "the API's detail is as it was"


# -- refusals, for a team lead -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(45, "45 s"), (90, "1 min 30 s"), (5400, "1 h 30 min"), (86400, "24 h"), (90000, "25 h"), (7 * 86400, "7 d")],
)
def test_durations_in_words(seconds: int, words: str) -> None:
    assert duration_words(seconds) == words


@pytest.mark.parametrize(
    ("cards", "words"),
    [(1, "a 1-card job"), (8, "an 8-card job"), (11, "an 11-card job"), (18, "an 18-card job"), (25, "a 25-card job")],
)
def test_job_sizes_in_words(cards: int, words: str) -> None:
    assert sized_job(cards) == words


def test_an_8_day_run_takes_an(demo) -> None:
    assert a_run(8 * 86400) == "an 8 d run" and a_run(30 * 3600) == "a 30 h run"


def test_the_submit_form_refuses_in_words(demo, user_factory) -> None:
    lead = user_factory("ivan", team="inference", role="lead")
    client = Client()
    client.force_login(lead)
    form = {
        "team": Team.objects.get(name="inference").pk,
        "name": "long",
        "command": "sleep 1",
        "priority_class": "normal",
        "num_devices": 1,
        "estimated_duration_s": "1h",
        "max_duration_s": "30h",
    }
    html = client.post("/jobs/new/", form).content.decode()
    assert "30 h is more than team inference&#x27;s 24 h limit on run time" in html
    assert "maxJobDuration" not in html and "86400" not in html
    big = {**form, "max_duration_s": "", "num_devices": 11, "chip_model": "910A"}
    html = client.post("/jobs/new/", big).content.decode()
    assert "an 11-card job; the cluster has 8 cards of 910A" in html
    assert not Job.objects.filter(name="long").exists()
