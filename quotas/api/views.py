"""Teams, policy versions and API tokens. Views check input and roles, then call the services."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from npuportal.api.error_handling import Conflict
from npuportal.api.errors import error_response, error_responses
from npuportal.api.parsers import FormatSuffixes
from npuportal.api.permissions import ADMIN, LEAD, IsAdmin, require_lead, visible_teams
from quotas.access.tokens import TokenLimitReached, issue_token, revoke_token
from quotas.accounting.statements import team_cost
from quotas.api.filtersets import PolicyFilterSet, TeamFilterSet
from quotas.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    MemberAddedSerializer,
    MemberAddSerializer,
    MemberChangedSerializer,
    MemberChangeSerializer,
    MemberSerializer,
    PolicyActivateSerializer,
    PolicyCreatedSerializer,
    PolicyCreateSerializer,
    PolicyDetailSerializer,
    PolicyDiffRequestSerializer,
    PolicyDiffSerializer,
    PolicyDryRunRequestSerializer,
    PolicyDryRunSerializer,
    PolicySerializer,
    PolicyTextSerializer,
    PolicyValidationSerializer,
    QuotaRequestCreateSerializer,
    QuotaRequestDecisionSerializer,
    QuotaRequestSerializer,
    TeamDetailSerializer,
    TeamPolicyChangedSerializer,
    TeamPolicyChangeSerializer,
    TeamSerializer,
    TeamUsageSerializer,
    json_safe,
)
from quotas.models import ApiToken, Membership, Policy, QuotaRequest, Team
from quotas.policies import requests as quota_requests
from quotas.policies.requests import RequestError, file_request, visible_requests
from quotas.policies.team_policy import NON_FIELD, TeamChangeError, change_team, team_overview
from quotas.policies.versions import ActivePolicy, activate_version, active_policy, cluster_facts, create_version
from quotas.tenancy.members import MemberError, add_member, remove_member, set_limits, set_role
from scheduling.engine.policy import (
    PolicyError,
    PolicyIssue,
    diff_policies,
    effective_quotas,
    load_policy,
    parse_policy,
    quota_at,
    semantic_diff,
)
from scheduling.services.usage import MONTH_PATTERN, UsageError, devices_in_use, team_usage

#: What ``a`` and ``b`` of a diff may name (as ``PolicyDiffRequestSerializer`` checks them).
VERSION_REF_PATTERN = r"^(v?\d{1,9}|active)$"
MONTH_PARAM = OpenApiParameter(
    "month", OpenApiTypes.STR, description="YYYY-MM on the policy's clock; default this month", pattern=MONTH_PATTERN
)


def _issues(issues: list[PolicyIssue]) -> list[dict[str, Any]]:
    return [{"path": i.path, "message": i.message, "severity": i.severity, "line": i.line} for i in issues]


def _invalid(issues: list[PolicyIssue]) -> Response:
    errors = [i for i in issues if i.severity == "error"]
    first = f"; first: {errors[0]}" if errors else ""
    return error_response(
        400, f"invalid policy ({len(errors)} error(s)){first}", field="yaml", details={"issues": _issues(issues)}
    )


def _check(text: str) -> tuple[Any, list[PolicyIssue]]:
    """Parse ``text`` against this cluster's chips and capacity: ``(policy or None, issues)``."""
    chips, capacity = cluster_facts()
    return load_policy(text, chip_models=chips or None, capacity=capacity if chips else None)


# -- teams --------------------------------------------------------------------


def team_quota(team: Team, active: ActivePolicy, now: Any) -> dict[str, Any]:
    result = effective_quotas(active.policy, now, [team.name])
    quota = result["teams"][team.name]  # type: ignore[index]
    return {
        "at": result["at"],
        "timezone": active.policy.timezone,
        "policy_version": active.version,
        **quota,
        "in_use": devices_in_use(team),
    }


def usage_body(team: Team, active: ActivePolicy, month: str | None, now: Any) -> dict[str, Any]:
    try:
        usage = team_usage(team, active.policy, month=month, now=now)
    except UsageError as exc:
        raise ValidationError({exc.field: [exc.message]}) from exc
    budget = quota_at(active.policy, team.name, now)[0].device_hours_per_month
    return {**usage.as_dict(), "device_hours_per_month": budget}


