"""Issuing and revoking API tokens: several named, revocable tokens per user.

A key is returned once, when its token is made, and stored only as a SHA-256 hash
(:func:`hash_key`), so a database dump does not hand out working keys; the API's
authentication (:mod:`npuportal.api.authentication`) looks tokens up by that hash.
The console's Tokens page and ``/api/v1/tokens/`` both come here.
"""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from quotas.models import ApiToken

KEY_PREFIX = "npu_"
#: A user may hold this many tokens; one more is refused (revoke an old one first).
MAX_TOKENS_PER_USER = 20


class TokenLimitReached(ValueError):
    pass


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@transaction.atomic
def issue_token(user: AbstractBaseUser, name: str) -> tuple[ApiToken, str]:
    """A new token for ``user`` and its key; the key is returned here once and never stored."""
    # Lock the user's row so two concurrent requests cannot both pass the limit.
    get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    if ApiToken.objects.filter(user=user).count() >= MAX_TOKENS_PER_USER:
        raise TokenLimitReached(f"you already have {MAX_TOKENS_PER_USER} tokens; revoke one first")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name.strip(), key_hash=hash_key(key), prefix=key[:12])
    return token, key


def revoke_token(token: ApiToken) -> None:
    token.delete()
