"""Bounding token guessing: requests whose token fails are counted per client address.

Past ``API_BAD_TOKEN_RATE`` (``20/min``: 20 failures in a clock minute) every request with a
token from that address answers 429 until the period ends, the right token included; otherwise a
guesser would learn a key by the one answer that is not 429. Requests whose token is good are
never counted, and requests without a token are not touched here (DRF's anonymous throttle has them).

The counts live in the cache (Redis when ``REDIS_URL`` is set, so all workers share them). A cache
that fails must not lock everybody out of the API, so every cache call fails open: the request goes
on as if nothing were counted, and the failure is logged.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.request import Request

from npuportal.client_ip import client_address

logger = logging.getLogger(__name__)

#: Cache key of one address's count in one period; tests swap it for keys of their own.
KEY_FORMAT = "bad-token-%(ident)s-%(window)d"
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _rate() -> tuple[int, int]:
    """(failures allowed, period in seconds) from ``API_BAD_TOKEN_RATE``, checked in settings.py."""
    count, _, period = settings.API_BAD_TOKEN_RATE.partition("/")
    return int(count), _SECONDS[period[0]]


def _key(ident: str, now: float, period: int) -> tuple[str, float]:
    window = int(now // period)
    return KEY_FORMAT % {"ident": ident, "window": window}, (window + 1) * period - now


def blocked_for(request: Request) -> float | None:
    """Seconds until this address may try tokens again, or None when it may now."""
    limit, period = _rate()
    key, remaining = _key(client_address(request) or "unknown", time.time(), period)
    try:
        failures = cache.get(key, 0)
    except Exception:  # fail open, see the module docstring
        logger.warning("bad-token throttle: cache unavailable, not checked", exc_info=True)
        return None
    return remaining if failures >= limit else None


def record_failure(request: Request) -> None:
    """Count one request whose token did not authenticate."""
    _, period = _rate()
    key, _ = _key(client_address(request) or "unknown", time.time(), period)
    try:
        # add() starts the count at 1 only if absent; a count that exists is incremented (atomic on
        # Redis). Backends without a native incr re-store the value with the default timeout, so the
        # key is given its period again: it must outlive the window it counts.
        if not cache.add(key, 1, timeout=period + 1):
            try:
                cache.incr(key)
                cache.touch(key, timeout=period + 1)
            except ValueError:  # expired between add() and incr()
                cache.add(key, 1, timeout=period + 1)
    except Exception:  # fail open, see the module docstring
        logger.warning("bad-token throttle: cache unavailable, failure not counted", exc_info=True)
