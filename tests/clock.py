"""Running the date-sensitive tests at a fixed instant: ``NPUPORTAL_TEST_CLOCK``.

``NPUPORTAL_TEST_CLOCK="2027-03-01T00:30 Asia/Shanghai"`` starts the test process's clock
at that wall-clock time of that zone (time-machine, ticking on from there), and the demo's
policy is seeded on that zone's clock, so "the 1st at 00:30 on the policy clock" is what the
tests see even though UTC is still on the day before. ``make test`` runs the tests marked
``clock`` at each of :data:`INSTANTS`; without the variable nothing is pinned.

Five fixed instants are not every day: a test that leans on data dated relative to today can
pass on all five and fail on the 3rd of a month. So ``make test`` also runs the ``clock`` tests at
three instants drawn at random (:func:`random_instants`; the seed is printed and
``NPUPORTAL_CLOCK_SEED`` repeats a draw), and ``make calendar`` sweeps :func:`calendar_instants`:
every day of a month across a year end, both ends of every month of a year, 29 February and the
DST change days of a northern and a southern zone. ``python -m tests.clock random|calendar``
prints them, one per line.

Only the test process travels: tests marked ``clock`` keep to the web server of the test
process (pytest-django's live server is a thread of it) and start no other processes.
"""

from __future__ import annotations

import argparse
import calendar
import os
import random
import re
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

VARIABLE = "NPUPORTAL_TEST_CLOCK"

#: The instants ``make test`` runs the ``clock`` tests at, each with the zone of its policy.
INSTANTS = (
    "2027-03-01T00:30 Asia/Shanghai",  # the 1st at 00:30: UTC is still on the last day of February
    "2027-04-30T23:30 America/Los_Angeles",  # the last day at 23:30: UTC is already on 1 May
    "2027-01-01T00:30 Asia/Shanghai",  # 1 January: UTC is still in last year
    "2027-03-14T03:30 America/New_York",  # the day clocks go forward (02:00 -> 03:00)
    "2027-10-31T02:30 Europe/Berlin",  # the day clocks go back: 02:30 happens twice
)

#: Zones the random draw picks from: each side of UTC, far from it, half-hour offsets, and both
#: hemispheres' daylight saving.
RANDOM_ZONES = (
    "Asia/Shanghai",
    "America/Los_Angeles",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Sydney",
    "Pacific/Auckland",
    "America/Santiago",
    "Asia/Kolkata",
    "Pacific/Kiritimati",
    "Pacific/Pago_Pago",
    "UTC",
)
SEED_VARIABLE = "NPUPORTAL_CLOCK_SEED"

_FORMAT = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}) ([A-Za-z_]+(?:/[A-Za-z_+-]+)*)$")


def pinned() -> tuple[datetime, str] | None:
    """The instant and zone named by the variable, or None when it is unset."""
    value = os.environ.get(VARIABLE, "").strip()
    if not value:
        return None
    match = _FORMAT.match(value)
    if not match:
        raise ValueError(f"{VARIABLE}={value!r}: expected 'YYYY-MM-DDTHH:MM Zone/Name'")
    zone = match.group(2)
    return datetime.fromisoformat(match.group(1)).replace(tzinfo=ZoneInfo(zone)), zone


def demo_policy_text(text: str) -> str:
    """The demo policy, on the pinned zone's clock when one is pinned."""
    found = pinned()
    if found is None:
        return text
    return re.sub(r"(?m)^(\s*timezone:\s*).*$", lambda m: m.group(1) + found[1], text, count=1)


def exists(day: date, hour: int, minute: int, zone: str) -> bool:
    """Whether that wall-clock time happens in ``zone`` (not skipped by a clock going forward)."""
    local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=ZoneInfo(zone))
    return local.astimezone(UTC).astimezone(ZoneInfo(zone)).replace(tzinfo=None) == local.replace(tzinfo=None)


def random_instants(seed: int, count: int = 3) -> list[str]:
    """``count`` instants between 2026 and 2030 drawn from ``seed``: a third at a month's edge
    (the 1st at 00:xx, the last day at 23:xx), the rest any day at any minute."""
    draw = random.Random(seed)
    found: list[str] = []
    while len(found) < count:
        zone = draw.choice(RANDOM_ZONES)
        year, month = draw.randint(2026, 2030), draw.randint(1, 12)
        last = calendar.monthrange(year, month)[1]
        edge = draw.random()
        if edge < 1 / 6:
            day, hour = date(year, month, 1), 0
        elif edge < 1 / 3:
            day, hour = date(year, month, last), 23
        else:
            day, hour = date(year, month, draw.randint(1, last)), draw.randint(0, 23)
        minute = draw.randint(0, 59)
        if exists(day, hour, minute, zone):
            found.append(f"{day:%Y-%m-%d}T{hour:02d}:{minute:02d} {zone}")
    return found


#: DST change days (2027): spring forward at an hour that exists, fall back at the hour that happens twice.
DST_DAYS = (
    ("2027-03-14T03:30", "America/New_York"),  # north: forward
    ("2027-11-07T01:30", "America/New_York"),  # north: back
    ("2027-03-28T03:30", "Europe/Berlin"),
    ("2027-10-31T02:30", "Europe/Berlin"),
    ("2027-10-03T03:30", "Australia/Sydney"),  # south: forward in October
    ("2027-04-04T02:30", "Australia/Sydney"),  # south: back in April
    ("2027-09-26T03:30", "Pacific/Auckland"),
    ("2027-04-04T02:30", "Pacific/Auckland"),
)


