"""Each instant of ``make test``'s date sweep runs only the modules ``tests.clock.files()`` names.

A test marked ``clock`` in a module that list missed would silently never run at the instants, so
this checks the list against what pytest itself collected in this session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import clock


def test_every_module_with_a_clock_test_is_in_the_sweeps_list(request: pytest.FixtureRequest) -> None:
    root = Path(__file__).resolve().parent.parent
    listed = set(clock.files(root))
    marked = {
        Path(item.path).resolve().relative_to(root).as_posix()
        for item in request.session.items
        if item.get_closest_marker("clock") is not None
    }
    assert marked <= listed, f"marked clock but not in tests.clock.files(): {sorted(marked - listed)}"


def test_the_list_finds_a_module_marked_either_way(tmp_path: Path) -> None:
    (tmp_path / "tests" / "deep").mkdir(parents=True)
    (tmp_path / "tests" / "test_a.py").write_text("pytestmark = [pytest.mark.django_db, pytest.mark.clock]\n")
    (tmp_path / "tests" / "deep" / "test_b.py").write_text("@pytest.mark.clock\ndef test_b(): ...\n")
    (tmp_path / "tests" / "test_c.py").write_text("@pytest.mark.clockwork\ndef test_c(): ...\n")
    (tmp_path / "tests" / "helper.py").write_text("pytest.mark.clock\n")
    assert clock.files(tmp_path) == ["tests/deep/test_b.py", "tests/test_a.py"]


def test_the_calendar_has_no_instant_twice_and_at_least_60() -> None:
    instants = clock.calendar_instants()
    assert len(instants) == len(set(instants)) >= 60


def test_a_sweep_names_its_instants_and_refuses_others(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["sweep"], ["sweep", "fixed", "tomorrow"], ["fixed", "random"]):
        with pytest.raises(SystemExit) as ended:
            clock.main(argv)
        assert ended.value.code == 2, argv
    assert "name the instants" in capsys.readouterr().err


def test_a_sweep_lists_the_instants_that_failed_and_stops_at_the_first_unless_told(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each instant is one pytest process with the instant in its environment; a failure is reported by name."""
    seen: list[str] = []

    class Done:
        def __init__(self, code: int) -> None:
            self.returncode = code

    def fake_run(command: list[str], env: dict[str, str], **_: object) -> Done:
        assert command[1:6] == ["-m", "pytest", "-m", "clock", "-p"] and "--maxfail=1" in command
        seen.append(env[clock.VARIABLE])
        return Done(1 if env[clock.VARIABLE].startswith("2027-01-01") else 0)

    monkeypatch.setattr(clock.subprocess, "run", fake_run)
    instants = list(clock.INSTANTS)
    assert clock.sweep(instants, keep_going=False, pytest_args=["--maxfail=1"]) == 1
    assert seen == instants[:3]
    seen.clear()
    assert clock.sweep(instants, keep_going=True, pytest_args=["--maxfail=1"]) == 1
    assert seen == instants
    out = capsys.readouterr().out
    assert "1 of 5 instants failed" in out and out.rstrip().endswith("2027-01-01T00:30 Asia/Shanghai")
