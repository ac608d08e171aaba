"""The client's address, as the sign-in locks and the API's throttles count it.

By default it is the connection's (``REMOTE_ADDR``): ``X-Forwarded-For`` is a header anybody
can write, so trusting it would let a guesser pick a fresh address per request. Behind reverse
proxies, ``NPUPORTAL_TRUSTED_PROXIES`` says how many; the client is then the address the outermost
of them saw, the entry that many places from the right of ``X-Forwarded-For`` (what each proxy
appends), the same rule as DRF's ``NUM_PROXIES``, which settings.py sets alike.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str | None:
    remote = request.META.get("REMOTE_ADDR") or None
    proxies = settings.TRUSTED_PROXY_COUNT
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    if not proxies or not hops:
        return remote
    candidate = hops[-min(proxies, len(hops))]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return remote  # not an address: more proxies configured than there are, or a forged header
