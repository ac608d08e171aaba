"""``manage.py sshare``: the fair-share tree as the tick sees it now, like Slurm's ``sshare -l``."""

from __future__ import annotations

import json
from dataclasses import asdict

from django.core.management.base import BaseCommand
from django.utils import timezone

from quotas.models import Team
from quotas.policies.versions import active_policy
from scheduling.engine.fairshare import fair_share_table, format_sshare, tree_from_usage
from scheduling.models import Job
from scheduling.services.snapshot import _usage


class Command(BaseCommand):
    help = "Show the department → team → user fair-share tree: shares, decayed usage, effective usage, factor."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: object, **opts: object) -> None:
        policy = active_policy().policy
        usage, _ = _usage(timezone.now(), policy)
        # Owners of queued work get a row even before they have used anything.
        owners = set(
            Job.objects.filter(state__in=[Job.State.PENDING, Job.State.RUNNING]).values_list(
                "team__name", "submitter__username"
            )
        )
        tree = tree_from_usage(policy, usage, owners)
        for name in Team.objects.values_list("name", flat=True):
            tree.setdefault(name, {"parent": None, "shares": float(policy.team(name).shares)})
        if opts["json"]:
            rows = fair_share_table(tree)
            self.stdout.write(json.dumps([asdict(row) for row in rows], indent=2))
            return
        self.stdout.write(format_sshare(tree), ending="")
