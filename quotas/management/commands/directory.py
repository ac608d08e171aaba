"""``manage.py directory``: the site directory's people in the portal.

- ``directory sync``: every member of a group the policy names gets their account, teams and roles
  as the directory has them; accounts the directory no longer has are marked inactive, keeping their
  jobs and history (``--dry-run``: list whom it would look at, change nothing).
- ``directory show USER``: where an account comes from, its groups at the last sign-in or sync,
  and its teams.

Exit codes: 0 ok, 1 the directory refused or could not be reached, 2 usage (LDAP not configured,
an unknown user). Run ``directory sync`` from cron or a Celery beat entry, e.g. hourly.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandParser

from quotas.management.subcommands import Exit, SubcommandCommand
from quotas.models import Membership, UserProfile

OK, FAILED, USAGE = 0, 1, 2


class Command(SubcommandCommand):
    help = "The site directory's people: sync accounts, teams and roles from LDAP groups; show an account."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
        p = sub.add_parser("sync", help="accounts, teams and roles from the directory; gone accounts inactive")
        p.add_argument("--dry-run", action="store_true", help="list the accounts it would look at; change nothing")
        p.add_argument("--json", action="store_true")
        p = sub.add_parser("show", help="an account's source, directory groups and teams")
        p.add_argument("username")

    def do_sync(self, opts: dict[str, Any]) -> None:
        import ldap

        from quotas.directory import ldap as directory_ldap

        if not directory_ldap.enabled():
            raise self._fail("directory sync: LDAP is not configured (set NPUPORTAL_LDAP_URL; see the README)", USAGE)
        try:
            report = directory_ldap.sync(dry_run=opts["dry_run"])
        except directory_ldap.LdapConfigError as exc:
            raise self._fail(f"directory sync: {exc}", FAILED) from exc
        except ldap.LDAPError as exc:
            message = f"directory sync: the directory at {_url()} refused or did not answer: {_ldap_text(exc)}"
            raise self._fail(message, FAILED) from exc
        if opts["json"]:
            self.stdout.write(json.dumps(report.__dict__, indent=2, sort_keys=True))
            return
        verb = "would look at" if opts["dry_run"] else "looked at"
        self.stdout.write(f"{verb} {len(report.checked)} account(s) from the directory")
        for name in report.created:
            self.stdout.write(f"  new account: {name}")
        for name, changes in sorted(report.changed.items()):
            for change in changes:
                self.stdout.write(f"  {name}: {change}")
        for name in report.left:
            self.stdout.write(f"  {name}: no longer in the directory: inactive (jobs and history kept)")
        if not opts["dry_run"] and not (report.created or report.changed or report.left):
            self.stdout.write("  nothing to change")

    def do_show(self, opts: dict[str, Any]) -> None:
        user = get_user_model().objects.filter(username__iexact=opts["username"]).first()
        if user is None:
            raise self._fail(f"directory show: no account {opts['username']!r}", USAGE)
        profile = UserProfile.objects.filter(user=user).first()
        source = profile.get_directory_display() if profile else "Local account"
        self.stdout.write(f"{user.get_username()}: {source}{'' if user.is_active else ', inactive'}")
        if profile and profile.directory:
            self.stdout.write(f"  directory name: {profile.directory_id}")
            self.stdout.write(f"  groups: {', '.join(profile.directory_groups) or '(none)'}")
        teams = Membership.objects.filter(user=user).select_related("team")
        self.stdout.write("  teams: " + (", ".join(f"{m.team.name} ({m.role})" for m in teams) or "(none)"))


def _url() -> str:
    from django.conf import settings

    return str(getattr(settings, "AUTH_LDAP_SERVER_URI", ""))


def _ldap_text(exc: Exception) -> str:
    """python-ldap's error as one line: its ``desc`` (and ``info``), not the dict it prints."""
    detail = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    text = str(detail.get("desc") or exc)
    return f"{text} ({detail['info']})" if detail.get("info") else text


__all__ = ["Command", "Exit"]
