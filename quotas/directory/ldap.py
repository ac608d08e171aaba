"""LDAP / Active Directory: settings from the environment, the sign-in backend, and the sync.

Off unless ``NPUPORTAL_LDAP_URL`` is set. Sign-in is ``django-auth-ldap``'s (a bind as the person, with
their password); what this module adds is that every sign-in, and ``manage.py directory sync``, puts
the person's groups through :func:`quotas.directory.apply.apply_directory`, so their teams and roles
are the directory's. Local accounts keep working beside it (the break-glass admin), and django-axes
counts a wrong directory password like any other failed sign-in.

The environment (docs: README "Sign-in with the site's directory"):

- ``NPUPORTAL_LDAP_URL``: ``ldap://host:389`` or ``ldaps://host:636``
- ``NPUPORTAL_LDAP_START_TLS``: ``1`` to upgrade an ``ldap://`` connection; ``NPUPORTAL_LDAP_CA_FILE``: the CA to trust
- ``NPUPORTAL_LDAP_BIND_DN`` / ``NPUPORTAL_LDAP_BIND_PASSWORD``: the service account that searches
  (empty: anonymous)
- ``NPUPORTAL_LDAP_USER_DN_TEMPLATE`` (``uid=%(user)s,ou=people,dc=example,dc=org``), or a search:
  ``NPUPORTAL_LDAP_USER_SEARCH_BASE`` with ``NPUPORTAL_LDAP_USER_FILTER`` (default ``(uid=%(user)s)``;
  Active Directory: ``(sAMAccountName=%(user)s)``)
- ``NPUPORTAL_LDAP_GROUP_SEARCH_BASE`` and ``NPUPORTAL_LDAP_GROUP_TYPE``: ``groupOfNames`` (default),
  ``groupOfUniqueNames``, ``posixGroup`` or ``activeDirectory`` (nested groups)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django_auth_ldap.backend import LDAPBackend

from quotas.directory.config import LdapConfigError

log = logging.getLogger(__name__)

BACKEND = "quotas.directory.ldap.DirectoryLDAPBackend"


def enabled() -> bool:
    return bool(getattr(settings, "AUTH_LDAP_SERVER_URI", ""))


class DirectoryLDAPBackend(LDAPBackend):  # type: ignore[misc]
    """django-auth-ldap's backend; each sign-in and population applies the person's groups."""

    def authenticate(self, request: Any, username: str | None = None, password: str | None = None, **kw: Any) -> Any:
        if not enabled():  # configured off: never try django-auth-ldap's default ldap://localhost
            return None
        return super().authenticate(request, username=username, password=password, **kw)

    #: What the last sign-in or population changed (the sync reports it).
    last_applied: Any = None

    def get_or_build_user(self, username: str, ldap_user: Any) -> tuple[AbstractUser, bool]:
        from quotas.directory.apply import DirectoryRefused, claim_check

        user, built = super().get_or_build_user(username, ldap_user)
        if not built:
            try:
                claim_check(user, "directory")
            except DirectoryRefused as exc:
                log.warning("LDAP sign-in refused: %s", exc)
                raise ldap_user.AuthenticationFailed(str(exc)) from exc
        return user, built

    def authenticate_ldap_user(self, ldap_user: Any, password: str) -> AbstractUser | None:
        user = super().authenticate_ldap_user(ldap_user, password)
        return self._applied(user, ldap_user, "LDAP sign-in")

    def populate_user(self, username: str) -> AbstractUser | None:
        from django_auth_ldap.backend import _LDAPUser

        ldap_user = _LDAPUser(self, username=username)
        user = ldap_user.populate_user()
        return self._applied(user, ldap_user, "directory sync")

    def _applied(self, user: AbstractUser | None, ldap_user: Any, via: str) -> AbstractUser | None:
        from quotas.directory.apply import apply_directory

        if user is None:
            return None
        from quotas.models import UserProfile

        profile = UserProfile.objects.filter(user=user).first()
        if not user.is_active and (profile is None or profile.directory_left is None):
            log.info("LDAP: %s is inactive by an admin's hand; not signed in", user.get_username())
            return None
        groups = set(ldap_user.group_dns) | set(ldap_user.group_names)
        self.last_applied = apply_directory(
            user, source="ldap", directory_id=str(ldap_user.dn or ""), groups=groups, via=via
        )
        user.refresh_from_db(fields=["is_active", "is_staff"])
        return user


#: Set on the request when the directory could not be asked (down, TLS refused): the sign-in page says
#: so instead of "wrong password".
DIRECTORY_ERROR_ATTR = "npuportal_directory_error"


def note_directory_error(sender: object, context: str, request: Any = None, exception: Any = None, **_: Any) -> None:
    """django-auth-ldap's ``ldap_error``: remember on the request that the directory did not answer."""
    if request is None or context != "authenticate":
        return
    detail = (
        exception.args[0] if exception is not None and exception.args and isinstance(exception.args[0], dict) else {}
    )
    setattr(request, DIRECTORY_ERROR_ATTR, str(detail.get("desc") or type(exception).__name__))


