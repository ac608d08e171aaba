"""A small client of the npuportal REST API over urllib: JSON in, JSON out, errors as exceptions.

Every failure becomes one of three exceptions, each mapped to an exit code by
:mod:`npuctl.main`: :class:`Refused` (the API said no: 4xx), :class:`AuthFailed`
(401/403), :class:`Unreachable` (no answer, or a 5xx).
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
#: Pages of a list read at most, so a typo cannot make the CLI read forever.
MAX_PAGES = 50


class ApiError(Exception):
    """The API could not do what was asked; ``str()`` is the sentence to show."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Refused(ApiError):
    """A 4xx other than 401/403: bad input, not found, conflict."""


class AuthFailed(ApiError):
    """401 or 403: no token, a bad token, or a role that may not do this."""


class Unreachable(ApiError):
    """No connection, a timeout, a non-JSON answer, or a server error (5xx)."""


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = (url or os.environ.get("NPUPORTAL_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("NPUPORTAL_TOKEN", "")
        self.timeout = timeout
        #: Set by :meth:`get_all`: the list went on past ``MAX_PAGES`` pages (what was read is a prefix).
        self.truncated = False

    # -- plumbing --------------------------------------------------------------
    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        """The decoded JSON answer (``None`` for 204); raises an :class:`ApiError`."""
        url = path if path.startswith(("http://", "https://")) else f"{self.url}/api/v1/{path.lstrip('/')}"
        if params:
            query = urllib.parse.urlencode(
                [(k, v) for k, vs in params.items() if vs is not None for v in (vs if isinstance(vs, list) else [vs])]
            )
            if query:
                url += ("&" if "?" in url else "?") + query
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", "npuctl")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Token {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            status = exc.code
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                reason = f"no answer within {self.timeout:g} s (--timeout)"
            raise Unreachable(f"cannot reach {self.url}: {reason}") from exc
        except http.client.HTTPException as exc:  # not HTTP at all, or a connection cut mid-answer
            raise Unreachable(f"{self.url} did not answer as an HTTP server ({type(exc).__name__})") from exc
        return self._decode(status, raw)

    def _decode(self, status: int, raw: bytes) -> Any:
        payload: Any = None
        if raw:
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = None
                if status < 400:
                    raise Unreachable(f"{self.url} did not answer with JSON (is it an npuportal server?)") from None
        if status >= 500:
            raise Unreachable(f"server error {status} at {self.url}: {_sentence(payload) or 'see the server log'}")
        if status in (401, 403):
            message = _sentence(payload) or ("not signed in" if status == 401 else "not allowed")
            if status == 401 and not self.token:
                message += " (set NPUPORTAL_TOKEN to an API token)"
            raise AuthFailed(message, status, payload)
        if status >= 400:
            raise Refused(_sentence(payload) or f"HTTP {status}", status, payload)
        return payload

    # -- verbs -----------------------------------------------------------------
    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {})

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def get_all(self, path: str, **params: Any) -> list[Any]:
        """Every row of a paginated list, following ``next`` links (at most ``MAX_PAGES`` more pages).

        :attr:`truncated` says whether rows were left unread, so the caller can say so.
        """
        self.truncated = False
        page = self.get(path, **params)
        if isinstance(page, list):
            return page
        rows = list(page.get("results", []))
        for _ in range(MAX_PAGES):
            if not page.get("next"):
                break
            page = self.request("GET", page["next"])
            rows.extend(page.get("results", []))
        self.truncated = bool(page.get("next"))
        return rows


def _sentence(payload: Any) -> str:
    if isinstance(payload, dict):
        for key in ("error", "detail"):
            if isinstance(payload.get(key), str):
                return payload[key]
    return ""
