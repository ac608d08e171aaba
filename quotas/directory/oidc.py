"""OIDC single sign-on (Keycloak, Azure AD, Dex, ...): settings from the environment and the backend.

Off unless ``NPUPORTAL_OIDC_ISSUER`` is set. The code flow is ``mozilla-django-oidc``'s; this module
adds what a shared cluster needs on top of it:

- endpoints found from the issuer's discovery document (``/.well-known/openid-configuration``) on first
  use, so a site gives the issuer, not four URLs;
- an ID token without a ``kid`` is checked against the provider's only signing key of that algorithm
  (``kid`` is optional in JWS; some providers leave it out);
- the account is the one with this subject, or the username claim; a sign-in never takes over a local
  admin account of the same name (any subject an identity provider vouches for could otherwise be
  ``admin``);
- teams and roles come from the groups claim, through :func:`quotas.directory.apply.apply_directory`:
  a subject whose groups map to nothing signs in with no team and sees no jobs.

Environment: ``NPUPORTAL_OIDC_ISSUER``, ``NPUPORTAL_OIDC_CLIENT_ID``, ``NPUPORTAL_OIDC_CLIENT_SECRET``,
``NPUPORTAL_OIDC_SCOPES`` (default ``openid email profile``), ``NPUPORTAL_OIDC_GROUPS_CLAIM``
(``groups``), ``NPUPORTAL_OIDC_USERNAME_CLAIM`` (``preferred_username``, else the subject),
``NPUPORTAL_OIDC_NAME`` (the button says "Sign in with NAME"), ``NPUPORTAL_OIDC_SIGN_ALGO`` (``RS256``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

log = logging.getLogger(__name__)

BACKEND = "quotas.directory.oidc.DirectoryOIDCBackend"
#: Session key of the reason a single sign-on did not sign the person in; the login page shows it.
SSO_ERROR_KEY = "npuportal.sso_error"
_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
    "OIDC_OP_LOGOUT_ENDPOINT": "end_session_endpoint",
}


def enabled() -> bool:
    return bool(getattr(settings, "NPUPORTAL_OIDC_ISSUER", ""))


_discovered: dict[str, dict[str, Any]] = {}
_discovery_lock = threading.Lock()


def discovery(issuer: str) -> dict[str, Any]:
    """The issuer's discovery document, fetched once per process (an empty one if it cannot be read)."""
    with _discovery_lock:
        if issuer in _discovered:
            return _discovered[issuer]
    try:
        response = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=10)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        log.warning("OIDC: cannot read %s/.well-known/openid-configuration: %s", issuer, exc)
        return {}
    with _discovery_lock:
        _discovered[issuer] = document
    return document


def setting(attr: str, *args: Any) -> Any:
    """A mozilla-django-oidc setting; an endpoint not set explicitly comes from the issuer's discovery."""
    from mozilla_django_oidc.utils import import_from_settings

    if attr in _ENDPOINTS and not getattr(settings, attr, None):
        issuer = getattr(settings, "NPUPORTAL_OIDC_ISSUER", "")
        return discovery(issuer).get(_ENDPOINTS[attr], "") if issuer else ""
    return import_from_settings(attr, *args)


def _safe_username(value: str) -> str:
    """A Django username from a claim: its allowed characters (letters, digits, @.+-_), 150 at most."""
    return re.sub(r"[^\w.@+-]", "_", value)[:150]


class DirectoryOIDCRequestView(OIDCAuthenticationRequestView):
    """The redirect to the provider (its endpoint found from the issuer); 404 while single sign-on is off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if enabled():
            super().__init__(*args, **kwargs)
        else:
            View.__init__(self, *args, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404("single sign-on is not configured")
        if not self.OIDC_OP_AUTH_ENDPOINT:
            request.session[SSO_ERROR_KEY] = "the identity provider did not answer; try again, or use a local account"
            return redirect(f"{reverse('login')}?sso=failed")
        response: HttpResponse = super().get(request)
        return response

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        return setting(attr, *args)


class DirectoryOIDCCallbackView(OIDCAuthenticationCallbackView):
    """The provider's redirect back; 404 while single sign-on is off."""

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404("single sign-on is not configured")
        response: HttpResponse = super().get(request)
        return response


class DirectoryOIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's code flow; the account and its teams as the module docstring says."""

    #: The claims of the sign-in under way (set by :meth:`verify_claims`).
    _claims: dict[str, Any] = {}

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        return setting(attr, *args)

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        if not enabled():
            return None
        return super().authenticate(request, **kwargs)

    def retrieve_matching_jwk(self, token: str) -> Any:
        import jwt

        header = jwt.get_unverified_header(token)
        if header.get("kid"):
            return super().retrieve_matching_jwk(token)
        keys = requests.get(self.OIDC_OP_JWKS_ENDPOINT, timeout=10).json().get("keys", [])
        usable = [
            k for k in keys if k.get("alg", header.get("alg")) == header.get("alg") and k.get("use", "sig") == "sig"
        ]
        if len(usable) != 1:
            raise SuspiciousOperation("the ID token names no key and the provider has more than one")
        return jwt.PyJWK(usable[0])

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The userinfo claims over the ID token's: groups may come in either."""
        return {**payload, **super().get_userinfo(access_token, id_token, payload)}

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        """A subject is all a sign-in needs; what it may do comes from its groups. Kept for them."""
        self._claims = claims
        return bool(claims.get("sub"))

    def _username(self, claims: Mapping[str, Any]) -> str:
        claim = self.get_settings("NPUPORTAL_OIDC_USERNAME_CLAIM", "preferred_username")
        return _safe_username(str(claims.get(claim) or claims["sub"]))

    def filter_users_by_claims(self, claims: Mapping[str, Any]) -> Any:
        from quotas.directory.apply import DirectoryRefused, claim_check
        from quotas.models import UserProfile

        users = self.UserModel.objects
        by_subject = users.filter(profile__directory=UserProfile.Directory.OIDC, profile__directory_id=claims["sub"])
        if by_subject.exists():
            return by_subject
        same_name = users.filter(username__iexact=self._username(claims))
        for user in same_name:
            try:
                claim_check(user, "single sign-on")
            except DirectoryRefused as exc:
                self._refuse(str(exc))
                raise SuspiciousOperation(str(exc)) from exc
        return same_name

    def create_user(self, claims: Mapping[str, Any]) -> Any:
        return self.UserModel.objects.create_user(
            self._username(claims), email=str(claims.get("email") or ""), password=None
        )

    def update_user(self, user: Any, claims: Mapping[str, Any]) -> Any:
        return user

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        from quotas.directory.apply import apply_directory
        from quotas.models import UserProfile

        user = super().get_or_create_user(access_token, id_token, payload)
        if user is None:
            return None
        claims = self._claims
        profile = UserProfile.objects.filter(user=user).first()
        if not user.is_active and (profile is None or profile.directory_left is None):
            self._refuse(f"the account {user.get_username()!r} is inactive")
            return None
        raw = claims.get(self.get_settings("NPUPORTAL_OIDC_GROUPS_CLAIM", "groups")) or []
        groups = [raw] if isinstance(raw, str) else [str(g) for g in raw if isinstance(g, str | int)]
        apply_directory(user, source="oidc", directory_id=str(claims["sub"]), groups=groups, via="single sign-on")
        user.refresh_from_db(fields=["is_active", "is_staff"])
        return user

    def _refuse(self, reason: str) -> None:
        request = getattr(self, "request", None)
        if request is not None and hasattr(request, "session"):
            request.session[SSO_ERROR_KEY] = reason
