"""Destructive console actions happen only when confirmed, with or without JavaScript.

Their forms carry ``data-confirm="..."``: ``static/js/confirm.js`` asks the question
and, on yes, sends ``confirm=yes`` with the form. A POST without it (JavaScript off,
or a hand-made request) acts on nothing: it answers a page asking the same question,
whose button sends the same fields again with ``confirm=yes``.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

#: Fields never copied onto the confirmation page's form: it has its own CSRF token and flag.
_NOT_CARRIED = {"csrfmiddlewaretoken", "confirm"}


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("confirm") == "yes"


def confirmation_page(request: HttpRequest, question: str, *, action: str, back: str) -> HttpResponse:
    """Ask ``question``; yes re-sends this POST's fields to its own path with ``confirm=yes``."""
    fields = [(key, value) for key in request.POST for value in request.POST.getlist(key) if key not in _NOT_CARRIED]
    return render(
        request,
        "confirm.html",
        {"question": question, "action": action, "fields": fields, "back": back, "target": request.path},
    )
