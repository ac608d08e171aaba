"""A real ``redis-server`` of the test's own, on a free port, that a test can stop and start again.

Fault tests need a Redis they may kill without touching the one the rest of the
suite (or anybody else on the machine) uses.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import redis

from tests.conftest import free_port
from tests.waiting import stop_process, wait_for

REDIS_SERVER = shutil.which("redis-server")
requires_redis_server = pytest.mark.skipif(REDIS_SERVER is None, reason="needs the redis-server program")


class RedisServer:
    """``redis-server`` without persistence: a restart starts empty, like a Redis that lost its memory."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.workdir)]
        log = (self.workdir / "redis.log").open("ab")
        self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=5, socket_timeout=5)

        def answers() -> bool:
            assert self._proc is not None
            assert self._proc.poll() is None, (self.workdir / "redis.log").read_text()[-2000:]
            return bool(client.ping())

        wait_for(answers, ignore=(redis.ConnectionError,), message=f"redis-server on port {self.port} to answer PING")

    def stop(self) -> None:
        if self._proc is None:
            return
        stop_process(self._proc)
        self._proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=1)
