"""HTTP client of the node agent API (``devices/agent``), with short timeouts.

Every call may fail: the caller decides what a failure means (a missed poll, a
launch to retry). Nothing here touches the database.
"""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings

from devices.models import Node


class AgentError(RuntimeError):
    pass


class AgentClient:
    def __init__(self, node: Node, timeout: float | None = None) -> None:
        self.base = node.agent_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {node.agent_token}"}
        self.timeout = timeout if timeout is not None else settings.AGENT_TIMEOUT_S

    def _call(self, method: str, path: str, json: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        try:
            resp = requests.request(method, self.base + path, json=json, headers=self.headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise AgentError(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
        if resp.status_code == 404 and method == "GET":
            return None
        if resp.status_code not in ok:
            raise AgentError(f"{method} {path}: HTTP {resp.status_code} {resp.text[:200]}")
        try:
            return resp.json()
        except ValueError as exc:
            raise AgentError(f"{method} {path}: not JSON") from exc

    def devices(self) -> dict[str, Any]:
        return self._call("GET", "/v1/devices")

    def jobs(self) -> list[dict[str, Any]]:
        body = self._call("GET", "/v1/jobs")
        if isinstance(body, dict):
            return list(body.get("jobs", []))
        return list(body or [])

    def job(self, job_id: int) -> dict[str, Any] | None:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def launch(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json=payload, ok=(200, 201))

    def stop(self, job_id: int, grace_s: float = 10) -> dict[str, Any] | None:
        return self._call("DELETE", f"/v1/jobs/{job_id}?grace={grace_s:g}", ok=(200, 202, 404))
