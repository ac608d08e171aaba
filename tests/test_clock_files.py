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
