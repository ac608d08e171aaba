"""/metrics is for Prometheus: a bearer token or an allowed client address, else 401/403 with a plain message.

It names teams and counts their jobs, so not everyone who can reach the web server may read it.
Defaults: the machine itself (127.0.0.1, ::1) may, without a token; nobody else.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "prometheus-0123456789abcdef"


def _networks(*items: str) -> list:
    return [ipaddress.ip_network(i, strict=False) for i in items]


def _get(remote: str, **headers: str):
    return Client().get("/metrics", REMOTE_ADDR=remote, **headers)


def _is_metrics(resp) -> bool:
    return resp.status_code == 200 and b"npuportal_jobs" in resp.content


def test_by_default_only_the_machine_itself_reads_it(settings) -> None:
    assert settings.METRICS_ALLOW == _networks("127.0.0.1", "::1") and settings.METRICS_TOKEN == ""
    assert _is_metrics(_get("127.0.0.1")) and _is_metrics(_get("::1")) and _is_metrics(_get("::ffff:127.0.0.1"))
    refused = _get("10.1.2.3")
    assert refused.status_code == 401 and refused["Content-Type"].startswith("text/plain")
    assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"npuportal_jobs" not in refused.content and b"NPUPORTAL_METRICS_TOKEN" in refused.content
    # No token is configured: no bearer token opens it, not even an empty one.
    assert _get("10.1.2.3", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    assert _get("10.1.2.3", HTTP_AUTHORIZATION="Bearer anything").status_code == 403


def test_a_bearer_token_opens_it_from_anywhere(settings) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW = []
    assert _is_metrics(_get("10.1.2.3", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"))
    assert _is_metrics(_get("10.1.2.3", HTTP_AUTHORIZATION=f"bearer   {TOKEN}"))
    wrong = _get("10.1.2.3", HTTP_AUTHORIZATION=f"Bearer {TOKEN[:-1]}x")
    assert wrong.status_code == 403 and wrong["Content-Type"].startswith("text/plain")
    assert b"npuportal_jobs" not in wrong.content and TOKEN.encode() not in wrong.content
    assert _get("10.1.2.3", HTTP_AUTHORIZATION=f"Token {TOKEN}").status_code == 401  # not a bearer token
    assert _get("10.1.2.3", HTTP_AUTHORIZATION="Bearer 令牌").status_code == 403
    assert _get("127.0.0.1").status_code == 401  # the allow-list is empty here


def test_allowed_networks_and_proxies(settings) -> None:
    settings.METRICS_ALLOW = _networks("10.1.0.0/16", "fd00::/8")
    assert _is_metrics(_get("10.1.2.3")) and _is_metrics(_get("fd00::9"))
    assert _get("10.2.0.1").status_code == 401 and _get("127.0.0.1").status_code == 401
    # Behind one trusted proxy the client is the address the proxy saw, not the proxy's own.
    settings.TRUSTED_PROXY_COUNT = 1
    assert _is_metrics(_get("192.0.2.7", HTTP_X_FORWARDED_FOR="10.1.9.9"))
    assert _get("10.1.2.3", HTTP_X_FORWARDED_FOR="203.0.113.5").status_code == 401


def _settings_in_child(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    code = "import npuportal.settings as s; print(s.METRICS_TOKEN or '-', ','.join(map(str, s.METRICS_ALLOW)) or '-')"
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("NPUPORTAL_METRICS_")}
    child_env = {**inherited, "NPUPORTAL_VAR_DIR": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_settings_come_from_the_environment_and_bad_values_stop_start_up(tmp_path) -> None:
    assert _settings_in_child(tmp_path).stdout.split() == ["-", "127.0.0.1/32,::1/128"]
    ok = _settings_in_child(tmp_path, NPUPORTAL_METRICS_TOKEN=f" {TOKEN}\n", NPUPORTAL_METRICS_ALLOW="10.0.0.0/8, ::1")
    assert ok.stdout.split() == [TOKEN, "10.0.0.0/8,::1/128"], ok.stderr
    assert _settings_in_child(tmp_path, NPUPORTAL_METRICS_ALLOW="").stdout.split() == ["-", "-"]
    for name, value, message in [
        ("NPUPORTAL_METRICS_ALLOW", "10.0.0.0/8,intranet", "NPUPORTAL_METRICS_ALLOW='10.0.0.0/8,intranet': 'intranet'"),
        ("NPUPORTAL_METRICS_TOKEN", "short", "NPUPORTAL_METRICS_TOKEN: expected at least 16 visible ASCII"),
        ("NPUPORTAL_METRICS_TOKEN", "令牌" * 10, "NPUPORTAL_METRICS_TOKEN: expected at least 16 visible ASCII"),
    ]:
        failed = _settings_in_child(tmp_path, **{name: value})
        assert failed.returncode != 0 and message in failed.stderr, (name, value, failed.stderr[-500:])
        assert value not in failed.stderr or name == "NPUPORTAL_METRICS_ALLOW"  # a token is never printed
