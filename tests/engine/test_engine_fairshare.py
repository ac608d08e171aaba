"""Classic fair share: Slurm's documented worked example, by hand."""

from __future__ import annotations

import pytest
from engine_factory import policy, quota

from scheduling.engine.fairshare import (
    fair_share_factors,
    fair_share_table,
    format_sshare,
    tree_from_usage,
)
from scheduling.engine.policy import TeamPolicy

# https://slurm.schedmd.com/classic_fair_share.html, "Example": the machine is
# allocated to accounts A (40 shares) and D (60); A has children B (30) and C
# (10); D has E (25) and F (35). User 1 is in B, users 2 and 3 (1 share each)
# in C, user 4 in E, user 5 in F. Usage as fractions of the whole machine:
# user 1 0.2, user 2 0.25, user 4 0.25 (users 3 and 5: none). The machine's
# total is 1.0 (not the 0.7 the users sum to), hence total_usage=1.0.
SLURM_EXAMPLE = {
    "A": {"parent": None, "shares": 40},
    "D": {"parent": None, "shares": 60},
    "B": {"parent": "A", "shares": 30},
    "C": {"parent": "A", "shares": 10},
    "E": {"parent": "D", "shares": 25},
    "F": {"parent": "D", "shares": 35},
    "user1": {"parent": "B", "shares": 1, "usage": 0.2},
    "user2": {"parent": "C", "shares": 1, "usage": 0.25},
    "user3": {"parent": "C", "shares": 1},
    "user4": {"parent": "E", "shares": 1, "usage": 0.25},
    "user5": {"parent": "F", "shares": 1},
}


def test_slurm_classic_worked_example() -> None:
    f = fair_share_factors(SLURM_EXAMPLE, total_usage=1.0)
    # Normalised shares: user1 = 30/40 * 40/100 = 0.3; users 2/3 = 1/2 * 10/40 * 0.4 = 0.05;
    # user4 = 25/60 * 0.6 = 0.25; user5 = 35/60 * 0.6 = 0.35.
    # Effective usage, top tier = actual: A = 0.2 + 0.25 = 0.45, D = 0.25.
    # B = 0.2 + (0.45 - 0.2) * 30/40 = 0.3875       C = 0.25 + (0.45 - 0.25) * 10/40 = 0.3
    # E = 0.25 + (0.25 - 0.25) * 25/60 = 0.25        F = 0 + (0.25 - 0) * 35/60 = 0.145833...
    # user1 = 0.2 + (0.3875 - 0.2) * 1/1 = 0.3875    user2 = 0.25 + (0.3 - 0.25) * 1/2 = 0.275
    # user3 = 0 + (0.3 - 0) * 1/2 = 0.15             user4 = 0.25, user5 = 0.145833...
    assert f["user1"] == pytest.approx(2 ** (-0.3875 / 0.3))  # doc: 0.408479
    assert f["user2"] == pytest.approx(2 ** (-0.275 / 0.05))  # doc: 0.022097
    assert f["user3"] == pytest.approx(2 ** (-0.15 / 0.05))  # doc: 0.125000
    assert f["user4"] == pytest.approx(2 ** (-0.25 / 0.25))  # doc: 0.500000
    assert f["user5"] == pytest.approx(2 ** (-(0.25 * 35 / 60) / 0.35))  # doc: 0.749154
    # The documented six-decimal figures themselves:
    documented = {"user1": 0.408479, "user2": 0.022097, "user3": 0.125, "user4": 0.5, "user5": 0.749154}
    for name, value in documented.items():
        assert f[name] == pytest.approx(value, abs=1e-6)
    # Accounts get factors too: A = 2^(-0.45/0.4), B = 2^(-0.3875/0.3).
    assert f["A"] == pytest.approx(2 ** (-0.45 / 0.4))
    assert f["B"] == pytest.approx(f["user1"])
    # "user 5's job would be granted the highest scheduling priority"
    assert max(documented, key=f.__getitem__) == "user5"


def test_raw_device_hours_give_the_same_factors() -> None:
    # 200/250/250 device-hours out of 1000 delivered = the doc's fractions.
    tree = {k: dict(v) for k, v in SLURM_EXAMPLE.items()}
    for name, value in (("user1", 200.0), ("user2", 250.0), ("user4", 250.0)):
        tree[name]["usage"] = value
    f = fair_share_factors(tree, total_usage=1000.0)
    assert f["user2"] == pytest.approx(0.022097, abs=1e-6)


def test_default_total_is_the_sum_of_usage() -> None:
    # Two accounts, equal shares; a used 3 h, b 1 h: U = 0.75 / 0.25, S = 0.5 each.
    tree = {"a": {"parent": None, "shares": 1, "usage": 3.0}, "b": {"parent": None, "shares": 1, "usage": 1.0}}
    f = fair_share_factors(tree)
    assert f["a"] == pytest.approx(2 ** (-0.75 / 0.5))  # 0.3536
    assert f["b"] == pytest.approx(2 ** (-0.25 / 0.5))  # 0.7071


def test_no_usage_means_factor_one_and_zero_shares_zero() -> None:
    tree = {"a": {"parent": None, "shares": 1}, "b": {"parent": None, "shares": 0}, "a/u": {"parent": "a", "shares": 1}}
    assert fair_share_factors(tree) == {"a": 1.0, "b": 0.0, "a/u": 1.0}


def test_unknown_parent_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown parent"):
        fair_share_table({"x": {"parent": "nope", "shares": 1}})


def test_tree_from_usage_hangs_users_under_teams_and_departments() -> None:
    pol = policy(
        {"ml": TeamPolicy("ml", "research", 3.0, quota()), "ops": TeamPolicy("ops", None, 1.0, quota())},
        departments={"research": 2.0},
    )
    tree = tree_from_usage(pol, {("ml", "ann"): 5.0}, [("ops", "bob"), ("guest", "eve")])
    assert tree["research"] == {"parent": None, "shares": 2.0}
    assert tree["ml"] == {"parent": "research", "shares": 3.0}
    assert tree["ops"]["parent"] is None and tree["guest"]["shares"] == 1.0
    assert tree["ml/ann"] == {"parent": "ml", "shares": 1.0, "usage": 5.0}
    assert tree["ops/bob"]["usage"] == 0.0
    assert set(fair_share_factors(tree)) == set(tree)


def test_format_sshare_lists_every_association() -> None:
    text = format_sshare(SLURM_EXAMPLE, fair_share_factors(SLURM_EXAMPLE, total_usage=1.0))
    lines = text.splitlines()
    assert lines[0].split() == [
        "Account",
        "RawShares",
        "NormShares",
        "RawUsage",
        "NormUsage",
        "EffectvUsage",
        "FairShare",
    ]
    assert len(lines) == 2 + len(SLURM_EXAMPLE)
    user1 = next(line for line in lines if line.strip().startswith("user1"))
    assert user1.startswith("  user1")  # indented under A, B
    assert user1.split()[-1] == "0.408479"
