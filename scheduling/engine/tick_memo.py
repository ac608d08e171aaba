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
  the tick; :meth:`TickMemo.free_grew` forgets them when cards come back. Holds
  only shrink too, so a try on some of the holds a failed try had fails as well
  — except for slices when a card several holds claim is given one
  (:meth:`TickMemo.slices_lent`).
* ``epoch`` — bumped when a hold is added or the failed placements are
  forgotten: a *stable* wait (one that tried no victims, ``stable``) holds
  across starts while the epoch stands.

A wait is *stable* (``Tick.place`` leaves ``stable`` set) when it cannot change
for the rest of the tick while no hold is added, ``find_fail`` is not cleared
and no reservation starts to hold back devices the job could use: every chip
was within the reservations or short of free devices anyway, placement failed
on every open chip (free cards only shrink), no victim search could run (the
search budget only shrinks, a team only leaves its guarantee) and every open
chip already has a blocked job. Starts elsewhere do not change such a wait, so
the memo keeps it across them.

A stable wait may have tried held cards (the cards of holds the job ends
before), in vain. A failed try is not free of effects: lending the cards and
taking them back moves their pools to the end of their buckets, which later
placements walk. So the memo remembers on which chip models the job looked for
cards (``MemoWait.looked``), and a job given the wait looks again, cheaply: on
each, its placement on free cards and on the held cards *it* ends before must be
failures ``find_fail`` and ``hold_fail`` know (else it is placed in full), and
the pools of those holds move as the try would have moved them. So a stable wait
is the wait of every job of its group (team, class, shape) while the epoch
stands, whatever holds each ends before: the rest of steps 4c-4g depends on the
group only. With the starvation guard a chip model has up to 17 holds; keyed
only by how many shadow times a job's end passes, the waits were worked out again
for each such count of each group after every new epoch.
"""

from __future__ import annotations

import math

from scheduling.engine.placement import Need
from scheduling.engine.snapshot import Wait


class MemoWait:
    """A wait of steps 4c-4g remembered for the jobs of a group after it (see ``Tick.run``)."""

    __slots__ = ("chips", "epoch", "held", "looked", "margin", "seq", "taken", "version", "wait")

    def __init__(
        self,
        chips: tuple[str, ...],
        version: int,
        wait: Wait,
        epoch: int,
        taken: float,
        margin: float,
        looked: tuple[str, ...] = (),
        held: bool = False,
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
        #: The chip models whose free cards (and held ones, if it ended before a hold) the job was
        #: placed on, in vain (``TickMemo.looked``), and whether it tried held cards: a job given
        #: this wait tries them again through ``find_fail`` and ``hold_fail`` (``Tick._retry``).
        self.looked = looked
        self.held = held
        #: When it was written to a :class:`RankMemo` (its count of writes then).
        self.seq = 0


class RankMemo:
    """A group's remembered waits by rank: how many shadow times a job's end passes (``-1``: no estimate).

    A wait remembered ``upward`` answers its rank and every higher one (a longer job ends
    before no more holds: the same tries, or fewer), as if written to each of them then;
    a later write at a rank wins over it. Kept as one entry, where a write per rank above made
    tens of thousands of writes a tick with the starvation guard's holds. Ranks above those that
    existed then are covered too: such a rank only exists after a hold was added, which started
    a new epoch and version, so a wait from before answers nobody there.
    """

    __slots__ = ("at", "count", "up")

    def __init__(self) -> None:
        #: Rank -> the wait written at that rank alone.
        self.at: dict[int, MemoWait] = {}
        #: (lowest rank, wait) of those written for a rank and up, lowest ranks increasing (a
        #: write from a rank replaces those from it or above).
        self.up: list[tuple[int, MemoWait]] = []
        #: Writes so far (``MemoWait.seq``: the later write wins).
        self.count = 0

    def get(self, rank: int) -> MemoWait | None:
        """The wait last written for ``rank``, or ``None``."""
        got = self.at.get(rank)
        up = self.up
        if up and rank >= 0:
            j = len(up) - 1
            while j >= 0:
                item = up[j]
                if item[0] <= rank:
                    if got is None or item[1].seq > got.seq:
                        return item[1]
                    break
                j -= 1
        return got

    def put(self, rank: int, wait: MemoWait, upward: bool = False) -> None:
        """Remember ``wait`` for ``rank``, and for every higher rank if ``upward`` (and ``rank`` >= 0)."""
        self.count += 1
        wait.seq = self.count
        if not upward or rank < 0:
            self.at[rank] = wait
            return
        up = self.up
        while up and up[-1][0] >= rank:
            up.pop()
        up.append((rank, wait))


class TickMemo:
    """The tick's shrink-only memory of the free state (see the module's docstring)."""

    __slots__ = ("epoch", "find_fail", "held", "hold_fail", "looked", "stable", "version")

    def __init__(self) -> None:
        #: Bumped whenever the free state changes; keys the memo of waits.
        self.version = 0
        #: Bumped when a hold is added or ``find_fail`` is cleared.
        self.epoch = 0
        #: Whether the placement being worked out is a stable wait (set by ``Tick.place``).
        self.stable = False
        #: The chip models the placement being worked out looked for free cards on (in order),
        #: and whether it tried held cards on one of them.
        self.looked: list[str] = []
        self.held = False
        #: Per need, the chip models its placement failed on (a held card given a slice stays
        #: hidden from plain placement, so a start on held cards leaves it as it is). Keyed by the
        #: need (hashed by identity), not by a ``(need, chip)`` tuple built for every look-up.
        self.find_fail: dict[Need, set[str]] = {}
        #: Same for placements that may use some holds' cards: per need and chip model the masks of
        #: those holds' places in their chip model's list. The holds only shrink too, and fewer
        #: holds' cards fit no more, so a mask within a failed one fails as well (:func:`covered`).
        self.hold_fail: dict[Need, dict[str, list[int]]] = {}

    def failed(self, need: Need, chip: str) -> bool:
        """Whether placing ``need`` on ``chip``'s free cards failed."""
        chips = self.find_fail.get(need)
        return chips is not None and chip in chips

    def fail(self, need: Need, chip: str) -> None:
        """Placing ``need`` on ``chip``'s free cards failed."""
        chips = self.find_fail.get(need)
        if chips is None:
            self.find_fail[need] = {chip}
        else:
            chips.add(chip)

    def hold_failures(self, need: Need, chip: str) -> list[int] | None:
        """The masks of the holds whose cards ``need`` failed to fit on ``chip`` with, if any."""
        by_chip = self.hold_fail.get(need)
        return by_chip.get(chip) if by_chip is not None else None

    def hold_failed(self, need: Need, chip: str, which: int) -> None:
        """``need`` did not fit on ``chip`` with the cards of the holds of mask ``which``."""
        by_chip = self.hold_fail.get(need)
        if by_chip is None:
            self.hold_fail[need] = {chip: [which]}
        elif chip in by_chip:
            by_chip[chip].append(which)
        else:
            by_chip[chip] = [which]

    def free_grew(self) -> None:
        """Cards came back to the free state mid-tick: forget what assumed it only shrinks."""
        self.find_fail.clear()
        self.hold_fail.clear()
        self.epoch += 1
        self.version += 1

    def slices_lent(self, chip: str) -> None:
        """A hold on ``chip`` lends a sliced card it did not: forget failed slice tries on its holds.

        A card several holds claim (a later starving job's hold takes it after an earlier one's
        job) given a slice through one hold becomes a sliced card of them all. Whole cards are
        unaffected (a sliced card is not free).
        """
        for need, by_chip in self.hold_fail.items():
            if need.template is not None:
                by_chip.pop(chip, None)

    def set_aside(self) -> SetAside:
        """``with memo.set_aside():`` failed placements start empty inside and come back after.

        For a placement that sees cards the rest of the tick does not (a promised job's
        own cards): what failed without them says nothing about it, and what fails with
        them says nothing about the others.
        """
        return SetAside(self)


