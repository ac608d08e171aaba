"""Reservation ratios: a share of healthy devices held for some priority classes.

A reservation ``ratio`` over a scope (all chips, or some chip models) holds
``R = floor(ratio x usable devices in the scope)`` devices for its classes.
The reserved classes' own running usage counts toward ``R`` (a reservation is
a floor on what those classes can get at once, not an extra on top of it), so
a job of any *other* class may start only if afterwards

    free devices in scope >= R - units the reserved classes already use there.

Jobs of the reserved classes are not limited by their own reservation. The
check runs on device units, so vNPU slices count as fractions; it runs before
placement, and a job it stops waits with ``ReservedCapacity``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from scheduling.engine.capacity import Chip, Occupant
from scheduling.engine.policy import Reservation


class _Held:
    __slots__ = ("ceiling", "chips", "reserved", "spec", "used")

    def __init__(self, spec: Reservation, chips: list[Chip]) -> None:
        self.spec = spec
        self.chips = chips
        usable = sum(c.usable_count for c in chips)
        self.reserved = math.floor(spec.ratio * usable + 1e-9)
        #: The most a non-reserved job could take in the scope with every usable card free.
        self.ceiling = float(usable - self.reserved)
        self.used = 0.0

    def headroom(self) -> float:
        """Units a non-reserved job may still take in the scope."""
        free = sum(c.free_units for c in self.chips)
        return free - max(0.0, self.reserved - self.used)


class ReservationLedger:
    """The policy's reservations against the tick's free state."""

    def __init__(
        self,
        specs: Iterable[Reservation],
        chips: Mapping[str, Chip],
        occupants: Iterable[Occupant],
    ) -> None:
        self.held: list[_Held] = []
        for spec in specs:
            scope = [c for name, c in chips.items() if spec.chip_models is None or name in spec.chip_models]
            self.held.append(_Held(spec, scope))
        self._applies: dict[tuple[str, str], list[_Held]] = {}
        self._counts: dict[tuple[str, str], list[_Held]] = {}
        self._room: dict[tuple[str, str], float] = {}
        self._text: dict[tuple[str, str], str] = {}
        #: Starts counted so far, and their units (headroom shrinks by at most the units taken).
        self.starts = 0
        self.taken = 0.0
        #: Last exact headroom per (class, chip) and :attr:`taken` then (see :meth:`surely_fits`).
        self._known: dict[tuple[str, str], tuple[float, float]] = {}
        if self.held:
            counts_of = self._counts
            for occ in occupants:
                key = (occ.job.priority_class, occ.chip)
                counts = counts_of.get(key)
                if counts is None:
                    counts = self._counts_for(*key)
                for h in counts:
                    h.used += occ.usable_units

    def limiting(self, cls: str, chip: str) -> list[_Held]:
        """Reservations that limit a job of ``cls`` on ``chip`` (cached)."""
        key = (cls, chip)
        found = self._applies.get(key)
        if found is None:
            found = self._applies[key] = [
                h
                for h in self.held
                if cls not in h.spec.priority_classes and (h.spec.chip_models is None or chip in h.spec.chip_models)
            ]
        return found

    def headroom(self, cls: str, chip: str) -> float:
        """Units a job of ``cls`` may take on ``chip`` now (``inf`` when nothing limits it).

        Memoised until the next start (:meth:`on_start` clears it): the long tail
        of a full queue asks the same question thousands of times.
        """
        key = (cls, chip)
        room = self._room.get(key)
        if room is None:
            limits = self._applies.get(key)
            if limits is None:
                limits = self.limiting(cls, chip)
            room = math.inf
            first = True
            for h in limits:
                free = 0.0
                for c in h.chips:
                    free += c.free_units
                held = h.reserved - h.used
                r = free - (held if held > 0.0 else 0.0)
                if first or r < room:
                    room, first = r, False
            self._room[key] = room
            self._known[key] = (room, self.taken)
        return room

    def ceiling(self, cls: str, chip: str) -> float:
        """The most a job of ``cls`` could take on ``chip`` with every usable card free (``inf``: no limit).

        Whatever runs, a reservation keeps its scope's reserved cards from other classes
        (its own classes' jobs take from the same cards): a job larger than this waits for
        no card to come free, only for the policy or the inventory to change. Constant
        for the tick.
        """
        return min((h.ceiling for h in self.limiting(cls, chip)), default=math.inf)

    def forget(self) -> None:
        """The free state changed other than by a start: headrooms worked out so far are void."""
        self._room.clear()
        self._known.clear()
        self._text.clear()

    def save(self) -> tuple[dict, dict, dict]:
        """What :meth:`restore` puts back: the headrooms worked out so far (for a free state to come back to)."""
        return dict(self._room), dict(self._known), dict(self._text)

    def restore(self, saved: tuple[dict, dict, dict]) -> None:
        self._room, self._known, self._text = saved

    def on_taken(self, units: float) -> None:
        """Free cards were taken other than by a start (held for a job): headroom shrank by ``units``."""
        self.taken += units
        if self._room:
            self._room.clear()
        if self._text:
            self._text.clear()

    def surely_fits(self, cls: str, chip: str, units: float) -> bool:
        """A cheap ``units <= headroom(cls, chip)``: ``True`` only when it certainly holds.

        Headroom only shrinks during a tick, by at most the units started since
        it was last worked out (:attr:`taken`), so the last exact value minus
        those units (and a slack for float sums) is a lower bound. ``False``
        means "work it out" (:meth:`headroom`), not "does not fit".
        """
        known = self._known.get((cls, chip))
        if known is None:
            return False
        room, taken = known
        bound = room - (self.taken - taken)
        return units < bound - 1e-6 * (1.0 + abs(bound))

    def on_start(self, cls: str, chip: str, units: float) -> None:
        """Count a started (or running) job of ``cls`` toward the reservations held for it."""
        counts = self._counts.get((cls, chip))
        if counts is None:
            counts = self._counts_for(cls, chip)
        for h in counts:
            h.used += units
        self.starts += 1
        self.on_taken(units)

    def _counts_for(self, cls: str, chip: str) -> list[_Held]:
        """Reservations held for ``cls`` whose scope includes ``chip`` (cached)."""
        counts = self._counts[(cls, chip)] = [
            h
            for h in self.held
            if cls in h.spec.priority_classes and (h.spec.chip_models is None or chip in h.spec.chip_models)
        ]
        return counts

    def describe(self, cls: str, chip: str) -> str:
        """Which reservation holds the devices back, in words (memoised like :meth:`headroom`)."""
        key = ("?" + cls, chip)
        text = self._text.get(key)
        if text is None:
            text = self._text[key] = self._describe(cls, chip)
        return text

    def _describe(self, cls: str, chip: str) -> str:
        limits = self.limiting(cls, chip)
        if not limits:
            return ""
        h = min(limits, key=lambda x: x.headroom())
        return (
            f"reservation {h.spec.name}: {h.reserved} held for "
            f"{', '.join(sorted(h.spec.priority_classes))}, "
            f"{sum(c.free_units for c in h.chips):g} free"
        )
