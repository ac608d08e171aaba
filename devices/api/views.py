"""Nodes and devices: everyone signed in reads them; admins cordon, drain and uncordon."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Prefetch, QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from devices.api.filtersets import DeviceFilterSet, NodeFilterSet
from devices.api.serializers import DeviceSerializer, NodeDetailSerializer, NodeOperationSerializer, NodeSerializer
from devices.models import Device, Node
from devices.services import operations
from quotas.api.errors import error_responses
from quotas.api.permissions import IsAdmin
from scheduling.models import Allocation


def devices_with_busy() -> QuerySet[Device]:
    """Devices annotated with ``busy``: whether an allocation on them is open (one subquery, no N+1)."""
    open_allocation = Allocation.objects.filter(device=OuterRef("pk"), end__isnull=True)
    return Device.objects.annotate(busy=Exists(open_allocation)).order_by("index")


def nodes_with_devices() -> QuerySet[Node]:
    return Node.objects.prefetch_related(Prefetch("devices", queryset=devices_with_busy())).order_by("name")


_OPERATION = {
    "request": NodeOperationSerializer,
    "responses": {200: NodeDetailSerializer, **error_responses(400, 401, 403, 404)},
}


@extend_schema_view(
    list=extend_schema(summary="Nodes with device counts", responses={200: NodeSerializer, **error_responses(401)}),
    retrieve=extend_schema(
        summary="One node with its device grid", responses={200: NodeDetailSerializer, **error_responses(401, 404)}
    ),
)
class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    filterset_class = NodeFilterSet
    lookup_field = "name"
    lookup_value_regex = r"[-a-zA-Z0-9_.]+"

    def get_queryset(self) -> QuerySet[Node]:
        return nodes_with_devices()

    def get_serializer_class(self) -> type:
        return NodeSerializer if self.action == "list" else NodeDetailSerializer

    def get_permissions(self) -> list[object]:
        if self.action in ("cordon", "drain", "uncordon"):
            return [IsAuthenticated(), IsAdmin()]
        return [IsAuthenticated()]

    def _operate(self, request: Request, use_case: object) -> Response:
        node = self.get_object()
        incoming = NodeOperationSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        use_case(node.name, actor=request.user, reason=incoming.validated_data["reason"])  # type: ignore[operator]
        return Response(NodeDetailSerializer(self.get_object(), context={"request": request}).data)

    @extend_schema(summary="Cordon: no new work on the node; running work stays (admins)", **_OPERATION)
    @action(detail=True, methods=["post"], filterset_class=None)
    def cordon(self, request: Request, name: str | None = None) -> Response:
        return self._operate(request, operations.cordon_node)

    @extend_schema(summary="Drain: no new work; running work finishes there (admins)", **_OPERATION)
    @action(detail=True, methods=["post"], filterset_class=None)
    def drain(self, request: Request, name: str | None = None) -> Response:
        return self._operate(request, operations.drain_node)

    @extend_schema(summary="Uncordon: the node takes new work again (admins)", **_OPERATION)
    @action(detail=True, methods=["post"], filterset_class=None)
    def uncordon(self, request: Request, name: str | None = None) -> Response:
        return self._operate(request, operations.uncordon_node)


@extend_schema_view(
    list=extend_schema(
        summary="Devices; filter by chip_model, health, node", responses={200: DeviceSerializer, **error_responses(401)}
    ),
    retrieve=extend_schema(summary="One device", responses={200: DeviceSerializer, **error_responses(401, 404)}),
)
class DeviceViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = DeviceSerializer
    filterset_class = DeviceFilterSet
    lookup_value_regex = r"\d{1,18}"

    def get_queryset(self) -> QuerySet[Device]:
        return devices_with_busy().select_related("node").order_by("node__name", "index")
