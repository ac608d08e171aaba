"""Job endpoints. Views validate input and call the services; nothing else."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied as DRFPermissionDenied
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from quotas.models import Team
from scheduling.api.serializers import JobDetailSerializer, JobSerializer, JobSubmitSerializer
from scheduling.models import Job
from scheduling.services import jobs as job_service


def visible_jobs(user: object) -> QuerySet[Job]:
    """Admins see all jobs; everyone else only their teams' jobs."""
    qs = Job.objects.select_related("team", "submitter", "vnpu_template")
    if getattr(user, "is_staff", False):
        return qs
    return qs.filter(team__memberships__user=user)


class JobFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__name")
    user = django_filters.CharFilter(field_name="submitter__username")
    submitted_after = django_filters.IsoDateTimeFilter(field_name="submitted_at", lookup_expr="gte")
    submitted_before = django_filters.IsoDateTimeFilter(field_name="submitted_at", lookup_expr="lt")

    class Meta:
        model = Job
        fields = ["state", "priority_class", "team", "user", "chip_model", "array_id"]


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = JobSerializer
    filterset_class = JobFilterSet

    def get_queryset(self) -> QuerySet[Job]:
        return visible_jobs(self.request.user).order_by("-submitted_at", "-id")

    def get_serializer_class(self) -> type:
        if self.action == "retrieve":
            return JobDetailSerializer
        if self.action == "create":
            return JobSubmitSerializer
        return JobSerializer

    def _team_for(self, request: Request, name: str | None) -> Team:
        if name:
            team = Team.objects.filter(name=name).first()
            if team is None or not job_service.can_act_for_team(request.user, team):
                # Same answer for "no such team" and "not yours": no probing of names.
                raise ValidationError({"team": [f"no team {name!r} that you belong to"]})
            return team
        teams = list(Team.objects.filter(memberships__user=request.user))
        if len(teams) != 1:
            raise ValidationError({"team": ["required: you belong to several teams or none"]})
        return teams[0]

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer(many=True)})
    def create(self, request: Request) -> Response:
        """Submit one job, or a job array with ``array: N``."""
        incoming = JobSubmitSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        team = self._team_for(request, data.get("team"))
        count = data.get("array") or 1
        array_id = job_service.next_array_id() if data.get("array") else ""
        created = []
        try:
            from django.db import transaction

            with transaction.atomic():
                for index in range(count):
                    spec = job_service.JobSpec(
                        name=data["name"] if count == 1 else f"{data['name']}[{index}]",
                        command=data["command"],
                        priority_class=data.get("priority_class") or None,
                        num_devices=data["num_devices"],
                        vnpu_template=data.get("vnpu_template") or None,
                        chip_model=data.get("chip_model") or None,
                        estimated_duration_s=data["estimated_duration_s"],
                        max_duration_s=data.get("max_duration_s"),
                    )
                    created.append(
                        job_service.submit_job(
                            team=team,
                            user=request.user,
                            spec=spec,
                            array_id=array_id,
                            array_index=index if array_id else None,
                        )
                    )
        except job_service.SubmissionError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        except job_service.PermissionDenied as exc:
            raise DRFPermissionDenied(str(exc)) from exc
        body = JobSerializer(created, many=True).data if array_id else JobSerializer(created[0]).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            job = job_service.cancel_job(job.pk, actor=request.user)
        except job_service.SubmissionError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        except job_service.PermissionDenied as exc:
            raise DRFPermissionDenied(str(exc)) from exc
        return Response(JobSerializer(job).data)
