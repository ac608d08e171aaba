"""The agent's HTTP JSON API, on the standard library's threading HTTP server.

Nodes run only Python and the vendor tool, so no framework: routing is a short table, every answer is
JSON (errors included, so the portal never has to parse HTML), and every request is authenticated before
anything else happens, so a request with a wrong token can observe and change nothing.
"""

from __future__ import annotations

import hmac
import json
import socket
import socketserver
import sys
import time
import traceback
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from devices.agent import AGENT_VERSION
from devices.agent.backends import Backend
from devices.agent.errors import ApiError
from devices.agent.jobs import MAX_TAIL_LINES, JobManager, parse_grace, parse_stop_reason, parse_wait, utc_iso
from devices.agent.sim import SimBackend

#: Largest request body read. It holds the longest command the portal sends (NPUPORTAL_MAX_COMMAND_BYTES is
#: at most 131,071 bytes) even if JSON escaped every byte as six (``\u0001``), with room for the rest;
#: a longer body is refused with 413, which the portal takes as final (the job fails, no retry).
MAX_BODY_BYTES = 1024 * 1024
MAX_DRAIN_BYTES = 64 * MAX_BODY_BYTES  # beyond this a sender is hostile; let the reset happen


@dataclass
class AgentContext:
    """Everything a request handler needs; one per agent process."""

    node: str
    backend: Backend
    jobs: JobManager
    token: bytes


class AgentServer(ThreadingHTTPServer):
    """Threading server carrying the agent context; threads are daemons so shutdown never hangs on a client."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], context: AgentContext, family: socket.AddressFamily) -> None:
        self.address_family = family
        self.context = context
        super().__init__(address, AgentHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup of the host, which can stall startup for
        # seconds on a node with broken DNS; we never use the name.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class AgentHandler(BaseHTTPRequestHandler):
    """Routes ``/v1/...`` requests; see the package README for the API."""

    server: AgentServer
    server_version = f"npuportal-agent/{AGENT_VERSION}"
    sys_version = ""
    protocol_version = "HTTP/1.0"

    # -- plumbing ---------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def version_string(self) -> str:
        return self.server_version

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # The portal polls every node constantly: log what changes something or fails, not every poll.
        if self.command == "GET" and str(code).startswith("2"):
            return
        super().log_request(code, size)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"npuportal-agent: {self.address_string()} {format % args}\n")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors the base class raises itself (bad request line, unknown method) are JSON too."""
        self.close_connection = True
        data = json.dumps({"error": message or HTTPStatus(code).phrase}).encode()
        self.send_response(code, message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED):
            self.wfile.write(data)

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _read_body(self) -> bytes:
        """Read the whole body first, even for requests we refuse: closing a socket with unread data
        makes the kernel reset the connection, and the client would lose our error answer."""
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            return b""
        try:
            length = int(length_header)
        except ValueError:
            raise ApiError(400, "Content-Length is not a number", "body") from None
        if length < 0:
            raise ApiError(400, "Content-Length is negative", "body")
        if length > MAX_BODY_BYTES:
            remaining = min(length, MAX_DRAIN_BYTES)
            while remaining > 0:
                chunk = self.rfile.read(min(remaining, 65536))
                if not chunk:
                    break
                remaining -= len(chunk)
            raise ApiError(413, f"body larger than {MAX_BODY_BYTES} bytes", "body")
        return self.rfile.read(length)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, credential = header.strip().partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            return False
        return hmac.compare_digest(credential.strip().encode(), self.server.context.token)

    def _handle(self, method: str) -> None:
        try:
            body = self._read_body()
            if not self._authorized():
                self._send(
                    HTTPStatus.UNAUTHORIZED,
                    {"error": "missing or wrong token (send 'Authorization: Bearer <token>')"},
                    {"WWW-Authenticate": 'Bearer realm="npuportal-agent"'},
                )
                return
            status, payload = self._route(method, body)
            self._send(status, payload)
        except ApiError as exc:
            self._send(exc.status, exc.body(), exc.headers)
        except Exception as exc:  # answer in JSON and keep serving
            traceback.print_exc(file=sys.stderr)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    # -- routes -----------------------------------------------------------------------------------
    def _route(self, method: str, body: bytes) -> tuple[int, Any]:
        ctx = self.server.context
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)

        def allow(*methods: str) -> None:
            if method not in methods:
                allowed = ", ".join(methods)
                raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} not allowed here", headers={"Allow": allowed})

        if parts == ["v1", "health"]:
            allow("GET")
            return 200, {
                "ok": True,
                "node": ctx.node,
                "backend": ctx.backend.name,
                "jobs_running": ctx.jobs.running_count(),
                "agent_version": AGENT_VERSION,
            }
        if parts == ["v1", "devices"]:
            allow("GET")
            report = ctx.backend.collect(ctx.jobs.device_usage())
            return 200, {
                "node": ctx.node,
                "backend": ctx.backend.name,
                "devices": report.devices,
                "collected_at": utc_iso(time.time()),
                "error": report.error,
                **report.extra,
            }
        if parts == ["v1", "jobs"]:
            allow("GET", "POST")
            if method == "GET":
                return 200, {"node": ctx.node, "jobs": ctx.jobs.list_jobs()}
            return ctx.jobs.submit(_json(body))
        if len(parts) == 3 and parts[:2] == ["v1", "jobs"]:
            allow("GET", "DELETE")
            if method == "GET":
                return 200, ctx.jobs.get(parts[2])
            grace = parse_grace(query.get("grace", [None])[-1], ctx.jobs.default_grace_s)
            reason = parse_stop_reason(query.get("reason", [None])[-1])
            wait = parse_wait(query.get("wait", [None])[-1])
            return 200, ctx.jobs.stop(parts[2], grace, reason, wait)
        if len(parts) == 4 and parts[:2] == ["v1", "jobs"] and parts[3] == "log":
            allow("GET")
            offset = _query_int(query, "offset", maximum=2**62)
            tail = _query_int(query, "tail", maximum=MAX_TAIL_LINES)
            if offset is not None and tail is not None:
                raise ApiError(400, "give offset or tail, not both", "tail")
            return 200, ctx.jobs.log(parts[2], offset=offset, tail=tail)
        if parts == ["v1", "rendezvous"]:
            allow("POST")
            return 200, ctx.jobs.rendezvous.offer(_json(body), ctx.backend.known_indices())
        if parts == ["v1", "sim", "faults"] and isinstance(ctx.backend, SimBackend):
            allow("POST")
            return 200, ctx.backend.inject_fault(_json(body))
        raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {url.path}")


def _query_int(query: dict[str, list[str]], name: str, *, maximum: int) -> int | None:
    """A whole number 0..``maximum`` from the query string, or None when absent; a 400 naming it otherwise."""
    values = query.get(name)
    if not values:
        return None
    raw = values[-1]
    if not raw.isdigit() or int(raw) > maximum:
        raise ApiError(400, f"{name} must be a whole number from 0 to {maximum}, not {raw[:40]!r}", name)
    return int(raw)


def _json(body: bytes) -> Any:
    if not body.strip():
        raise ApiError(400, "request body must be JSON", "body")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", "body") from None
