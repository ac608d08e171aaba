"""The directory settings read from the environment, checked at start (imported by the settings module).

Nothing here imports Django's models, so ``npuportal/settings.py`` can use it; the backends that use
these settings are :mod:`quotas.directory.ldap` and :mod:`quotas.directory.oidc`, whose docstrings list
the variables.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

GROUP_TYPES = ("groupOfNames", "groupOfUniqueNames", "posixGroup", "activeDirectory")
_TRUE = {"1", "true", "yes", "on"}


class LdapConfigError(ValueError):
    """A directory setting in the environment that cannot work; names the variable."""


def ldap_settings(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """django-auth-ldap's settings from ``NPUPORTAL_LDAP_*``; empty when ``NPUPORTAL_LDAP_URL`` is unset.

    Raises :class:`LdapConfigError` naming the variable when the rest cannot work, so a site finds
    out at start, not at the first person's sign-in.
    """
    env = os.environ if env is None else env
    url = env.get("NPUPORTAL_LDAP_URL", "").strip()
    if not url:
        return {}
    import ldap
    from django_auth_ldap.config import (
        GroupOfNamesType,
        GroupOfUniqueNamesType,
        LDAPSearch,
        NestedActiveDirectoryGroupType,
        PosixGroupType,
    )

    if not re.match(r"^ldaps?://", url):
        raise LdapConfigError(f"NPUPORTAL_LDAP_URL: must start with ldap:// or ldaps://, got {url!r}")
    template = env.get("NPUPORTAL_LDAP_USER_DN_TEMPLATE", "").strip()
    search_base = env.get("NPUPORTAL_LDAP_USER_SEARCH_BASE", "").strip()
    if not template and not search_base:
        raise LdapConfigError(
            "NPUPORTAL_LDAP_USER_DN_TEMPLATE or NPUPORTAL_LDAP_USER_SEARCH_BASE: one is needed to find a person"
        )
    if template and "%(user)s" not in template:
        raise LdapConfigError("NPUPORTAL_LDAP_USER_DN_TEMPLATE: must contain %(user)s, e.g. uid=%(user)s,ou=people,...")
    group_base = env.get("NPUPORTAL_LDAP_GROUP_SEARCH_BASE", "").strip()
    if not group_base:
        raise LdapConfigError("NPUPORTAL_LDAP_GROUP_SEARCH_BASE: required; teams and roles come from groups")
    group_type = env.get("NPUPORTAL_LDAP_GROUP_TYPE", "groupOfNames").strip()
    if group_type not in GROUP_TYPES:
        raise LdapConfigError(f"NPUPORTAL_LDAP_GROUP_TYPE: one of {', '.join(GROUP_TYPES)}, got {group_type!r}")
    user_filter = env.get("NPUPORTAL_LDAP_USER_FILTER", "(uid=%(user)s)").strip()
    if search_base and "%(user)s" not in user_filter:
        raise LdapConfigError("NPUPORTAL_LDAP_USER_FILTER: must contain %(user)s, e.g. (uid=%(user)s)")

    object_class = {
        "groupOfNames": "groupOfNames",
        "groupOfUniqueNames": "groupOfUniqueNames",
        "posixGroup": "posixGroup",
        "activeDirectory": "group",
    }[group_type]
    types = {
        "groupOfNames": GroupOfNamesType,
        "groupOfUniqueNames": GroupOfUniqueNamesType,
        "posixGroup": PosixGroupType,
        "activeDirectory": NestedActiveDirectoryGroupType,
    }
    options: dict[Any, Any] = {ldap.OPT_REFERRALS: 0, ldap.OPT_NETWORK_TIMEOUT: 10}
    ca_file = env.get("NPUPORTAL_LDAP_CA_FILE", "").strip()
    if ca_file:
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
        options[ldap.OPT_X_TLS_NEWCTX] = 0
    out: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": url,
        "AUTH_LDAP_START_TLS": env.get("NPUPORTAL_LDAP_START_TLS", "").strip().lower() in _TRUE,
        "AUTH_LDAP_BIND_DN": env.get("NPUPORTAL_LDAP_BIND_DN", ""),
        "AUTH_LDAP_BIND_PASSWORD": env.get("NPUPORTAL_LDAP_BIND_PASSWORD", ""),
        "AUTH_LDAP_GROUP_SEARCH": LDAPSearch(group_base, ldap.SCOPE_SUBTREE, f"(objectClass={object_class})"),
        "AUTH_LDAP_GROUP_TYPE": types[group_type](name_attr="cn"),
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_CONNECTION_OPTIONS": options,
        "AUTH_LDAP_CACHE_TIMEOUT": 0,
        "NPUPORTAL_LDAP_GROUP_TYPE": group_type,
        "NPUPORTAL_LDAP_USERNAME_ATTR": env.get("NPUPORTAL_LDAP_USERNAME_ATTR", "").strip()
        or _filter_attr(user_filter if search_base else template),
    }
    if template:
        out["AUTH_LDAP_USER_DN_TEMPLATE"] = template
    else:
        out["AUTH_LDAP_USER_SEARCH"] = LDAPSearch(search_base, ldap.SCOPE_SUBTREE, user_filter)
    return out


def _filter_attr(text: str) -> str:
    """The attribute holding the username: ``uid`` of ``(uid=%(user)s)`` or of ``uid=%(user)s,ou=...``."""
    found = re.search(r"([A-Za-z][\w-]*)=%\(user\)s", text)
    return found.group(1) if found else "uid"


class OidcConfigError(ValueError):
    """An OIDC setting in the environment that cannot work; names the variable."""


def oidc_settings(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """mozilla-django-oidc's settings from ``NPUPORTAL_OIDC_*``; empty when no issuer is set."""
    env = os.environ if env is None else env
    issuer = env.get("NPUPORTAL_OIDC_ISSUER", "").strip().rstrip("/")
    if not issuer:
        return {}
    if not re.match(r"^https?://", issuer):
        raise OidcConfigError(f"NPUPORTAL_OIDC_ISSUER: must be an http(s) URL, got {issuer!r}")
    client_id = env.get("NPUPORTAL_OIDC_CLIENT_ID", "").strip()
    if not client_id:
        raise OidcConfigError("NPUPORTAL_OIDC_CLIENT_ID: required with NPUPORTAL_OIDC_ISSUER")
    return {
        "NPUPORTAL_OIDC_ISSUER": issuer,
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": env.get("NPUPORTAL_OIDC_CLIENT_SECRET", ""),
        "OIDC_RP_SCOPES": env.get("NPUPORTAL_OIDC_SCOPES", "openid email profile").strip(),
        "OIDC_RP_SIGN_ALGO": env.get("NPUPORTAL_OIDC_SIGN_ALGO", "RS256").strip(),
        "OIDC_TIMEOUT": 10,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "NPUPORTAL_OIDC_GROUPS_CLAIM": env.get("NPUPORTAL_OIDC_GROUPS_CLAIM", "groups").strip(),
        "NPUPORTAL_OIDC_USERNAME_CLAIM": env.get("NPUPORTAL_OIDC_USERNAME_CLAIM", "preferred_username").strip(),
        "NPUPORTAL_OIDC_NAME": env.get("NPUPORTAL_OIDC_NAME", "single sign-on").strip(),
        "LOGIN_REDIRECT_URL_FAILURE": "/login/?sso=failed",
    }
