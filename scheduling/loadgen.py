"""A small load generator that keeps the demo's queues alive.

Each team submits jobs shaped like its real work: inference serves from vNPU
slices and a few cards at high or critical class, training asks for whole
910B4 nodes or 910A rings, research for one or two cards. Jobs are real
processes on the simulated agents (``sleep``), so they finish by themselves.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

from django.contrib.auth import get_user_model

from quotas.models import Membership, Team
from scheduling.models import Job
from scheduling.services.jobs import JobSpec, SubmissionError, submit_job

log = logging.getLogger("loadgen")


@dataclass(frozen=True)
class Shape:
    team: str
    name: str
    weight: int
    devices: int
    chip: str | None
    template: str | None
    classes: tuple[str, ...]
    seconds: tuple[int, int]


SHAPES = [
    Shape("inference", "serve-qwen-7b", 3, 1, "310P3", "vir02", ("high", "normal"), (30, 120)),
    Shape("inference", "serve-embeddings", 2, 1, "910B4", "vir05_1c_8g", ("critical", "high"), (40, 150)),
    Shape("inference", "batch-rerank", 2, 2, "910B4", None, ("normal",), (30, 90)),
    Shape("training", "pretrain-llama", 1, 8, "910B4", None, ("normal", "low"), (90, 300)),
    Shape("training", "finetune-lora", 3, 4, "910A", None, ("normal", "high"), (45, 180)),
    Shape("training", "sweep-lr", 2, 2, "910B4", None, ("low",), (30, 120)),
    Shape("research", "ablation", 3, 1, "910A", None, ("normal", "low"), (20, 100)),
    Shape("research", "notebook", 2, 1, "310P3", "vir01", ("normal",), (30, 90)),
    Shape("research", "eval-suite", 2, 2, None, None, ("low", "normal"), (30, 120)),
]


def submit_one(rng: random.Random) -> Job | None:
    shape = rng.choices(SHAPES, weights=[s.weight for s in SHAPES])[0]
    team = Team.objects.filter(name=shape.team).first()
    lead = Membership.objects.filter(team=team, role=Membership.Role.LEAD).select_related("user").first()
    if team is None or lead is None:
        return None
    seconds = rng.randint(*shape.seconds)
    spec = JobSpec(
        name=f"{shape.name}-{rng.randint(100, 999)}",
        command=f"echo starting {shape.name}; sleep {seconds}; echo done",
        priority_class=rng.choice(shape.classes),
        num_devices=shape.devices,
        vnpu_template=shape.template,
        chip_model=shape.chip,
        estimated_duration_s=int(seconds * rng.uniform(1.0, 1.5)),
        max_duration_s=seconds * 3,
    )
    try:
        return submit_job(team=team, user=lead.user, spec=spec)
    except SubmissionError as exc:
        log.info("skipped %s: %s", shape.name, exc)
        return None


def run(*, interval_s: float = 8.0, max_pending: int = 25, seed: int | None = None, count: int | None = None) -> None:
    """Submit a job every ``interval_s`` (jittered) while the queue is not too long."""
    rng = random.Random(seed)
    done = 0
    get_user_model()  # fail early if the app registry is not ready
    while count is None or done < count:
        if Job.objects.filter(state=Job.State.PENDING).count() < max_pending:
            job = submit_one(rng)
            if job is not None:
                done += 1
                log.info("submitted #%s %s (%s, %s)", job.pk, job.name, job.team.name, job.priority_class)
        time.sleep(interval_s * rng.uniform(0.5, 1.5))
