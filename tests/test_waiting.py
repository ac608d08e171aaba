"""The suite's one way of waiting (tests/waiting.py): what it returns, how it fails, how it scales."""

from __future__ import annotations

import itertools

import pytest

from tests import waiting
from tests.waiting import ceiling, ceiling_ms, wait_for


def test_returns_the_first_truthy_value() -> None:
    calls = itertools.count(1)
    assert wait_for(lambda: ["ready"] if next(calls) >= 3 else [], interval=0) == ["ready"]


def test_until_judges_a_fetched_value_and_a_failure_shows_the_whole_record() -> None:
    states = iter(["running", "stopping", "killed"])
    assert wait_for(lambda: {"state": next(states)}, until=lambda job: job["state"] == "killed", interval=0) == {
        "state": "killed"
    }
    with pytest.raises(AssertionError, match=r"last value seen: \{'state': 'running', 'pid': 7\}"):
        wait_for(lambda: {"state": "running", "pid": 7}, until=lambda job: job["state"] == "killed", timeout=0.05)


def test_fails_saying_what_it_awaited_and_the_last_value_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(waiting.SCALE_ENV, "0.5")
    with pytest.raises(AssertionError, match=r"^waited 0\.05 s for the job to end; last value seen: 0$"):
        wait_for(lambda: 0, timeout=0.1, interval=0.01, message="the job to end")


def test_without_a_message_it_names_the_condition() -> None:
    def nothing_yet() -> list[str]:
        return []

    with pytest.raises(AssertionError, match=r"for nothing_yet; last value seen: \[\]"):
        wait_for(nothing_yet, timeout=0.05, interval=0.01)


def test_ignored_exceptions_are_not_yet_and_others_fail_at_once() -> None:
    calls = itertools.count(1)

    def refused_twice() -> bool:
        if next(calls) <= 2:
            raise ConnectionRefusedError("not listening yet")
        return True

    assert wait_for(refused_twice, interval=0, ignore=(OSError,)) is True

    def refused() -> bool:
        raise ConnectionRefusedError("not listening")

    with pytest.raises(AssertionError, match=r"last value seen: ConnectionRefusedError\('not listening'\)"):
        wait_for(refused, timeout=0.05, interval=0.01, ignore=(OSError,))

    def broken() -> bool:
        raise KeyError("state")

    with pytest.raises(KeyError):
        wait_for(broken, ignore=(OSError,))  # not "not yet": a bug of the condition fails the wait at once


def test_the_scale_multiplies_every_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(waiting.SCALE_ENV, raising=False)
    assert (ceiling(), ceiling(30), ceiling_ms(15)) == (60.0, 30.0, 15000)
    monkeypatch.setenv(waiting.SCALE_ENV, "2.5")
    assert (ceiling(), ceiling_ms(15)) == (150.0, 37500)


@pytest.mark.parametrize("bad", ["soon", "0", "-1", "inf", "nan"])
def test_a_bad_scale_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(waiting.SCALE_ENV, bad)
    with pytest.raises(ValueError, match=waiting.SCALE_ENV):
        ceiling()
