"""Every route of the REST API (``/api/v1/``): one router, and the clock (``npuportal.api_clock``).

Each app's viewsets are registered here, and the jobs routes of
``scheduling.api.urls`` are taken over as they are, so the API root lists every
endpoint and the OpenAPI schema is generated from one place.
"""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from devices.api.views import DeviceViewSet, NodeViewSet
from npuportal.api_clock import ClockView
from quotas.api.views import ApiTokenViewSet, PolicyViewSet, TeamViewSet
from scheduling.api.urls import router as scheduling_router

router = DefaultRouter()
for prefix, viewset, basename in scheduling_router.registry:
    router.register(prefix, viewset, basename=basename)
router.register("teams", TeamViewSet, basename="team")
router.register("nodes", NodeViewSet, basename="node")
router.register("devices", DeviceViewSet, basename="device")
router.register("policies", PolicyViewSet, basename="policy")
router.register("tokens", ApiTokenViewSet, basename="token")

# Unknown paths under the API answer 404 in the API's error shape: ``npuportal.api_errors.page_not_found``.
urlpatterns = [path("clock/", ClockView.as_view(), name="clock"), *router.urls]
