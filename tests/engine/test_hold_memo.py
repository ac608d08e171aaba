"""The tick's memo of failed placements on held cards refuses only what a real try refuses.

With the starvation guard a chip model carries many holds, and a job that ends before
some of them may start on their cards (``Tick.find_with_hold``). A try that failed is
remembered (``TickMemo.hold_fail``): a later try on the same holds, or on some of them,
is refused without being made, since free cards and holds only shrink during a tick.
For slices that was not so: a card claimed by several holds (a later starving job's
hold takes it after an earlier one's job) that is given a slice through one hold
becomes a sliced card with room left in all of them, so those holds lend room they
did not lend before. The memo then refused slices that fit. These tests make the real
try beside every refusal the memo gives and require it to fail too.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import pytest

from scheduling import engine
from scheduling.engine import decide as decide_module
from scheduling.engine.bench_core import make_synthetic_snapshot
from scheduling.engine.placement import Need, find
from scheduling.engine.snapshot import Snapshot
from scheduling.engine.tick_memo import covered

pytestmark = pytest.mark.skipif(
    engine.BUILD == "compiled",
    reason="wraps a Tick method, which a compiled build forbids; .ci/run runs it with NPUPORTAL_ENGINE=python",
)


def _starving_world(seed: int) -> Snapshot:
    """A synthetic cluster with a queue old enough that the guard stacks holds (vNPU slices among the jobs)."""
    rng = random.Random(3000 + seed)
    snap = make_synthetic_snapshot(rng.choice((400, 1500, 3000)), rng.choice((30, 100, 300)), 8, 0.7, 8, seed)
    snap.policy = dataclasses.replace(
        snap.policy, starvation_after_s=rng.choice((24.0, 48.0, 60.0)) * 3600.0, backfill=True
    )
    return snap


def _count_wrong_refusals(snap: Snapshot, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """``(refusals from the memo, of which a real try would have fitted)`` in one tick."""
    plain = decide_module.Tick.find_with_hold
    seen = [0, 0]

    def checked(tick: decide_module.Tick, need: Need, chip: str, usable: Any) -> object:
        failed = tick.free_memo.hold_failures(need, chip)
        if failed is not None and covered(usable.which, failed):
            seen[0] += 1
            state = tick.state
            with state.tentative([(hold.free_now, hold.sliced_now) for hold in usable.holds]) as lent:
                fits = find(state, need, chip) is not None
            for hold, kept in zip(usable.holds, lent.kept, strict=True):
                hold.free_now = kept
            seen[1] += fits
        return plain(tick, need, chip, usable)

    monkeypatch.setattr(decide_module.Tick, "find_with_hold", checked)
    decide_module.decide(copy.deepcopy(snap))
    return seen[0], seen[1]


@pytest.mark.parametrize("seed", [3, 18, 0, 5, 9])
def test_memo_refuses_no_held_slice_that_fits(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeds 3 and 18 gave a slice on a card several holds claim; the memo must know what it lends now."""
    refusals, wrong = _count_wrong_refusals(_starving_world(seed), monkeypatch)
    assert refusals > 0, "the world should exercise the memo of failed held-card tries"
    assert wrong == 0, f"{wrong} of {refusals} refusals from the memo would have fitted"
