"""``manage.py policy``: validate, apply, export, history, diff, rollback, effective.

Exit codes are a contract with scripts: 0 ok, 1 invalid policy (or a refused
change), 2 usage error (bad arguments, unknown version, a file that cannot be
read or is not UTF-8, ``apply`` without ``--comment`` or an author); see
:mod:`npuportal.commandline` for those of every command (3 database, 78 settings).
"""

from __future__ import annotations

import getpass
import json
from datetime import datetime
from typing import Any

from django.core.management.base import CommandParser
from django.utils import timezone

from quotas.management.subcommands import Exit, SubcommandCommand, read_text_file
from quotas.models import Policy, Team
from quotas.policies.versions import activate_version, active_policy, cluster_facts, create_version
from scheduling.engine.policy import (
    Policy as ParsedPolicy,
)
from scheduling.engine.policy import (
    PolicyError,
    diff_policies,
    effective_quotas,
    load_policy,
    parse_policy,
    semantic_diff,
    zone,
)
from scheduling.engine.starvation import summary as starvation_summary

OK, INVALID, USAGE = 0, 1, 2


class Command(SubcommandCommand):
    help = "Scheduling policy as config: validate, apply (with --dry-run), export, history, diff, rollback, effective."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
        p = sub.add_parser("validate", help="check a policy file; every error and warning at once")
        p.add_argument("file")
        p.add_argument("--json", action="store_true")
        p = sub.add_parser("apply", help="store a policy file as a new version and activate it")
        p.add_argument("file")
        p.add_argument("--comment", "-m", default="", help="why (required unless --dry-run; kept in the history)")
        p.add_argument(
            "--author",
            default=None,
            help="the admin (portal username) recorded as the author; default: the portal user named as your login",
        )
        p.add_argument("--dry-run", action="store_true", help="simulate current vs candidate; store nothing")
        p.add_argument("--days", type=int, default=7, help="dry run: replay this many days of recorded jobs")
        p.add_argument("--trace", default=None, help="dry run: replay this trace CSV instead of recorded jobs")
        p.add_argument("--json", action="store_true")
        p = sub.add_parser("export", help="print the active (or a given) version's YAML as written")
        p.add_argument("--version", type=int, default=None)
        sub.add_parser("history", help="list versions")
        p = sub.add_parser("diff", help="what changed between two versions (numbers, 'active', or files)")
        p.add_argument("a")
        p.add_argument("b")
        p = sub.add_parser("rollback", help="make an earlier version the active one again")
        p.add_argument("version", type=int)
        p.add_argument("--author", default=None)
        p = sub.add_parser("effective", help="every team's quota in force at a moment")
        p.add_argument("file", nargs="?", default=None)
        p.add_argument("--at", default=None, help="ISO time, e.g. 2026-11-27T23:30 (policy timezone if naive)")
        p.add_argument("--json", action="store_true")

    # -- helpers -------------------------------------------------------------

    def _read(self, path: str) -> str:
        try:
            return read_text_file(path, "policy file")
        except ValueError as exc:
            raise self._fail(str(exc), USAGE) from exc

    def _version(self, number: int) -> Policy:
        record = Policy.objects.filter(version=number).first()
        if record is None:
            raise self._fail(f"no policy version {number} (see `policy history`)", USAGE)
        return record

    def _text_of(self, ref: str) -> tuple[str, str]:
        if ref == "active":
            record = Policy.objects.filter(is_active=True).first()
            if record is None:
                raise self._fail("no active policy", USAGE)
            return record.yaml_text, f"v{record.version}"
        if ref.lstrip("v").isdigit():
            record = self._version(int(ref.lstrip("v")))
            return record.yaml_text, f"v{record.version}"
        return self._read(ref), ref

    def _user(self, username: str | None) -> Any:
        if not username:
            return None
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise self._fail(f"--author: no user {username!r}", USAGE)
        return user

    def _comment(self, text: str) -> str:
        """The comment an applied version keeps, as the API and the console require it: not blank, 500 at most."""
        comment = (text or "").strip()
        if not comment:
            raise self._fail("--comment: say why you change the policy (it is kept in the history)", USAGE)
        limit = Policy._meta.get_field("comment").max_length
        if limit is not None and len(comment) > limit:
            raise self._fail(f"--comment: at most {limit} characters (this one has {len(comment)})", USAGE)
        return comment

    def _author(self, username: str | None) -> Any:
        """The admin recorded as the author: ``--author``, else the portal user named as the OS login.

        Every version has an author, as it does through the API and the console (the
        signed-in admin); an author who is not an admin there could not have applied it.
        """
        from django.contrib.auth import get_user_model

        users = get_user_model().objects
        if username:
            user = users.filter(username=username).first()
            if user is None:
                raise self._fail(f"--author: no portal user {username!r}", USAGE)
        else:
            try:
                login = getpass.getuser()
            except (OSError, KeyError):  # no login name (a container's user without a passwd entry)
                login = ""
            user = users.filter(username=login).first() if login else None
            if user is None:
                raise self._fail(
                    f"--author: name the admin applying this (no portal user is named {login!r}, your login)"
                    if login
                    else "--author: name the admin applying this (your login name is unknown)",
                    USAGE,
                )
        if not (user.is_active and user.is_staff):
            raise self._fail(f"--author: {user.username!r} is not an active admin (staff) of the portal", USAGE)
        return user

    def _report(self, issues: list[Any], as_json: bool) -> int:
        errors = [i for i in issues if i.severity == "error"]
        if as_json:
            self.stdout.write(
                json.dumps(
                    {
                        "valid": not errors,
                        "issues": [
                            {"path": i.path, "message": i.message, "severity": i.severity, "line": i.line}
                            for i in issues
                        ],
                    },
                    indent=2,
                )
            )
        else:
            for issue in issues:
                where = f" (line {issue.line})" if issue.line else ""
                self.stdout.write(f"{issue.severity}: {issue}{where}")
            if errors:
                self.stdout.write(f"invalid: {len(errors)} error(s), {len(issues) - len(errors)} warning(s)")
            else:
                self.stdout.write(f"valid ({len(issues)} warning(s))")
        return INVALID if errors else OK

    # -- actions -------------------------------------------------------------
    def do_validate(self, opts: dict[str, Any]) -> None:
        text = self._read(opts["file"])
        chips, capacity = cluster_facts()
        _, issues = load_policy(text, chip_models=chips or None, capacity=capacity if chips else None)
        raise Exit(self._report(issues, opts["json"]))

    def do_apply(self, opts: dict[str, Any]) -> None:
        text = self._read(opts["file"])
        if not opts["dry_run"]:  # checked before anything else: a refused apply stores nothing
            comment, author = self._comment(opts["comment"]), self._author(opts["author"])
        chips, capacity = cluster_facts()
        candidate, issues = load_policy(text, chip_models=chips or None, capacity=capacity if chips else None)
        if candidate is None:
            self._report(issues, opts["json"])
            raise Exit(INVALID)
        current = active_policy()
        changes = semantic_diff(current.policy, candidate) if current.record else ["first policy"]
        if opts["dry_run"]:
            from quotas.policies.dryrun import dry_run, format_comparison

            try:
                result = dry_run(current.policy, candidate, days=opts["days"], trace=opts["trace"])
            except ValueError as exc:
                raise self._fail(f"dry run: {exc}", USAGE) from exc
            if opts["json"]:
                self.stdout.write(json.dumps({"changes": changes, **result}, indent=2, default=str))
            else:
                self.stdout.write("changes:\n" + "\n".join(f"  {c}" for c in changes or ["(none)"]))
                self.stdout.write(format_comparison(result))
                self.stdout.write("dry run: nothing was stored")
            raise Exit(OK)
        try:
            record = create_version(text, author=author, comment=comment)
        except PolicyError as exc:
            self._report(exc.issues, opts["json"])
            raise Exit(INVALID) from exc
        for issue in issues:
            self.stdout.write(f"{issue.severity}: {issue}")
        self.stdout.write(f"applied as v{record.version} (active from the next tick)")
        for change in changes:
            self.stdout.write(f"  {change}")

    def do_export(self, opts: dict[str, Any]) -> None:
        if opts["version"] is not None:
            record = self._version(opts["version"])
        else:
            record = Policy.objects.filter(is_active=True).first()
            if record is None:
                raise self._fail("no active policy", USAGE)
        self.stdout.write(record.yaml_text, ending="" if record.yaml_text.endswith("\n") else "\n")

    def do_history(self, opts: dict[str, Any]) -> None:
        self.stdout.write(f"{'version':>7}  {'active':6}  {'created':16}  {'author':12}  comment")
        for p in Policy.objects.select_related("author").order_by("-version"):
            author = p.author.username if p.author else "-"
            created = timezone.localtime(p.created).strftime("%Y-%m-%d %H:%M")
            self.stdout.write(f"{p.version:>7}  {'*' if p.is_active else '':6}  {created:16}  {author:12}  {p.comment}")

    def do_diff(self, opts: dict[str, Any]) -> None:
        (a_text, a_name), (b_text, b_name) = self._text_of(opts["a"]), self._text_of(opts["b"])
        try:
            a, b = parse_policy(a_text), parse_policy(b_text)
        except PolicyError as exc:
            self.stderr.write(str(exc))
            raise Exit(INVALID) from exc
        lines = semantic_diff(a, b)
        self.stdout.write(f"{a_name} → {b_name}: " + (f"{len(lines)} change(s)" if lines else "no change in meaning"))
        for line in lines:
            self.stdout.write(f"  {line}")
        text = diff_policies(a_text, b_text, old_name=a_name, new_name=b_name)
        if text:
            self.stdout.write(text)

    def do_rollback(self, opts: dict[str, Any]) -> None:
        record = self._version(opts["version"])
        if record.is_active:
            self.stdout.write(f"v{record.version} is already active")
            raise Exit(OK)
        try:
            activate_version(record.version, actor=self._user(opts["author"]), comment="rollback")
        except PolicyError as exc:
            self._report(exc.issues, False)
            self.stderr.write(f"v{record.version} no longer validates; it stays inactive")
            raise Exit(INVALID) from exc
        self.stdout.write(f"v{record.version} is active again (from the next tick)")

    def do_effective(self, opts: dict[str, Any]) -> None:
        if opts["file"]:
            try:
                policy: ParsedPolicy = parse_policy(self._read(opts["file"]))
            except PolicyError as exc:
                self.stderr.write(str(exc))
                raise Exit(INVALID) from exc
        else:
            policy = active_policy().policy
        at = timezone.now()
        if opts["at"]:
            try:
                at = datetime.fromisoformat(opts["at"])
            except ValueError as exc:
                raise self._fail(f"--at: {opts['at']!r} is not an ISO date-time like 2026-11-27T23:30", USAGE) from exc
            if at.tzinfo is None:
                at = at.replace(tzinfo=zone(policy.timezone))
        teams = list(dict.fromkeys([*policy.teams, *Team.objects.values_list("name", flat=True)]))
        result = effective_quotas(policy, at, teams)
        result["starvation"] = starvation_summary(policy)
        if opts["json"]:
            self.stdout.write(json.dumps(result, indent=2))
            return
        self.stdout.write(f"quotas in force at {result['at']} ({policy.timezone})")
        self.stdout.write(_starvation_line(result["starvation"]))
        self.stdout.write(f"{'team':16} {'schedule':16} {'guaranteed':24} {'max':28} jobs  classes")
        for name, q in result["teams"].items():
            g = ", ".join(f"{k}={v}" for k, v in q["guaranteed"].items()) or "-"
            m = ", ".join(f"{k}={v}" for k, v in q["max"].items()) or "unlimited"
            classes = ",".join(q["allowedPriorityClasses"]) if q["allowedPriorityClasses"] else "all"
            jobs = q["maxConcurrentJobs"] if q["maxConcurrentJobs"] is not None else "-"
            self.stdout.write(f"{name:16} {q['schedule'] or '(base)':16} {g:24} {m:28} {jobs!s:5} {classes}")


def _starvation_line(guard: dict[str, Any]) -> str:
    """``policy effective``'s line for the starvation guard (spec.starvation, classes' starvationAfter)."""
    own = ", ".join(f"{name} after {after}" for name, after in guard["classes"].items())
    if guard["after"] is None and not own:
        return "starvation guard: off"
    text = f"starvation guard: jobs waiting more than {guard['after']} go first" if guard["after"] else ""
    if own:
        text = f"{text}; " if text else "starvation guard: "
        text += f"own thresholds: {own}"
    return text
