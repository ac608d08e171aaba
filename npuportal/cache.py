"""Django's Redis cache backend, with one Redis client per pool and a local stand-in while Redis is down.

Django's backend builds a new ``redis.Redis`` for every cache call, and each
build sets up its table of response callbacks (about 0.1 ms of CPU here). The
API's throttle reads and writes the cache on every request, so the client is
built once instead. redis-py clients are thread-safe, and Django keeps one
cache object per thread anyway.

The cache holds nothing that cannot be lost (throttle counters, the agent poll's
lock), yet every API request reads it: with Django's backend a stopped Redis
made every API call a 500. Here a call that finds Redis unreachable is served
by a per-process local memory cache instead, logged once per outage; Redis is
tried again after ``RETRY_AFTER_S`` (by one thread, the others stay local
meanwhile) and takes over again as soon as it answers. Short socket timeouts
keep a hung Redis from holding requests for the client's default 5 s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

#: What an unreachable (or hung) Redis raises; anything else is a real bug and still raises.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError)
#: Seconds the cache stays local after Redis failed before one call tries Redis again.
RETRY_AFTER_S = 3.0
#: Socket timeouts (s) of the cache's Redis connections unless OPTIONS set them: a cache call takes < 1 ms.
SOCKET_TIMEOUT_S = 0.5


class _ReusedClients(RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


class _LocalStandIn(LocMemCache):
    """Keys reach it already prefixed and versioned by the Redis backend: it adds nothing of its own.

    The timeouts it gets are Redis's (seconds, None for ever, 0 for gone), which it reads the same way.
    """

    def make_key(self, key: Any, version: int | None = None) -> Any:
        return key


class _Outage:
    """Whether the Redis at one address is taken to be down, shared by all threads of the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down = False
        self.retry_at = 0.0

    def use_redis(self) -> bool:
        """True when this call should try Redis: it is up, or the back-off is over (one caller probes)."""
        if not self.down:
            return True
        with self.lock:
            now = time.monotonic()
            if now < self.retry_at:
                return False
            self.retry_at = now + RETRY_AFTER_S  # the others stay local while this call probes
            return True

    def failed(self, location: str, exc: Exception) -> None:
        with self.lock:
            first = not self.down
            self.down = True
            self.retry_at = time.monotonic() + RETRY_AFTER_S
        if first:
            log.warning("cache unavailable (%s: %s), throttling per process until Redis answers", location, exc)

    def answered(self, location: str) -> bool:
        """Note that Redis answered; True for the call that ends an outage."""
        if not self.down:
            return False
        with self.lock:
            was_down, self.down = self.down, False
        if was_down:
            log.warning("cache at %s answers again: throttling shared through Redis", location)
        return was_down


_outages: dict[str, _Outage] = {}
_outages_lock = threading.Lock()


def _outage_of(location: str) -> _Outage:
    with _outages_lock:
        return _outages.setdefault(location, _Outage())


def _without_password(location: str) -> str:
    """``host:port/db`` of each server, for log lines: a REDIS_URL may carry a password."""
    shown = []
    for url in location.replace(";", ",").split(","):
        parts = urlsplit(url.strip())
        shown.append(f"{parts.hostname}:{parts.port or 6379}{parts.path}" if parts.hostname else parts.scheme)
    return ",".join(shown)


class RedisCache(DjangoRedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        options = dict(params.get("OPTIONS") or {})
        options.setdefault("socket_connect_timeout", SOCKET_TIMEOUT_S)
        options.setdefault("socket_timeout", SOCKET_TIMEOUT_S)
        super().__init__(server, {**params, "OPTIONS": options})
        self._class = _ReusedClients
        location = server if isinstance(server, str) else ",".join(server)
        self._location = _without_password(location)
        self._outage = _outage_of(location)
        # One store per process: LocMemCache shares its dict by name across threads.
        self._local = _LocalStandIn(
            f"npuportal-redis-standin:{location}",
            {"TIMEOUT": params.get("TIMEOUT", 300), "OPTIONS": {"MAX_ENTRIES": 100_000}},
        )

    @property
    def redis_down(self) -> bool:
        """Whether calls are being served locally because Redis did not answer."""
        return self._outage.down

    def _either(self, redis_call: Callable[[], Any], local_call: Callable[[], Any]) -> Any:
        if not self._outage.use_redis():
            return local_call()
        try:
            result = redis_call()
        except UNREACHABLE as exc:
            self._outage.failed(self._location, exc)
            return local_call()
        if self._outage.answered(self._location):
            self._local.clear()  # what was counted locally is over; the next outage starts afresh
        return result

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        seconds = self.get_backend_timeout(timeout)
        return self._either(lambda: self._cache.add(key, value, seconds), lambda: self._local.add(key, value, seconds))

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        key = self.make_and_validate_key(key, version=version)
        return self._either(lambda: self._cache.get(key, default), lambda: self._local.get(key, default))

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        key = self.make_and_validate_key(key, version=version)
        seconds = self.get_backend_timeout(timeout)
        self._either(lambda: self._cache.set(key, value, seconds), lambda: self._local.set(key, value, seconds))

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        seconds = self.get_backend_timeout(timeout)
        return self._either(lambda: self._cache.touch(key, seconds), lambda: self._local.touch(key, seconds))

    def delete(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return self._either(lambda: self._cache.delete(key), lambda: self._local.delete(key))

    def get_many(self, keys: Any, version: int | None = None) -> dict[Any, Any]:
        key_map = {self.make_and_validate_key(key, version=version): key for key in keys}
        found = self._either(lambda: self._cache.get_many(key_map.keys()), lambda: self._local.get_many(list(key_map)))
        return {key_map[k]: v for k, v in found.items()}

    def has_key(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return self._either(lambda: self._cache.has_key(key), lambda: self._local.has_key(key))

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        key = self.make_and_validate_key(key, version=version)
        return self._either(lambda: self._cache.incr(key, delta), lambda: self._local.incr(key, delta))

    def set_many(self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> list[Any]:
        if not data:
            return []
        safe = {self.make_and_validate_key(key, version=version): value for key, value in data.items()}
        seconds = self.get_backend_timeout(timeout)
        self._either(lambda: self._cache.set_many(safe, seconds), lambda: self._local.set_many(safe, seconds))
        return []

    def delete_many(self, keys: Any, version: int | None = None) -> None:
        if not keys:
            return
        safe = [self.make_and_validate_key(key, version=version) for key in keys]
        self._either(lambda: self._cache.delete_many(safe), lambda: self._local.delete_many(safe))

    def clear(self) -> bool:
        return self._either(self._cache.clear, self._local.clear)
