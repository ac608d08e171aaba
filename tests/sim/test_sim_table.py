"""``python -m scheduling.sim.table``: the table of docs/simulator.md, on the shipped 300-row slice."""

from __future__ import annotations

import io

from sim_support import ALIBABA_300, EXAMPLES

from scheduling.sim.table import HEADER, run, without_guard
from scheduling.sim.traces import load_cluster
from scheduling.simulate import load_policy


def test_the_table_has_a_row_per_policy_scheduler_and_the_guards_cost() -> None:
    out = io.StringIO()
    figures = run(["alibaba"], str(ALIBABA_300), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "| " + " | ".join(HEADER) + " |"
    rows = [line.split(" | ")[0].lstrip("| ") for line in lines[2:]]
    assert rows == [
        f"alibaba · {kind} · {who}"
        for kind in ("example", "capped")
        for who in ("policy", "without the guard", "FIFO", "EASY")
    ]
    assert set(figures) == {"alibaba/example", "alibaba/capped"}
    capped = figures["alibaba/capped"]
    assert capped["policy"]["policy"] == "alibaba-openb-v2023-capped"
    assert capped["policy"]["wait_s"]["guard_bound"] is not None
    assert capped["without_guard"]["wait_s"]["guard_bound"] is None
    assert "× without the guard" in lines[2 + 4]


def test_without_guard_turns_off_the_policys_threshold_and_every_classs() -> None:
    cluster = load_cluster(EXAMPLES / "clusters/alibaba_openb_v2023.yaml")
    policy = load_policy(EXAMPLES / "policies/alibaba_openb_v2023_capped.yaml", cluster)
    assert policy.starvation_after_s == 86400.0
    plain = without_guard(policy)
    assert plain.starvation_after_s is None
    assert all(plain.starvation_after(pc.name) is None for pc in plain.priority_classes)


def test_the_capped_examples_are_written_by_their_rule() -> None:
    """Each team's max is twice its guarantee, the guard at a day: the shape docs/simulator.md names."""
    for name in ("ms_itp_elasticflow", "alibaba_openb_v2023"):
        cluster = load_cluster(EXAMPLES / f"clusters/{name}.yaml")
        policy = load_policy(EXAMPLES / f"policies/{name}_capped.yaml", cluster)
        assert policy.starvation_after_s == 86400.0
        for team in policy.teams.values():
            assert team.quota.max["devices"] == 2 * team.quota.guaranteed["devices"], team.name
