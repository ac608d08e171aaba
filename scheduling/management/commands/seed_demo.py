"""``manage.py seed_demo``: the demo site, created once, safe to run again."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from scheduling.demo import logins_file, seed


class Command(BaseCommand):
    help = "Create the demo cluster, teams, users, policy and jobs (idempotent)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--no-agents", action="store_true", help="Register nodes without agent URLs")

    def handle(self, *args: object, no_agents: bool = False, **opts: object) -> None:
        passwords = seed(with_agents=not no_agents)
        if passwords:
            self.stdout.write(f"Demo logins (shown once; also kept in {logins_file()}):")
            for user, password in passwords.items():
                self.stdout.write(f"  {user:18} {password}")
        else:
            self.stdout.write(f"Demo already present; logins are in {logins_file()}")
