"""Why a job is where it is in the queue, like Slurm's ``sprio`` plus ``squeue -r``.

``explain(snapshot, job_id)`` recomputes the job's priority factors exactly as
the tick does and runs the tick once to get its decision, so what the console
shows is what the scheduler did, not a second opinion.
"""

from __future__ import annotations

from typing import Any

from scheduling.engine import reasons
from scheduling.engine.decide import Tick, eligible
from scheduling.engine.estimate import ESTIMATED_REASONS, estimate_starts
from scheduling.engine.placement import need_of
from scheduling.engine.policy import quota_to_json
from scheduling.engine.priority import class_factors, job_factors, weighted
from scheduling.engine.snapshot import Wait


def explain(snapshot: Any, job_id: int) -> dict[str, Any]:
    """Factors, weights, weighted values, total, quota in force and the decision for ``job_id``.

    Shape::

        {"job_id", "team", "user", "priority_class", "state": "pending"|"running",
         "factors": {name: {"factor", "weight", "weighted"}}, "priority": total,
         "starvation": {"after_s": seconds|None, "waited_s", "starving": bool},
         "quota": {..., "schedule": name|None},
         "decision": "start"|"wait"|"running",
         "reason", "reason_text", "detail", "estimated_start", "slots", "backfilled"}

    Raises ``KeyError`` for a job that is neither pending nor running.
    """
    policy = snapshot.policy
    job = next((j for j in snapshot.pending if j.id == job_id), None)
    running = job is None
    if job is None:
        job = next((j for j in snapshot.running if j.id == job_id), None)
    if job is None:
        raise KeyError(job_id)
    view, held, cancelled = eligible(snapshot)  # the pipeline's step 0, as decide
    hold = held.get(job_id) or (
        Wait(reasons.DEPENDENCY_NEVER_SATISFIED, cancelled[job_id]) if job_id in cancelled else None
    )
    tick = Tick(snapshot if hold is not None else view)
    ledger = tick.ledger(job.team)
    out: dict[str, Any] = {
        "job_id": job.id,
        "team": job.team,
        "user": job.user,
        "priority_class": job.priority_class,
        "state": "running" if running else "pending",
        "quota": {"schedule": ledger.schedule, **quota_to_json(policy, ledger.quota)},
    }
    if running:
        tick.state.release()  # not run: hand its layout back for the next tick
        out.update(decision="running", reason=None, reason_text="", detail="", estimated_start=None)
        return out
    fair = tick.fair_share_of()
    need = need_of(tick.state, job, tick.need_cache)
    units = need.units[need.chips[0]] if need.chips else float(job.num_devices)
    factors = job_factors(
        job,
        class_factors(policy),
        fair.get((job.team, job.user), 0.0),
        tick.now,
        policy.ordering,
        units,
        tick.state.largest_node,
    )
    values = weighted(factors, policy.ordering)
    weights = {
        "priority_class": policy.ordering.weight_priority_class,
        "fair_share": policy.ordering.weight_fair_share,
        "age": policy.ordering.weight_age,
        "job_size": policy.ordering.weight_job_size,
        "duration": policy.ordering.weight_duration,
    }
    out["factors"] = {
        name: {"factor": getattr(factors, name), "weight": weights[name], "weighted": values[name]} for name in weights
    }
    out["priority"] = sum(values.values())
    after = tick.guard.after(job.priority_class)
    waited = tick.now - job.submitted_at
    # The starvation guard comes before every factor above (see scheduling.engine.starvation).
    out["starvation"] = {"after_s": after, "waited_s": waited, "starving": tick.guard.starving(job, tick.now)}
    if hold is not None:  # held at step 0: the tick never looks at it
        tick.state.release()
        out.update(
            decision="wait",
            reason=hold.reason,
            reason_text=reasons.describe(hold.reason),
            detail=hold.detail,
            estimated_start=None,
        )
        return out
    decisions = tick.run()
    start = next((s for s in decisions.starts if s.job_id == job_id), None)
    if start is not None:
        out.update(
            decision="start",
            reason=None,
            reason_text="",
            detail="",
            estimated_start=tick.now,
            slots=[{"device_id": s.device_id, "vnpu_template": s.vnpu_template} for s in start.slots],
            backfilled=start.backfilled,
        )
        return out
    wait = decisions.waiting[job_id]
    if wait.estimated_start is None and wait.reason in ESTIMATED_REASONS:
        estimate_starts(snapshot, decisions)  # as the tick's planning pass gives it
        wait = decisions.waiting[job_id]  # (a new value: waits are never edited)
    out.update(
        decision="wait",
        reason=wait.reason,
        reason_text=reasons.describe(wait.reason),
        detail=wait.detail,
        estimated_start=wait.estimated_start,
    )
    return out