# -- directory sync --------------------------------------------------------------


@dataclass
class SyncReport:
    """What ``directory sync`` did: accounts looked at, changes made, accounts marked as gone."""

    checked: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    changed: dict[str, list[str]] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)


def _connection() -> Any:
    import ldap

    conn = ldap.initialize(settings.AUTH_LDAP_SERVER_URI)
    for option, value in settings.AUTH_LDAP_CONNECTION_OPTIONS.items():
        conn.set_option(option, value)
    if settings.AUTH_LDAP_START_TLS:
        conn.start_tls_s()
    conn.simple_bind_s(settings.AUTH_LDAP_BIND_DN, settings.AUTH_LDAP_BIND_PASSWORD)
    return conn


def _member_usernames(conn: Any, groups: list[str]) -> Iterator[str]:
    """The usernames of the members of the policy's groups (each given as a cn or a DN)."""
    import ldap
    from ldap.filter import escape_filter_chars

    group_type = settings.NPUPORTAL_LDAP_GROUP_TYPE
    name_attr = settings.NPUPORTAL_LDAP_USERNAME_ATTR
    search = settings.AUTH_LDAP_GROUP_SEARCH
    member_attr = {"groupOfUniqueNames": "uniqueMember", "posixGroup": "memberUid"}.get(group_type, "member")
    for group in groups:
        if "=" in group:
            found = conn.search_s(group, ldap.SCOPE_BASE, "(objectClass=*)", [member_attr])
        else:
            filt = f"(&{search.filterstr}(cn={escape_filter_chars(group)}))"
            found = conn.search_s(search.base_dn, ldap.SCOPE_SUBTREE, filt, [member_attr])
        for _dn, attrs in found:
            for raw in attrs.get(member_attr, []):
                value = raw.decode()
                if group_type == "posixGroup":
                    yield value
                    continue
                try:
                    entry = conn.search_s(value, ldap.SCOPE_BASE, "(objectClass=*)", [name_attr])
                except ldap.NO_SUCH_OBJECT:
                    continue  # a member DN the directory no longer has
                for _edn, eattrs in entry:
                    for name in eattrs.get(name_attr, [])[:1]:
                        yield name.decode()


def sync(*, dry_run: bool = False) -> SyncReport:
    """Bring every directory account, and every member of the policy's groups, in line with the directory.

    Members of the policy's groups who never signed in get their account (so a lead sees them);
    accounts the directory no longer has are marked inactive, keeping their jobs and history.
    """
    import ldap

    from quotas.directory.apply import mark_left
    from quotas.directory.groups import mapped_groups
    from quotas.models import UserProfile
    from quotas.policies.versions import active_policy

    report = SyncReport()
    backend = DirectoryLDAPBackend()
    users = get_user_model()
    conn = _connection()
    try:
        try:
            in_groups = set(_member_usernames(conn, mapped_groups(active_policy().policy)))
        except ldap.NO_SUCH_OBJECT as exc:
            raise LdapConfigError(f"a group the policy names is not in the directory: {exc}") from exc
    finally:
        conn.unbind_s()
    known = set(
        UserProfile.objects.filter(directory=UserProfile.Directory.LDAP).values_list("user__username", flat=True)
    )
    for username in sorted(in_groups | known):
        report.checked.append(username)
        existed = users.objects.filter(username__iexact=username).exists()
        if dry_run:
            continue
        backend.last_applied = None
        user = backend.populate_user(username)
        if user is None:
            gone = users.objects.filter(username__iexact=username).first()
            if gone is not None and username in known and mark_left(gone, via="directory sync"):
                report.left.append(username)
            continue
        if not existed:
            report.created.append(username)
        if backend.last_applied is not None and backend.last_applied.changes:
            report.changed[username] = backend.last_applied.changes
    return report
