"""What a tick remembers to answer the long tail of a full queue fast, and for how long.

Nothing here is policy: every rule of :mod:`decide` would give the same answers
without it, only slower (the differential and fast-path tests hold it to that).

**Lifetime: one tick.** A :class:`TickMemo` is made by ``decide.Tick`` and
dropped with it; nothing here is carried to the next tick (what is, the free
state's layout and running totals, lives in :mod:`layout`). Within the tick
each remembered answer rests on one fact about the free state, and is dropped
when that fact stops holding:

* ``version`` — bumped on every change of the free state (a start, a hold, a
  preemption). A wait remembered at a version holds while it stands.
* ``find_fail`` / ``hold_fail`` — placements that failed. Free cards only
  shrink during a tick, so a shape that does not fit now does not fit later in
  the tick; :meth:`TickMemo.free_grew` forgets them when cards come back.
* ``epoch`` — bumped when a hold is added or the failed placements are
  forgotten: a *stable* wait (one that tried no held cards and no victims,
  ``stable``) holds across starts while the epoch stands.

A wait is *stable* (``Tick.place`` leaves ``stable`` set) when it cannot change
for the rest of the tick while no hold is added, ``find_fail`` is not cleared
and no reservation starts to hold back devices the job could use: every chip
was within the reservations or short of free devices anyway, placement failed
on every open chip (free cards only shrink), the held cards were not tried, no
victim search could run (the search budget only shrinks, a team only leaves
its guarantee) and every open chip already has a blocked job. Starts elsewhere
do not change such a wait, so the memo keeps it across them.
"""

from __future__ import annotations

from scheduling.engine.placement import Need
from scheduling.engine.snapshot import Wait


class MemoWait:
    """A wait of steps 4c-4g remembered for the jobs of a group after it (see ``Tick.run``)."""

    __slots__ = ("chips", "epoch", "margin", "taken", "version", "wait")

    def __init__(
        self, chips: tuple[str, ...], version: int, wait: Wait, epoch: int, taken: float, margin: float
    ) -> None:
        #: The chip models admission allowed (the answer holds for the same ones).
        self.chips = chips
        #: The free state's version it was worked out at: the answer holds while it stands.
        self.version = version
        #: The answer, shared by every job it is given to.
        self.wait = wait
        #: ``TickMemo.epoch`` if the wait is stable (it holds across starts while the epoch stands), else -1.
        self.epoch = epoch
        #: ``reservations.taken`` when the reservations were last checked, and the margin found then.
        self.taken = taken
        self.margin = margin


class TickMemo:
    """The tick's shrink-only memory of the free state (see the module's docstring)."""

    __slots__ = ("epoch", "find_fail", "hold_fail", "stable", "version")

    def __init__(self) -> None:
        #: Bumped whenever the free state changes; keys the memo of waits.
        self.version = 0
        #: Bumped when a hold is added or ``find_fail`` is cleared.
        self.epoch = 0
        #: Whether the placement being worked out is a stable wait (set by ``Tick.place``).
        self.stable = False
        #: ``(need, chip)`` whose placement failed (a held card given a slice has room for
        #: more: a start on held cards clears it).
        self.find_fail: set[tuple[Need, str]] = set()
        #: Same for placements that may use some holds' cards (keyed by a mask of those holds'
        #: places in their chip model's list; the holds only shrink too).
        self.hold_fail: set[tuple[Need, str, int]] = set()

    def free_grew(self) -> None:
        """Cards came back to the free state mid-tick: forget what assumed it only shrinks."""
        self.find_fail.clear()
        self.hold_fail.clear()
        self.epoch += 1
        self.version += 1

    def set_aside(self) -> SetAside:
        """``with memo.set_aside():`` failed placements start empty inside and come back after.

        For a placement that sees cards the rest of the tick does not (a promised job's
        own cards): what failed without them says nothing about it, and what fails with
        them says nothing about the others.
        """
        return SetAside(self)


class SetAside:
    """The context of :meth:`TickMemo.set_aside`."""

    __slots__ = ("find_fail", "hold_fail", "memo")

    def __init__(self, memo: TickMemo) -> None:
        self.memo = memo
        self.find_fail = memo.find_fail
        self.hold_fail = memo.hold_fail

    def __enter__(self) -> None:
        self.memo.find_fail = set()
        self.memo.hold_fail = set()

    def __exit__(self, *exc: object) -> None:
        self.memo.find_fail = self.find_fail
        self.memo.hold_fail = self.hold_fail
