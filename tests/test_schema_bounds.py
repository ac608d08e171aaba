"""The OpenAPI schema states the bounds the server enforces: a client that keeps to it is never refused for them.

The job log's ``offset``, ``tail`` and ``attempt`` carry their minimum and maximum, and a node's
``agent_url`` and ``token`` their pattern; the server refuses one past each bound (400 naming it)
and takes the bound itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from devices.services.registration import agent_url_problem, token_problem
from scheduling.models import Job

SCHEMA = yaml.safe_load((Path(settings.BASE_DIR) / "schema" / "openapi.yaml").read_text())


def _log_parameters() -> dict[str, dict]:
    operation = SCHEMA["paths"]["/api/v1/jobs/{id}/log/"]["get"]
    return {p["name"]: p["schema"] for p in operation["parameters"] if p["in"] == "query"}


def test_the_log_parameters_state_their_bounds() -> None:
    found = _log_parameters()
    assert found["offset"] == {"type": "integer", "minimum": 0, "maximum": 2**62}
    assert found["tail"] == {"type": "integer", "minimum": 0, "maximum": 10000}
    assert found["attempt"] == {"type": "integer", "minimum": 1, "maximum": 10**6}


@pytest.mark.django_db
def test_the_server_enforces_exactly_those_bounds(demo, api, user_factory) -> None:
    job = Job.objects.order_by("pk").first()
    admin = api(user_factory("bounds-admin", staff=True))
    for name, bounds in _log_parameters().items():
        if "minimum" not in bounds:
            continue
        for outside in (bounds["minimum"] - 1, bounds["maximum"] + 1):
            resp = admin.get(f"/api/v1/jobs/{job.pk}/log/", {name: str(outside)})
            assert resp.status_code == 400 and resp.json()["field"] == name, (name, outside, resp.content)
            assert "must be a whole number from" in resp.json()["error"]
        for inside in (bounds["minimum"], bounds["maximum"]):  # within bounds (attempt 10⁶ is still no such run)
            resp = admin.get(f"/api/v1/jobs/{job.pk}/log/", {name: str(inside)})
            assert resp.status_code < 500 and "must be a whole number" not in resp.content.decode(), (name, inside)


def test_the_node_fields_state_their_patterns() -> None:
    fields = SCHEMA["components"]["schemas"]["NodeCreateRequest"]["properties"]
    url, token = fields["agent_url"]["pattern"], fields["token"]["pattern"]
    assert url == "^https?://[!-~]+$" and token == "^[!-~]{1,200}$"
    # What the pattern refuses, the server refuses; what it accepts the server may still refuse (a bad port).
    for value in ("http://令牌.example", "http://a b", "ftp://host", "10.0.0.5:8471", ""):
        assert not re.fullmatch(url.strip("^$"), value) and agent_url_problem(value), value
    for value in ("令牌", "with space", "", "x" * 201):
        assert not re.fullmatch(token.strip("^$"), value) and token_problem(value), value
    assert re.fullmatch(url.strip("^$"), "http://10.0.0.5:8471") and not agent_url_problem("http://10.0.0.5:8471")
