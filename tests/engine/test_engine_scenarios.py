"""YAML scenarios: a cluster, a queue and the decisions the policy must produce.

Each file in ``scenarios/`` is one small story with its expectation; the loader
is in ``engine_factory.load_scenario``. Only the keys an ``expect`` names are
checked, so a scenario states exactly the rule it is about.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from engine_factory import T0, load_scenario

from scheduling.engine.decide import decide

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    snap, cluster, expect = load_scenario(yaml.safe_load(path.read_text()))
    out = decide(snap)
    started = {s.job_id: s for s in out.starts}
    if "starts" in expect:
        want = expect["starts"]
        if isinstance(want, dict):
            assert set(started) == set(want), f"started {sorted(started)}"
            for job_id, devices in want.items():
                got = sorted(cluster.name_of(slot.device_id) for slot in started[job_id].slots)
                assert got == sorted(devices), f"job {job_id} got {got}"
        else:
            assert [s.job_id for s in out.starts] == list(want)
    for job_id, reason in (expect.get("waiting") or {}).items():
        assert job_id in out.waiting, f"job {job_id} not waiting (started: {sorted(started)})"
        assert out.waiting[job_id].reason == reason, out.waiting[job_id]
    if "preemptions" in expect:
        assert sorted(p.job_id for p in out.preemptions) == sorted(expect["preemptions"])
        for p in out.preemptions:
            assert p.grace_deadline == T0 + snap.policy.grace_period_s
    if "evictions" in expect:
        assert sorted(out.evictions) == sorted(expect["evictions"])
    for job_id, words in (expect.get("details") or {}).items():
        assert words in out.waiting[job_id].detail, out.waiting[job_id]
    for job_id, offset in (expect.get("estimated") or {}).items():
        if offset is None:
            assert out.waiting[job_id].estimated_start is None, out.waiting[job_id]
        else:
            assert out.waiting[job_id].estimated_start == pytest.approx(T0 + offset)
    if "backfilled" in expect:
        assert sorted(j for j, s in started.items() if s.backfilled) == sorted(expect["backfilled"])
    if "cancelled" in expect:
        assert sorted(out.cancelled) == sorted(expect["cancelled"])
    # Every pending job is either started, has a reason, or is cancelled (a dependency never satisfied).
    assert set(started) | set(out.waiting) | set(out.cancelled) == {j.id for j in snap.pending}
    assert not set(started) & set(out.waiting)
    assert not set(out.cancelled) & (set(started) | set(out.waiting))
