"""/metrics: Prometheus text read from the database at scrape time, with no job or user names."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from devices.models import Device, Node
from quotas.models import Team
from scheduling.models import Job, TickRecord

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_cached_policy():
    from quotas.policies import versions

    versions._cache.clear()
    yield
    versions._cache.clear()


def _scrape() -> dict[str, list]:
    resp = Client().get("/metrics")
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/plain")
    text = resp.content.decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}, text


def _value(samples, name: str, **labels: str) -> float:
    for sample in samples:
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise AssertionError(f"no sample {name} {labels}")


def test_metrics_reflect_the_database_now(demo, user_factory) -> None:
    user = user_factory("secret-person", team="research")
    team = Team.objects.get(name="research")
    now = timezone.now()
    for i in range(3):
        Job.objects.create(
            team=team, submitter=user, name=f"secret-job-{i}", command="x", priority_class="low", submitted_at=now
        )
    Device.objects.filter(chip_model="310P3", index=0).update(health="failed")
    Node.objects.filter(name="ascend-a-01").update(reachable=False, missed_polls=4)
    for ms in (5, 30, 700, 3000):
        TickRecord.objects.create(started_at=now - timedelta(seconds=ms), duration_ms=ms, decide_ms=1)
    TickRecord.objects.create(started_at=now - timedelta(hours=3), duration_ms=99999, decide_ms=1)  # too old

    families, text = _scrape()
    assert (
        _value(families["npuportal_jobs"], "npuportal_jobs", state="pending", team="research", priority_class="low")
        == 3
    )
    assert _value(families["npuportal_devices"], "npuportal_devices", health="failed", chip_model="310P3") == 1
    assert _value(families["npuportal_devices"], "npuportal_devices", health="healthy", chip_model="910B4") == 16
    assert _value(families["npuportal_agent_poll_failures"], "npuportal_agent_poll_failures") == 4
    assert _value(families["npuportal_nodes_unreachable"], "npuportal_nodes_unreachable") == 1
    assert _value(families["npuportal_policy_version"], "npuportal_policy_version") == 1
    ticks = families["npuportal_tick_duration_seconds"]
    assert _value(ticks, "npuportal_tick_duration_seconds_count") == 4
    assert _value(ticks, "npuportal_tick_duration_seconds_bucket", le="0.01") == 1
    assert _value(ticks, "npuportal_tick_duration_seconds_bucket", le="1.0") == 3
    assert _value(ticks, "npuportal_tick_duration_seconds_bucket", le="+Inf") == 4
    assert _value(ticks, "npuportal_tick_duration_seconds_sum") == pytest.approx(3.735)
    assert 0 <= _value(families["npuportal_tick_age_seconds"], "npuportal_tick_age_seconds") < 60
    assert "secret-job" not in text and "secret-person" not in text


def test_metrics_change_without_restart_and_need_no_login(demo, user_factory) -> None:
    families, _ = _scrape()
    assert not [s for s in families["npuportal_jobs"] if s.labels["state"] == "running"]
    assert "npuportal_tick_age_seconds" not in [s.name for s in families["npuportal_tick_age_seconds"]]
    user = user_factory("u", team="training")
    Job.objects.create(
        team=Team.objects.get(name="training"),
        submitter=user,
        name="r",
        command="x",
        priority_class="normal",
        state="running",
        submitted_at=timezone.now(),
    )
    families, _ = _scrape()
    assert _value(families["npuportal_jobs"], "npuportal_jobs", state="running", team="training") == 1


def test_a_scrape_is_a_fixed_handful_of_queries(demo, django_assert_max_num_queries) -> None:
    with django_assert_max_num_queries(7):
        Client().get("/metrics")
    assert Client().post("/metrics").status_code == 405
