"""``manage.py sprio JOB``: why a job is where it is — priority factors, quota in force, decision."""

from __future__ import annotations

import json
import sys
from datetime import datetime

from django.core.management.base import BaseCommand
from django.utils import timezone

from quotas.policies.versions import active_policy
from scheduling.engine.durations import format_duration
from scheduling.engine.explain import explain
from scheduling.engine.policy import zone
from scheduling.services.snapshot import load_snapshot


class Command(BaseCommand):
    help = "Explain a pending or running job like Slurm's sprio: each factor, weight and the wait reason."

    def add_arguments(self, parser) -> None:
        parser.add_argument("job_id", type=int)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: object, **opts: object) -> None:
        snapshot, _ = load_snapshot(timezone.now(), active_policy().policy)
        try:
            info = explain(snapshot, opts["job_id"])
        except KeyError:
            self.stderr.write(f"job {opts['job_id']} is neither pending nor running")
            sys.exit(2)
        if opts["json"]:
            self.stdout.write(json.dumps(info, indent=2, default=str))
            return
        self.stdout.write(
            f"job {info['job_id']} ({info['team']}/{info['user']}, class {info['priority_class']}): {info['state']}"
        )
        if info.get("factors"):
            self.stdout.write(f"  {'factor':14} {'value':>8} {'weight':>8} {'weighted':>10}")
            for name, f in info["factors"].items():
                self.stdout.write(f"  {name:14} {f['factor']:>8.4f} {f['weight']:>8g} {f['weighted']:>10.1f}")
            self.stdout.write(f"  {'priority':14} {'':>8} {'':>8} {info['priority']:>10.1f}")
        starvation = info.get("starvation")
        if starvation and starvation["after_s"] is not None:
            waited = format_duration(round(starvation["waited_s"]))
            after = format_duration(starvation["after_s"])
            if starvation["starving"]:
                self.stdout.write(f"  starving: waited {waited} > {after}: served before the factors above apply")
            else:
                self.stdout.write(f"  starvation guard: waited {waited} of {after}")
        quota = info["quota"]
        self.stdout.write(
            f"  quota in force: schedule {quota.get('schedule') or '(base)'}, "
            f"guaranteed {quota['guaranteed']}, max {quota['max']}"
        )
        if info.get("reason"):
            est = info.get("estimated_start")
            detail = f" ({info['detail']})" if info.get("detail") else ""
            when = ""
            if est:  # on the policy's clock, as the console shows times
                local = datetime.fromtimestamp(est, zone(snapshot.policy.timezone))
                when = f" (estimated start {local:%Y-%m-%d %H:%M %Z})"
            self.stdout.write(
                f"  decision: {info['decision']} — {info['reason']}: {info.get('reason_text', '')}{detail}{when}"
            )
        elif info.get("decision"):
            self.stdout.write(f"  decision: {info['decision']}")
