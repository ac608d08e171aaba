"""The Redis cache backend against a real redis-server that stops, hangs and comes back.

The cache only holds what may be lost (throttle counters, the poll lock), so
an unreachable Redis must turn into a per-process store, not into errors, and
Redis must take over again by itself.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npuportal import cache as cache_module
from npuportal.cache import RedisCache
from tests.redis_server import RedisServer, requires_redis_server

pytestmark = requires_redis_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path / "redis")
    s.start()
    yield s
    s.stop()


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.name == "npuportal.cache" and text in r.getMessage())


def test_a_stopped_redis_is_stood_in_for_locally_and_taken_back_when_it_answers(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cache_module, "RETRY_AFTER_S", 0.3)
    caplog.set_level(logging.WARNING, logger="npuportal.cache")
    one = RedisCache(server.url, {"KEY_PREFIX": "t"})
    one.set("a", 1, 60)
    assert server.client().get("t:1:a") == b"1"

    server.stop()
    started = time.monotonic()
    assert one.get("a") is None  # the local store starts empty
    assert one.add("lock", 1, 60) is True
    assert one.add("lock", 1, 60) is False
    one.set("n", 5, 60)
    assert one.incr("n") == 6
    assert one.get_many(["n", "lock", "missing"]) == {"n": 6, "lock": 1}
    assert one.delete("lock") is True and one.has_key("lock") is False
    one.set_many({"x": 1, "y": 2}, 60)
    one.delete_many(["x"])
    assert one.get("x") is None and one.get("y") == 2
    assert one.redis_down and time.monotonic() - started < 5.0  # no call waited for Redis
    # Another thread's cache object (Django keeps one per thread) shares the outage and the store.
    other = RedisCache(server.url, {"KEY_PREFIX": "t"})
    assert other.get("n") == 6
    time.sleep(0.4)  # past the back-off: one call tries Redis, finds it still down, stays local
    assert one.get("n") == 6
    assert _warnings(caplog, "cache unavailable") == 1
    assert "throttling per process until Redis answers" in caplog.text

    server.start()
    time.sleep(0.4)
    assert one.get("n") is None  # Redis again (it restarted empty), not the local store
    assert not one.redis_down
    one.set("b", 2, 60)
    assert server.client().get("t:1:b") == b"2"
    assert _warnings(caplog, "answers again") == 1

    server.stop()
    assert one.get("n") is None  # what was counted in the last outage was dropped on recovery
    assert _warnings(caplog, "cache unavailable") == 2


def test_a_hung_redis_costs_one_short_timeout_not_the_client_default(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that accepts connections but never answers (SIGSTOP) must not hold each call for 5 s."""
    caplog.set_level(logging.WARNING, logger="npuportal.cache")
    c = RedisCache(server.url, {})
    c.set("k", 1, 60)
    proc = server._proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert c.get("k") is None
        first = time.monotonic() - started
        started = time.monotonic()
        for _ in range(20):
            c.get("k")
        rest = time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGCONT)
    assert first < 4.0, first  # one short timeout (SOCKET_TIMEOUT_S), not the 5 s of the client's default
    assert rest < cache_module.SOCKET_TIMEOUT_S, rest  # local for the back-off: not one more timeout
    assert "Timeout" in caplog.text
