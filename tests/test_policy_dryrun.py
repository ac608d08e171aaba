"""The dry run replays recorded jobs through the simulator under both policies."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from quotas.models import Policy
from quotas.policies.dryrun import cluster_spec, dry_run, recorded_rows
from quotas.policies.versions import active_policy
from scheduling.engine.policy import parse_policy
from scheduling.engine.simulator import run_simulation
from tests.test_policy_commands import DEMO, run, write

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


def _recorded_load(api, user_factory) -> None:
    lead = user_factory("dry", team="research", role="lead")
    for i in range(6):
        resp = api(lead).post(
            "/api/v1/jobs/",
            {"name": f"d{i}", "command": "true", "num_devices": 2, "chip_model": "910A", "estimated_duration_s": 3600},
            format="json",
        )
        assert resp.status_code == 201


def test_recorded_jobs_carry_their_checkpoint_interval(demo, api, user_factory) -> None:
    lead = user_factory("dry", team="research", role="lead")
    body = {"name": "c", "command": "true", "estimated_duration_s": 3600, "checkpoint_interval_s": 900}
    created = api(lead).post("/api/v1/jobs/", body, format="json").json()
    until = timezone.now() + timedelta(seconds=1)
    rows = {r["job_id"]: r for r in recorded_rows(until - timedelta(days=1), until)}
    assert rows[str(created["id"])]["checkpoint_interval_s"] == 900


def test_cluster_model_built_from_the_database(demo) -> None:
    spec = cluster_spec()
    assert spec.devices_by_chip() == {"910B4": 16, "910A": 8, "310P3": 4}
    rings = {g.chip_model: g.group_size for g in spec.node_groups}
    assert rings == {"910B4": 8, "910A": 4, "310P3": 4}
    assert {t.name for t in spec.vnpu_templates} >= {"vir01", "vir02", "vir04", "vir05_1c_8g"}


def test_dry_run_numbers_equal_a_direct_simulator_run(demo, api, user_factory) -> None:
    _recorded_load(api, user_factory)
    current = active_policy().policy
    candidate = parse_policy(
        DEMO.replace(
            "max: {devices: 12}\n        maxConcurrentJobs: 10", "max: {devices: 4}\n        maxConcurrentJobs: 10"
        )
    )
    # The dry run and the direct runs read the same window only if they read the same "now": the
    # clock stands still for both (on a loaded machine the seconds between them moved the window).
    with time_machine.travel(timezone.now(), tick=False):
        result = dry_run(current, candidate, days=7)
        assert result["jobs"] >= 6
        until = timezone.now()
        rows = recorded_rows(until - timedelta(days=7), until)
        start = until - timedelta(days=7)
        run_a = run_simulation(rows, cluster_spec(), current, start=start, job_records=True)
        run_b = run_simulation(rows, cluster_spec(), candidate, start=start, job_records=True)
    direct_a, direct_b = run_a["policy"], run_b["policy"]
    for key in ("teams", "jobs", "preemption"):
        for side, direct in (("current", direct_a), ("candidate", direct_b)):
            assert result[side][key] == direct[key], _differing(result[side][key], direct[key])
    research = result["comparison"]["teams"]["research"]
    for key, metric in (("wait_p95_s", "p95"), ("wait_max_s", "max")):
        a, b = direct_a["teams"]["research"]["wait_s"][metric], direct_b["teams"]["research"]["wait_s"][metric]
        assert research[key] == {"a": a, "b": b, "delta": round(b - a, 6)}
    # What a tighter cap promises is that research never holds more than 4 cards at once in the
    # candidate's replay. Its waits need not grow: with fewer research jobs running, the order in
    # which the other teams' jobs start changes, and at some instants research's p95 comes out shorter.
    peak_a = _peak_devices(run_a["job_records"]["policy"], "research")
    peak_b = _peak_devices(run_b["job_records"]["policy"], "research")
    assert peak_a > 4, peak_a
    assert 0 < peak_b <= 4, peak_b
    assert research["not_started"]["b"] >= research["not_started"]["a"]


def _peak_devices(records: list[dict], team: str) -> int:
    """The most cards ``team``'s jobs held at one instant of a replay (from its job records)."""
    edges: list[tuple[float, int]] = []
    for rec in records:
        if rec["team"] == team and rec["first_start_s"] != "":
            assert rec["preemptions"] == 0, rec  # one run per job: first start to end
            edges += [(float(rec["first_start_s"]), rec["num_devices"]), (float(rec["end_s"]), -rec["num_devices"])]
    peak = held = 0
    for _, change in sorted(edges, key=lambda e: (e[0], e[1])):
        held += change
        peak = max(peak, held)
    return peak


