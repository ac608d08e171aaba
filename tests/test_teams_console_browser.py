"""An admin changes a team's weight on the Teams page in a real chromium: bad values refused, a good one in effect."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from quotas.models import AuditEvent, Policy
from quotas.policies.versions import parsed
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_admin_changes_a_team_weight_invalid_then_valid(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("ops", staff=True)
    user_factory("tom", team="training", role="lead")
    login(page, "ops", "pw-ops")
    page.get_by_role("link", name="Teams").click()
    row = page.locator("#team-training")
    expect(row.locator(".shares")).to_have_text("50")
    norm_before = row.locator(".norm-shares").inner_text()
    factor_before = row.locator(".fair-share").inner_text()
    assert norm_before.startswith("0.5000")  # 50 of the department's 30 + 50 + 20
    snap(page, "teams before")

    page.get_by_role("link", name="Edit training").click()
    weight = page.get_by_label("Weight (shares)")
    comment = page.get_by_label("Comment (required)")
    save = page.get_by_role("button", name="Save as a new policy version")
    for bad, reason in (("-3", "must be a number >= 0, got -3"), ("abc", "must be a number >= 0, got 'abc'")):
        weight.fill(bad)
        comment.fill("trying a weight")
        save.click()
        error = page.locator("#shares-error")
        expect(error).to_contain_text("Weight (shares)")
        expect(error).to_contain_text(reason)
        expect(page.locator("#form-errors")).to_contain_text("Nothing was saved")
        assert Policy.objects.count() == 1 and Policy.objects.get(is_active=True).version == 1
    snap(page, "invalid weight refused")

    weight.fill("60")
    comment.fill("")
    save.click()
    expect(page.locator("#comment-error")).to_contain_text("kept in the policy history")
    assert Policy.objects.count() == 1

    page.get_by_label("Weight (shares)").fill("60")
    page.get_by_label("Comment (required)").fill("training's paper deadline")
    page.get_by_role("button", name="Save as a new policy version").click()
    page.wait_for_url("**/teams/")
    expect(page.get_by_role("status").first).to_contain_text("team training: shares 50 → 60")
    expect(page.get_by_role("status").first).to_contain_text("Policy v2 is active")
    row = page.locator("#team-training")
    expect(row.locator(".shares")).to_have_text("60")
    norm_after = row.locator(".norm-shares").inner_text()
    assert norm_after.startswith("0.5455") and norm_after != norm_before  # 60 / (30 + 60 + 20)
    assert row.locator(".fair-share").inner_text() != factor_before  # the demo's usage weighs less against 60
    snap(page, "teams after")

    active = Policy.objects.get(is_active=True)
    assert (active.version, active.comment, active.author.username) == (2, "training's paper deadline", "ops")
    assert parsed(active).teams["training"].shares == 60
    assert parsed(active).teams["inference"] == parsed(Policy.objects.get(version=1)).teams["inference"]
    assert AuditEvent.objects.filter(action="team.change", target="team training", actor__username="ops").exists()

    page.get_by_role("link", name="history").click()
    expect(page.locator("#history tbody tr").first).to_contain_text("training's paper deadline")

    # The team's lead sees the new weight and share on their quota page.
    page.get_by_role("button", name="Log out").click()
    login(page, "tom", "pw-tom")
    page.get_by_role("link", name="Quota").click()
    expect(page.locator("#fair-share-training .shares")).to_have_text("60")
    expect(page.locator("#fair-share-training .norm-shares")).to_contain_text("0.5455")
    assert page.locator("#fair-share tbody tr").count() == 1  # their team only
    assert page.get_by_role("link", name="Teams").count() == 0
    refused = page.goto("/teams/training/")
    assert refused is not None and refused.status == 403  # the console's 403 page, not a sign-in
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
