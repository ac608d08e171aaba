"""Every route of the REST API (``/api/v1/``): one router, and the clock (``npuportal.api.clock``).

Each app's viewsets are registered here, and the jobs routes of
``scheduling.api.urls`` are taken over as they are, so the API root lists every
endpoint and the OpenAPI schema is generated from one place.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.urls import path
from rest_framework.routers import DefaultRouter

from devices.api.views import DeviceViewSet, NodeViewSet
from npuportal.api.clock import ClockView
from npuportal.api.me import MeView
from npuportal.api.parsers import FormatSuffixes
from quotas.api.views import ApiTokenViewSet, PolicyViewSet, QuotaRequestViewSet, TeamViewSet
from scheduling.api.urls import router as scheduling_router


class Router(DefaultRouter):
    """DRF's router, taking only viewsets that accept its ``.json``/``.api`` paths on every route."""

    def register(self, prefix: str, viewset: Any, basename: str | None = None) -> None:
        if not issubclass(viewset, FormatSuffixes):
            raise ImproperlyConfigured(
                f"{viewset.__name__}: API viewsets derive from npuportal.api.parsers.FormatSuffixes, "
                f"or /api/v1/{prefix}/….json is a 500"
            )
        super().register(prefix, viewset, basename=basename)


router = Router()
for prefix, viewset, basename in scheduling_router.registry:
    router.register(prefix, viewset, basename=basename)
router.register("teams", TeamViewSet, basename="team")
router.register("nodes", NodeViewSet, basename="node")
router.register("devices", DeviceViewSet, basename="device")
router.register("policies", PolicyViewSet, basename="policy")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("quota-requests", QuotaRequestViewSet, basename="quota-request")

# Unknown paths under the API answer 404 in the API's error shape: ``npuportal.api.error_handling.page_not_found``.
urlpatterns = [
    path("clock/", ClockView.as_view(), name="clock"),
    path("me/", MeView.as_view(), name="me"),
    *router.urls,
]
