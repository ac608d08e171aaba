"""Trace preparation: trace rows become the jobs a replay runs (:class:`SimJob`).

A row that cannot be read as a job (no duration, no devices, an unknown class)
or that the engine's feasibility rule says can never run here is skipped and
counted by reason (the ``SKIP_*`` keys of ``jobs.skipped_by_reason``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from scheduling.engine.feasibility import Request, Shapes, check
from scheduling.engine.policy import Policy
from scheduling.engine.snapshot import (
    JobState,
    VnpuTemplate,
)
from scheduling.sim.traces import ClusterSpec, TraceRow

#: Float slack for unit comparisons (template shares, meters).
EPS = 1e-9

#: Skip reasons (keys of ``jobs.skipped_by_reason``).
SKIP_ZERO_DURATION = "zero_duration"
SKIP_NO_DEVICES = "no_devices"
SKIP_UNKNOWN_CLASS = "unknown_priority_class"
#: A job the engine's feasibility rule says can never run here (the API refuses it at submission).
SKIP_NEVER_RUNNABLE = "never_runnable"


# --- jobs -------------------------------------------------------------------------------------


@dataclass(slots=True)
class SimJob:
    """A trace job during the replay: the engine's :class:`JobState` plus what metrics need."""

    state: JobState
    key: str
    duration: float
    units: float  # card equivalents while running (vNPU: template cores / chip cores)
    status: str = "pending"  # pending | running | completed | cancelled
    first_start: float | None = None
    run_token: int = 0
    chip: str = ""  # chip model of the devices it runs on
    preempted: int = 0
    end: float | None = None  # completion or cancellation time
    #: The first estimated start a sampled planning pass gave it (``estimates_every``).
    first_estimate: float | None = None
    #: Seconds it waited with a reason of its own team's limits (``reasons.QUOTA_REASONS``).
    own_limits_s: float = 0.0
    #: Seconds of its run kept by checkpoints before it was stopped: a restart runs the rest.
    saved: float = 0.0
    #: Its wait up to its first start less the time its own team's limits held it.
    beyond_s: float | None = None
    #: Device-hours its stops threw away, and the reason of the preemption that stopped it last.
    lost_dh: float = 0.0
    preempt_reason: str = ""


def _default_class(policy: Policy) -> str:
    """The class of trace jobs that name none (``"normal"`` for a policy without classes)."""
    return policy.default_class.name if policy.priority_classes else "normal"


def _vnpu_for(fraction: float, chip: str, chip_cores: int, templates: list[VnpuTemplate]) -> VnpuTemplate | None:
    """Smallest template of ``chip`` whose share of the chip's AI cores covers ``fraction``."""
    fits = [t for t in templates if t.chip_model == chip and t.ai_cores / chip_cores + EPS >= fraction]
    return min(fits, key=lambda t: (t.ai_cores, t.memory_mb, t.ai_cpus, t.name)) if fits else None


def prepare_jobs(
    rows: list[TraceRow],
    cluster: ClusterSpec,
    policy: Policy,
    epoch: float,
    class_map: Mapping[str, str] | None = None,
) -> tuple[list[SimJob], Counter[str]]:
    """Turn trace rows into jobs for ``decide``; rows that can never run are counted by reason.

    A job's priority class is the row's ``priority_class``, else ``class_map[tenant]``, else
    the policy's default class.
    """
    skipped: Counter[str] = Counter()
    jobs: list[SimJob] = []
    by_chip = cluster.devices_by_chip()
    chip_cores = {g.chip_model: g.ai_cores for g in cluster.node_groups}
    vnpu_chips = [c for c in chip_cores if any(t.chip_model == c for t in cluster.vnpu_templates)]
    templates = list(cluster.vnpu_templates)
    classes = {pc.name for pc in policy.priority_classes}
    default_class = _default_class(policy)
    # The inventory laid out once; each shape and each job's limits answered once.
    shapes = Shapes(policy, cluster.build_nodes(), cluster.templates())
    verdicts: dict[tuple[object, ...], bool] = {}
    for row in rows:
        if row.duration_s <= 0:
            skipped[SKIP_ZERO_DURATION] += 1
            continue
        cls = row.priority_class or (class_map or {}).get(row.tenant) or default_class
        if classes and cls not in classes:
            skipped[SKIP_UNKNOWN_CLASS] += 1
            continue
        chip = row.chip_model
        if chip is not None and chip not in by_chip:
            skipped[SKIP_NEVER_RUNNABLE] += 1  # a chip model the inventory does not have
            continue
        num = row.num_devices
        template: VnpuTemplate | None = None
        units = float(num)
        milli = row.gpu_milli
        if milli is not None and 0 < milli < 1000 and num <= 1:
            vchip = chip if chip is not None else (vnpu_chips[0] if vnpu_chips else None)
            if vchip is not None:
                template = _vnpu_for(milli / 1000.0, vchip, chip_cores[vchip], templates)
                if template is not None:
                    chip = vchip
                    units = template.ai_cores / chip_cores[vchip]
            num, units = 1, (units if template is not None else 1.0)
        if num <= 0:
            skipped[SKIP_NO_DEVICES] += 1
            continue
        tmpl_name = template.name if template is not None else None
        key = (row.tenant, chip, tmpl_name, num, cls, row.duration_s)
        runnable = verdicts.get(key)
        if runnable is None:
            request = Request(
                team=row.tenant,
                num_devices=num,
                chip_model=chip,
                vnpu_template=tmpl_name,
                priority_class=cls,
                duration_s=row.duration_s,
                estimated_duration_s=row.duration_s,
            )
            runnable = verdicts[key] = check(policy, request, shapes) is None
        if not runnable:
            skipped[SKIP_NEVER_RUNNABLE] += 1
            continue
        job_id = len(jobs) + 1
        state = JobState(
            id=job_id,
            team=row.tenant,
            user=row.user,
            priority_class=cls,
            num_devices=num,
            submitted_at=epoch + row.submit_time_s,
            estimated_duration_s=row.duration_s,
            vnpu_template=template.name if template is not None else None,
            chip_model=chip,
            checkpoint_interval_s=row.checkpoint_interval_s,
        )
        jobs.append(SimJob(state=state, key=row.job_id, duration=row.duration_s, units=units))
    shapes.close()
    return jobs, skipped