def passed(times: list[float], t: float) -> int:
    """How many of the sorted ``times`` lie before ``t`` (``bisect.bisect_left``).

    Written out: compiled, it is a loop over a typed list, where ``bisect_left`` is a call
    through the interpreter's calling convention, made for every waiting job while holds exist.
    """
    lo = 0
    hi = len(times)
    if hi and times[hi - 1] < t:  # a third of the waiting jobs end after every shadow time
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if times[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Ranks:
    """:func:`passed` over one sorted list of times, through a grid of cells over their span.

    ``Tick.run`` counts, for each of a full queue's waiting jobs, the shadow times its end
    passes; with the starvation guard there are dozens of them (a binary search over
    ``MAX_HOLDS_PER_CHIP`` per chip model for each of 10,000 jobs). The grid gives the count at
    the start of the end's cell, and a step or two over the times in the cell finds the exact
    one: the answer is :func:`passed`'s whatever rounding placed the end in a neighbouring
    cell. Built in one pass over the times, when a tick's list of them changes.
    """

    __slots__ = ("cells", "grid", "hi", "lo", "n", "scale", "times")

    def __init__(self, times: list[float]) -> None:
        self.times = times
        n = self.n = len(times)
        # (The first and last times kept as floats of their own: read for every job, unboxed once.)
        self.lo = lo = times[0] if n else 0.0
        self.hi = times[n - 1] if n else 0.0
        span = self.hi - lo
        self.cells = cells = 2 * n
        #: Cells per second (0: no grid, when the times do not span a finite length).
        #: A few times are searched as fast as a grid is built: none below eight.
        self.scale = scale = cells / span if n >= 8 and 0.0 < span < math.inf else 0.0
        grid: list[int] = []
        if scale > 0.0:
            width = span / cells
            r = 0
            for b in range(cells + 1):
                edge = lo + b * width
                while r < n and times[r] < edge:
                    r += 1
                grid.append(r)
        self.grid = grid

    def count(self, t: float) -> int:
        """How many of the times lie before ``t``: ``passed(times, t)``."""
        n = self.n
        if n == 0 or t <= self.lo:
            return 0
        if self.hi < t:
            return n
        times = self.times
        if self.scale == 0.0:
            return passed(times, t)
        b = int((t - self.lo) * self.scale)
        if b > self.cells:
            b = self.cells
        r = self.grid[b]
        while r > 0 and times[r - 1] >= t:
            r -= 1
        while r < n and times[r] < t:
            r += 1
        return r


def covered(which: int, failed: list[int]) -> bool:
    """Whether the holds of mask ``which`` are all among those of one of the ``failed`` masks."""
    for mask in failed:
        if which & ~mask == 0:
            return True
    return False


class SetAside:
    """The context of :meth:`TickMemo.set_aside`."""

    __slots__ = ("find_fail", "hold_fail", "memo")

    def __init__(self, memo: TickMemo) -> None:
        self.memo = memo
        self.find_fail = memo.find_fail
        self.hold_fail = memo.hold_fail

    def __enter__(self) -> None:
        self.memo.find_fail = {}
        self.memo.hold_fail = {}

    def __exit__(self, *exc: object) -> None:
        self.memo.find_fail = self.find_fail
        self.memo.hold_fail = self.hold_fail


class ShadowMemo:
    """The starving jobs' shadow replays of one tick, per chip model and card count.

    The starvation guard gives up to ``MAX_HOLDS_PER_CHIP`` starving jobs per chip
    model a shadow time each, and a job that may run on several models replays
    every one of them to keep the earliest. Each replay walked the chip's expected
    releases from now: the walks grew with the holds before them, and most of a
    tick with a long starving backlog went into them. Two facts cut that down,
    neither of them a rule (``backfill.shadow`` answers the same without them):

    * **Same inputs, same answer.** A replay reads the free state of one chip
      model's pools and the releases on them. ``chip_version`` counts the
      changes to those (a start, a hold, a promise on the model); a replay of
      the same model and card count at the same version and ``epoch`` is the
      one already made (``results``).
    * **A floor.** Within an ``epoch`` cards only come free *later*: a start
      takes free cards until its job ends, a hold until its job would end, a
      promise until its job would. Fit is monotone in the free cards, so a
      shape that did not fit before ``t`` in one replay fits no earlier in a
      later one, as long as neither replay started from a free state it fitted
      already (``find_fail`` says so). The replay still applies the releases
      before the floor, but tries no placement there (``floors``).

    ``epoch`` is bumped (:meth:`earlier`) whenever cards may come free sooner:
    a preemption (its victims leave at their deadline), cards coming back to
    the free state, a promised job's turn (its cards are lent to it, its claim
    may lapse), a start on held cards (an ordinary hold's cards never came
    back in a replay; the started job's do).
    """

    __slots__ = ("chip_version", "epoch", "floors", "results")

    def __init__(self) -> None:
        #: Bumped when cards may come free earlier than a replay assumed (anywhere).
        self.epoch = 0
        #: Per chip model: bumped when its free state or its releases change.
        self.chip_version: dict[str, int] = {}
        #: ``(chip, cards) -> (epoch, chip version, answer)`` of the last replay.
        self.results: dict[tuple[str, int], tuple[int, int, tuple[float, list[int]] | None]] = {}
        #: ``(chip, cards) -> (epoch, shadow time)`` of the last replay that found a time.
        self.floors: dict[tuple[str, int], tuple[int, float]] = {}

    def changed(self, chip: str) -> None:
        """The free state or the releases of ``chip`` changed (cards only come free later)."""
        self.chip_version[chip] = self.chip_version.get(chip, 0) + 1

    def earlier(self) -> None:
        """Cards may come free sooner than the replays so far assumed: forget them all."""
        self.epoch += 1
        self.results.clear()
        self.floors.clear()

    def answer(self, chip: str, cards: int) -> tuple[bool, tuple[float, list[int]] | None]:
        """``(True, answer)`` if this replay was made at the current state, else ``(False, None)``."""
        got = self.results.get((chip, cards))
        if got is not None and got[0] == self.epoch and got[1] == self.chip_version.get(chip, 0):
            return True, got[2]
        return False, None

    def floor(self, chip: str, cards: int) -> float:
        """The earliest a replay of ``cards`` on ``chip`` may fit (``-inf``: no floor known)."""
        got = self.floors.get((chip, cards))
        if got is not None and got[0] == self.epoch:
            return got[1]
        return -math.inf

    def keep(self, chip: str, cards: int, found: tuple[float, list[int]] | None, from_no_fit: bool) -> None:
        """Remember a replay's answer; its time is a floor if it started from a free state without a fit."""
        self.results[(chip, cards)] = (self.epoch, self.chip_version.get(chip, 0), found)
        if from_no_fit and found is not None:
            self.floors[(chip, cards)] = (self.epoch, found[0])
