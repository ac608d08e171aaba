"""The committed OpenAPI schema is what the code generates, and the API answers what it says.

The fuzz run is schemathesis' CLI over real HTTP against pytest-django's live
server, with all of its checks, signed in as an admin (who may call
everything) and as a team lead; it prints the number of requests and failures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from django.conf import settings

SCHEMA_FILE = Path(settings.BASE_DIR) / "schema" / "openapi.yaml"


def generated_schema() -> str:
    """The schema as ``manage.py spectacular`` (``make schema``) writes it."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiYamlRenderer

    schema = SchemaGenerator().get_schema(request=None, public=True)
    return OpenApiYamlRenderer().render(schema, renderer_context={}).decode()


def test_committed_schema_matches_the_code() -> None:
    committed = SCHEMA_FILE.read_text() if SCHEMA_FILE.exists() else ""
    assert generated_schema() == committed, (
        "schema/openapi.yaml is out of date with the API code: run `make schema` and commit the result"
    )


def test_schema_is_valid_openapi() -> None:
    from drf_spectacular.validation import validate_schema

    validate_schema(yaml.safe_load(SCHEMA_FILE.read_text()))


def test_schema_is_served_and_documents_every_endpoint(client) -> None:
    resp = client.get("/api/schema/")
    assert resp.status_code == 200
    paths = yaml.safe_load(resp.content)["paths"]
    for path in (
        "/api/v1/jobs/{id}/resubmit/",
        "/api/v1/jobs/{id}/explain/",
        "/api/v1/teams/{name}/usage/",
        "/api/v1/nodes/{name}/drain/",
        "/api/v1/devices/",
        "/api/v1/policies/dry-run/",
        "/api/v1/policies/{version}/activate/",
        "/api/v1/tokens/{id}/",
    ):
        assert path in paths
    # Swagger UI and Redoc come from the project's own static files: the docs work with no internet.
    for docs in ("/api/docs/", "/api/redoc/"):
        page = client.get(docs)
        assert page.status_code == 200
        html = page.content.decode()
        assert "/static/drf_spectacular_sidecar/" in html, docs
        assert "cdn." not in html and "unpkg" not in html, docs


def test_schema_documents_the_errors_and_nulls_that_are_answered() -> None:
    schema = yaml.safe_load(SCHEMA_FILE.read_text())
    for name in ("Job", "JobDetail", "Allocation"):
        assert schema["components"]["schemas"][name]["properties"]["vnpu_template"]["nullable"] is True
    error = {"$ref": "#/components/schemas/Error"}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert {"401", "429"} <= set(responses), (method, path)
            if any(p["in"] == "query" for p in operation.get("parameters", [])) or "requestBody" in operation:
                assert responses["400"]["content"]["application/json"]["schema"] == error, (method, path)
            if "requestBody" in operation:
                assert {"413", "415"} <= set(responses) and set(operation["requestBody"]["content"]) == {
                    "application/json"
                }
    limit = next(p for p in schema["paths"]["/api/v1/teams/"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 1000}


# -- fuzzing ----------------------------------------------------------------------

#: Examples per operation in the fuzzing phase for each user (``NPUPORTAL_FUZZ_EXAMPLES`` raises it). The
#: coverage phase makes about 1,320 requests a user whatever this is; 25 bring each run to about 2,340.
FUZZ_EXAMPLES = int(os.environ.get("NPUPORTAL_FUZZ_EXAMPLES", "25"))
#: Fixed, so a failure is reproduced by running the test again (``NPUPORTAL_FUZZ_SEED`` changes it).
FUZZ_SEED = os.environ.get("NPUPORTAL_FUZZ_SEED", "20261201")
#: Requests each user must make (the admin and the lead alike), so neither run is silently thin.
MIN_REQUESTS = 2000

#: Operations that check input against the cluster's own data, beyond what a schema can say: a
#: well-formed request may still be bad input (400) there. ``positive_data_acceptance`` allows
#: 400 on these only; every other check, and every other operation, is held to the defaults.
CONTENT_CHECKED = {
    ("POST", "/api/v1/jobs/"): "a job must fit the cluster's chips and templates and the team's quota",
    ("GET", "/api/v1/jobs/"): "a cursor is opaque: only one taken from a next/previous link is a position",
    ("PATCH", "/api/v1/teams/{name}/"): "the change must leave a valid policy that differs from the active one",
    ("POST", "/api/v1/policies/"): "the text must be a valid policy for this cluster",
    ("POST", "/api/v1/policies/dry-run/"): "the text must be a valid policy for this cluster",
    ("POST", "/api/v1/policies/diff/"): "each text must parse as a policy",
}


#: Operations that call out to a node's agent: a well-formed address where no agent answers is a 502, as
#: documented. ``not_a_server_error`` and ``positive_data_acceptance`` allow that 502 on these only. They
#: come first and are named whole (``include-name``): schemathesis takes the first ``[[operations]]`` entry
#: that matches, and one entry's ``include-path`` and ``include-method`` match either way.
UPSTREAM = {
    "POST /api/v1/nodes/": "the portal asks the agent at agent_url for its devices before adding the node",
}


def _config_file(directory: Path) -> Path:
    lines = []
    for name, why in UPSTREAM.items():
        lines += [
            f"# {why}",
            "[[operations]]",
            f'include-name = "{name}"',
            'checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502"]',
            "checks.positive_data_acceptance.expected-statuses = "
            '["2xx", "400", "401", "403", "404", "409", "429", "502"]',
            "",
        ]
    for (method, path), why in CONTENT_CHECKED.items():
        lines += [
            f"# {why}",
            "[[operations]]",
            f'include-path = "{path}"',
            f'include-method = "{method}"',
            'checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]',
            "",
        ]
    path = directory / "schemathesis.toml"
    path.write_text("\n".join(lines))
    return path


def _fuzz(url: str, key: str, directory: Path) -> dict[str, object]:
    """schemathesis' CLI with every check against ``url`` as the token's user: requests, failures, checks run."""
    directory.mkdir()
    reports = directory / "reports"
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(_config_file(directory)),
        "run",
        str(SCHEMA_FILE),
        "--url",
        url,
        "--header",
        f"Authorization: Token {key}",
        "--checks",
        "all",
        "--max-examples",
        str(FUZZ_EXAMPLES),
        "--seed",
        FUZZ_SEED,
        "--workers",
        "1",
        "--report",
        "ndjson",
        "--report-dir",
        str(reports),
        "--no-color",
    ]
    started = time.monotonic()
    done = subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=1800, check=False)
    elapsed = time.monotonic() - started
    requests, failures, checks = 0, 0, set()
    for report in reports.glob("*.ndjson"):
        for line in report.read_text().splitlines():
            event = json.loads(line)
            finished = event.get("ScenarioFinished")
            if not finished:
                continue
            recorder = finished["recorder"]
            requests += len(recorder.get("interactions", {}))
            for results in recorder.get("checks", {}).values():
                for result in results:
                    checks.add(result["name"])
                    failures += result["status"] == "failure"
    return {
        "requests": requests,
        "failures": failures,
        "checks": checks,
        "code": done.returncode,
        "out": done.stdout,
        "seconds": elapsed,
    }


