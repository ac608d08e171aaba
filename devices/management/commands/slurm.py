"""``manage.py slurm``: what the portal sees of its Slurm cluster (``check``), its nodes taken in
(``import``), and a month's accounting compared with Slurm's (``reconcile``).

Both use the cluster's ``SLURM_CONF`` (``NPUPORTAL_SLURM_CONF``, else the process's own) and Slurm's
commands on ``PATH``; docs/slurm.md has worked examples. Exit codes, as the other commands':
0 ok (``check``: the portal can run jobs on this Slurm); 1 refused or not usable (the controller
does not answer, no such partition, a node left out of the import or not yet removed); 2 usage
error (an unknown ``--chip``, a bad ``--month``). ``reconcile --month YYYY-MM`` compares each job's
device-hours with ``sacct``'s (:mod:`devices.slurm.reconcile`): exit 1 when the month's totals are
more than 1% apart or Slurm's accounting did not answer. A refusal is one line on stderr and changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from devices.services.slurm_import import ImportRefused, import_nodes
from devices.slurm import survey
from devices.slurm.commands import SlurmError
from devices.slurm.reconcile import reconcile
from quotas.accounting.statements import ChargebackUsageError
from quotas.management.subcommands import Exit, SubcommandCommand

OK, REFUSED, USAGE = 0, 1, 2


class Command(SubcommandCommand):
    help = "The Slurm cluster the portal runs jobs on: check what it offers, import its nodes, reconcile a month."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
        sub.add_parser("check", help="say what Slurm offers the portal and what is wrong (exit 1: not usable)")
        p = sub.add_parser("import", help="make the portal's nodes and cards those of Slurm")
        p.add_argument("--replace", action="store_true", help="also remove the portal's nodes Slurm does not have")
        p.add_argument(
            "--chip", default="", help="the chip model of every imported node (else Slurm's GRES type or feature)"
        )
        p.add_argument("--partition", default="", help="only the nodes of this partition")
        p = sub.add_parser(
            "reconcile", help="compare each job's device-hours in a month with sacct's; exit 1 beyond 1% apart"
        )
        p.add_argument("--month", required=True, help="the month, YYYY-MM on the policy's clock")

    def do_check(self, opts: dict[str, Any]) -> None:
        found = survey.survey()
        findings = survey.assess(found, partition=getattr(settings, "NPUPORTAL_SLURM_PARTITION", ""))
        say = self.stdout.write
        say(f"Slurm {found.version or '(version unknown)'}, configuration {found.conf}")
        say(f"controller: {'reachable' if found.controller_up else 'NOT reachable'} ({found.controller})")
        if found.partitions:
            say(
                "partitions: "
                + "; ".join(
                    f"{p.name} ({'default, ' if p.default else ''}{p.state.lower()}, nodes {p.nodes})"
                    for p in found.partitions
                )
            )
        if found.nodes:
            say(f"nodes: {len(found.nodes)}")
            width = max(len(n.name) for n in found.nodes)
            for node in found.nodes:
                chip = survey.chip_of(node)
                say(
                    f"  {node.name:{width}}  {node.state:<10} Gres={_short_gres(node.gres)}"
                    + (f"  chip {chip}" if chip else "")
                    + (f"  reason: {node.reason}" if node.reason else "")
                )
                cards = f"{len(node.cards)} card(s), " if node.cards else ""
                say(f"  {'':{width}}  {cards}{node.placement}")
        if found.sacct_ok:
            say(f"accounting: {found.accounting_type + ', ' if found.accounting_type else ''}reachable ({found.sacct})")
        elif found.accounting_type.endswith("/none"):
            say("accounting: none (AccountingStorageType=accounting_storage/none)")
        else:
            say(f"accounting: NOT reachable ({found.sacct})")
        for finding in findings:
            say(f"{finding.level}: {finding.text}")
        usable = not [f for f in findings if f.level == "problem"]
        say("usable: yes, the portal can run jobs on this Slurm" if usable else "usable: NO")
        if not usable:
            raise Exit(REFUSED)

    def do_import(self, opts: dict[str, Any]) -> None:
        try:
            result = import_nodes(replace=opts["replace"], chip=opts["chip"], partition=opts["partition"], actor=None)
        except ImportRefused as exc:
            raise self._fail(f"slurm import: {exc}", USAGE if exc.usage else REFUSED) from exc
        for line in result.lines:
            self.stdout.write(line)
        counts = ", ".join(
            f"{len(names)} {what}"
            for what, names in (
                ("added", result.added),
                ("changed", result.changed),
                ("removed", result.removed),
                ("unchanged", result.unchanged),
                ("left out", result.skipped),
            )
            if names
        )
        if not (result.added or result.changed or result.removed or result.skipped):
            self.stdout.write(
                f"nothing to change: the portal's nodes are those of {result.source} ({counts or 'none'})"
            )
        else:
            self.stdout.write(f"import from {result.source}: {counts}")
        if not result.complete:
            raise Exit(REFUSED)

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


def _short_gres(gres: str) -> str:
    """A node's ``Gres=`` for a line: eight per-card entries as ``npu:c0:1,…,npu:c7:1``."""
    items = gres.split(",") if gres else []
    if len(items) > 3:
        return f"{items[0]},…,{items[-1]}"
    return gres or "(none)"
