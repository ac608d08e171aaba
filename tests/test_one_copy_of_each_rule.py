"""Rules written once: the cluster lock's SQL and the rendezvous variables each have one home.

A second copy drifts (a changed lock key in one place would let the tick and the poll run together),
so these tests read the source tree and fail when a copy comes back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import AnonymousUser

from devices.agent import environment, rendezvous
from devices.agent.ranktable import ServerCards
from npuctl import durations as cli_durations
from quotas.models import Membership, Team
from quotas.tenancy import visibility
from scheduling.engine import durations as policy_durations

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scheduling", "devices", "quotas", "npuportal", "npuctl")


def _sources_containing(text: str) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts and text in path.read_text(encoding="utf-8")
    )


def test_the_advisory_lock_sql_is_written_once() -> None:
    assert _sources_containing("pg_advisory") == ["npuportal/cluster_lock.py"]


def test_the_rendezvous_variables_are_listed_once() -> None:
    assert rendezvous.RENDEZVOUS_ENV is environment.RENDEZVOUS_NAMES
    assert set(environment.RENDEZVOUS_NAMES) <= environment.RESERVED_NAMES
    assert _sources_containing('"MASTER_ADDR"') == ["devices/agent/environment.py"]


def test_a_launch_sets_every_rendezvous_variable() -> None:
    cards = ((0, "192.168.1.10"), (1, "192.168.1.11"))
    servers = (ServerCards("10.0.0.1", cards), ServerCards("10.0.0.2", cards))
    part = rendezvous.Rendezvous("10.0.0.1", 29500, 1, servers)
    env = part.env(Path("/tmp/ranks.json"))
    assert tuple(env) == environment.RENDEZVOUS_NAMES
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"
    assert (env["WORLD_SIZE"], env["NNODES"], env["NODE_RANK"], env["NPROC_PER_NODE"]) == ("4", "2", "1", "2")
    assert env["RANK_TABLE_FILE"] == "/tmp/ranks.json"


def test_team_visibility_is_decided_in_one_module() -> None:
    """Which teams a user sees is written in quotas.tenancy.visibility only (a lead-only list is another rule)."""
    assert _sources_containing("memberships__user=user)") == ["quotas/tenancy/visibility.py"]
    assert _sources_containing("teams_of(") == []


@pytest.mark.django_db
def test_an_admin_sees_every_team_a_member_their_own_and_a_visitor_none(user_factory) -> None:
    research, inference = Team.objects.create(name="vis-a"), Team.objects.create(name="vis-b")
    member = user_factory("vera")
    Membership.objects.create(user=member, team=research, role="member")
    admin = user_factory("ada", staff=True)
    assert visibility.visible_team_ids(admin) is None
    assert visibility.visible_team_ids(member) == {research.pk}
    assert visibility.visible_team_ids(AnonymousUser()) == frozenset()
    rows = Membership.objects.filter(team__name__startswith="vis-")
    assert {m.team for m in visibility.only_visible(rows, member)} == {research}
    assert visibility.only_visible(rows, admin).count() == rows.count()
    assert set(visibility.visible_teams(member)) == {research}
    assert set(visibility.visible_teams(admin)) >= {research, inference}
    assert list(visibility.visible_teams(AnonymousUser())) == []
    assert visibility.sees_team(member, research) and not visibility.sees_team(member, inference)
    assert visibility.sees_team(admin, inference) and not visibility.sees_team(AnonymousUser(), research)


@pytest.mark.parametrize(
    "text",
    ["90s", "15m", "2h", "1h30m", "1h 30m", "1.5h", "1d", "1w", "30:00", "2:00:00", "1-12:00", "90"],
)
def test_the_policy_reads_every_duration_the_command_line_reads_the_same(text: str) -> None:
    """One grammar (npuctl.durations): a policy file, ``npuctl --time`` and the console's forms agree."""
    assert policy_durations.parse_duration(text) == cli_durations.parse_seconds(text)
    assert cli_durations.parse_duration(text) == round(cli_durations.parse_seconds(text))


def test_only_slurms_own_directives_read_a_bare_number_as_minutes() -> None:
    assert cli_durations.parse_duration("30", bare="minutes") == 1800  # #SBATCH --time=30
    assert cli_durations.parse_duration("30") == 30 and policy_durations.parse_duration("30") == 30.0


@pytest.mark.parametrize("text", ["1h1h", "30m1h", "2:60:00", "1-24:00", "soon", ""])
def test_a_duration_the_command_line_refuses_the_policy_refuses_with_the_same_words(text: str) -> None:
    with pytest.raises(ValueError) as cli:
        cli_durations.parse_seconds(text)
    with pytest.raises(ValueError) as policy:
        policy_durations.parse_duration(text)
    assert str(policy.value) == str(cli.value)


def _lines_matching(pattern: str) -> list[str]:
    found = re.compile(pattern)
    return sorted(
        {
            str(path.relative_to(ROOT))
            for package in PACKAGES
            for path in (ROOT / package).rglob("*.py")
            if "migrations" not in path.parts
            for line in path.read_text(encoding="utf-8").splitlines()
            if found.search(line)
        }
    )


def test_a_jobs_run_time_is_read_by_two_named_rules_only() -> None:
    """The limit (maximum first) and the expectation (estimate first) live in run_time; nobody inlines either."""
    assert _lines_matching(r"max_duration_s or \S*estimated_duration_s") == ["scheduling/engine/run_time.py"]
    assert _lines_matching(r"estimated_duration_s or \S*max_duration_s") == ["scheduling/engine/run_time.py"]
    assert _sources_containing("def job_duration") == []


def test_the_pending_order_is_ranked_in_one_place() -> None:
    """The tick and order_pending both sort through priority.rank: no second sort of the multifactor score."""
    assert _sources_containing("def rank(") == ["scheduling/engine/priority.py"]
    assert _sources_containing("def order_pending(") == ["scheduling/engine/priority.py"]
    assert _sources_containing("priority.rank(") == ["scheduling/engine/decide.py"]
