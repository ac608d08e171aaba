"""``manage.py nodes``: add a node from its agent, remove one, cordon, drain or uncordon one, list them (docs/nodes.md).

Cordon, drain and uncordon are the console's and the API's operations
(:mod:`devices.services.operations`), so a script on the server needs no token; with the Slurm
executor each one is carried to Slurm too (``scontrol update State=DRAIN`` / ``State=RESUME``).

Exit codes, as the other commands' (:mod:`npuportal.commandline`): 0 ok; 1 refused (a duplicate
name, an agent that does not answer or refuses the token, jobs running on the node, no such node);
2 usage error (a token file that cannot be read). Every refusal is one line on stderr and changes
nothing. A cordon, drain or uncordon Slurm then refuses (``scontrol`` failed) is a ``warning:`` line
on stderr naming the node and Slurm's message, with exit code 0: the portal's change stands.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser
from django.db.models import Count

from devices.models import Node
from devices.services import operations
from devices.services.registration import RegistrationError, describe_jobs, register_node, remove_node
from quotas.management.subcommands import Exit, SubcommandCommand, read_text_file

OK, REFUSED, USAGE = 0, 1, 2


class Command(SubcommandCommand):
    help = "Nodes of the inventory: add one from its agent, remove one, list them."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
        p = sub.add_parser("add", help="ask the node's agent for its devices and register the node with them")
        p.add_argument("name")
        p.add_argument("--agent-url", required=True, help="the agent's base URL, e.g. http://10.0.0.5:8471")
        p.add_argument("--token-file", required=True, help="the file holding the agent's token (its --token-file)")
        p = sub.add_parser("remove", help="take a node out of the inventory (refused while jobs run there)")
        p.add_argument("name")
        p.add_argument(
            "--drain", action="store_true", help="jobs running: drain the node now; run remove again once it is drained"
        )
        p.add_argument("--reason", default="", help="why (kept in the inventory history and the audit log)")
        for verb, what in (
            ("cordon", "no new work on the node; what runs there stays"),
            ("drain", "no new work; what runs there finishes, then the node is drained"),
            ("uncordon", "the node takes new work again"),
        ):
            p = sub.add_parser(verb, help=what)
            p.add_argument("name")
            p.add_argument("--reason", default="", help="why (kept in the inventory history and the audit log)")
        p = sub.add_parser("list", help="every node with its devices and state")
        p.add_argument("--removed", action="store_true", help="also the removed nodes")
        p.add_argument("--json", action="store_true")

    def _refused(self, exc: RegistrationError) -> Exit:
        return self._fail(f"{exc}", REFUSED)

    def do_add(self, opts: dict[str, Any]) -> None:
        try:
            token = read_text_file(opts["token_file"], "token file").strip()
        except ValueError as exc:
            raise self._fail(f"--token-file: {exc}", USAGE) from exc
        try:
            done = register_node(opts["name"], opts["agent_url"], token, actor=None)
        except RegistrationError as exc:
            raise self._refused(exc) from exc
        node = done.node
        chips = ", ".join(sorted(set(node.devices.values_list("chip_model", flat=True))))
        verb = "re-added (it had been removed)" if done.reactivated else "added"
        self.stdout.write(f"node {node.name} {verb}: {done.devices} device(s) ({chips}) from {node.agent_url}")

    def do_remove(self, opts: dict[str, Any]) -> None:
        try:
            done = remove_node(opts["name"], actor=None, drain=opts["drain"], reason=opts["reason"])
        except RegistrationError as exc:
            raise self._refused(exc) from exc
        if done.removed:
            self.stdout.write(f"node {done.node.name} removed: no longer scheduled or polled; its history stays")
            return
        self.stdout.write(
            f"node {done.node.name} is {done.node.state}: {len(done.running)} job(s) still run there "
            f"({describe_jobs(done.running)}); run `manage.py nodes remove {done.node.name}` again once it is drained"
        )

    def _operate(self, opts: dict[str, Any]) -> None:
        use_case = {
            "cordon": operations.cordon_node,
            "drain": operations.drain_node,
            "uncordon": operations.uncordon_node,
        }[opts["action"]]
        try:
            done = use_case(opts["name"], actor=None, reason=opts["reason"])
        except Node.DoesNotExist as exc:
            raise self._fail(f"no node named {opts['name']!r} in the inventory", REFUSED) from exc
        except operations.NodeRemoved as exc:
            raise self._fail(str(exc), REFUSED) from exc
        if done.changed:
            self.stdout.write(f"node {done.node.name}: {done.previous} → {done.node.state}")
            for failure in done.executor_failures:  # the portal's change stands: still exit code 0
                self.stderr.write(f"warning: {failure}; the node is {done.node.state} in the portal all the same")
        else:
            self.stdout.write(f"node {done.node.name} is already {done.node.state}: nothing changed")

    do_cordon = do_drain = do_uncordon = _operate

    def do_list(self, opts: dict[str, Any]) -> None:
        nodes = Node.objects.annotate(devices_total=Count("devices")).order_by("name")
        if not opts["removed"]:
            nodes = nodes.filter(removed_at__isnull=True)
        rows = []
        chips: dict[int, set[str]] = {}
        for node_id, chip in Node.objects.filter(devices__isnull=False).values_list("pk", "devices__chip_model"):
            chips.setdefault(node_id, set()).add(chip)
        for node in nodes:
            rows.append(
                {
                    "name": node.name,
                    "state": "removed" if node.removed_at else node.state,
                    "reachable": node.reachable,
                    "devices": node.devices_total,
                    "chip_models": sorted(chips.get(node.pk, set())),
                    "agent_url": node.agent_url,
                    "created": node.created.isoformat(),
                    "removed_at": node.removed_at.isoformat() if node.removed_at else None,
                }
            )
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        self.stdout.write(f"{'NAME':20} {'STATE':9} {'REACHABLE':9} {'DEVICES':7} {'CHIPS':12} AGENT")
        for row in rows:
            self.stdout.write(
                f"{row['name']:20} {row['state']:9} {'yes' if row['reachable'] else 'no':9} {row['devices']:<7} "
                f"{','.join(row['chip_models']):12} {row['agent_url']}"
            )