def test_apply_dry_run_prints_the_per_team_difference_and_stores_nothing(demo, api, user_factory, tmp_path) -> None:
    _recorded_load(api, user_factory)
    code, out, _ = run("apply", write(tmp_path, DEMO.replace("shares: 20", "shares: 60")), "--dry-run")
    assert code == 0, out
    assert "team research: shares 20 → 60" in out
    assert "research" in out.split("dry run over", 1)[1]
    assert "nothing was stored" in out
    assert Policy.objects.count() == 1


def _starving_load() -> int:
    """Three days ago, on the 16 × 910B4: research fills 8 cards for 2 hours, then training
    (2.5 times research's shares) submits a 4-card, 1-hour job every 10 minutes for 20 hours, more
    than the cards run; at 2 hours research submits one 8-card job, which fair share keeps
    behind training's backlog.

    The replay holds these jobs only: the demo's own history is dated relative to today (last
    month's jobs run into the week before on the first days of a month), and on some days it
    filled the same cards and hid what the guard changes.
    """
    from django.contrib.auth import get_user_model

    from quotas.models import Team
    from scheduling.models import Job

    Job.objects.all().delete()

    user = get_user_model().objects.create_user("dry-starving")
    teams = {t.name: t for t in Team.objects.filter(name__in=["research", "training"])}
    t0 = timezone.now() - timedelta(days=3)

    def job(team: str, at: float, n: int, hours: float) -> Job:
        submitted = t0 + timedelta(seconds=at)
        return Job(
            team=teams[team],
            submitter=user,
            name=f"{team}-{at:.0f}",
            command="true",
            priority_class="normal",
            num_devices=n,
            chip_model="910B4",
            estimated_duration_s=int(hours * 3600),
            state=Job.State.COMPLETED,
            submitted_at=submitted,
        )

    jobs = [job("research", 0, 8, 2)]
    jobs += [job("training", i * 600, 4, 1) for i in range(120)]
    big = job("research", 2 * 3600, 8, 1)
    jobs.append(big)
    Job.objects.bulk_create(jobs)
    return Job.objects.get(name=big.name, team=teams["research"]).pk


def test_apply_dry_run_shows_what_a_starvation_guard_changes_over_the_last_7_days(demo, tmp_path) -> None:
    big = _starving_load()
    guarded = DEMO.replace("  backfill: true\n", "  backfill: true\n  starvation: {after: 2h}\n")
    assert guarded != DEMO
    code, out, _ = run("apply", write(tmp_path, guarded), "--dry-run")
    assert code == 0, out
    assert "starvation.after: off → 2h" in out
    current, candidate = active_policy().policy, parse_policy(guarded)
    result = dry_run(current, candidate, days=7)
    # The replay the dry run made, job by job: research's big job no longer waits out the backlog.
    until = timezone.now()
    rows = recorded_rows(until - timedelta(days=7), until)
    waits = [
        {
            r["job_id"]: r["wait_s"]
            for r in run_simulation(rows, cluster_spec(), p, start=until - timedelta(days=7), job_records=True)[
                "job_records"
            ]["policy"]
        }[str(big)]
        for p in (current, candidate)
    ]
    assert waits[1] < waits[0], waits
    longest = result["comparison"]["overall"]["wait_max_s"]
    assert f"longest wait {longest['a']:.1f} → {longest['b']:.1f} s" in out
    assert Policy.objects.count() == 1, "a dry run stores nothing"


def _differing(got: object, want: object, path: str = "") -> str:
    """Where two nested values differ, for an assertion message pytest would otherwise truncate."""
    if isinstance(got, dict) and isinstance(want, dict):
        parts = [
            _differing(got.get(key), want.get(key), f"{path}.{key}")
            for key in sorted(got.keys() | want.keys(), key=str)
            if got.get(key) != want.get(key)
        ]
        return "; ".join(parts)
    return f"{path or 'value'}: dry run {got!r}, direct run {want!r}"
