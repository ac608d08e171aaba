"""API tokens: several named, revocable tokens per user, sent as ``Authorization: Token <key>``.

Keys (made by :mod:`quotas.access.tokens`) start with ``npu_`` and are stored only as a SHA-256 hash, so a
database dump does not hand out working keys. DRF's own one-per-user tokens
(``rest_framework.authtoken``) keep working through the same header, so older
scripts and the test suite's clients are not broken.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.request import Request

from npuportal import row_reads
from npuportal.api import token_throttle
from quotas.access.tokens import KEY_PREFIX, hash_key
from quotas.models import ApiToken

#: ``last_used`` is written at most this often per token, so reads do not all become writes.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiTokenAuthentication(TokenAuthentication):
    """``Token npu_…`` keys from :class:`ApiToken`; any other key is looked up as a DRF authtoken.

    Tokens that fail are counted per client address (:mod:`npuportal.api.token_throttle`): past the
    limit, the address gets 429 for any token until the period ends, so keys cannot be guessed.
    """

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, object] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None  # no token: session auth or anonymous, not ours to count
        wait = token_throttle.blocked_for(request)
        if wait is not None:
            raise exceptions.Throttled(
                wait=wait, detail="Too many requests with a token that does not authenticate from this address."
            )
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed:
            token_throttle.record_failure(request)
            raise

    def authenticate_credentials(self, key: str) -> tuple[AbstractBaseUser, object]:
        if not key.startswith(KEY_PREFIX):
            return super().authenticate_credentials(key)
        found = _token_and_user(hash_key(key))
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        token, user = found
        token.user = user
        if not user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        now = timezone.now()
        if token.last_used is None or now - token.last_used > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used=now)
            token.last_used = now
        return token.user, token


def _token_and_user(key_hash: str) -> tuple[ApiToken, Any] | None:
    """The token with this hash and its user, in one read.

    Every API request makes it, so the SQL is written out (``npuportal.row_reads``):
    the ORM's ``select_related(...).get(...)`` spends more CPU compiling than the lookup takes.
    """
    User = get_user_model()
    sql = (
        f"SELECT {row_reads.columns(ApiToken, 't')}, {row_reads.columns(User, 'u')} "
        f"FROM {row_reads.table(ApiToken)} t JOIN {row_reads.table(User)} u "
        f"ON u.{row_reads.column(User, User._meta.pk.name)} = t.{row_reads.column(ApiToken, 'user')} "
        f"WHERE t.{row_reads.column(ApiToken, 'key_hash')} = %s"
    )
    found = row_reads.first(sql, [key_hash], ApiToken, User)
    return (found[0], found[1]) if found else None
