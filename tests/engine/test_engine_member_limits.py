"""A team lead's limits on a member (cards at once, jobs at once): ``MemberLimit``, step 0 of decide."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine import reasons
from scheduling.engine.decide import decide
from scheduling.engine.explain import explain
from tests.engine.engine_factory import Cluster, job, policy, snapshot


def started(decisions: object) -> set[int]:
    return {s.job_id for s in decisions.starts}  # type: ignore[attr-defined]


def test_a_member_at_their_card_limit_waits_and_others_of_the_team_go_ahead() -> None:
    cluster = Cluster().node("n1", devices=8).node("n2", devices=8)
    d1, d2 = cluster.dev("n1/0"), cluster.dev("n1/1")
    running = [job(1, "a", 2, user="ana", slots=[d1, d2])]
    pending = [
        job(2, "a", 4, user="ana", submitted=-300),  # would take ana to 6 cards: over her 4
        job(3, "a", 1, user="ana", submitted=-200),  # later than 2: waits behind it
        job(4, "a", 4, user="ben", submitted=-100),  # ben has no limit
    ]
    snap = replace(snapshot(policy(), cluster, pending, running), member_limits={("a", "ana"): (4.0, None)})
    out = decide(snap)
    assert started(out) == {4}
    assert out.waiting[2].reason == reasons.MEMBER_LIMIT
    assert (
        out.waiting[2].detail
        == "your team lead lets you hold 4 cards at once; yours hold 2 (or go first) and this job asks 4"
    )
    assert out.waiting[3].reason == reasons.MEMBER_LIMIT
    # Without the limit the same snapshot starts ana's jobs.
    assert {2, 3} <= started(decide(snapshot(policy(), cluster, pending, running)))


def test_a_member_at_their_job_limit_waits_until_one_ends() -> None:
    cluster = Cluster().node("n1", devices=8)
    running = [job(1, "a", 1, user="ana", slots=[cluster.dev("n1/0")])]
    pending = [job(2, "a", 1, user="ana", submitted=-100), job(3, "a", 1, user="ana", submitted=-50)]
    limits = {("a", "ana"): (None, 2)}
    out = decide(replace(snapshot(policy(), cluster, pending, running), member_limits=limits))
    assert started(out) == {2}  # one more fits under 2 at once
    assert out.waiting[3].reason == reasons.MEMBER_LIMIT
    assert out.waiting[3].detail == "your team lead lets you run 2 jobs at once; 2 run or go first"
    # Her running job ended: job 3 starts.
    after = decide(replace(snapshot(policy(), cluster, pending[1:], []), member_limits=limits))
    assert started(after) == {3}


def test_the_limit_is_a_teams_own_limit_and_explain_says_the_same() -> None:
    cluster = Cluster().node("n1", devices=8)
    pending = [job(2, "a", 8, user="ana")]
    snap = replace(snapshot(policy(), cluster, pending, []), member_limits={("a", "ana"): (4.0, None)})
    assert reasons.MEMBER_LIMIT in reasons.QUOTA_REASONS  # the guard does not count it as starving
    text = explain(snap, 2)
    assert reasons.MEMBER_LIMIT in str(text)
