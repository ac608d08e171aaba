"""Running the date-sensitive tests at a fixed instant: ``NPUPORTAL_TEST_CLOCK``.

``NPUPORTAL_TEST_CLOCK="2027-03-01T00:30 Asia/Shanghai"`` starts the test process's clock
at that wall-clock time of that zone (time-machine, ticking on from there), and the demo's
policy is seeded on that zone's clock, so "the 1st at 00:30 on the policy clock" is what the
tests see even though UTC is still on the day before. ``make test`` runs the tests marked
``clock`` at each of :data:`INSTANTS`; without the variable nothing is pinned.

Only the test process travels: tests marked ``clock`` keep to the web server of the test
process (pytest-django's live server is a thread of it) and start no other processes.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
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
