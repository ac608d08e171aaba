"""``manage.py tick``: run one scheduling tick now and print what it decided."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from scheduling.services.tick import run_tick


class Command(BaseCommand):
    help = "Run one scheduling tick (what Celery beat does every few seconds)."

    def handle(self, *args: object, **opts: object) -> None:
        r = run_tick()
        self.stdout.write(
            f"policy v{r.policy_version}: started {len(r.started)}, preempting {len(r.preempted)}, "
            f"evicted {len(r.evicted)}, "
            + (f"called off {len(r.called_off)}, " if r.called_off else "")
            + f"waiting {r.waiting} in {r.duration_ms:.1f} ms "
            f"(load {r.load_ms:.1f}, decide {r.decide_ms:.1f}, persist {r.persist_ms:.1f})"
        )
