"""The Django admin never shows a node's agent token: write-only, replaced only when a new one is typed."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from devices.models import Node

pytestmark = pytest.mark.django_db

SECRET = "s3cret-agent-token-0123456789"


class _FormFields(HTMLParser):
    """The values a browser would send for the page's change form (inputs, selects, textareas)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio"):
                if "checked" in a:
                    self.values[name] = a.get("value", "on")
            else:
                self.values[name] = a.get("value", "")
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.values[self._select] = a.get("value", "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.values[self._textarea] += data.lstrip("\n")


def _form(page: str) -> dict[str, str]:
    parser = _FormFields()
    parser.feed(page)
    return parser.values


@pytest.fixture
def node() -> Node:
    return Node.objects.create(name="n-secret", agent_url="http://10.0.0.5:8471", agent_token=SECRET)


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password="pw", email="r@example.com"))
    return client


def _change(client: Client, node: Node, **fields: str):
    url = f"/admin/devices/node/{node.pk}/change/"
    data = _form(client.get(url).content.decode())
    data.update(fields)
    data["_save"] = "Save"
    return client.post(url, data)


def test_the_change_page_never_shows_the_token(admin_client, node) -> None:
    page = admin_client.get(f"/admin/devices/node/{node.pk}/change/").content.decode()
    assert SECRET not in page
    assert 'type="password"' in page and "write-only" in page
    assert _form(page)["agent_token"] == ""


def test_saving_without_a_token_keeps_it_and_a_new_one_replaces_it(admin_client, node) -> None:
    resp = _change(admin_client, node, agent_token="", state="cordoned")
    assert resp.status_code == 302, resp.content.decode()[:2000]
    node.refresh_from_db()
    assert node.agent_token == SECRET and node.state == "cordoned"
    resp = _change(admin_client, node, agent_token="  a-new-token-42  ")
    assert resp.status_code == 302
    node.refresh_from_db()
    assert node.agent_token == "a-new-token-42"
    history = admin_client.get(f"/admin/devices/node/{node.pk}/history/").content.decode()
    assert "a-new-token-42" not in history and SECRET not in history


def test_a_token_an_agent_cannot_be_sent_is_refused_and_changes_nothing(admin_client, node) -> None:
    resp = _change(admin_client, node, agent_token="令牌令牌", state="cordoned")
    assert resp.status_code == 200
    page = resp.content.decode()
    assert "visible ASCII" in page and SECRET not in page and "令牌令牌" not in page
    node.refresh_from_db()
    assert node.agent_token == SECRET and node.state == "ready"


def test_a_view_only_admin_does_not_see_it_either(node) -> None:
    viewer = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_node"))
    client = Client()
    client.force_login(viewer)
    page = client.get(f"/admin/devices/node/{node.pk}/change/")
    assert page.status_code == 200
    assert SECRET not in page.content.decode() and "write-only" in page.content.decode()
