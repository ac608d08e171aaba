"""Benchmark of the decision core alone: synthetic snapshots, timed ``decide``.

``python -m scheduling.bench`` wraps :func:`bench_decide` with a database part;
run this module directly for the core only::

    python -m scheduling.engine.bench_core --pending 10000 --nodes 1000

The synthetic cluster mixes the shapes the core must handle: 910B4 servers (one
8-card group), 910A-class servers (two 4-card HCCS rings) and 310P3 servers
with vNPU templates; a share of the cards is busy with running jobs of every
size, a few are unhealthy; pending jobs of 8 teams in 3 classes ask for 1, 2,
4, 8 and 16 cards or a vNPU slice. The policy uses guarantees, caps, a
reservation and backfill, so every stage of the pipeline runs.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduling.engine.capacity import Layout
from scheduling.engine.decide import Tick, decide
from scheduling.engine.policy import (
    DEVICES,
    Ordering,
    Policy,
    PriorityClass,
    Quota,
    Reservation,
    TeamPolicy,
    chip_resource,
)
from scheduling.engine.snapshot import Decisions, DeviceState, JobState, NodeState, Slot, Snapshot, VnpuTemplate

#: Simulated "now" of every synthetic snapshot (a Monday 10:00 UTC).
BENCH_NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)

#: (chip model, share of nodes, topology groups per node, AI cores, HBM MB, AI CPUs)
CHIP_MIX: tuple[tuple[str, float, int, int, int, int], ...] = (
    ("910B4", 0.6, 1, 20, 32768, 7),
    ("910A", 0.3, 2, 32, 32768, 14),
    ("310P3", 0.1, 1, 8, 24576, 7),
)

TEMPLATES: dict[tuple[str, str], VnpuTemplate] = {
    ("910B4", "vir05_1c_8g"): VnpuTemplate("910B4", "vir05_1c_8g", 8192, 5, 1),
    ("910B4", "vir10_3c_16g"): VnpuTemplate("910B4", "vir10_3c_16g", 16384, 10, 3),
    ("310P3", "vir02"): VnpuTemplate("310P3", "vir02", 6144, 2, 1),
    ("310P3", "vir04"): VnpuTemplate("310P3", "vir04", 12288, 4, 2),
}


def bench_policy(teams: int = 8) -> Policy:
    """A policy that exercises every stage: classes that preempt, guarantees, a reservation."""
    classes = (
        PriorityClass("urgent", 0, frozenset({"batch"}), preemptible=False),
        PriorityClass("normal", 1, frozenset(), default=True),
        PriorityClass("batch", 2),
    )
    team_policies = {}
    for t in range(teams):
        name = f"team{t}"
        quota = Quota(
            guaranteed={DEVICES: 64.0} if t < teams // 2 else {},
            max={DEVICES: 2400.0, chip_resource("310P3"): 200.0},
            max_concurrent_jobs=2000,
            device_hours_per_month=None if t % 3 else 5_000_000.0,
            max_job_duration_s=7 * 86400.0,
            allowed_priority_classes=None if t % 4 else frozenset({"normal", "batch"}),
        )
        team_policies[name] = TeamPolicy(name, f"dept{t % 2}", 10.0 + t, quota)
    defaults = TeamPolicy("*", None, 1.0, Quota())
    return Policy(
        name="bench",
        timezone="UTC",
        priority_classes=classes,
        ordering=Ordering(weight_job_size=500.0),
        placement_strategy="binpack",
        backfill=True,
        grace_period_s=300.0,
        on_preempt="requeue",
        reservations=(Reservation("urgent-floor", 0.05, None, frozenset({"urgent"})),),
        departments={"dept0": 60.0, "dept1": 40.0},
        teams=team_policies,
        defaults=defaults,
    )


def make_synthetic_snapshot(
    pending: int = 10000,
    nodes: int = 1000,
    devices_per_node: int = 8,
    busy: float = 0.7,
    teams: int = 8,
    seed: int = 0,
) -> Snapshot:
    """A reproducible snapshot of ``nodes`` servers with ``busy`` of their cards taken."""
    rng = random.Random(seed)
    now = BENCH_NOW.timestamp()
    node_states: list[NodeState] = []
    device_id = 0
    chips_of_node: list[str] = []
    for n in range(nodes):
        r = (n + 0.5) / nodes
        acc = 0.0
        spec = CHIP_MIX[-1]
        for entry in CHIP_MIX:
            acc += entry[1]
            if r <= acc:
                spec = entry
                break
        chip, _, groups, cores, hbm, cpus = spec
        per_group = max(devices_per_node // groups, 1)
        devs = []
        for i in range(devices_per_node):
            device_id += 1
            healthy = rng.random() > 0.002
            devs.append(
                DeviceState(
                    id=device_id,
                    node=f"node{n:04d}",
                    index=i,
                    chip_model=chip,
                    topology_group=f"node{n:04d}/g{i // per_group}",
                    hbm_mb=hbm,
                    ai_cores=cores,
                    ai_cpus=cpus,
                    usable=healthy,
                    health="healthy" if healthy else "unhealthy",
                )
            )
        node_states.append(NodeState(f"node{n:04d}", devs, schedulable=rng.random() > 0.003))
        chips_of_node.append(chip)

    team_names = [f"team{t}" for t in range(teams)]
    classes = ("urgent", "normal", "batch")
    running: list[JobState] = []
    job_id = 0
    target = busy * nodes * devices_per_node
    taken = 0
    for node, chip in zip(node_states, chips_of_node, strict=True):
        free = [d for d in node.devices]
        rng.shuffle(free)
        quota = round(busy * devices_per_node + rng.uniform(-2, 2))
        while free and quota > 0 and taken < target:
            size = min(rng.choice((1, 1, 2, 4, 8)), quota, len(free))
            if chip == "310P3" and rng.random() < 0.4:
                dev = free.pop()
                names = [k for k in TEMPLATES if k[0] == chip]
                slots: tuple[Slot, ...] = tuple(Slot(dev.id, rng.choice(names)[1]) for _ in range(rng.randint(1, 2)))
                size = 1
            else:
                devs = [free.pop() for _ in range(size)]
                slots = tuple(Slot(d.id) for d in devs)
            for slot in slots:
                job_id += 1
                started = now - rng.uniform(60, 86400)
                running.append(
                    JobState(
                        id=job_id,
                        team=rng.choice(team_names),
                        user=f"u{rng.randint(0, 5)}",
                        priority_class=rng.choice(classes),
                        num_devices=1 if slot.vnpu_template else size,
                        submitted_at=started - rng.uniform(0, 3600),
                        estimated_duration_s=rng.uniform(600, 2 * 86400),
                        max_duration_s=3 * 86400.0,
                        started_at=started,
                        slots=(slot,) if slot.vnpu_template else slots,
                        vnpu_template=slot.vnpu_template,
                    )
                )
                if not slot.vnpu_template:
                    break
            taken += size
            quota -= size

    pending_jobs: list[JobState] = []
    for _ in range(pending):
        job_id += 1
        roll = rng.random()
        template = None
        chip_model: str | None = None
        if roll < 0.08:
            chip_model, template = rng.choice(list(TEMPLATES))
            size = 1
        else:
            size = rng.choice((1, 1, 1, 2, 2, 4, 4, 8, 8, 16))
            chip_model = rng.choice((None, "910B4", "910B4", "910A"))
        pending_jobs.append(
            JobState(
                id=job_id,
                team=rng.choice(team_names),
                user=f"u{rng.randint(0, 9)}",
                priority_class=rng.choices(classes, weights=(1, 6, 3))[0],
                num_devices=size,
                submitted_at=now - rng.uniform(0, 3 * 86400),
                estimated_duration_s=rng.uniform(300, 86400),
                max_duration_s=rng.choice((None, 86400.0, 2 * 86400.0)),
                vnpu_template=template,
                chip_model=chip_model,
            )
        )
    usage = {(t, f"u{u}"): rng.uniform(0, 5000) for t in team_names for u in range(10)}
    month = {t: rng.uniform(0, 100000) for t in team_names}
    return Snapshot(
        now=BENCH_NOW,
        policy=bench_policy(teams),
        nodes=node_states,
        pending=pending_jobs,
        running=running,
        templates=dict(TEMPLATES),
        usage=usage,
        month_device_hours=month,
    )


def clone_snapshot(snap: Snapshot) -> Snapshot:
    """A copy with new node, device and job objects (what the database tick builds every time), and its rows.

    Slot objects, templates and the policy are immutable values and are shared; every
    running job gets a new ``slots`` tuple, as the database tick builds one.
    """
    nodes = [
        NodeState(
            n.name,
            [
                DeviceState(
                    d.id,
                    d.node,
                    d.index,
                    d.chip_model,
                    d.topology_group,
                    d.hbm_mb,
                    d.ai_cores,
                    d.ai_cpus,
                    d.usable,
                    d.health,
                )
                for d in n.devices
            ],
            n.schedulable,
            n.state,
        )
        for n in snap.nodes
    ]

    def job(j: JobState) -> JobState:
        return JobState(
            j.id,
            j.team,
            j.user,
            j.priority_class,
            j.num_devices,
            j.submitted_at,
            j.estimated_duration_s,
            j.vnpu_template,
            j.chip_model,
            j.max_duration_s,
            j.started_at,
            tuple([*j.slots]),  # a new tuple, as a snapshot read from the database has
            j.preempt_deadline,
            checkpoint_interval_s=j.checkpoint_interval_s,
            own_limits_s=j.own_limits_s,
        )

    # The rows the database tick would have read these nodes and devices from (it passes them
    # as ``inventory_values``; new tuples every time, as a new read gives).
    node_rows = [(k, n.name, n.state, n.schedulable) for k, n in enumerate(nodes)]
    device_rows = [
        (d.id, k, d.index, d.chip_model, d.topology_group, d.hbm_mb, d.ai_cores, d.ai_cpus, d.health, d.usable)
        for k, n in enumerate(nodes)
        for d in n.devices
    ]
    return Snapshot(
        snap.now,
        snap.policy,
        nodes,
        [job(j) for j in snap.pending],
        [job(j) for j in snap.running],
        dict(snap.templates),
        dict(snap.usage),
        dict(snap.month_device_hours),
        inventory_values=(node_rows, device_rows),
    )


def next_tick(snapshot: Snapshot, decisions: Decisions, seconds: float = 30.0) -> Snapshot:
    """The snapshot ``seconds`` later (new objects): the tick's starts running, its victims leaving, its evictions gone.

    At 70 % busy with 10k waiting jobs the first tick fills the cluster; the ticks
    after it, the ones a running system mostly makes, decide over a full cluster.
    """
    snap = clone_snapshot(snapshot)
    now = snap.now.timestamp()
    started = {s.job_id: s for s in decisions.starts}
    leaving = {p.job_id: p.grace_deadline for p in decisions.preemptions}
    evicted = set(decisions.evictions)
    pending = []
    for job in snap.pending:
        start = started.get(job.id)
        if start is None:
            pending.append(job)
            continue
        job.started_at = now
        job.slots = tuple(start.slots)
        snap.running.append(job)
    snap.running = [job for job in snap.running if job.id not in evicted]
    for job in snap.running:
        if job.id in leaving:
            job.preempt_deadline = leaving[job.id]
    snap.pending = pending
    snap.now = snap.now + timedelta(seconds=seconds)
    return snap


def time_decide(snapshot: Snapshot, ticks: int = 7) -> dict[str, float]:
    """Median/max/min of ``ticks`` timed calls in ms, each on a fresh copy of ``snapshot``.

    The database tick never passes the same snapshot twice, so every call gets
    new objects (:func:`clone_snapshot`, made outside the timer) and only
    ``decide`` is timed (freeing its own state included, the decisions it
    returns freed after), each call after a full ``gc.collect()`` (else a
    collection of the copies, due from allocations before the call, would
    land inside the timer). Wall clock (``*_ms``) and CPU time of this process
    (``cpu_*_ms``: on a shared machine the fairer figure). ``first_ms`` is a
    cold tick: no cached layout (see :class:`capacity.Layout`); the timed
    ticks find the layout the previous tick left, as consecutive ticks of an
    unchanged inventory do.
    """
    copies = [clone_snapshot(snapshot) for _ in range(ticks + 1)]
    Layout._idle.clear()
    first0 = time.perf_counter()
    decisions = decide(copies[0])
    first = (time.perf_counter() - first0) * 1000
    times = []
    cpu = []
    for snap in copies[1:]:
        gc.collect()  # start each tick from a collected heap, as timeit does (outside the timer)
        c0 = time.process_time()
        t0 = time.perf_counter()
        out = decide(snap)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        del out  # the caller's to free, after it has written the decisions (outside the timer)
    return {
        "first_ms": first,
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "min_ms": min(times),
        "cpu_median_ms": statistics.median(cpu),
        "cpu_min_ms": min(cpu),
        "starts": float(len(decisions.starts)),
        "preemptions": float(len(decisions.preemptions)),
        "waiting": float(len(decisions.waiting)),
    }


def time_split(snapshot: Snapshot, ticks: int = 7) -> dict[str, float]:
    """Medians in ms of the tick's three parts, each tick on a fresh copy (as :func:`time_decide`).

    ``state_ms``: the free state built and the running jobs charged (``Tick(snapshot)``);
    ``order_ms``: the pending jobs ordered (``Tick.order``); ``decide_ms``: the rest of
    ``Tick.run`` (admission, placement, preemption, waits). The three add up to a tick
    without the cyclic collector's pause, which :func:`decide` also keeps out, and
    without freeing the tick's state, which :func:`decide` times.
    """
    copies = [clone_snapshot(snapshot) for _ in range(ticks + 1)]
    decide(copies[0])  # the layout cached, as for the timed ticks of time_decide
    parts: dict[str, list[float]] = {"state_ms": [], "order_ms": [], "decide_ms": []}
    for snap in copies[1:]:
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            tick = Tick(snap)
            t1 = time.perf_counter()
            ordered = tick.order()
            t2 = time.perf_counter()
            out = tick.run(ordered)
            t3 = time.perf_counter()
            del tick, out  # freed outside the timers (the tick's own state is freed inside decide's)
        finally:
            gc.enable()
        parts["state_ms"].append((t1 - t0) * 1000)
        parts["order_ms"].append((t2 - t1) * 1000)
        parts["decide_ms"].append((t3 - t2) * 1000)
    return {k: statistics.median(v) for k, v in parts.items()}


def bench_starving(snap: Snapshot, ticks: int = 7) -> dict[str, Any]:
    """The same snapshot with the starvation guard on (a sixth of the queue starving) and off.

    The synthetic queue was submitted over three days, so a guard at 60 h makes about a sixth of
    it starving: those jobs go first and stack holds (up to ``MAX_HOLDS_PER_CHIP`` per chip
    model). The two are timed in pairs, off then on, ``2 * ticks + 1`` pairs after one warm-up
    pair: on a shared machine a burst of load then lands on both sides of a pair, where timing
    all of one before all of the other gave ratios from 1.3 to 2.5 for the same code within
    minutes. Returns both timings (wall and CPU, median and minimum, ms) and ``ratio`` (guard on
    / off, medians; ``ratio_min`` of the minima).
    """
    from scheduling.engine.starvation import Guard

    guarded = clone_snapshot(snap)
    guarded.policy = replace(snap.policy, starvation_after_s=60 * 3600.0)
    guard = Guard(guarded.policy)
    now = snap.now.timestamp()
    starving = sum(1 for j in guarded.pending if guard.starving(j, now))
    held = decide(clone_snapshot(guarded))
    holds = sum(1 for w in held.waiting.values() if "held for it" in w.detail)
    del held
    decide(clone_snapshot(snap))  # the warm-up pair: both find the layout the previous tick left
    wall: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(2 * ticks + 1):
        for side, which in (("off", snap), ("on", guarded)):
            copy = clone_snapshot(which)
            gc.collect()  # outside the timer, as in time_decide
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = decide(copy)
            wall[side].append((time.perf_counter() - t0) * 1000)
            cpu[side].append((time.process_time() - c0) * 1000)
            del out, copy
    off_median, on_median = statistics.median(wall["off"]), statistics.median(wall["on"])
    return {
        "starving_jobs": starving,
        "holds": holds,
        "pairs": len(wall["off"]),
        "off_median_ms": off_median,
        "on_median_ms": on_median,
        "off_min_ms": min(wall["off"]),
        "on_min_ms": min(wall["on"]),
        "off_cpu_median_ms": statistics.median(cpu["off"]),
        "on_cpu_median_ms": statistics.median(cpu["on"]),
        "ratio": on_median / off_median if off_median else None,
        "ratio_min": min(wall["on"]) / min(wall["off"]) if min(wall["off"]) else None,
    }


def profile_starving(guard: bool, ticks: int) -> None:
    """Run :func:`bench_starving`'s snapshot ``ticks + 1`` times (guard on or off), nothing else timed.

    For a profiler that counts, which wall-clock pairs on a shared VM cannot match: under
    ``valgrind --tool=callgrind --collect-atstart=no --toggle-collect=CPyDef_decide___decide``
    (the compiled core's ``decide``) the instructions run inside ``decide`` are the same from
    run to run, so a change of a percent shows (docs/engine.md, "Starvation guard").
    """
    snap = make_synthetic_snapshot(10000, 1000, 8, 0.7, 8, 0)
    if guard:
        snap.policy = replace(snap.policy, starvation_after_s=60 * 3600.0)
    copies = [clone_snapshot(snap) for _ in range(ticks + 1)]
    for copy in copies:
        decide(copy)
    from scheduling import engine

    side = "on" if guard else "off"
    print(f"engine build: {engine.BUILD}; {ticks + 1} ticks of the starving benchmark, guard {side}")


def bench_decide(
    pending: int = 10000,
    nodes: int = 1000,
    devices_per_node: int = 8,
    busy: float = 0.7,
    teams: int = 8,
    seed: int = 0,
    ticks: int = 7,
    growth: tuple[int, ...] = (1000, 10000, 100000),
) -> dict[str, Any]:
    """Time ``decide`` on the synthetic cluster; ``growth`` repeats it per pending count.

    Returns ``{"pending", "devices", "median_ms", "max_ms", "first_ms", ...,
    "growth": [{"pending": n, "median_ms": ..., "max_ms": ..., "ms_per_1k": ...}]}``.
    ``first_ms`` is a cold tick (no cached layout); ``cpu_median_ms`` the median CPU time.
    """
    snap = make_synthetic_snapshot(pending, nodes, devices_per_node, busy, teams, seed)
    result: dict[str, Any] = {
        "pending": pending,
        "devices": nodes * devices_per_node,
        "running": len(snap.running),
        **time_decide(snap, ticks),
        "split": time_split(snap, ticks),
    }
    # The tick after: the cluster as the first tick left it, 30 s later.
    after = next_tick(snap, decide(clone_snapshot(snap)))
    timing = time_decide(after, ticks)
    result["next_tick"] = {
        "pending": len(after.pending),
        "running": len(after.running),
        **{k: timing[k] for k in ("median_ms", "max_ms", "cpu_median_ms", "starts", "preemptions")},
        "split": time_split(after, ticks),
    }
    result["starving"] = bench_starving(snap, ticks)
    rows = []
    for n in growth:
        snap_n = make_synthetic_snapshot(n, nodes, devices_per_node, busy, teams, seed)
        timing = time_decide(snap_n, max(3, ticks if n <= 20000 else 3))
        rows.append(
            {
                "pending": n,
                "median_ms": timing["median_ms"],
                "max_ms": timing["max_ms"],
                "first_ms": timing["first_ms"],
                "cpu_median_ms": timing["cpu_median_ms"],
                "ms_per_1k": timing["median_ms"] / (n / 1000),
            }
        )
    result["growth"] = rows
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--busy", type=float, default=0.7)
    parser.add_argument("--ticks", type=int, default=7)
    parser.add_argument("--growth", default="1000,10000,100000")
    parser.add_argument(
        "--profile-starving",
        choices=("off", "on"),
        help="only run the starving benchmark's snapshot (guard off or on) for --ticks ticks after one, "
        "for a profiler to count (no timing printed)",
    )
    args = parser.parse_args(argv)
    if args.profile_starving:
        profile_starving(args.profile_starving == "on", args.ticks)
        return
    growth = tuple(int(x) for x in args.growth.split(",") if x)
    res = bench_decide(args.pending, args.nodes, args.devices_per_node, args.busy, ticks=args.ticks, growth=growth)
    from scheduling import engine

    print(f"engine build: {engine.BUILD} (NPUPORTAL_ENGINE=python for the plain Python one)")
    print(
        f"decide: {res['pending']} pending, {res['devices']} devices, {res['running']} running: "
        f"median {res['median_ms']:.1f} ms (CPU {res['cpu_median_ms']:.1f} ms), max {res['max_ms']:.1f} ms, "
        f"cold {res['first_ms']:.1f} ms ({res['starts']:.0f} starts, {res['preemptions']:.0f} preemptions)"
    )
    split = res["split"]
    print(
        f"  split: state {split['state_ms']:.1f} ms (free state, running jobs charged), order "
        f"{split['order_ms']:.1f} ms, decide {split['decide_ms']:.1f} ms (admission, placement, preemption, waits)"
    )
    nxt = res["next_tick"]
    print(
        f"next tick (its starts running, 30 s later): {nxt['pending']} pending, {nxt['running']} running: "
        f"median {nxt['median_ms']:.1f} ms (CPU {nxt['cpu_median_ms']:.1f} ms), max {nxt['max_ms']:.1f} ms "
        f"({nxt['starts']:.0f} starts, {nxt['preemptions']:.0f} preemptions)"
    )
    split = nxt["split"]
    print(
        f"  split: state {split['state_ms']:.1f} ms, order {split['order_ms']:.1f} ms, "
        f"decide {split['decide_ms']:.1f} ms"
    )
    for row in res["growth"]:
        print(
            f"  {row['pending']:>7} pending: median {row['median_ms']:8.1f} ms  CPU {row['cpu_median_ms']:8.1f} ms"
            f"  max {row['max_ms']:8.1f} ms  cold {row['first_ms']:8.1f} ms  ({row['ms_per_1k']:.2f} ms per 1k)"
        )


if __name__ == "__main__":
    main()
