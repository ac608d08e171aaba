"""Trace replay through the decision core, in simulated time.

The loop is a discrete-event simulation. Events are the next submission, the
next job end, the next preemption grace deadline and the next policy clock edge
(a time-of-day quota window opening or closing, a calendar month starting when a
team has a monthly device-hour budget). All events at one timestamp are applied
together, then :func:`scheduling.engine.decide.decide` is called once with a
:class:`Snapshot` built exactly as the database tick builds it, and its decisions
are applied in the tick's order: evictions, starts, preemptions.

The simulator's own bookkeeping is O(changes) per event: pending jobs live in a
list with O(1) add/remove that is handed to every snapshot as it is (no copy);
running jobs in start order, handed over as a list with a ``RunningDelta`` (what
ended and started since the last snapshot) so the core, too, works on what
changed; the node and device objects are built once and reused (nothing in a
replay makes a device unhealthy), the free-capacity map, usage meters and quota
ledger are touched only when a job starts or stops. The core stays the hot path.

Rules the replay adds around the core (all in ``docs/simulator.md``):

* A job runs for its trace ``duration_s``, which is also its estimated duration.
* A preempted job keeps running until its grace deadline; then ``decide`` is
  expected to evict it. If it does not, the simulator stops it anyway and counts
  a *forced stop* (a sign the core forgot an eviction). A stopped victim is
  requeued with its original submission time or cancelled, per
  ``policy.on_preempt``. It loses the work since its start, or since its last
  checkpoint if it checkpoints (:mod:`work_lost`, the rule the victim search
  weighs): requeued, it runs again for its duration less the work it saved.
* Rows that cannot be read as a job (no duration, no devices, an unknown class) and
  jobs that can never run are skipped before the replay and counted by reason. "Can
  never run" is the engine's one rule (:func:`feasibility.check`, the rule that refuses
  such a job at submission), on the simulated inventory: counted as ``never_runnable``.
* ``decide`` is skipped at an event only when it provably cannot start or
  preempt anything (see :meth:`Simulation._decide_needed`).

It lives beside the decision core, not in it: plain Python, never compiled (the
core is; ``scheduling.engine.COMPILED``), and it calls the core only through
``decide`` and the planning pass. Its parts:

* :mod:`.traces` — trace and cluster files read and checked;
* :mod:`.jobs` — trace preparation: rows become :class:`SimJob`, or are skipped by reason;
* :mod:`.occupancy` — the replay's bookkeeping of pending and running jobs and their cards;
* :mod:`.baselines` — the FIFO and EASY reference schedulers;
* :mod:`.replay` — the event loop (:class:`Simulation`, :func:`run_simulation`);
* :mod:`.metrics` — meters, fairness, percentiles, :func:`compare`.

``scheduling.engine.simulator`` and ``scheduling.engine.traces`` re-export it for
scripts written before the move.
"""

from __future__ import annotations

from scheduling.sim.baselines import BASELINES, EasyBaseline, FifoBaseline, parse_baselines
from scheduling.sim.jobs import SimJob, prepare_jobs
from scheduling.sim.metrics import DecayedMeter, Meter, compare, jain_index
from scheduling.sim.occupancy import SimulationError
from scheduling.sim.replay import DEFAULT_START, DecideFn, ProgressFn, Simulation, run_simulation

__all__ = [
    "BASELINES",
    "DEFAULT_START",
    "DecayedMeter",
    "DecideFn",
    "EasyBaseline",
    "FifoBaseline",
    "Meter",
    "ProgressFn",
    "SimJob",
    "Simulation",
    "SimulationError",
    "compare",
    "jain_index",
    "parse_baselines",
    "prepare_jobs",
    "run_simulation",
]
