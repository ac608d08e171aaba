"""Job endpoints. Views validate input and call the services; nothing else."""

from __future__ import annotations

from typing import Any

from django.db.models import (
    Aggregate,
    CharField,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Prefetch,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Substr
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied as DRFPermissionDenied
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from npuportal.api.error_handling import Conflict
from npuportal.api.errors import error_responses
from npuportal.api.pagination import KeysetPagination
from npuportal.api.parsers import FormatSuffixes
from quotas.api.serializers import json_safe
from scheduling.api.serializers import (
    COMMAND_HEAD,
    COMMAND_PREVIEW_CHARS,
    HELD_DEVICE_TIME,
    HELD_NODES,
    JobDetailSerializer,
    JobOutputSerializer,
    JobSerializer,
    JobSubmitSerializer,
    JobSummarySerializer,
    api_time,
    job_representation,
    job_summary_representation,
)
from scheduling.filters import JOB_ORDERING, JobFilterSet, visible_jobs
from scheduling.models import Allocation, Job, JobEvent
from scheduling.services import jobs as job_service
from scheduling.services import output as output_service


def list_columns(qs: QuerySet[Job]) -> QuerySet[Job]:
    """Jobs as lists show them: every column but the command, of which only its start is read.

    A command may be tens of KiB; a page of them would be read, held and sent whole for a
    preview of one line. The page's rows stay the same rows in the same order. Each row also
    carries, from its allocations, the nodes it holds now and its device time so far (two
    correlated subqueries on the allocation's job index, evaluated for the page's rows only),
    so ``npuctl queue`` and ``npuctl history`` need no query per job.
    """
    held = Allocation.objects.filter(job=OuterRef("pk")).order_by().values("job")
    now = Value(timezone.now(), output_field=DateTimeField())
    device_time = ExpressionWrapper(
        (Coalesce(F("end"), now, output_field=DateTimeField()) - F("start")) * F("device_share"),
        output_field=DurationField(),
    )
    return qs.defer("command", "env").annotate(
        **{
            COMMAND_HEAD: Substr("command", 1, COMMAND_PREVIEW_CHARS + 1),
            HELD_NODES: Subquery(
                held.filter(end__isnull=True).annotate(names=NodeNames("device__node__name")).values("names")[:1],
                output_field=CharField(),
            ),
            HELD_DEVICE_TIME: Subquery(
                held.annotate(total=Sum(device_time)).values("total")[:1], output_field=DurationField()
            ),
        }
    )


class NodeNames(Aggregate):
    """The distinct node names of a group of rows, joined by commas (order left to the reader)."""

    function = "GROUP_CONCAT"
    template = "%(function)s(DISTINCT %(expressions)s)"
    output_field = CharField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, function="STRING_AGG", template="%(function)s(DISTINCT %(expressions)s, ',')"
        )


#: The job log's query numbers (least, most): :func:`_whole` enforces them and the schema states them.
LOG_OFFSET = (0, 2**62)
LOG_TAIL = (0, output_service.MAX_TAIL_LINES)
LOG_ATTEMPT = (1, 10**6)


def _bounded(name: str, bounds: tuple[int, int], description: str) -> OpenApiParameter:
    """A whole-number query parameter whose schema carries the bounds the view enforces."""
    return OpenApiParameter(
        name, {"type": "integer", "minimum": bounds[0], "maximum": bounds[1]}, description=description
    )


class JobPagination(KeysetPagination):
    """Jobs newest first, on the (team, state,) submitted_at, id indexes; no COUNT at any size."""

    ordering = JOB_ORDERING


