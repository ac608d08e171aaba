"""How the suite waits: for a condition, up to a ceiling a passing test never reaches.

The suite runs on small shared machines (two cores, often a second test run beside it), where a
subprocess may take seconds to start and a page seconds to update. So a test never gives a thing a
tight budget ("done within 5 s"): it polls for the condition it needs and stops as soon as that holds,
and the deadline only bounds how long a broken run hangs before it fails. :data:`DEFAULT_TIMEOUT_S`
(60 s) is that ceiling; ``NPUPORTAL_TEST_WAIT_SCALE`` multiplies every ceiling of the suite (``2`` on
a machine slower still, ``0.5`` to make a hanging test fail sooner when debugging).

- :func:`wait_for` polls a condition and returns its first truthy value (or the first value that
  ``until`` accepts), or fails saying what it awaited and the last value it saw.
- :func:`ceiling` is a scaled number of seconds, for the timeouts of other APIs (``subprocess``,
  ``communicate``, ``queue.get``); :func:`ceiling_ms` the same in milliseconds (Playwright).

A test that checks that something does *not* happen keeps its short observation window, but looks
after a positive event that proves the system had its chance (a later job finished, a reply came),
not merely after a sleep.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SCALE_ENV = "NPUPORTAL_TEST_WAIT_SCALE"

#: The default ceiling of one wait, in seconds (before scaling).
DEFAULT_TIMEOUT_S = 60.0


def scale() -> float:
    """``NPUPORTAL_TEST_WAIT_SCALE`` as a positive number (1 when unset); a bad value stops the run, named."""
    raw = os.environ.get(SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV} must be a number (a factor such as 2 or 0.5), not {raw!r}") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"{SCALE_ENV} must be a positive number, not {raw!r}")
    return value


def ceiling(seconds: float = DEFAULT_TIMEOUT_S) -> float:
    """``seconds`` scaled by ``NPUPORTAL_TEST_WAIT_SCALE``: the timeout to hand to another API."""
    return seconds * scale()


def ceiling_ms(seconds: float = DEFAULT_TIMEOUT_S) -> int:
    """:func:`ceiling` in whole milliseconds, as Playwright takes its timeouts."""
    return round(ceiling(seconds) * 1000)


def wait_for(
    condition: Callable[[], T],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    message: str = "",
    ignore: tuple[type[BaseException], ...] = (),
    until: Callable[[T], object] | None = None,
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something truthy, and return that.

    With ``until``, ``condition`` fetches a value (a job's record) and ``until(value)`` says whether it is
    the awaited one (``lambda job: job["state"] == "killed"``); a failure then shows the whole last record.

    ``timeout`` is a ceiling in seconds, scaled by ``NPUPORTAL_TEST_WAIT_SCALE``. Past it, an
    ``AssertionError`` says what was awaited (``message``, else the condition's name) and the last
    value seen. Exceptions of the ``ignore`` types count as "not yet" (a server still starting refuses
    connections) and are shown as the last value; any other exception, an assertion of the condition's
    own included, fails the wait at once.
    """
    limit = ceiling(timeout)
    deadline = time.monotonic() + limit
    last: object = None
    while True:
        try:
            value = condition()
        except ignore as exc:
            last = exc
        else:
            if until(value) if until is not None else value:
                return value
            last = value
        if time.monotonic() >= deadline:
            what = message or getattr(condition, "__name__", repr(condition))
            raise AssertionError(f"waited {limit:g} s for {what}; last value seen: {last!r}")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen[bytes] | None, seconds: float = 30) -> None:
    """Stop a process a test started, by its pid: SIGTERM, then SIGKILL if it is still there after
    ``ceiling(seconds)``. Nothing to do for one already gone."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=ceiling(seconds))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