@extend_schema_view(
    list=extend_schema(summary="Your teams (admins: all)", responses={200: TeamSerializer, **error_responses(401)}),
)
class TeamViewSet(FormatSuffixes, viewsets.ReadOnlyModelViewSet):
    serializer_class = TeamSerializer
    filterset_class = TeamFilterSet
    lookup_field = "name"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"

    def get_queryset(self) -> QuerySet[Team]:
        if getattr(self, "swagger_fake_view", False):
            return Team.objects.none()
        user = self.request.user
        role = Membership.objects.filter(team=OuterRef("pk"), user=user).values("role")[:1]
        return visible_teams(user).annotate(member_role=Subquery(role)).order_by("name")

    def _role(self, team: Team) -> str | None:
        return ADMIN if self.request.user.is_staff else getattr(team, "member_role", None)

    @extend_schema(
        summary="A team: its quota now; usage and members for leads and admins",
        responses={200: TeamDetailSerializer, **error_responses(401, 404)},
    )
    def retrieve(self, request: Request, name: str | None = None) -> Response:
        team = self.get_object()
        active = active_policy()
        now = timezone.now()
        body: dict[str, Any] = dict(TeamSerializer(team, context={"request": request}).data)
        body["quota"] = team_quota(team, active, now)
        if self._role(team) in (ADMIN, LEAD):
            body["usage"] = usage_body(team, active, None, now)
            body["members"] = MemberSerializer(team.memberships.select_related("user"), many=True).data
        else:
            body["usage"] = None
            body["members"] = None
        return Response(body)

    @extend_schema(
        summary="Change the team's weight and base quota as a new active policy version (admins)",
        description=(
            "The active policy is changed for this team only and stored as a new version with the comment, "
            "like `POST /api/v1/policies/`: validated against the cluster, audited, in the history. "
            "Nothing is stored when any field is invalid."
        ),
        request=TeamPolicyChangeSerializer,
        responses={200: TeamPolicyChangedSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    def partial_update(self, request: Request, name: str | None = None) -> Response:
        team = self.get_object()
        if not request.user.is_staff:
            raise PermissionDenied("only admins may change a team's weight and quota")
        incoming = TeamPolicyChangeSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            result = change_team(
                team.name,
                shares=data.get("shares"),
                guaranteed=data.get("guaranteed"),
                maximum=data.get("max"),
                comment=data["comment"],
                author=request.user,
                base_version=data.get("base_version"),
            )
        except TeamChangeError as exc:
            if set(exc.errors) == {"base_version"}:  # someone activated another version meanwhile
                raise Conflict(_nested_errors(exc.errors)) from exc
            raise ValidationError(_nested_errors(exc.errors)) from exc
        row = team_overview([team.name])[0]
        return Response(
            {
                "team": team.name,
                "policy_version": result.record.version,
                "changes": result.changes,
                "warnings": result.warnings,
                "guaranteed": row.guaranteed,
                "max": row.max,
                "fair_share": {
                    "shares": row.shares,
                    "norm_shares": row.norm_shares,
                    "fair_share": row.fair_share,
                    "usage_hours": row.usage_hours,
                },
            }
        )

    @extend_schema(
        summary="The team's device-hours and cost in a month (leads and admins)",
        parameters=[MONTH_PARAM],
        responses={200: TeamUsageSerializer, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"], filterset_class=None, pagination_class=None)
    def usage(self, request: Request, name: str | None = None) -> Response:
        team = self.get_object()
        require_lead(request.user, team)
        month = request.query_params.get("month")
        if month == "":
            raise ValidationError({"month": ["must be a month like 2026-11 (leave it out for this month)"]})
        now = timezone.now()
        body = usage_body(team, active_policy(), month, now)
        body["cost"] = team_cost(team, body["month"], now=now).as_dict()
        return Response(body)

    @extend_schema(
        methods=["GET"],
        summary="The team's members, with their roles and limits (leads and admins)",
        responses={200: MemberSerializer(many=True), **error_responses(401, 403, 404)},
    )
    @extend_schema(
        methods=["POST"],
        summary="Add a member by username, or invite an e-mail address (leads and admins)",
        description=(
            "An address without an account is invited: they join at their first sign-in with it, or through "
            "the link in `detail` (valid 14 days; e-mailed where mail is set up). A team the policy runs from "
            "the directory refuses it (`team`): change its group there."
        ),
        request=MemberAddSerializer,
        responses={201: MemberAddedSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    @action(detail=True, methods=["get", "post"], filterset_class=None, pagination_class=None)
    def members(self, request: Request, name: str | None = None) -> Response:
        team = self.get_object()
        require_lead(request.user, team)
        if request.method == "GET":
            return Response(MemberSerializer(team.memberships.select_related("user").order_by("pk"), many=True).data)
        incoming = MemberAddSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        who = data["who"].strip()
        before = set(team.memberships.values_list("pk", flat=True))
        try:
            text = add_member(
                request.user,
                team,
                who,
                data["role"],
                link_for=lambda secret: request.build_absolute_uri(reverse("team-invitation", args=[secret])),
            )
        except MemberError as exc:
            raise _member_refusal(exc) from exc
        added = team.memberships.select_related("user").exclude(pk__in=before).first()
        body = {
            "detail": text,
            "member": MemberSerializer(added).data if added is not None else None,
            "invited": None if added is not None else who.lower(),
        }
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(
        methods=["PATCH"],
        summary="Change a member's role or limits (leads and admins)",
        description=(
            "Any of `role`, `max_devices`, `max_jobs`; a limit left out stays, null lifts it. The engine holds "
            "a job past a member's limits with `MemberLimit`. Roles are the directory's on a directory team; "
            "limits stay the lead's there."
        ),
        request=MemberChangeSerializer,
        responses={200: MemberChangedSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    @extend_schema(
        methods=["DELETE"],
        summary="Remove a member; their jobs and history stay the team's (leads and admins)",
        responses={200: MemberChangedSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    @action(
        detail=True,
        methods=["patch", "delete"],
        url_path=r"members/(?P<username>[^/]+)",
        filterset_class=None,
        pagination_class=None,
    )
    def member(self, request: Request, name: str | None = None, username: str | None = None) -> Response:
        team = self.get_object()
        require_lead(request.user, team)
        membership = team.memberships.select_related("user").filter(user__username=username).first()
        if membership is None:
            raise NotFound(f"{username} is not a member of {team.name}")
        try:
            if request.method == "DELETE":
                text = remove_member(request.user, team, membership.pk)
                return Response({"detail": text, "member": MemberSerializer(membership).data})
            incoming = MemberChangeSerializer(data=request.data)
            incoming.is_valid(raise_exception=True)
            data = incoming.validated_data
            texts = [] if data else [f"Nothing to change for {membership.user.get_username()}."]
            with transaction.atomic():  # both or neither
                if "role" in data:
                    texts.append(set_role(request.user, team, membership.pk, data["role"]))
                if "max_devices" in data or "max_jobs" in data:
                    texts.append(
                        set_limits(
                            request.user,
                            team,
                            membership.pk,
                            data.get("max_devices", membership.max_devices),  # null: no limit
                            data.get("max_jobs", membership.max_jobs),
                        )
                    )
        except MemberError as exc:
            raise _member_refusal(exc) from exc
        membership.refresh_from_db()
        return Response({"detail": " ".join(texts), "member": MemberSerializer(membership).data})


def _member_refusal(exc: MemberError) -> Exception:
    """404 for a member no longer in the team (removed by a request a moment before), 409 for a change
    the team's state refuses (its only lead, already in it, run by the directory), else 400."""
    if exc.gone:
        return NotFound("; ".join(exc.errors.values()))
    details = {key: [message] for key, message in exc.errors.items()}
    return Conflict(details) if exc.conflict else ValidationError(details)


def _nested_errors(errors: dict[str, str]) -> dict[str, Any]:
    """Service error keys as the request's own shape: ``max.devices/910B4`` → ``{"max": {"devices/910B4": [...]}}``.

    So the error body's ``field`` reads ``max.devices/910B4`` and ``details`` mirrors the request.
    """
    out: dict[str, Any] = {}
    for key, message in errors.items():
        if key == NON_FIELD:
            out.setdefault("non_field_errors", []).append(message)
        elif key.startswith(("guaranteed.", "max.")):
            kind, resource = key.split(".", 1)
            out.setdefault(kind, {})[resource] = [message]
        else:
            out[key] = [message]
    return out


# -- policies -----------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(
        summary="Policy versions, newest first", responses={200: PolicySerializer, **error_responses(401, 403)}
    ),
    retrieve=extend_schema(
        summary="One version with its YAML", responses={200: PolicyDetailSerializer, **error_responses(401, 403, 404)}
    ),
)
class PolicyViewSet(FormatSuffixes, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Versioned scheduling policy; admins only."""

    permission_classes = [IsAuthenticated, IsAdmin]
    queryset = Policy.objects.select_related("author").order_by("-version")
    filterset_class = PolicyFilterSet
    lookup_field = "version"
    lookup_value_regex = r"\d{1,9}"

    def get_serializer_class(self) -> type:
        return PolicyDetailSerializer if self.action == "retrieve" else PolicySerializer

    @extend_schema(
        summary="Store a new version and make it active",
        request=PolicyCreateSerializer,
        responses={201: PolicyCreatedSerializer, **error_responses(400, 401, 403)},
    )
    def create(self, request: Request) -> Response:
        incoming = PolicyCreateSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        text, comment = incoming.validated_data["yaml"], incoming.validated_data["comment"].strip()
        if not comment:
            raise ValidationError({"comment": ["say why you change the policy: the comment is kept in history"]})
        candidate, issues = _check(text)
        if candidate is None:
            return _invalid(issues)
        current = active_policy()
        changes = semantic_diff(current.policy, candidate) if current.record else ["first policy"]
        try:
            record = create_version(text, author=request.user, comment=comment)
        except PolicyError as exc:
            return _invalid(exc.issues)
        body = {**PolicyDetailSerializer(record).data, "changes": changes, "issues": _issues(issues)}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Make this version the active one (e.g. a rollback)",
        request=PolicyActivateSerializer,
        responses={200: PolicySerializer, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def activate(self, request: Request, version: str | None = None) -> Response:
        record = self.get_object()
        incoming = PolicyActivateSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        if not record.is_active:
            try:
                record = activate_version(
                    record.version, actor=request.user, comment=incoming.validated_data["comment"].strip()
                )
            except PolicyError as exc:
                return _invalid(exc.issues)
        return Response(PolicySerializer(record).data)

    @extend_schema(
        summary="Check a policy text against this cluster: every error and warning",
        request=PolicyTextSerializer,
        responses={200: PolicyValidationSerializer, **error_responses(400, 401, 403)},
    )
    @action(detail=False, methods=["post"], filterset_class=None)
    def validate(self, request: Request) -> Response:
        incoming = PolicyTextSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        candidate, issues = _check(incoming.validated_data["yaml"])
        return Response({"valid": candidate is not None, "issues": _issues(issues)})

    @extend_schema(
        summary="Replay recorded jobs under the active and the candidate policy; stores nothing",
        request=PolicyDryRunRequestSerializer,
        responses={200: PolicyDryRunSerializer, **error_responses(400, 401, 403)},
    )
    @action(detail=False, methods=["post"], url_path="dry-run", filterset_class=None)
    def dry_run(self, request: Request) -> Response:
        from quotas.policies.dryrun import dry_run

        incoming = PolicyDryRunRequestSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        candidate, issues = _check(incoming.validated_data["yaml"])
        if candidate is None:
            return _invalid(issues)
        current = active_policy()
        changes = semantic_diff(current.policy, candidate) if current.record else ["first policy"]
        try:
            result = dry_run(current.policy, candidate, days=incoming.validated_data["days"])
        except ValueError as exc:
            return error_response(400, f"dry run: {exc}")
        return Response(json_safe({"changes": changes, "issues": _issues(issues), **result}))

    @extend_schema(
        summary="What changed between two stored versions",
        parameters=[
            OpenApiParameter(
                "a",
                OpenApiTypes.STR,
                description="Old side: a version number or 'active'",
                required=True,
                pattern=VERSION_REF_PATTERN,
            ),
            OpenApiParameter(
                "b",
                OpenApiTypes.STR,
                description="New side: a version number or 'active'",
                required=True,
                pattern=VERSION_REF_PATTERN,
            ),
        ],
        responses={200: PolicyDiffSerializer, **error_responses(400, 401, 403, 404)},
        methods=["GET"],
    )
    @extend_schema(
        summary="What changed between two policies, each a stored version or a YAML text",
        request=PolicyDiffRequestSerializer,
        responses={200: PolicyDiffSerializer, **error_responses(400, 401, 403, 404)},
        methods=["POST"],
    )
    @action(detail=False, methods=["get", "post"], filterset_class=None, pagination_class=None)
    def diff(self, request: Request) -> Response:
        if request.method == "GET":
            data: Any = {k: request.query_params[k] for k in ("a", "b") if k in request.query_params}
        else:
            data = request.data
            if not isinstance(data, dict):
                raise ValidationError({"a": ["send a JSON object"]})
        incoming = PolicyDiffRequestSerializer(data=data)
        incoming.is_valid(raise_exception=True)
        sides = []
        for side in ("a", "b"):
            ref, text = incoming.validated_data.get(side), incoming.validated_data.get(f"{side}_yaml")
            if ref is not None:
                record = (
                    Policy.objects.filter(is_active=True).first()
                    if ref == "active"
                    else Policy.objects.filter(version=int(ref.lstrip("v"))).first()
                )
                if record is None:
                    raise NotFound({side: [f"no policy version {ref!r}"]})
                sides.append((record.yaml_text, f"v{record.version}", side))
            else:
                sides.append((text, f"{side}_yaml", f"{side}_yaml"))
        parsed = []
        for text, _label, field in sides:
            try:
                parsed.append(parse_policy(text))
            except PolicyError as exc:
                errors = [i for i in exc.issues if i.severity == "error"]
                return error_response(
                    400,
                    f"invalid policy ({len(errors)} error(s)); first: {errors[0] if errors else exc}",
                    field=field,
                    details={"issues": _issues(exc.issues)},
                )
        (a_text, a_name, _), (b_text, b_name, _) = sides
        return Response(
            {
                "a": a_name,
                "b": b_name,
                "changes": semantic_diff(parsed[0], parsed[1]),
                "diff": diff_policies(a_text, b_text, old_name=a_name, new_name=b_name),
            }
        )


# -- tokens -------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(
        summary="Your API tokens (never the keys)", responses={200: ApiTokenSerializer, **error_responses(401)}
    ),
    destroy=extend_schema(summary="Revoke one of your tokens", responses={204: None, **error_responses(401, 404)}),
)
class ApiTokenViewSet(FormatSuffixes, mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = ApiTokenSerializer
    lookup_value_regex = r"\d{1,18}"

    def get_queryset(self) -> QuerySet[ApiToken]:
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user).order_by("-created", "-id")

    @extend_schema(
        summary="Make a new token; its key is in this answer only",
        request=ApiTokenCreateSerializer,
        responses={201: ApiTokenCreatedSerializer, **error_responses(400, 401, 409)},
    )
    def create(self, request: Request) -> Response:
        incoming = ApiTokenCreateSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        try:
            token, key = issue_token(request.user, incoming.validated_data["name"])
        except TokenLimitReached as exc:
            raise Conflict({"name": [str(exc)]}) from exc
        return Response({**ApiTokenSerializer(token).data, "key": key}, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: ApiToken) -> None:
        revoke_token(instance)


def _request_errors(exc: RequestError) -> dict[str, list[str]]:
    return {field: [why] for field, why in exc.errors.items()}


class QuotaRequestViewSet(FormatSuffixes, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Quota change requests: leads file them for their teams, admins approve or refuse them."""

    serializer_class = QuotaRequestSerializer
    lookup_value_regex = r"\d{1,18}"

    def get_queryset(self) -> QuerySet[QuotaRequest]:
        if getattr(self, "swagger_fake_view", False):
            return QuotaRequest.objects.none()
        return visible_requests(self.request.user).order_by("-created", "-id")

    @extend_schema(
        summary="Ask for a change of a team's guaranteed or maximum cards for a period (team leads)",
        request=QuotaRequestCreateSerializer,
        responses={201: QuotaRequestSerializer, **error_responses(400, 401, 403)},
    )
    def create(self, request: Request) -> Response:
        incoming = QuotaRequestCreateSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            filed = file_request(
                request.user,
                data["team"],
                field=data["field"],
                resource=data["resource"],
                change=data["change"],
                first_day=data["first_day"],
                last_day=data["last_day"],
                justification=data["justification"],
            )
        except RequestError as exc:
            if "team" in exc.errors and "only the leads" in exc.errors["team"]:
                raise PermissionDenied(exc.errors["team"]) from exc
            raise ValidationError(_request_errors(exc)) from exc
        return Response(QuotaRequestSerializer(filed).data, status=status.HTTP_201_CREATED)

    def _decide(self, request: Request, pk: str | None, verdict: str) -> Response:
        if not request.user.is_staff:
            raise PermissionDenied("only admins decide on quota requests")
        found = self.get_object()
        incoming = QuotaRequestDecisionSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            if verdict == "approve":
                decided = quota_requests.approve(found.pk, request.user, note=data.get("note", ""))
            else:
                decided = quota_requests.refuse(found.pk, request.user, reason=data.get("reason", ""))
        except RequestError as exc:
            if "request" in exc.errors:
                raise Conflict(_request_errors(exc)) from exc
            raise ValidationError(_request_errors(exc)) from exc
        return Response(QuotaRequestSerializer(decided).data)

    @extend_schema(
        summary="Approve: a new active policy version with the change in force on the request's dates (admins)",
        request=QuotaRequestDecisionSerializer,
        responses={200: QuotaRequestSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, pk, "approve")

    @extend_schema(
        summary="Refuse with a reason the lead reads (admins)",
        request=QuotaRequestDecisionSerializer,
        responses={200: QuotaRequestSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"])
    def refuse(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, pk, "refuse")
