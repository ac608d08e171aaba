"""``/metrics``: the cluster in Prometheus' text format, read from the database at scrape time.

Nothing is counted in process memory: every number comes from the database
when Prometheus asks, so all gunicorn workers (and machines) give the same
answer. Labels carry teams, chips, states and classes — never job names or
user names.

| metric | type | labels |
|---|---|---|
| ``npuportal_jobs`` | gauge | state (pending/running), team, priority_class |
| ``npuportal_devices`` | gauge | health, chip_model |
| ``npuportal_nodes`` | gauge | state, reachable |
| ``npuportal_tick_duration_seconds`` | histogram | (ticks of the last hour) |
| ``npuportal_tick_age_seconds`` | gauge | (absent before the first tick) |
| ``npuportal_agent_poll_failures`` | gauge | (sum of the nodes' consecutive missed polls) |
| ``npuportal_nodes_unreachable`` | gauge | |
| ``npuportal_policy_version`` | gauge | (0 when none is active) |

Who may read it: a request with ``Authorization: Bearer <NPUPORTAL_METRICS_TOKEN>`` (compared
in constant time), or from an address in ``NPUPORTAL_METRICS_ALLOW`` (default the machine
itself), as :func:`npuportal.client_ip.client_address` counts it. Anyone else gets a plain 401
(no token) or 403 (a wrong one): team names and their queues are not for every visitor.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from npuportal.client_ip import client_address

#: Upper bounds (seconds) of the tick-duration histogram's buckets.
TICK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: The tick histogram covers ticks started this long ago at most.
TICK_WINDOW = timedelta(hours=1)


class ClusterCollector(Collector):
    """Reads the cluster's state with a handful of grouped queries on every scrape."""

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._devices()
        yield from self._nodes()
        yield from self._ticks()
        yield self._policy()

    def _jobs(self) -> Iterator[Metric]:
        from scheduling.models import Job

        family = GaugeMetricFamily(
            "npuportal_jobs", "Pending and running jobs", labels=["state", "team", "priority_class"]
        )
        rows = (
            Job.objects.filter(state__in=[Job.State.PENDING, Job.State.RUNNING])
            .values_list("state", "team__name", "priority_class")
            .annotate(n=Count("id"))
            .order_by("state", "team__name", "priority_class")
        )
        for state, team, pclass, n in rows:
            family.add_metric([state, team, pclass], n)
        yield family

    def _devices(self) -> Iterator[Metric]:
        from devices.models import Device

        family = GaugeMetricFamily(
            "npuportal_devices", "Devices by health and chip model", labels=["health", "chip_model"]
        )
        rows = (
            Device.objects.filter(node__removed_at__isnull=True)
            .values_list("health", "chip_model")
            .annotate(n=Count("id"))
            .order_by("health", "chip_model")
        )
        for health, chip, n in rows:
            family.add_metric([health, chip], n)
        yield family

    def _nodes(self) -> Iterator[Metric]:
        from devices.models import Node

        nodes = GaugeMetricFamily("npuportal_nodes", "Nodes by state and reachability", labels=["state", "reachable"])
        failures = 0
        unreachable = 0
        for state, reachable, n, missed in (
            Node.objects.filter(removed_at__isnull=True)
            .values_list("state", "reachable")
            .annotate(n=Count("id"), missed=Sum("missed_polls"))
            .order_by("state", "reachable")
        ):
            nodes.add_metric([state, "true" if reachable else "false"], n)
            failures += missed or 0
            unreachable += 0 if reachable else n
        yield nodes
        yield GaugeMetricFamily(
            "npuportal_agent_poll_failures", "Consecutive missed agent polls, summed over nodes", value=failures
        )
        yield GaugeMetricFamily("npuportal_nodes_unreachable", "Nodes whose agent does not answer", value=unreachable)

    def _ticks(self) -> Iterator[Metric]:
        from scheduling.models import TickRecord

        now = timezone.now()
        recent = TickRecord.objects.filter(started_at__gte=now - TICK_WINDOW)
        aggregates = {f"le_{i}": Count("id", filter=Q(duration_ms__lte=b * 1000)) for i, b in enumerate(TICK_BUCKETS)}
        summary = recent.aggregate(total=Count("id"), sum_ms=Sum("duration_ms"), **aggregates)
        buckets = [(str(b), summary[f"le_{i}"]) for i, b in enumerate(TICK_BUCKETS)]
        buckets.append(("+Inf", summary["total"]))
        yield HistogramMetricFamily(
            "npuportal_tick_duration_seconds",
            f"Duration of the scheduling ticks started in the last {int(TICK_WINDOW.total_seconds())} s",
            buckets=buckets,
            sum_value=(summary["sum_ms"] or 0.0) / 1000.0,
        )
        last = TickRecord.objects.order_by("-started_at").values_list("started_at", flat=True).first()
        age = GaugeMetricFamily("npuportal_tick_age_seconds", "Seconds since the last scheduling tick started")
        if last is not None:
            age.add_metric([], max((now - last).total_seconds(), 0.0))
        yield age

    def _policy(self) -> Metric:
        from quotas.models import Policy

        version = Policy.objects.filter(is_active=True).values_list("version", flat=True).first()
        return GaugeMetricFamily(
            "npuportal_policy_version", "Version of the active scheduling policy", value=version or 0
        )


registry = CollectorRegistry(auto_describe=False)
registry.register(ClusterCollector())


def _allowed_address(request: HttpRequest) -> bool:
    found = client_address(request)
    try:
        address = ipaddress.ip_address(found or "")
    except ValueError:
        return False
    candidates = [address]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:  # a dual-stack socket's ::ffff:a.b.c.d
        candidates.append(address.ipv4_mapped)
    return any(a in network for a in candidates for network in settings.METRICS_ALLOW if a.version == network.version)


def _bearer(request: HttpRequest) -> str | None:
    """The bearer token of the request, or ``None`` when it brings none."""
    scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
    credentials = credentials.strip()
    return credentials if scheme.lower() == "bearer" and credentials else None


def refusal(request: HttpRequest) -> HttpResponse | None:
    """Why this request may not read the metrics (a plain 401 or 403), or ``None`` when it may."""
    offered = _bearer(request)
    if offered is not None:
        expected = settings.METRICS_TOKEN
        if expected and hmac.compare_digest(offered.encode(), expected.encode()):
            return None
        return HttpResponse("403 the metrics token does not match\n", status=403, content_type="text/plain")
    if _allowed_address(request):
        return None
    response = HttpResponse(
        "401 /metrics needs 'Authorization: Bearer <NPUPORTAL_METRICS_TOKEN>' "
        "or a client address in NPUPORTAL_METRICS_ALLOW\n",
        status=401,
        content_type="text/plain",
    )
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint: a bearer token or an allowed address, no sign-in (no job or user names)."""
    refused = refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
