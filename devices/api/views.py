"""Nodes and devices: everyone signed in reads them; admins add, remove, cordon, drain and uncordon nodes."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Prefetch, QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from devices.api.filtersets import DeviceFilterSet, NodeFilterSet
from devices.api.serializers import (
    DeviceSerializer,
    NodeCreateSerializer,
    NodeDetailSerializer,
    NodeOperationSerializer,
    NodeSerializer,
)
from devices.models import Device, Node
from devices.services import operations, registration
from npuportal.api.errors import error_response, error_responses
from npuportal.api.parsers import FormatSuffixes
from npuportal.api.permissions import IsAdmin
from scheduling.models import Allocation


def devices_with_busy() -> QuerySet[Device]:
    """Devices annotated with ``busy``: whether an allocation on them is open (one subquery, no N+1)."""
    open_allocation = Allocation.objects.filter(device=OuterRef("pk"), end__isnull=True)
    return Device.objects.annotate(busy=Exists(open_allocation)).order_by("index")


def nodes_with_devices() -> QuerySet[Node]:
    return Node.objects.prefetch_related(Prefetch("devices", queryset=devices_with_busy())).order_by("name")


_OPERATION = {
    "request": NodeOperationSerializer,
    "responses": {200: NodeDetailSerializer, **error_responses(400, 401, 403, 404, 409)},
}


@extend_schema_view(
    list=extend_schema(summary="Nodes with device counts", responses={200: NodeSerializer, **error_responses(401)}),
    retrieve=extend_schema(
        summary="One node with its device grid", responses={200: NodeDetailSerializer, **error_responses(401, 404)}
    ),
)
class NodeViewSet(FormatSuffixes, viewsets.ReadOnlyModelViewSet):
    filterset_class = NodeFilterSet
    lookup_field = "name"
    lookup_value_regex = r"[-a-zA-Z0-9_.]+"

    def get_queryset(self) -> QuerySet[Node]:
        nodes = nodes_with_devices()
        if self.action == "list" and "removed" not in self.request.query_params:
            # The list is the inventory as it is; ``?removed=true`` lists the removed nodes, and a
            # removed node is still found by its name (its history points at it).
            nodes = nodes.filter(removed_at__isnull=True)
        return nodes

    def get_serializer_class(self) -> type:
        return NodeSerializer if self.action == "list" else NodeDetailSerializer

    def get_permissions(self) -> list[object]:
        if self.action in ("cordon", "drain", "uncordon", "create", "destroy"):
            return [IsAuthenticated(), IsAdmin()]
        return [IsAuthenticated()]

    @extend_schema(
        summary="Add a node: the portal asks its agent for the devices and registers them (admins)",
        request=NodeCreateSerializer,
        responses={201: NodeDetailSerializer, **error_responses(400, 401, 403, 409, 502)},
    )
    def create(self, request: Request) -> Response:
        incoming = NodeCreateSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            done = registration.register_node(data["name"], data["agent_url"], data["token"], actor=request.user)
        except registration.RegistrationError as exc:
            return _refusal(exc)
        node = nodes_with_devices().get(pk=done.node.pk)
        return Response(NodeDetailSerializer(node, context={"request": request}).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Remove a node from the inventory; its history stays (admins)",
        parameters=[
            OpenApiParameter(
                "drain",
                OpenApiTypes.BOOL,
                description="Jobs running: drain the node (202 with the node) instead of refusing; "
                "delete again once it is drained",
            ),
            OpenApiParameter("reason", OpenApiTypes.STR, description="Why (kept in the history)"),
        ],
        request=None,
        responses={204: None, 202: NodeDetailSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    def destroy(self, request: Request, name: str | None = None) -> Response:
        drain = request.query_params.get("drain", "false").strip().lower()
        if drain not in ("true", "false"):
            return error_response(400, "must be true or false", field="drain")
        reason = request.query_params.get("reason", "")
        if len(reason) > 200:
            return error_response(400, "at most 200 characters", field="reason")
        try:
            done = registration.remove_node(name or "", actor=request.user, drain=drain == "true", reason=reason)
        except registration.RegistrationError as exc:
            return _refusal(exc)
        if done.removed:
            return Response(status=status.HTTP_204_NO_CONTENT)
        node = nodes_with_devices().get(pk=done.node.pk)
        return Response(NodeDetailSerializer(node, context={"request": request}).data, status=status.HTTP_202_ACCEPTED)

    def _operate(self, request: Request, use_case: object) -> Response:
        node = self.get_object()
        incoming = NodeOperationSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        try:
            use_case(node.name, actor=request.user, reason=incoming.validated_data["reason"])  # type: ignore[operator]
        except operations.NodeRemoved as exc:  # read-only: it says when it was removed
            return error_response(409, str(exc), field="name")
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


#: HTTP status of each kind of :class:`registration.RegistrationError`.
_REFUSAL_STATUS = {"invalid": 400, "refused": 400, "duplicate": 409, "busy": 409, "unreachable": 502, "missing": 404}


def _refusal(exc: registration.RegistrationError) -> Response:
    return error_response(_REFUSAL_STATUS[exc.kind], str(exc), field=exc.field)


@extend_schema_view(
    list=extend_schema(
        summary="Devices; filter by chip_model, health, node", responses={200: DeviceSerializer, **error_responses(401)}
    ),
    retrieve=extend_schema(summary="One device", responses={200: DeviceSerializer, **error_responses(401, 404)}),
)
class DeviceViewSet(FormatSuffixes, viewsets.ReadOnlyModelViewSet):
    serializer_class = DeviceSerializer
    filterset_class = DeviceFilterSet
    lookup_value_regex = r"\d{1,18}"

    def get_queryset(self) -> QuerySet[Device]:
        devices = devices_with_busy().select_related("node").order_by("node__name", "index")
        # The list is the inventory; a removed node's card is still found by its id (its history points at it).
        return devices.filter(node__removed_at__isnull=True) if self.action == "list" else devices
