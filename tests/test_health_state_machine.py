"""The health state machine's rules, without agents or a database (docs/health.md)."""

from __future__ import annotations

import pytest

from devices.executors.agents import describe_exit, outcome
from devices.services.health import (
    DEGRADED,
    FAILED,
    HEALTHY,
    UNKNOWN,
    WARNING,
    Thresholds,
    Verdict,
    classify,
    step,
)

T = Thresholds(warning_temp_c=85, degraded_temp_c=95, missed_polls=3, rejoin_polls=3)


def reading(health: str = "OK", temp: float | None = 40, ecc: int | None = 0) -> dict[str, object]:
    return {"index": 0, "health": health, "temp_c": temp, "ecc_errors": ecc}


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (reading("OK"), HEALTHY),
        (reading("Warning"), WARNING),
        (reading("Alarm"), DEGRADED),
        (reading("Critical"), FAILED),
        (reading("UNKNOWN", temp=None, ecc=None), FAILED),
        (reading("lost", temp=None), FAILED),
        (reading("Smoking"), FAILED),
        (reading("OK", temp=85), HEALTHY),
        (reading("OK", temp=85.5), WARNING),
        (reading("OK", temp=95), WARNING),
        (reading("OK", temp=96), DEGRADED),
        (reading("Warning", temp=98), DEGRADED),
        (reading("Alarm", temp=90), DEGRADED),
        (None, FAILED),
    ],
)
def test_classify_maps_words_and_temperatures(report: dict[str, object] | None, expected: str) -> None:
    assert classify(report, known_ecc=0, first_reading=False, t=T).health == expected


def test_rising_ecc_fails_a_device_but_a_first_reading_is_only_a_baseline() -> None:
    verdict = classify(reading("OK", ecc=2), known_ecc=1, first_reading=False, t=T)
    assert verdict.health == FAILED
    assert "ECC errors rose from 1 to 2" in verdict.reason
    assert classify(reading("OK", ecc=2), known_ecc=2, first_reading=False, t=T).health == HEALTHY
    assert classify(reading("OK", ecc=5), known_ecc=0, first_reading=True, t=T).health == HEALTHY
    assert classify(reading("OK", ecc=None), known_ecc=3, first_reading=False, t=T).health == HEALTHY


def test_every_finding_is_named_worst_first() -> None:
    verdict = classify(reading("Warning", temp=97, ecc=1), known_ecc=0, first_reading=False, t=T)
    assert verdict.health == FAILED
    assert "ECC" in verdict.reason and "97 °C" in verdict.reason and "Warning" in verdict.reason


def test_getting_worse_is_immediate() -> None:
    for current, target in [(HEALTHY, WARNING), (HEALTHY, FAILED), (WARNING, DEGRADED), (DEGRADED, FAILED)]:
        s = step(current, 2, Verdict(target, "x"), 3)
        assert (s.health, s.streak, s.changed) == (target, 0, True)


def test_warning_back_to_healthy_is_immediate() -> None:
    assert step(WARNING, 0, Verdict(HEALTHY, "ok"), 3).health == HEALTHY


@pytest.mark.parametrize("current", [DEGRADED, FAILED, UNKNOWN])
def test_leaving_an_unusable_state_needs_k_better_polls_in_a_row(current: str) -> None:
    streak = 0
    for n in (1, 2):
        s = step(current, streak, Verdict(HEALTHY, "ok"), 3)
        assert (s.health, s.streak, s.changed) == (current, n, False)
        assert f"{n}/3" in s.detail
        streak = s.streak
    s = step(current, streak, Verdict(HEALTHY, "ok"), 3)
    assert (s.health, s.streak, s.changed) == (HEALTHY, 0, True)
    assert "rejoined" in s.detail


def test_a_bad_reading_resets_the_rejoin_streak() -> None:
    s = step(FAILED, 2, Verdict(FAILED, "lost"), 3)
    assert (s.health, s.streak, s.changed) == (FAILED, 0, False)
    s = step(FAILED, 2, Verdict(DEGRADED, "hot"), 3)
    assert (s.health, s.streak, s.changed) == (DEGRADED, 0, True), "failed → degraded after the streak"


def test_agent_outcomes() -> None:
    assert outcome({"state": "succeeded", "exit_code": 0}) == (0, "Completed", "exit code 0")
    assert outcome({"state": "failed", "exit_code": 2})[:2] == (2, "NonZeroExit")
    code, reason, detail = outcome({"state": "failed", "exit_code": -11})
    assert (code, reason) == (-11, "NonZeroExit") and "SIGSEGV" in detail
    code, reason, detail = outcome({"state": "killed", "exit_code": -15, "reason": "walltime"})
    assert (code, reason) == (-15, "Walltime") and "SIGTERM" in detail
    assert outcome({"state": "killed", "exit_code": -9, "reason": "cancelled"})[1] == "Killed"
    assert outcome({"state": "failed", "exit_code": None, "reason": "could not start: x"}) == (
        None,
        "NonZeroExit",
        "failed on the agent: could not start: x",
    )
    assert describe_exit(-9) == "killed by signal SIGKILL"
    assert describe_exit(-99) == "killed by signal signal 99"
