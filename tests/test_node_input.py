"""What a node's agent address and token may be: refused up front, naming the field, never a 500.

The token travels in an HTTP header (``Authorization: Bearer <token>``), which carries ASCII
only: ``令牌`` in it made ``requests`` raise ``UnicodeEncodeError`` mid-request, a 500. The
URL must be one the portal can call. Both are checked before any agent is asked, by the one
check the API, ``manage.py nodes add`` and the Django admin share.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from devices.models import Node
from devices.services.agent_client import AgentAddress, AgentClient, AgentError
from devices.services.registration import RegistrationError, validate

pytestmark = pytest.mark.django_db

GOOD_URL = "http://10.0.0.5:8471"
GOOD_TOKEN = "x" * 20


@pytest.mark.parametrize(
    ("agent_url", "token", "field", "says"),
    [
        (GOOD_URL, "令牌-of-the-agent", "token", "visible ASCII"),
        (GOOD_URL, "tok\x7fen-with-delete", "token", "visible ASCII"),
        (GOOD_URL, "tok\x00en", "token", "visible ASCII"),
        ("http://[::1", GOOD_TOKEN, "agent_url", "not an agent URL"),
        ("http://10.0.0.5:99999", GOOD_TOKEN, "agent_url", "port"),
        ("http://10.0.0.5:0", GOOD_TOKEN, "agent_url", "port"),
        ("http://令牌.example:8471", GOOD_TOKEN, "agent_url", "ASCII"),
        ("http://10.0.0.5:8471/\x01", GOOD_TOKEN, "agent_url", "ASCII"),
        ("http://10.0.0.5:8471/a b", GOOD_TOKEN, "agent_url", "ASCII"),
        ("http://user:pw@10.0.0.5:8471", GOOD_TOKEN, "agent_url", "user"),
        ("http://10.0.0.5:8471/?q=1", GOOD_TOKEN, "agent_url", "query"),
        ("ftp://10.0.0.5", GOOD_TOKEN, "agent_url", "not an agent URL"),
        ("https://" + "0" * 192, GOOD_TOKEN, "agent_url", "not a host name"),  # a label past 63 characters
        ("http://a..b:8471", GOOD_TOKEN, "agent_url", "not a host name"),
        ("http://a!b:8471", GOOD_TOKEN, "agent_url", "not a host name"),
    ],
)
def test_the_api_refuses_with_a_400_naming_the_field(demo, api, user_factory, agent_url, token, field, says) -> None:
    root = user_factory("root-n", staff=True)
    body = {"name": "n-new", "agent_url": agent_url, "token": token}
    resp = api(root).post("/api/v1/nodes/", body, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["field"] == field, resp.json()
    assert says in resp.json()["error"], resp.json()
    assert not Node.objects.filter(name="n-new").exists()


def test_the_command_refuses_a_token_file_that_is_not_ascii(demo, tmp_path) -> None:
    token_file = tmp_path / "agent.token"
    token_file.write_text("令牌令牌令牌\n", encoding="utf-8")
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as done:
        argv = ["add", "n-new", "--agent-url", GOOD_URL, "--token-file", str(token_file)]
        call_command("nodes", *argv, stdout=out, stderr=err)
    assert done.value.code == 1, (out.getvalue(), err.getvalue())
    assert "token" in err.getvalue() and "visible ASCII" in err.getvalue() and "Traceback" not in err.getvalue()
    assert not Node.objects.filter(name="n-new").exists()


def test_a_stored_address_no_request_can_go_to_is_an_agent_error_not_a_crash() -> None:
    # A node saved before these checks (or by hand in the database) is polled like any other.
    client = AgentClient(AgentAddress(0, "old", "https://" + "0" * 192, GOOD_TOKEN), timeout=2)
    with pytest.raises(AgentError, match="cannot be called"):
        client.devices()


def test_good_addresses_pass() -> None:
    for url in (
        "http://10.0.0.5:8471",
        "https://node-7.example.org",
        "http://[fd00::5]:8471/agent",
        "http://xn--3e0b.kr",
    ):
        validate("n1", url, "Abc-123_~.+/=")
    with pytest.raises(RegistrationError):
        validate("n1", GOOD_URL, "has space")
