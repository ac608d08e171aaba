"""HTTP client of the node agent API (``devices/agent``), with short timeouts.

Every call may fail: the caller decides what a failure means (a missed poll, a
launch to retry). Nothing here touches the database, so calls can run in
threads while no transaction is open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests
from django.conf import settings

from devices.agent.jobs import MAX_STOP_REASON
from devices.models import Node

#: Request fields whose refusal depends only on what the portal sent (and, for ``user``, ``cwd`` and
#: ``output``, on the job's account on the node: no such account, a directory it may not enter),
#: never on the node's devices or state: the job fails at once with the agent's words.
_OWN_FIELDS = frozenset({"body", "job_id", "command", "env", "user", "team", "cwd", "output"})


class AgentError(RuntimeError):
    """A call that did not get the answer it needed.

    ``status`` is the HTTP status, if one came back; ``field`` the request field the agent
    named in its error answer, if it did.
    """

    def __init__(self, message: str, status: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field

    @property
    def never_succeeds(self) -> bool:
        """Whether sending the same request again can only get the same refusal.

        413 (too large) always; 400 when the agent names the body, the job id, the command
        or the environment: what the portal sent, not the node's devices or state, is at
        fault. Anything else (no answer, 409 busy devices, 5xx) may pass on a retry.
        """
        if self.status == 413:
            return True
        return self.status == 400 and self.field in _OWN_FIELDS


@dataclass(frozen=True)
class AgentAddress:
    """What a call needs to know about a node; a plain value, safe to hand to a thread."""

    node_id: int
    name: str
    url: str
    token: str

    @classmethod
    def of(cls, node: Node) -> AgentAddress:
        return cls(node.pk, node.name, node.agent_url, node.agent_token)


class AgentClient:
    def __init__(self, node: Node | AgentAddress, timeout: float | None = None) -> None:
        address = node if isinstance(node, AgentAddress) else AgentAddress.of(node)
        self.name = address.name
        self.base = address.url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {address.token}"}
        self.timeout = timeout if timeout is not None else settings.AGENT_TIMEOUT_S

    def _call(
        self, method: str, path: str, json: Any = None, ok: tuple[int, ...] = (200,), timeout: float | None = None
    ) -> Any:
        timeout = self.timeout if timeout is None else timeout
        try:
            resp = requests.request(method, self.base + path, json=json, headers=self.headers, timeout=timeout)
        except requests.Timeout as exc:
            raise AgentError(f"{method} {path}: no answer within {timeout:g} s") from exc
        except requests.RequestException as exc:
            raise AgentError(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
        except ValueError as exc:  # an address no request can go to (urllib3's LocationParseError, an idna error)
            raise AgentError(f"{method} {path}: the agent URL {self.base!r} cannot be called: {exc}") from exc
        if resp.status_code == 401:
            raise AgentError(
                f"{method} {path}: HTTP 401, the agent refused our token "
                "(the node's agent token does not match the agent's --token-file)",
                status=401,
            )
        if resp.status_code == 404 and method == "GET":
            return None
        if resp.status_code not in ok:
            raise AgentError(
                f"{method} {path}: HTTP {resp.status_code} {_error_text(resp)}",
                status=resp.status_code,
                field=_error_field(resp),
            )
        try:
            return resp.json()
        except ValueError as exc:
            raise AgentError(f"{method} {path}: answer is not JSON", status=resp.status_code) from exc

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def devices(self) -> dict[str, Any]:
        body = self._call("GET", "/v1/devices")
        if not isinstance(body, dict) or not isinstance(body.get("devices"), list):
            raise AgentError("GET /v1/devices: answer has no device list")
        return body

    def jobs(self) -> list[dict[str, Any]]:
        body = self._call("GET", "/v1/jobs")
        if isinstance(body, dict) and isinstance(body.get("jobs"), list):
            return [j for j in body["jobs"] if isinstance(j, dict)]
        raise AgentError("GET /v1/jobs: answer has no job list")

    def job(self, agent_job_id: str | int) -> dict[str, Any] | None:
        """One job record, or ``None`` when the agent does not know the id."""
        return self._call("GET", f"/v1/jobs/{quote(str(agent_job_id), safe='')}")

    def log(
        self, agent_job_id: str | int, *, offset: int | None = None, tail: int | None = None
    ) -> dict[str, Any] | None:
        """A range of one run's output (``GET /v1/jobs/<id>/log``), or ``None`` when the agent does not know it."""
        query = f"?tail={tail}" if tail is not None else f"?offset={offset or 0}"
        body = self._call("GET", f"/v1/jobs/{quote(str(agent_job_id), safe='')}/log{query}")
        if body is not None and not (isinstance(body, dict) and isinstance(body.get("data"), str)):
            raise AgentError("GET /v1/jobs/<id>/log: answer has no data")
        return body

    def launch(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Start a job; the agent answers 200 with the existing record when the id is known."""
        return self._call("POST", "/v1/jobs", json=payload, ok=(200, 201))

    def rendezvous(self, agent_job_id: str, devices: list[int], port: bool) -> dict[str, Any]:
        """This node's part of a multi-node job's rendezvous (``POST /v1/rendezvous``; see docs/agent.md).

        ``port``: reserve a free port for the job (asked of the first server only). The same run
        asking again gets the same port.
        """
        body = self._call("POST", "/v1/rendezvous", json={"job_id": agent_job_id, "devices": devices, "port": port})
        if not isinstance(body, dict) or not isinstance(body.get("devices"), list):
            raise AgentError("POST /v1/rendezvous: answer has no device list")
        if port and not (isinstance(body.get("port"), int) and not isinstance(body.get("port"), bool)):
            raise AgentError("POST /v1/rendezvous: answer has no port")
        return body

    def stop(
        self, agent_job_id: str | int, grace_s: float = 10, reason: str = "", wait_s: float = 0
    ) -> dict[str, Any] | None:
        """SIGTERM now, SIGKILL after ``grace_s``; a job the agent does not know is fine (404).

        ``reason`` (why the portal stops it) goes into the agent's record of the job.
        ``wait_s`` > 0 has the agent answer once the job has ended (or ``wait_s`` passed):
        the call then takes that much longer than the usual timeout at most.
        """
        query = f"grace={grace_s:g}"
        if wait_s > 0:
            query += f"&wait={wait_s:g}"
        # One printable line no longer than the agent accepts: a stop is never refused for its words.
        words = " ".join("".join(c if c.isprintable() else " " for c in reason).split())[:MAX_STOP_REASON]
        if words:
            query += f"&reason={quote(words, safe='')}"
        path = f"/v1/jobs/{quote(str(agent_job_id), safe='')}?{query}"
        return self._call("DELETE", path, ok=(200, 404), timeout=self.timeout + max(0.0, wait_s))

    def inject_fault(self, device: int, kind: str) -> dict[str, Any]:
        """Simulated backend only: ``ecc``, ``overheat``, ``lost`` or ``recover``."""
        return self._call("POST", "/v1/sim/faults", json={"device": device, "kind": kind})


def _error_text(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])[:300]
    return resp.text[:200]


def _error_field(resp: requests.Response) -> str | None:
    """The request field an agent's JSON error answer names (``{"error", "field"}``), if any."""
    try:
        body = resp.json()
    except ValueError:
        return None
    field = body.get("field") if isinstance(body, dict) else None
    return field if isinstance(field, str) else None
