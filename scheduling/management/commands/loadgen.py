"""``manage.py loadgen``: keep submitting realistic demo jobs.

Exit codes: 0 done (``--count`` jobs submitted, or stopped), 2 a bad option (named, with
the reason), and those of every command (:mod:`npuportal.commandline`: 3 database, 130 Ctrl-C).
"""

from __future__ import annotations

import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling.loadgen import run

USAGE = 2
#: The longest mean interval taken: ``time.sleep`` cannot wait past the OS's clock, and a day is plenty.
MAX_INTERVAL_S = 86400.0


class Command(BaseCommand):
    help = "Submit realistic jobs from each demo team every few seconds."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=8.0, help="mean seconds between submissions (> 0)")
        parser.add_argument("--max-pending", type=int, default=25, help="pause while this many jobs wait (>= 1)")
        parser.add_argument("--count", type=int, default=None, help="stop after this many jobs (>= 1)")
        parser.add_argument("--seed", type=int, default=None)

    def handle(self, *args: object, **opts: Any) -> None:
        interval, max_pending, count = opts["interval"], opts["max_pending"], opts["count"]
        # Checked here, not in argparse's type=, so the message is one line naming the option.
        if not math.isfinite(interval) or not 0 < interval <= MAX_INTERVAL_S:
            raise CommandError(
                f"--interval: {interval:g} must be more than 0 and at most {MAX_INTERVAL_S:g} seconds",
                returncode=USAGE,
            )
        if max_pending < 1:
            raise CommandError(f"--max-pending: {max_pending} must be 1 or more", returncode=USAGE)
        if count is not None and count < 1:
            raise CommandError(f"--count: {count} must be 1 or more", returncode=USAGE)
        run(interval_s=interval, max_pending=max_pending, seed=opts["seed"], count=count)
