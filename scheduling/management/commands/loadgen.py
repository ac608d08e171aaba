"""``manage.py loadgen``: keep submitting realistic demo jobs."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from scheduling.loadgen import run


class Command(BaseCommand):
    help = "Submit realistic jobs from each demo team every few seconds."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--interval", type=float, default=8.0, help="mean seconds between submissions")
        parser.add_argument("--max-pending", type=int, default=25, help="pause while this many jobs wait")
        parser.add_argument("--count", type=int, default=None, help="stop after this many jobs")
        parser.add_argument("--seed", type=int, default=None)

    def handle(self, *args: object, **opts: object) -> None:
        run(interval_s=opts["interval"], max_pending=opts["max_pending"], seed=opts["seed"], count=opts["count"])