@pytest.fixture
def fuzz_users(live_server, demo, user_factory, monkeypatch):
    """Tokens of an admin and of a team lead, with throttling out of the way of a fast client."""
    from rest_framework.authtoken.models import Token
    from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

    from quotas.policies import versions

    monkeypatch.setattr(SimpleRateThrottle, "cache_format", f"throttle-{uuid.uuid4().hex}-%(scope)s-%(ident)s")
    monkeypatch.setitem(UserRateThrottle.THROTTLE_RATES, "user", "1000000/min")
    monkeypatch.setitem(AnonRateThrottle.THROTTLE_RATES, "anon", "1000000/min")
    versions._cache.clear()
    admin = user_factory("fuzz-admin", staff=True)
    lead = user_factory("fuzz-lead", team="training", role="lead")
    yield {"admin": Token.objects.create(user=admin).key, "lead": Token.objects.create(user=lead).key}
    versions._cache.clear()


@pytest.mark.slow
def test_api_conforms_to_its_schema_under_fuzzing(live_server, fuzz_users, tmp_path) -> None:
    """schemathesis with all its checks over real HTTP, as an admin and as a lead: no failure of any kind.

    The checks include no 5xx, status codes and content types the schema documents, bodies
    matching the response schemas, schema-violating input refused and schema-valid input
    taken. Writes (submit, cancel, cordon, new policies, token revocation) run too: the
    database is the test's own.
    """
    # The two users run at once (two CLI processes against the threaded live server): half the wall time.
    # Each is held to the bound on its own: one user's thin run is not made up by the other's.
    with ThreadPoolExecutor(max_workers=len(fuzz_users)) as pool:
        runs = {role: pool.submit(_fuzz, live_server.url, key, tmp_path / role) for role, key in fuzz_users.items()}
        results = {role: run.result() for role, run in runs.items()}
    for role, r in results.items():
        print(
            f"schemathesis as {role}: {r['requests']} requests, {r['failures']} failures, "
            f"{len(r['checks'])} checks, {r['seconds']:.0f} s"
        )
    for role, r in results.items():
        assert r["failures"] == 0 and r["code"] == 0, f"as {role}:\n{r['out'][-20000:]}"
        assert {"not_a_server_error", "status_code_conformance", "response_schema_conformance"} <= r["checks"]
        assert {"content_type_conformance", "negative_data_rejection", "positive_data_acceptance"} <= r["checks"]
        assert r["requests"] >= MIN_REQUESTS, f"as {role}: {r['requests']} requests, fewer than {MIN_REQUESTS}"