@extend_schema_view(
    list=extend_schema(
        summary="Your teams' jobs (admins: all); each with the start of its command (the job has all of it)",
        responses={200: JobSummarySerializer, **error_responses(400, 401)},
    ),
    retrieve=extend_schema(
        summary="One job with its allocations and events",
        responses={200: JobDetailSerializer, **error_responses(401, 404)},
    ),
)
class JobViewSet(FormatSuffixes, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = JobSerializer
    filterset_class = JobFilterSet
    pagination_class = JobPagination
    lookup_value_regex = r"\d{1,18}"

    def get_queryset(self) -> QuerySet[Job]:
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        qs = visible_jobs(self.request.user).order_by(*JOB_ORDERING)
        if self.action == "retrieve":
            events = Prefetch("events", queryset=JobEvent.objects.select_related("other_job__team"))
            qs = qs.select_related("submitter__profile").prefetch_related(
                "allocations__device__node", "allocations__vnpu_template", events
            )
        elif self.action == "list":
            qs = list_columns(qs)
        return qs

    def get_serializer_class(self) -> type:
        if self.action == "retrieve":
            return JobDetailSerializer
        if self.action == "create":
            return JobSubmitSerializer
        if self.action == "list":
            return JobSummarySerializer
        return JobSerializer

    @extend_schema(
        summary="Submit one job, or a job array with array: N (then the answer is a list)",
        request=JobSubmitSerializer,
        responses={
            201: OpenApiResponse(
                {
                    "oneOf": [
                        {"$ref": "#/components/schemas/Job"},
                        {"type": "array", "items": {"$ref": "#/components/schemas/JobSummary"}},
                    ]
                },
                description="The job; when `array` was given, the list of its copies as lists carry jobs",
            ),
            **error_responses(400, 401, 403, 413),
        },
    )
    def create(self, request: Request) -> Response:
        """Submit one job, or a job array with ``array: N``."""
        incoming = JobSubmitSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        spec = job_service.JobSpec(
            name=data["name"],
            command=data["command"],
            priority_class=data.get("priority_class") or None,
            num_devices=data["num_devices"],
            vnpu_template=data.get("vnpu_template") or None,
            chip_model=data.get("chip_model") or None,
            estimated_duration_s=data["estimated_duration_s"],
            max_duration_s=data.get("max_duration_s"),
            checkpoint_interval_s=data.get("checkpoint_interval_s"),
            env=data.get("env") or {},
            cwd=data.get("cwd") or "",
            output=data.get("output") or "",
            depends_on=data.get("depends_on") or "",
        )
        try:
            team = job_service.submission_team(request.user, data.get("team"))
            if "array" in data or data.get("array_limit") is not None:
                indices, limit = _array(data)
                jobs = job_service.submit_array(
                    team=team, user=request.user, spec=spec, indices=indices, limit=limit, member_checked=True
                )
                body: Any = [job_summary_representation(job) for job in jobs]
            else:
                job = job_service.submit_job(team=team, user=request.user, spec=spec, member_checked=True)
                body = job_representation(job)
        except job_service.SubmissionError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        except job_service.PermissionDenied as exc:
            raise DRFPermissionDenied(str(exc)) from exc
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Cancel a pending or running job (409 when it already ended)",
        request=None,
        responses={200: JobSerializer, **error_responses(401, 403, 404, 409)},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            job = job_service.cancel_job(job.pk, actor=request.user)
        except job_service.SubmissionError as exc:  # it already ended
            raise Conflict({exc.field: [exc.message]}) from exc
        except job_service.PermissionDenied as exc:
            raise DRFPermissionDenied(str(exc)) from exc
        return Response(JobSerializer(job).data)

    @extend_schema(
        summary="Submit a copy of this job with the same spec (a new job, queued now)",
        request=None,
        responses={201: JobSerializer, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def resubmit(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        spec = job_service.JobSpec(
            name=job.name,
            command=job.command,
            priority_class=job.priority_class,
            num_devices=job.num_devices,
            vnpu_template=job.vnpu_template.name if job.vnpu_template else None,
            chip_model=job.chip_model or None,
            estimated_duration_s=job.estimated_duration_s,
            max_duration_s=job.max_duration_s,
            checkpoint_interval_s=job.checkpoint_interval_s,
            env=dict(job.env or {}),
            cwd=job.cwd,
            output=job.output,
        )
        try:
            copy = job_service.submit_job(team=job.team, user=request.user, spec=spec)
        except job_service.SubmissionError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        except job_service.PermissionDenied as exc:
            raise DRFPermissionDenied(str(exc)) from exc
        return Response(JobSerializer(copy).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="The job's output: a byte range of one run on one node, or its last lines",
        description=(
            "Follow a running job by asking again from `next_offset` until `complete` is true. "
            "`?tail=N` gives the last N lines instead; `?attempt=K` an earlier run (1 is the first start); "
            "`?node=NAME` one node of a multi-node run (default: its first). The end of each run's output "
            "is kept when it ends, so it stays readable after the node is gone."
        ),
        parameters=[
            _bounded("offset", LOG_OFFSET, "byte offset to continue from (0: the start)"),
            _bounded("tail", LOG_TAIL, f"the last N lines, 0 to {output_service.MAX_TAIL_LINES}"),
            _bounded("attempt", LOG_ATTEMPT, "which run, 1 for the first start (default: the latest)"),
            OpenApiParameter("node", str, description="which node of the run (default: its first)"),
        ],
        responses={200: JobOutputSerializer, **error_responses(400, 401, 404)},
    )
    @action(detail=True, methods=["get"], filterset_class=None)
    def log(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        query = request.query_params
        try:
            answer = output_service.read_output(
                job,
                offset=_whole(query, "offset", LOG_OFFSET),
                tail=_whole(query, "tail", LOG_TAIL),
                attempt=_whole(query, "attempt", LOG_ATTEMPT),
                node=query.get("node") or None,
            )
        except output_service.OutputError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        return Response(answer)

    @extend_schema(
        summary="The whole output of one run on one node, as a text file",
        description=(
            "Streams the run's log from its node page by page (`text/plain; charset=utf-8`, as an attachment). "
            "Where the node no longer has it, the end the portal kept follows a line "
            "`[npuportal: bytes A to B of this output were left out: why]`. `?attempt=K` and `?node=NAME` "
            "as for `log/`. Members of the job's team and admins only; another team's job is a 404."
        ),
        parameters=[
            OpenApiParameter("attempt", int, description="which run, 1 for the first start (default: the latest)"),
            OpenApiParameter("node", str, description="which node of the run (default: its first)"),
        ],
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="the output"),
            **error_responses(400, 401, 404),
        },
    )
    @action(detail=True, methods=["get"], url_path="log/download", filterset_class=None)
    def log_download(self, request: Request, pk: str | None = None) -> StreamingHttpResponse:
        job = self.get_object()
        query = request.query_params
        try:
            download = output_service.download_output(
                job, attempt=_whole(query, "attempt", LOG_ATTEMPT), node=query.get("node") or None
            )
        except output_service.OutputError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        response = StreamingHttpResponse(download.chunks, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{download.filename}"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    @extend_schema(
        summary="Why this job is where it is in the queue: its priority breakdown",
        responses={200: OpenApiTypes.OBJECT, **error_responses(401, 404, 409)},
    )
    @action(detail=True, methods=["get"], filterset_class=None)
    def explain(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        if job.is_final:
            raise Conflict({"state": [f"job is {job.state}; only pending and running jobs are ranked"]})
        from scheduling.services.explain import explain_job

        try:
            breakdown = explain_job(job)
        except KeyError as exc:  # it ended between the two reads
            raise Conflict({"state": ["job is no longer pending or running"]}) from exc
        breakdown["estimated_start"] = api_time(breakdown["estimated_start"])  # as the job's own reads
        return Response(json_safe(breakdown))


def _array(data: dict[str, Any]) -> tuple[list[int], int | None]:
    """The copies' indices and the at-most-running of a submission's ``array`` and ``array_limit``."""
    from scheduling.services.arrays import ArrayError, parse_array

    if "array" not in data:
        raise job_service.SubmissionError("array", "required with array_limit: the copies to submit, such as 0-15")
    try:
        indices, limit = parse_array(data["array"])
    except ArrayError as exc:
        raise job_service.SubmissionError("array", str(exc)) from None
    given = data.get("array_limit")
    if given is not None and limit is not None and given != limit:
        raise job_service.SubmissionError("array_limit", f"{given} disagrees with the %{limit} of array")
    return indices, limit if limit is not None else given


def _whole(query: Any, name: str, bounds: tuple[int, int]) -> int | None:
    """A whole number within ``bounds`` from the query string, None when absent; a 400 naming it otherwise."""
    least, maximum = bounds
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or not least <= int(raw) <= maximum:
        raise ValidationError({name: [f"must be a whole number from {least} to {maximum}, not {raw[:40]!r}"]})
    return int(raw)
