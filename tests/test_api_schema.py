"""The committed OpenAPI schema is what the code generates, and the API survives fuzzing from it.

The fuzz run is schemathesis over the Django WSGI app in-process: every
operation of ``schema/openapi.yaml``, a bounded number of generated requests
each, signed in as an admin (who may call everything), asserting no 5xx.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import schemathesis
import yaml
from django.conf import settings
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error

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


# -- fuzzing ----------------------------------------------------------------------


def _app():
    """The project's WSGI app, without Django closing the test's connection between requests.

    Django's test client does the same: ``close_old_connections`` would close the
    connection that holds the test transaction.
    """
    from npuportal.wsgi import application

    return application


schema = schemathesis.openapi.from_dict(yaml.safe_load(SCHEMA_FILE.read_text()) if SCHEMA_FILE.exists() else {})
schema.app = _app()


@pytest.fixture
def fuzz_key(demo, user_factory, monkeypatch):
    from django.core import signals
    from django.db import close_old_connections
    from rest_framework.authtoken.models import Token
    from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

    from quotas import services

    monkeypatch.setattr(SimpleRateThrottle, "cache_format", f"throttle-{uuid.uuid4().hex}-%(scope)s-%(ident)s")
    services._cache.clear()
    monkeypatch.setitem(UserRateThrottle.THROTTLE_RATES, "user", "100000/min")
    monkeypatch.setitem(AnonRateThrottle.THROTTLE_RATES, "anon", "100000/min")
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    admin = user_factory("fuzzer", staff=True)
    user_factory("fuzz-member", team="training")
    yield Token.objects.create(user=admin).key
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)
    services._cache.clear()


@pytest.mark.slow
@schema.parametrize()
@hypothesis_settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_survives_fuzzing(case, fuzz_key) -> None:
    response = case.call(headers={"Authorization": f"Token {fuzz_key}"})
    case.validate_response(response, checks=[not_a_server_error])
