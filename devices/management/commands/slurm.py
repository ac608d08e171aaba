"""``manage.py slurm``: the portal beside a Slurm cluster (``NPUPORTAL_EXECUTOR=slurm``; docs/slurm.md).

One sub-command per task, as ``manage.py nodes`` and ``chargeback`` have: ``reconcile --month
YYYY-MM`` compares a month's device-hours, job by job, with Slurm's accounting
(:mod:`devices.slurm.reconcile`). Exit codes as the other commands' (:mod:`npuportal.commandline`):
0 the two agree within 1%; 1 they do not, or Slurm did not answer; 2 a usage error (a bad month).
Every refusal is one line on stderr.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from devices.executors.slurm import SlurmError
from devices.slurm.reconcile import reconcile
from quotas.accounting.statements import ChargebackUsageError
from quotas.management.subcommands import Exit, SubcommandCommand

OK, REFUSED, USAGE = 0, 1, 2


class Command(SubcommandCommand):
    help = "The portal beside a Slurm cluster: compare a month's accounting with Slurm's."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
        p = sub.add_parser(
            "reconcile", help="compare each job's device-hours in a month with sacct's; exit 1 beyond 1% apart"
        )
        p.add_argument("--month", required=True, help="the month, YYYY-MM on the policy's clock")

    def do_reconcile(self, opts: dict[str, Any]) -> None:
        try:
            result = reconcile(opts["month"])
        except ChargebackUsageError as exc:
            raise self._fail(f"--{exc}", USAGE) from exc
        except SlurmError as exc:
            raise self._fail(f"Slurm's accounting could not be read: {exc}", REFUSED) from exc
        for line in result.lines():
            self.stdout.write(line)
        if not result.agree:
            raise Exit(REFUSED)