def calendar_instants() -> list[str]:
    """The sweep of ``make calendar``, in order:

    - every day from 15 December 2027 to 15 January 2028 (a month across a month and a year end),
      alternately at 00:30 in Asia/Shanghai (UTC still on the day before) and at 23:30 in
      America/Los_Angeles (UTC already on the next day);
    - both ends of every month of 2027 on the policy clock: the 1st at 00:30 (Asia/Shanghai) and
      the last day at 23:30 (America/Los_Angeles);
    - 29 February 2028 at 00:30 and 23:30;
    - the DST change days of :data:`DST_DAYS`, two northern zones and two southern.
    """
    found: list[str] = []
    day = date(2027, 12, 15)
    while day <= date(2028, 1, 15):
        if day.toordinal() % 2:
            found.append(f"{day:%Y-%m-%d}T00:30 Asia/Shanghai")
        else:
            found.append(f"{day:%Y-%m-%d}T23:30 America/Los_Angeles")
        day += timedelta(days=1)
    for month in range(1, 13):
        last = calendar.monthrange(2027, month)[1]
        found.append(f"2027-{month:02d}-01T00:30 Asia/Shanghai")
        found.append(f"2027-{month:02d}-{last:02d}T23:30 America/Los_Angeles")
    found += ["2028-02-29T00:30 Asia/Shanghai", "2028-02-29T23:30 America/Los_Angeles"]
    found += [f"{at} {zone}" for at, zone in DST_DAYS]
    return list(dict.fromkeys(found))  # 31 December 2027 is both a day of the month and a month's end


#: How a test module says it is date-sensitive: ``pytestmark = [..., pytest.mark.clock]`` or
#: ``@pytest.mark.clock`` on a test. tests/test_clock_files.py checks this finds every one.
_MARKED = re.compile(r"\bpytest\.mark\.clock\b")


def files(root: Path | None = None) -> list[str]:
    """The test modules that hold tests marked ``clock``, relative to the project.

    Each instant's run names these instead of collecting the whole suite only to deselect most of
    it: collecting every module took 25 of an instant's 90 s on a busy 2-core machine.
    """
    base = root or Path(__file__).resolve().parent.parent
    found = [
        path.relative_to(base).as_posix()
        for path in sorted((base / "tests").rglob("test_*.py"))
        if _MARKED.search(path.read_text(encoding="utf-8"))
    ]
    return found


def sweep(instants: list[str], *, keep_going: bool, pytest_args: list[str]) -> int:
    """Run the ``clock`` tests at each instant, one pytest process at a time; 0 when all passed.

    Each instant is one process without xdist workers: an instant's 245 tests took 39 CPU-seconds
    that way and 63 on two workers (each worker imports and collects again), and the sweep runs
    beside the rest of the suite (``make test``), where the cores are what is short. With
    ``keep_going`` every instant runs and the ones that failed are listed at the end (``make
    calendar``); without, the first failure ends the sweep.
    """
    modules = files()
    failed: list[str] = []
    started = time.monotonic()
    for number, at in enumerate(instants, 1):
        print(
            f'== [{number}/{len(instants)}] tests marked clock at {at} (repeat: {VARIABLE}="{at}" pytest -m clock)',
            flush=True,
        )
        command = [sys.executable, "-m", "pytest", "-m", "clock", "-p", "no:xdist", *pytest_args, *modules]
        env = {**os.environ, VARIABLE: at}
        code = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, check=False).returncode
        if code != 0:
            failed.append(at)
            if not keep_going:
                break
    minutes = (time.monotonic() - started) / 60
    if failed:
        print(f"== clock sweep: {len(failed)} of {len(instants)} instants failed ({minutes:.1f} min), at:")
        print(*failed, sep="\n")
        return 1
    print(f"== clock sweep: all {len(instants)} instants passed ({minutes:.1f} min)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.clock fixed|random|calendar``: the instants, one per line (the seed on stderr).

    ``python -m tests.clock files``: the test modules with tests marked ``clock``, one per line.
    ``python -m tests.clock sweep fixed random [--keep-going] [-- PYTEST_ARGS]``: run the ``clock``
    tests at those instants (what ``make test`` and ``make calendar`` do).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(prog="python -m tests.clock")
    parser.add_argument("which", choices=("fixed", "random", "calendar", "files", "sweep"))
    parser.add_argument("sets", nargs="*", help="with sweep: which instants (fixed, random, calendar)")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--keep-going", action="store_true", help="with sweep: run every instant, list the failures")
    args = parser.parse_args(argv)
    if args.sets and args.which != "sweep":
        parser.error(f"{args.which} takes no more names")
    if args.which == "files":
        print(*files(), sep="\n")
        return 0
    if args.which == "sweep":
        if not args.sets or not set(args.sets) <= {"fixed", "random", "calendar"}:
            parser.error(f"sweep: name the instants, of fixed, random and calendar (not {args.sets})")
        instants = [at for which in args.sets for at in _instants(which, args.count)]
        return sweep(instants, keep_going=args.keep_going, pytest_args=pytest_args)
    print(*_instants(args.which, args.count), sep="\n")
    return 0


def _instants(which: str, count: int) -> list[str]:
    if which == "fixed":
        return list(INSTANTS)
    if which == "calendar":
        return calendar_instants()
    given = os.environ.get(SEED_VARIABLE, "").strip()
    seed = int(given) if given else random.SystemRandom().randrange(1, 10**9)
    print(f"clock seed {seed} (repeat the draw with {SEED_VARIABLE}={seed})", file=sys.stderr, flush=True)
    return random_instants(seed, count)


if __name__ == "__main__":
    raise SystemExit(main())
