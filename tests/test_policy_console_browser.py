"""The policy editor and the team's quota page, driven in a real chromium."""

from __future__ import annotations

import pytest

from quotas.models import AuditEvent, Policy
from tests.browser import login, page, requires_chromium  # noqa: F401 - page is a fixture

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_admin_sees_inline_errors_then_applies_and_restores(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("ops", staff=True)
    login(page, "ops", "pw-ops")
    page.get_by_role("link", name="Policy").click()
    editor = page.get_by_label("Policy YAML")
    original = editor.input_value()
    assert "kind: SchedulingPolicy" in original

    broken = original.replace("shares: 50", "shares: -5").replace("ratio: 0.25", "ratio: 2")
    editor.fill(broken)
    page.get_by_role("button", name="Validate").click()
    issues = page.locator("#issues")
    assert "spec.teams[1].shares" in issues.inner_text()
    assert "spec.reservations[0].ratio" in issues.inner_text()
    # Clicking an error's line link selects that line in the editor.
    page.locator(".goto-line").first.click()
    selected = page.evaluate(
        "() => { const t = document.getElementById('yaml_text');"
        " return t.value.slice(t.selectionStart, t.selectionEnd); }"
    )
    assert "ratio" in selected or "shares" in selected
    page.get_by_role("button", name="Apply").click()
    assert Policy.objects.count() == 1  # invalid text is never stored

    editor = page.get_by_label("Policy YAML")
    editor.fill(original.replace("shares: 20", "shares: 35"))
    page.get_by_role("button", name="Validate").click()
    assert "team research: shares 20 → 35" in page.locator("#changes").inner_text()
    page.get_by_label("Comment (required to apply)").fill("more weight for research")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url("**/policy/history/")
    assert "Policy v2 is active" in page.content()
    assert Policy.objects.get(is_active=True).version == 2

    page.once("dialog", lambda dialog: dialog.accept())  # "Restore policy v1? ..."
    page.get_by_role("button", name="Restore v1").click()
    page.wait_for_url("**/policy/history/")
    assert Policy.objects.get(is_active=True).version == 1
    assert AuditEvent.objects.filter(target="policy v1", actor__username="ops").exists()


def test_lead_sees_own_team_quota_and_week_heatmap_only(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("lena", team="inference", role="lead")
    login(page, "lena", "pw-lena")
    page.get_by_role("link", name="Quota").click()
    table = page.locator("#quota-now").inner_text()
    assert "inference" in table and "training" not in table and "research" not in table
    page.wait_for_selector("#heatmap-inference .main-svg")  # Plotly drew it from our own static files
    assert page.locator(".heatmap").count() == 1
    assert page.get_by_role("link", name="Policy").count() == 0
    resp = page.goto("/policy/")
    assert "login" in page.url or (resp is not None and resp.status in (302, 403))
