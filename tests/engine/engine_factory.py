"""Small builders for engine tests: policies, clusters, jobs and snapshots, no Django.

Also the YAML scenario format (``tests/engine/scenarios/*.yaml``): see
:func:`load_scenario`. Devices are named ``node/index`` in scenarios and
numbered in node order here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from scheduling.engine.policy import (
    Ordering,
    Policy,
    PriorityClass,
    Quota,
    Reservation,
    TeamPolicy,
)
from scheduling.engine.snapshot import Dependencies, DeviceState, JobState, NodeState, Slot, Snapshot, VnpuTemplate

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
T0 = NOW.timestamp()

TEMPLATES = {
    ("910B4", "vir05_1c_8g"): VnpuTemplate("910B4", "vir05_1c_8g", 8192, 5, 1),
    ("910B4", "vir10_3c_16g"): VnpuTemplate("910B4", "vir10_3c_16g", 16384, 10, 3),
    ("310P3", "vir02"): VnpuTemplate("310P3", "vir02", 6144, 2, 1),
    ("310P3", "vir04"): VnpuTemplate("310P3", "vir04", 12288, 4, 2),
}
#: (AI cores, HBM MB, AI CPUs) per chip model.
CARDS = {"910B4": (20, 32768, 7), "910A": (32, 32768, 14), "310P3": (8, 24576, 7)}


def classes(*specs: str | tuple[str, Iterable[str]] | tuple[str, Iterable[str], bool]) -> tuple[PriorityClass, ...]:
    """Priority classes in rank order: ``"name"``, ``("name", preempts)`` or ``("name", preempts, preemptible)``."""
    out = []
    for rank, spec in enumerate(specs):
        if isinstance(spec, str):
            out.append(PriorityClass(spec, rank, default=spec == "normal"))
        else:
            preemptible = spec[2] if len(spec) > 2 else True  # type: ignore[misc]
            out.append(PriorityClass(spec[0], rank, frozenset(spec[1]), preemptible, default=spec[0] == "normal"))
    return tuple(out)


def quota(
    guaranteed: Mapping[str, float] | None = None,
    max: Mapping[str, float] | None = None,
    max_jobs: int | None = None,
    hours: float | None = None,
    max_duration: float | None = None,
    allowed: Iterable[str] | None = None,
) -> Quota:
    return Quota(
        guaranteed=dict(guaranteed or {}),
        max=dict(max or {}),
        max_concurrent_jobs=max_jobs,
        device_hours_per_month=hours,
        max_job_duration_s=max_duration,
        allowed_priority_classes=None if allowed is None else frozenset(allowed),
    )


def policy(
    teams: Mapping[str, Quota | TeamPolicy] | None = None,
    priority_classes: tuple[PriorityClass, ...] | None = None,
    *,
    backfill: bool = True,
    strategy: str = "binpack",
    grace: float = 300.0,
    reservations: Iterable[Reservation] = (),
    departments: Mapping[str, float] | None = None,
    ordering: Ordering | None = None,
    starvation: float | None = None,
) -> Policy:
    team_policies: dict[str, TeamPolicy] = {}
    for name, value in (teams or {}).items():
        team_policies[name] = value if isinstance(value, TeamPolicy) else TeamPolicy(name, None, 1.0, value)
    return Policy(
        name="test",
        timezone="UTC",
        priority_classes=priority_classes or classes(("high", ["low"]), "normal", "low"),
        ordering=ordering or Ordering(),
        placement_strategy=strategy,
        backfill=backfill,
        grace_period_s=grace,
        on_preempt="requeue",
        reservations=tuple(reservations),
        departments=dict(departments or {}),
        teams=team_policies,
        defaults=TeamPolicy("*", None, 1.0, Quota()),
        starvation_after_s=starvation,
    )


class Cluster:
    """Nodes with devices numbered in order; ``dev("n1/3")`` is the id of n1's card 3."""

    def __init__(self) -> None:
        self.nodes: list[NodeState] = []
        self.ids: dict[str, int] = {}
        self._next = 1

    def node(
        self,
        name: str,
        chip: str = "910B4",
        devices: int = 8,
        groups: int = 1,
        unhealthy: Iterable[int] = (),
        schedulable: bool = True,
    ) -> Cluster:
        cores, hbm, cpus = CARDS.get(chip, (8, 16384, 4))
        bad = set(unhealthy)
        per_group = max(devices // groups, 1)
        devs = []
        for i in range(devices):
            devs.append(
                DeviceState(
                    self._next, name, i, chip, f"{name}/ring{i // per_group}", hbm, cores, cpus, usable=i not in bad
                )
            )
            self.ids[f"{name}/{i}"] = self._next
            self._next += 1
        self.nodes.append(NodeState(name, devs, schedulable=schedulable))
        return self

    def dev(self, ref: str) -> int:
        return self.ids[ref]

    def name_of(self, device_id: int) -> str:
        return next(k for k, v in self.ids.items() if v == device_id)


def job(
    id: int,
    team: str = "a",
    n: int = 1,
    cls: str = "normal",
    *,
    user: str = "u",
    submitted: float = -60.0,
    est: float = 3600.0,
    max_duration: float | None = None,
    chip: str | None = None,
    vnpu: str | None = None,
    slots: Iterable[int | tuple[int, str]] = (),
    started: float | None = None,
    deadline: float | None = None,
    checkpoint: float | None = None,
) -> JobState:
    """A job; times are seconds relative to NOW. ``slots`` makes it a running job."""
    slot_list = tuple(Slot(s[0], s[1]) if isinstance(s, tuple) else Slot(s, vnpu) for s in slots)
    running = bool(slot_list)
    return JobState(
        id=id,
        team=team,
        user=user,
        priority_class=cls,
        num_devices=n,
        submitted_at=T0 + submitted,
        estimated_duration_s=est,
        vnpu_template=vnpu,
        chip_model=chip,
        max_duration_s=max_duration,
        started_at=(T0 + (started if started is not None else -600.0)) if running else None,
        slots=slot_list,
        preempt_deadline=None if deadline is None else T0 + deadline,
        checkpoint_interval_s=checkpoint,
    )


def snapshot(
    pol: Policy,
    cluster: Cluster,
    pending: Iterable[JobState] = (),
    running: Iterable[JobState] = (),
    usage: Mapping[tuple[str, str], float] | None = None,
    month: Mapping[str, float] | None = None,
    now: datetime = NOW,
) -> Snapshot:
    return Snapshot(
        now=now,
        policy=pol,
        nodes=cluster.nodes,
        pending=list(pending),
        running=list(running),
        templates=dict(TEMPLATES),
        usage=dict(usage or {}),
        month_device_hours=dict(month or {}),
    )


# -- YAML scenarios ------------------------------------------------------------------


def _duration(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    text = str(value)
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]
    return float(text[:-1]) * unit


def load_scenario(doc: Mapping[str, Any]) -> tuple[Snapshot, Cluster, Mapping[str, Any]]:
    """``(snapshot, cluster, expect)`` from a scenario mapping.

    Format::

        policy: {classes: [high: [low], normal, low], backfill: true, strategy: binpack, starvation: 24h,
                 grace: 300, teams: {a: {guaranteed: {devices: 8}, max: {...}, max_jobs: 2,
                 hours: 100, max_duration: 1h, allowed: [normal]}},
                 reservations: [{name: r, ratio: 0.25, chips: [910B4], classes: [high]}]}
        nodes: [{name: n1, chip: 910B4, devices: 8, groups: 1, unhealthy: [0], schedulable: true}]
        running: [{id: 1, team: a, cls: low, devices: [n1/0], started: -1h, est: 2h, deadline: 60,
                   checkpoint: 30m}]
        pending: [{id: 10, team: a, n: 4, cls: normal, submitted: -1m, est: 10m, chip: 910B4, vnpu: ...}]
        usage: {a/u: 10}
        dependencies: {10: waits for job 3 to complete, 11: {never: job 4 failed}}
        arrays: {A20: {limit: 2, jobs: [20, 21, 22]}}
        expect: {starts: {10: [n1/0, ...]} or [10, ...], waiting: {11: Resources},
                 preemptions: [1], evictions: [2], estimated: {11: 3600}, backfilled: [12], cancelled: [13]}
    """
    p = doc.get("policy", {})
    class_specs: list[Any] = []
    class_after: dict[str, float | None] = {}
    for spec in p.get("classes", [{"high": ["low"]}, "normal", "low"]):
        if isinstance(spec, str):
            class_specs.append(spec)
        else:
            ((name, value),) = spec.items()
            if isinstance(value, Mapping):
                class_specs.append((name, value.get("preempts", []), value.get("preemptible", True)))
                if value.get("starvationAfter") is not None:
                    class_after[name] = _duration(value["starvationAfter"])
            else:
                class_specs.append((name, value or []))
    teams = {}
    for name, t in (p.get("teams") or {}).items():
        t = t or {}
        teams[name] = TeamPolicy(
            name,
            t.get("department"),
            float(t.get("shares", 1.0)),
            quota(
                t.get("guaranteed"),
                t.get("max"),
                t.get("max_jobs"),
                t.get("hours"),
                _duration(t.get("max_duration")),
                t.get("allowed"),
            ),
        )
    reservations = [
        Reservation(
            r.get("name", "r"),
            float(r["ratio"]),
            None if r.get("chips") is None else frozenset(r["chips"]),
            frozenset(r["classes"]),
        )
        for r in p.get("reservations", [])
    ]
    pol = policy(
        teams,
        tuple(replace(pc, starvation_after_s=class_after.get(pc.name)) for pc in classes(*class_specs)),
        backfill=p.get("backfill", True),
        strategy=p.get("strategy", "binpack"),
        grace=float(p.get("grace", 300)),
        reservations=reservations,
        departments=p.get("departments"),
        starvation=_duration(p.get("starvation")),
    )
    cl = Cluster()
    for node in doc.get("nodes", []):
        cl.node(
            node["name"],
            node.get("chip", "910B4"),
            node.get("devices", 8),
            node.get("groups", 1),
            node.get("unhealthy", ()),
            node.get("schedulable", True),
        )

    def slot_of(ref: str) -> int | tuple[int, str]:
        if "@" in ref:
            dev, tmpl = ref.split("@")
            return (cl.dev(dev), tmpl)
        return cl.dev(ref)

    def make(j: Mapping[str, Any], is_running: bool) -> JobState:
        return job(
            j["id"],
            j.get("team", "a"),
            j.get("n", len(j.get("devices", [])) if is_running else 1),
            j.get("cls", "normal"),
            user=j.get("user", "u"),
            submitted=_duration(j.get("submitted", -60)) or 0.0,
            est=_duration(j.get("est", 3600)) or 0.0,
            max_duration=_duration(j.get("max_duration")),
            chip=j.get("chip"),
            vnpu=j.get("vnpu"),
            slots=[slot_of(d) for d in j.get("devices", [])] if is_running else (),
            started=_duration(j.get("started", -600)),
            deadline=_duration(j.get("deadline")),
            checkpoint=_duration(j.get("checkpoint")),
        )

    usage = {tuple(k.split("/")): float(v) for k, v in (doc.get("usage") or {}).items()}
    snap = snapshot(
        pol,
        cl,
        [make(j, False) for j in doc.get("pending", [])],
        [make(j, True) for j in doc.get("running", [])],
        usage=usage,  # type: ignore[arg-type]
        month=doc.get("month"),
        now=NOW + timedelta(seconds=float(doc.get("now", 0))),
    )
    deps = doc.get("dependencies") or {}
    if deps:
        snap.dependencies = {
            int(jid): Dependencies(True, d["never"]) if isinstance(d, Mapping) else Dependencies(False, str(d))
            for jid, d in deps.items()
        }
    arrays = doc.get("arrays") or {}
    if arrays:
        snap.array_limits = {
            int(jid): (name, int(a["limit"])) for name, a in arrays.items() for jid in a.get("jobs", [])
        }
    return snap, cl, doc.get("expect", {})


def load_scenario_text(text: str) -> tuple[Snapshot, Cluster, Mapping[str, Any]]:
    return load_scenario(yaml.safe_load(text))


def small_cluster(draw: Any) -> tuple[Cluster, int]:
    """One to three 4-card 910B4 nodes, drawn with hypothesis's ``draw``, and how many cards they hold."""
    from hypothesis import strategies as st

    cl = Cluster()
    nodes = draw(st.integers(1, 3))
    for n in range(nodes):
        cl.node(f"n{n}", "910B4", 4)
    return cl, 4 * nodes
