"""Console page of access: a user's own API tokens (the Tokens page, ``/tokens/``).

The page only gathers input; issuing and revoking are :mod:`quotas.access.tokens`, as for ``/api/v1/tokens/``.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from npuportal.confirmation import confirmation_page, confirmed
from quotas.access.tokens import TokenLimitReached, issue_token, revoke_token
from quotas.models import ApiToken

#: Session key holding a token's key between its creation and the page that shows it once.
NEW_TOKEN_KEY = "console.new_api_token"


def revoke_question(name: str) -> str:
    return f"Revoke the token {name!r}? Scripts and the CLI using it stop working at once."


@login_required
def api_tokens(request: HttpRequest) -> HttpResponse:
    """A user's own API tokens: make one (the key is shown once), revoke one.

    Both answer with a redirect, so reloading the page never makes a second token:
    a new key waits in the session for the next view of the page and is dropped there.
    """
    error = ""
    if request.method == "POST":
        if "revoke" in request.POST:
            token = ApiToken.objects.filter(user=request.user, pk=request.POST.get("revoke")).first()
            if token is None:
                error = "No such token of yours."
            elif not confirmed(request):
                return confirmation_page(
                    request, revoke_question(token.name), action="revoke it", back=reverse("console-api-tokens")
                )
            else:
                revoke_token(token)
                messages.success(request, f"Token {token.name!r} is revoked.")
                return redirect("console-api-tokens")
        else:
            name = request.POST.get("name", "").strip()
            if not name or len(name) > 100:
                error = "Name the token (1 to 100 characters), e.g. the laptop or script that will use it."
            else:
                try:
                    with transaction.atomic():
                        _, key = issue_token(request.user, name)
                except TokenLimitReached as exc:
                    error = str(exc)
                else:
                    request.session[NEW_TOKEN_KEY] = key
                    return redirect("console-api-tokens")
    new_key = request.session.pop(NEW_TOKEN_KEY, None) if request.method == "GET" else None
    tokens = ApiToken.objects.filter(user=request.user).order_by("-created")
    response = render(request, "quotas/api_tokens.html", {"tokens": tokens, "new_key": new_key, "error": error})
    if new_key:
        response["Cache-Control"] = "no-store"  # the key is on this page once: no copy in a cache
    return response
