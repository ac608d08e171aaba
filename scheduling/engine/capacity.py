"""The cluster's free state for one tick: who holds which device, what is free.

Built once per tick from the snapshot and then updated in place as the tick
starts jobs, so placement never rescans the cluster. The layout is chosen for
the hot path (10k pending jobs against 8k devices in a few milliseconds):

* a *pool* is the devices of one chip model on one node; its free whole cards
  are a bitmask (bit ``i`` = ``pool.devs[i]``) and its topology groups (HCCS
  rings) are masks over the same bits;
* each chip model keeps its pools in *buckets* keyed by ``(g, f)``: ``f`` free
  cards in the pool, ``g`` free cards in its best group. A job of ``n`` cards
  walks a precomputed list of bucket keys in strategy order (binpack: fullest
  node first; spread: emptiest first) and takes the first pool it finds, so a
  placement costs a handful of dict probes, not a scan of 1,000 nodes;
* ``max_group_free`` per chip answers "does an ``n``-card job fit anywhere?"
  in O(1), which is what makes the long tail of a full cluster cheap;
* vNPU slices: sliced cards sit in buckets by remaining AI cores;
* lookup tables per chip and group layout: the bucket key of a free mask
  (``Pool.ktab``) and the cards best fit takes for ``(free mask, n)``
  (:meth:`Chip.pick`), filled on first use;
* the static part (pools, groups, buckets' shape, device index, the lookup
  tables and the static shape checks of :mod:`placement`) and everything else
  kept from one tick to the next is a :class:`layout.Layout`, with its
  lifetime stated there; this module is the one tick's view of it
  (:class:`ClusterState`): it resets or patches the layout's free fields,
  marks the running jobs, and changes the free state only through its methods;
* :meth:`ClusterState.tentative` tries changes to the free state and puts
  them back (Kueue's ``SimulateWorkloadRemoval``, Volcano's ``Statement``).

Device units: a whole card is 1; a vNPU slice is ``template.ai_cores /
card.ai_cores`` of a card (quota, reservations and fair share all count so).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from operator import attrgetter

from scheduling.engine.layout import EPS, Card, Chip, Layout, Occupant, Pool, inventory_fingerprint, lowest_bits  # noqa: F401 (re-exported)
from scheduling.engine.snapshot import JobState, RunningDelta, Snapshot, VnpuTemplate

_IDX = attrgetter("idx")


class ClusterState:
    """Free state of the whole cluster for one tick (see the module docstring)."""

    def __init__(self, snapshot: Snapshot, strategy: str, now: float) -> None:
        self.strategy = strategy
        self.now = now
        self.templates: Mapping[tuple[str, str], VnpuTemplate] = snapshot.templates
        layout = self._layout = Layout.get(snapshot.nodes, snapshot.inventory_key, snapshot.inventory_values)
        #: The layout went back to the cache (:meth:`release`): this state is dead.
        self._released = False
        self.chips: dict[str, Chip] = layout.chips
        self.pools: list[Pool] = layout.pools
        #: device id -> (pool, index)
        self.where: dict[int, tuple[Pool, int]] = layout.where
        self.largest_node = layout.largest_node
        #: Shapes resolved against this inventory, kept with the layout while the templates stay.
        if layout.needs_templates != self.templates:
            layout.needs = {}
            layout.needs_templates = dict(self.templates)
        self.needs = layout.needs
        self._card_jobs: dict[int, list[int]] | None = None
        self.occupants: dict[int, Occupant] = {}
        #: Some running or started job holds a vNPU slice (fractional units: no incremental sums).
        self.has_slices = False
        #: :meth:`running_totals` carried its sums on the layout; with it, what changed since
        #: the previous tick's (``None``: counted from scratch); :attr:`card_jobs` patches with it.
        self._carried = False
        #: ``(tick number it is from, gone, new)``.
        self._diff: tuple[int, list[Occupant], list[Occupant]] | None = None
        #: This tick's number on the layout, and the changes :meth:`_occupy_changes` found
        #: since the tick that left ``held`` (``(that tick, gone, new)``).
        self.gen = -1
        #: The caller keeps its job objects between ticks (see :meth:`occupy`): only then is
        #: anything about the running jobs carried to the next tick.
        self.reuse = False
        self._occ_diff: tuple[int, list[Occupant], list[Occupant]] | None = None
        #: Jobs started in this tick (taken out of ``card_jobs`` again before it is kept).
        self._started: list[Occupant] = []
        self._delta = snapshot.running_delta
        #: The caller's running list keeps its order (see ``RunningDelta.in_order``).
        self.in_order = False
        #: Pools whose free cards this tick changed (the next tick puts them back first).
        self._touched: list[Pool] = []
        #: The running jobs already leaving (``preempt_deadline`` set), in the running list's order.
        self.leaving: list[Occupant] = []
        #: Occupants this tick made leave (victims): with :attr:`leaving`, the only ones whose
        #: tick field a carried-over running set must clear.
        self.marked: list[Occupant] = []

    def release(self) -> None:
        """The tick is over: hand the layout back for the next tick (this state is dead after)."""
        layout = self._layout
        if not self._released:
            self._released = True
            occ_map = layout.occ_map
            for occ in self._started:  # the kept running set is the one the tick began with
                if occ_map.get(occ.job.id) is occ:
                    del occ_map[occ.job.id]
            layout.touched = self._touched
            layout.stale = (self.leaving, self.marked)
            cj = self._card_jobs
            if cj is not None and self._carried and not self.has_slices:
                for occ in self._started:  # back to the jobs running when the tick began
                    _card_jobs_drop(cj, occ)
                layout.card_jobs = (self.gen, cj)
            layout.put_back()

    def _changes(self, before: dict[int, Occupant]) -> tuple[list[Occupant], list[Occupant]] | None:
        """Occupants gone since ``before`` and new ones, or ``None`` when rebuilding is cheaper.

        Only a caller that reuses its job objects (the simulator) keeps occupants
        between ticks (see :meth:`occupy`); a database tick's are all new, and
        there the diff would cost more than the rebuild it saves.
        """
        occupants = self.occupants
        get = occupants.get
        removed = [occ for jid, occ in before.items() if get(jid) is not occ]
        if len(removed) * 4 > len(occupants) + 16:
            return None
        prev = before.get
        added = [occ for jid, occ in occupants.items() if prev(jid) is not occ]
        if (len(removed) + len(added)) * 4 > len(occupants) + 16:
            return None
        return removed, added

    def running_totals(self) -> dict[str, list]:
        """team -> ``[units, {chip: units}, jobs]`` over the running jobs, whole cards only.

        Every unit is a whole card here, so the sums are exact in any order and
        can be carried from the last tick on this layout: only the jobs that
        ended or started since are added or taken away (the simulator's ticks
        differ by a few jobs out of thousands). The dict is shared with the
        layout: read it, never change it.
        """
        layout = self._layout
        assert layout is not None and not self.has_slices
        occupants = self.occupants
        if not self.reuse:  # new objects every tick (the database's): nothing to carry over
            layout.totals = None
            totals: dict[str, list] = {}
            for occ in occupants.values():
                _add_total(totals, occ, 1.0)
            return totals
        self._carried = True
        known = self._occ_diff
        # The running set as counted, for a next tick that cannot say what changed (no
        # running delta): a copy of it, unless this one could (the next will too, most likely).
        base = dict(occupants) if known is None else None
        cached = layout.totals
        if cached is not None:
            if known is not None and known[0] == cached[2]:  # occupy already knows what changed
                diff: tuple[list[Occupant], list[Occupant]] | None = (known[1], known[2])
            elif cached[0] is not None:
                diff = self._changes(cached[0])
            else:
                diff = None
            if diff is not None:
                self._diff = (cached[2], *diff)
                totals = cached[1]
                for sign, occs in ((-1.0, diff[0]), (1.0, diff[1])):
                    for occ in occs:
                        _add_total(totals, occ, sign)
                layout.totals = (base, totals, self.gen)
                return totals
        totals = {}
        for occ in occupants.values():
            _add_total(totals, occ, 1.0)
        layout.totals = (base, totals, self.gen)
        return totals

    @property
    def card_jobs(self) -> dict[int, list[int]]:
        """device id -> job ids on it (one for a whole card, several slices); built on first use.

        With whole cards only (one job per card, so no order to keep) the last
        tick's map is patched with the jobs that came and went since.
        """
        cj = self._card_jobs
        if cj is None:
            layout = self._layout
            cached = layout.card_jobs if layout is not None else None
            if layout is not None:
                layout.card_jobs = None  # this tick owns the map now (or it is stale)
            diff = self._diff
            if cached is not None and diff is not None and cached[0] == diff[0] and not self.has_slices:
                cj = self._card_jobs = cached[1]
                for occ in diff[1]:
                    _card_jobs_drop(cj, occ)
                for occ in diff[2]:
                    _card_jobs_add(cj, occ)
                for occ in self._started:
                    _card_jobs_add(cj, occ)
                return cj
            cj = self._card_jobs = {}
            for occ in self.occupants.values():
                _card_jobs_add(cj, occ)
        return cj

    def add_occupant(self, occ: Occupant, sliced: bool | None = None) -> None:
        """Record a job started in this tick (after its cards were taken); ``sliced``: it holds a slice, if known."""
        jid = occ.job.id
        self.occupants[jid] = occ
        self._started.append(occ)
        if not self.has_slices and (any(card[2] is not None for card in occ.cards) if sliced is None else sliced):
            self.has_slices = True
        cj = self._card_jobs
        if cj is not None:
            _card_jobs_add(cj, occ)

    def occupy(
        self,
        running: Iterable[JobState],
        evicted: set[int],
        reuse: bool = False,
        leaving: list[JobState] | None = None,
    ) -> None:
        """Mark the running jobs' devices taken (jobs in ``evicted`` are gone). Once, on a fresh state.

        ``reuse``: the caller keeps its job objects from tick to tick (it passes an
        inventory key); then the cards held at the last tick are kept on the layout
        and only the jobs that came and went since are applied (:meth:`_occupy_changes`).
        With a ``Snapshot.running_delta`` as well, even the free state and the running
        set are carried over (:meth:`_occupy_delta`): the tick costs what changed.
        ``leaving``: the running jobs with a ``preempt_deadline``, in order, if the caller
        has them (found by a scan if not).
        """
        layout = self._layout
        layout.gen += 1
        self.gen = layout.gen
        self.reuse = reuse
        held = layout.held
        layout.held = None
        running = running if isinstance(running, list) else list(running)
        delta = self._delta if reuse else None
        in_order = self.in_order = delta is not None and delta.in_order
        stale = layout.stale
        if not in_order:
            layout.by_end = None
        image = layout.image and not layout.sliced and delta is not None and delta.since == layout.delta_version
        layout.delta_version = delta.version if delta is not None else None
        if leaving is None:
            leaving = [job for job in running if job.preempt_deadline is not None]
        if image and held is not None and self._occupy_delta(running, evicted, held, delta):  # type: ignore[arg-type]
            self._find_leaving(leaving)
            if layout.by_end is not None:
                diff = self._occ_diff
                assert diff is not None  # set by _occupy_delta
                self._update_by_end(diff[1], diff[2], stale)
            return
        layout.by_end = None
        layout.reset()
        self.occupants = {}
        if reuse and held is not None and layout.held_seen:
            jobs = running
            if evicted:
                jobs = [job for job in jobs if job.id not in evicted]
            if not self._occupy_changes(jobs, held):
                layout.reset()  # half applied: start again from nothing held
                self.occupants.clear()
                self._occupy_all(jobs, set(), reuse)
        else:
            self._occupy_all(running, evicted, reuse)
        layout.occ_map = self.occupants if reuse else {}
        if in_order:  # running positions, in the running list's order (so is the dict)
            seq = layout.seq
            for occ in self.occupants.values():
                occ.seq = seq
                seq += 1
            layout.seq = seq
        layout.evicted_last = set(evicted)
        # (``self._layout``, not ``layout``: the type checker still sees the ``None`` set above,
        # and a compiled build would check the value against it.)
        if delta is not None and self._layout.held is not None:
            self._keep_image()
        self._find_leaving(leaving)

    def _find_leaving(self, jobs: list[JobState]) -> None:
        """:attr:`leaving` from the running jobs with a deadline, in the running list's order
        (what breaks ties between leaving jobs)."""
        occupants = self.occupants
        leaving = self.leaving = []
        for job in jobs:
            occ = occupants.get(job.id)
            if occ is not None and occ.job is job:
                occ.leaving = job.preempt_deadline
                leaving.append(occ)

    def by_end(self, running: list[JobState]) -> dict[str, list[Occupant]]:
        """Running jobs with cards (started before this tick) per chip model, by expected end.

        Ties keep the running list's order (what the shadow replay reads first). For a
        caller whose list keeps its order, the lists are kept on the layout and patched
        from tick to tick (:meth:`_update_by_end`); otherwise sorted here. Read only.
        """
        layout = self._layout
        kept = layout.by_end
        if kept is not None:
            return {name: occs for name, (_, occs) in kept.items()}
        now = self.now
        by_chip: dict[str, list[Occupant]] = {}
        occupants = self.occupants
        if self.in_order:  # the running set is kept in the list's order
            for occ in occupants.values():
                if occ.cards and occ.job.started_at is not None:
                    occs = by_chip.get(occ.chip)
                    if occs is None:
                        by_chip[occ.chip] = [occ]
                    else:
                        occs.append(occ)
        else:
            for job in running:
                found = occupants.get(job.id)
                if found is not None and found.job is job and found.cards and job.started_at is not None:
                    occs = by_chip.get(found.chip)
                    if occs is None:
                        by_chip[found.chip] = [found]
                    else:
                        occs.append(found)
        out: dict[str, list[Occupant]] = {}
        keep: dict[str, tuple[list[tuple[float, int]], list[Occupant]]] = {}
        for name, occs in by_chip.items():
            ends = ends_of(occs, now)
            order = sorted(range(len(occs)), key=ends.__getitem__)
            out[name] = ordered = [occs[i] for i in order]
            if self.in_order:
                keys = []
                for i in order:
                    occ = occs[i]
                    occ.sort_end = ends[i]
                    keys.append((ends[i], occ.seq))
                keep[name] = (keys, ordered)
        if self.in_order:
            layout.by_end = keep
        return out

    def _update_by_end(self, gone: list[Occupant], added: list[Occupant], stale: tuple[list[Occupant], ...]) -> None:
        """Patch ``Layout.by_end`` with the jobs that left, came, or changed deadline since the last tick.

        A kept end still holds while it lies after ``now`` (see :func:`end_of`): when the
        earliest does not, the lists are dropped and sorted afresh when next needed.
        """
        layout = self._layout
        kept = layout.by_end
        assert kept is not None
        now = self.now
        moved = {id(occ): occ for group in stale for occ in group}  # deadlines may have changed
        for occ in self.leaving:
            moved[id(occ)] = occ
        for occ in gone:
            moved[id(occ)] = occ
        for occ in added:  # a job that started since and already leaves is new, not moved: once
            moved.pop(id(occ), None)
        for occ in moved.values():  # take them out where they were sorted
            entry = kept.get(occ.chip)
            if entry is None or not occ.cards:
                continue
            keys, occs = entry
            i = bisect_left(keys, (occ.sort_end, occ.seq))
            if i < len(occs) and occs[i] is occ:
                del keys[i]
                del occs[i]
        occupants = self.occupants
        back = [occ for occ in moved.values() if occupants.get(occ.job.id) is occ]
        for occ in [*back, *added]:
            if not occ.cards or occ.job.started_at is None:
                continue
            entry = kept.get(occ.chip)
            if entry is None:
                entry = kept[occ.chip] = ([], [])
            keys, occs = entry
            end = end_of(occ, now)
            occ.sort_end = end
            key = (end, occ.seq)
            i = bisect_left(keys, key)
            keys.insert(i, key)
            occs.insert(i, occ)
        for keys, _ in kept.values():
            if keys and keys[0][0] <= now:
                layout.by_end = None
                return

    def _keep_image(self) -> None:
        """Record the free state as the tick begins, for the next tick's :meth:`_occupy_delta`."""
        for chip in self.chips.values():
            chip.members = [list(bucket) for bucket in chip.buckets]  # in pool order, as just bucketed
            chip.counts0 = list(chip.group_count)
            chip.top0 = chip.max_group_free
            chip.free0 = chip.free_units
            chip.dirty = set()
        for pool in self.pools:
            pool.key0 = pool.key
        self._layout.image = True

    def _occupy_delta(self, running: list[JobState], evicted: set[int], held: list[int], delta: RunningDelta) -> bool:
        """Start from the last tick's image and apply ``delta``: ``False`` (nothing changed) when it does not hold.

        Builds what :meth:`_occupy_all` would: the same free masks, buckets in
        pool order, per-chip counts and free units (whole cards: integer sums), one
        occupant per running job with its tick fields cleared. The running set is
        kept by job id, in the running list's order only when the caller promises
        ``in_order``: what depends on that order (:attr:`leaving`, the shadow time's
        releases) walks the running list otherwise. Everything is checked before
        anything is changed.
        """
        layout = self._layout
        occ_map = layout.occ_map
        evicted_last = layout.evicted_last
        gone: dict[int, Occupant] = {}
        for job in delta.ended:
            occ = occ_map.get(job.id)
            if occ is None:
                if job.id in evicted_last:
                    continue  # left out as evicted last tick, stopped since
                return False
            if occ.job is not job:
                return False
            gone[job.id] = occ
        if evicted_last and not evicted_last <= ({job.id for job in delta.ended} | evicted):
            return False  # an evicted job is back without being stopped: count the long way
        for jid in evicted:
            occ = occ_map.get(jid)
            if occ is not None:
                gone[jid] = occ
        new_held = list(held)
        changed: set[Pool] = set()
        for occ in gone.values():
            for pool, i, _ in occ.cards:
                new_held[pool.idx] &= ~(1 << i)
                changed.add(pool)
        added: list[Occupant] = []
        seq = layout.seq
        for job in delta.started:
            if job.id in evicted:
                continue
            if job.id in occ_map and job.id not in gone:
                return False
            occ = self._whole_card_occupant(job, new_held, changed)
            if occ is None:
                return False
            occ.seq = seq
            seq += 1
            added.append(occ)
        layout.seq = seq
        # The promise holds: apply it.
        for jid in gone:
            del occ_map[jid]
        for occ in added:
            occ_map[occ.job.id] = occ
        leaving, marked = layout.stale  # the tick fields the last tick set, cleared
        for occ in leaving:
            occ.leaving = None
        for occ in marked:
            occ.leaving = None
        self.occupants = occ_map  # (expected ends carry over while they hold: see end_of)
        for pool in layout.touched:  # back to the free state the last tick began with
            pool.free = pool.usable & ~held[pool.idx]
            pool.key = pool.key0
        chips = self.chips
        moved: set[str] = set()
        for pool in changed:
            chip = chips[pool.chip]
            before = pool.usable & ~held[pool.idx]
            free = pool.free = pool.usable & ~new_held[pool.idx]
            chip.free0 += free.bit_count() - before.bit_count()
            key = pool.ktab.get(free)
            if key is None:
                key = chip.bucket_key(pool)
            old = pool.key0
            if key != old:
                chip.members[old].remove(pool)
                insort(chip.members[key], pool, key=_IDX)
                chip.dirty.add(old)
                chip.dirty.add(key)
                width = chip.size + 1
                chip.counts0[old // width] -= 1
                chip.counts0[key // width] += 1
                pool.key0 = key
                moved.add(chip.name)
            pool.key = key
        for chip in chips.values():
            if chip.name in moved:
                counts = chip.counts0
                top = len(counts) - 1
                while top > 0 and counts[top] == 0:
                    top -= 1
                chip.top0 = top
            if chip.dirty:
                buckets = chip.buckets
                members = chip.members
                for key in chip.dirty:
                    buckets[key] = dict.fromkeys(members[key])
                chip.dirty = set()
            chip.group_count = list(chip.counts0)
            chip.max_group_free = chip.top0
            chip.free_units = chip.free0
        if layout.seen_slots:
            layout.seen_slots = {}  # the running set is kept here now; the slots index is stale
        self._occ_diff = (layout.held_gen, list(gone.values()), added)
        layout.held = new_held
        layout.held_seen = False  # (``seen_slots`` was emptied above)
        layout.held_gen = self.gen
        layout.evicted_last = set(evicted)
        self.has_slices = False
        return True

    def _occupy_changes(self, jobs: list[JobState], base: list[int]) -> bool:
        """Occupy from the last tick's cards: ``False`` (nothing to trust) when that does not apply.

        It applies when every running job is a whole-card job known by its slots
        tuple (``seen_slots``) or new, the set changed by a few jobs, and no card is
        claimed twice. The result is what :meth:`_occupy_all` would build: the same
        free masks (usable and not held), occupants in the running list's order,
        pools bucketed in pool order.
        """
        layout = self._layout
        seen = layout.seen_slots
        cur = {id(job.slots): job for job in jobs}
        if len(cur) != len(jobs):  # a tuple shared by two jobs (``()``): count them the long way
            return False
        gone = seen.keys() - cur.keys()
        new = cur.keys() - seen.keys()
        if (len(gone) + len(new)) * 4 > len(jobs) + 16:
            return False
        held = list(base)
        removed = []
        for key in gone:
            hit = seen.pop(key)
            removed.append(hit[6])
            for pool, i, _ in hit[1]:
                held[pool.idx] &= ~(1 << i)
        added = []
        for key in new:
            job = cur[key]
            occ = self._whole_card_occupant(job, held, None)
            if occ is None:
                return False
            seen[key] = [job.slots, occ.cards, occ.units, occ.usable_units, occ.chip, None, occ]
            added.append(occ)
        occupants = self.occupants
        for key, job in cur.items():  # the running list's order (its keys are distinct)
            occ = seen[key][6]
            if occ is None or occ.job is not job:
                return False
            occ.expected_end = None
            occ.leaving = job.preempt_deadline
            occupants[job.id] = occ
        for pool, mask in zip(self.pools, held, strict=True):
            pool.free = pool.usable & ~mask
        self._occ_diff = (layout.held_gen, removed, added)
        layout.held = held
        layout.held_seen = True
        layout.held_gen = self.gen
        self.has_slices = False
        self._bucket_all(set())
        return True

    def _whole_card_occupant(self, job: JobState, held: list[int], changed: set[Pool] | None) -> Occupant | None:
        """A new running job's occupant, its cards marked in ``held`` (and their pools in ``changed``).

        ``None`` where the short ways stop (an unknown card, a vNPU slice, a card
        already held, no card at all): the caller then counts the long way.
        """
        slot_info = self._layout.slot_info
        cards: list[tuple[Pool, int, VnpuTemplate | None]] = []
        usable_units = 0.0
        chip_name = ""
        for slot in job.slots:
            info = slot_info.get(slot.device_id)
            if info is None or slot.vnpu_template is not None:
                return None
            pool, _, usable, card = info
            bit = 1 << card[1]
            if held[pool.idx] & bit:
                return None  # claimed twice
            held[pool.idx] |= bit
            if changed is not None:
                changed.add(pool)
            chip_name = pool.chip
            if usable:
                usable_units += 1.0
            cards.append(card)
        if not cards:
            return None
        return Occupant(job, chip_name, float(len(cards)), cards, usable_units, None, job.preempt_deadline)

    def _occupy_all(self, running: Iterable[JobState], evicted: set[int], reuse: bool) -> None:
        """:meth:`occupy` job by job."""
        templates = self.templates
        chips = self.chips
        occupants = self.occupants
        sliced: set[Pool] = set()
        layout = self._layout
        slot_info = layout.slot_info
        # Whole-card jobs already seen by this layout, by their slots tuple: the
        # simulator keeps a running job's tuple from tick to tick. A tuple of
        # frozen slots is a value, so the same object means the same cards;
        # the entry keeps the tuple alive so its id cannot be reused. Entries
        # not seen in this tick are dropped.
        # (A caller that builds new objects every tick, the database, never hits: no index.)
        seen = layout.seen_slots if reuse else {}
        kept: dict[int, list] = {}
        # Such a caller has nothing to patch :attr:`card_jobs` from: it is built here, in the
        # order the property would build it (running jobs, then their cards), at little cost.
        cj: dict[int, list[int]] | None = None if reuse else {}
        for job in running:
            if evicted and job.id in evicted:
                continue
            slots = job.slots
            hit = seen.get(id(slots)) if reuse else None
            if hit is not None and hit[0] is slots:
                masks = hit[5]
                if masks is None:  # second sighting: worth a mask per node
                    merged: dict[Pool, int] = {}
                    for pool, i, _ in hit[1]:
                        merged[pool] = merged.get(pool, -1) & ~(1 << i)
                    masks = hit[5] = tuple(merged.items())
                for pool, keep in masks:
                    pool.free &= keep
                kept[id(slots)] = hit
                occ = hit[6]
                if occ is not None and occ.job is job:  # the same run as last tick: only its tick fields change
                    occ.expected_end = None
                    occ.leaving = job.preempt_deadline
                else:
                    occ = hit[6] = Occupant(job, hit[4], hit[2], hit[1], hit[3], None, job.preempt_deadline)
                occupants[job.id] = occ
                continue
            cards: list[tuple[Pool, int, VnpuTemplate | None]] = []
            mine: list[int] | None = None  # the job's list in ``cj``, shared by its cards
            units = usable_units = 0.0
            chip_name = job.chip_model
            located: str | None = None
            whole = True
            for slot in slots:
                info = slot_info.get(slot.device_id)
                if info is None:  # device gone from the inventory: count it, place nothing
                    units += 1.0
                    if slot.vnpu_template is not None:
                        whole = False
                    continue
                pool, keep, usable, card = info
                chip_name = located = pool.chip
                pool.free &= keep
                if cj is not None:  # (see _card_jobs_add)
                    pool.jobs_changed += 1
                    on_card = cj.get(slot.device_id)
                    if on_card is None:
                        if mine is None:
                            mine = [job.id]
                        cj[slot.device_id] = mine
                    else:
                        cj[slot.device_id] = [*on_card, job.id]
                tmpl = None
                if slot.vnpu_template is not None:
                    whole = False
                    tmpl = templates.get((chip_name, slot.vnpu_template))
                if tmpl is None:
                    units += 1.0
                    if usable:
                        usable_units += 1.0
                    cards.append(card)
                    continue
                i = card[1]
                pool.used_cores[i] += tmpl.ai_cores
                pool.used_mem[i] += tmpl.memory_mb
                pool.used_cpus[i] += tmpl.ai_cpus
                pool.slices[i] += 1
                sliced.add(pool)
                u = chips[chip_name].slice_units(tmpl)
                units += u
                if usable:
                    usable_units += u
                cards.append((pool, i, tmpl))
            # expected_end is worked out when a shadow time needs it (see :func:`end_of`)
            occ = Occupant(job, chip_name or "", units, cards, usable_units, None, job.preempt_deadline)
            if whole and cards and reuse:
                kept[id(slots)] = [slots, cards, units, usable_units, located, None, occ]
            occupants[job.id] = occ
        layout.seen_slots = kept
        if cj is not None:
            self._card_jobs = cj
        self.has_slices = bool(sliced)
        layout.sliced |= sliced
        if reuse and not sliced and len(kept) == len(occupants):
            layout.held = self._held_masks(kept)
            layout.held_seen = True
            layout.held_gen = self.gen
        self._bucket_all(sliced)

    def _held_masks(self, kept: dict[int, list]) -> list[int] | None:
        """Cards held per pool by the jobs in ``kept``, or ``None`` when a card is held twice."""
        held = [0] * len(self.pools)
        for hit in kept.values():
            for pool, i, _ in hit[1]:
                bit = 1 << i
                if held[pool.idx] & bit:
                    return None
                held[pool.idx] |= bit
        return held

    def _bucket_all(self, sliced: set[Pool]) -> None:
        """Every pool into its bucket (all empty after the reset), in pool order."""
        for chip in self.chips.values():
            free_units = 0.0
            width = chip.size + 1
            buckets = chip.buckets
            counts = chip.group_count
            top = chip.max_group_free
            for pool in chip.pools:
                free = pool.free
                key = pool.ktab.get(free)
                if key is None:
                    key = chip.bucket_key(pool)
                buckets[key][pool] = None
                pool.key = key
                g = key // width
                counts[g] += 1
                if g > top:
                    top = g
                free_units += free.bit_count()
                if pool in sliced:
                    for i in range(pool.size):
                        if pool.slices[i] and pool.usable >> i & 1:
                            free_units += self._slice_left(chip, pool, i) / chip.card_cores
                            self._rebucket_slice(chip, pool, i, None)
            chip.max_group_free = top
            chip.free_units = free_units

    # -- slices --------------------------------------------------------------

    @staticmethod
    def _slice_left(chip: Chip, pool: Pool, i: int) -> int:
        return max(pool.devs[i].ai_cores - pool.used_cores[i], 0)

    def _rebucket_slice(self, chip: Chip, pool: Pool, i: int, old_left: int | None) -> None:
        if old_left is not None:
            chip.slice_buckets[old_left].pop((pool, i), None)
        if pool.slices[i] and pool.usable >> i & 1:
            chip.slice_buckets[self._slice_left(chip, pool, i)][(pool, i)] = None

    def hide_slices(self, pool: Pool, i: int) -> None:
        """Take a sliced card out of slice placement (held for a blocked job); :meth:`show_slices` undoes it.

        Its slices stay; a slice started on it puts it back (:meth:`take_slice`).
        """
        chip = self.chips[pool.chip]
        chip.slice_buckets[self._slice_left(chip, pool, i)].pop((pool, i), None)

    def show_slices(self, pool: Pool, i: int) -> None:
        self._rebucket_slice(self.chips[pool.chip], pool, i, None)

    # -- taking devices ------------------------------------------------------

    def take_whole(self, pool: Pool, mask: int) -> None:
        """Give the cards in ``mask`` (free ones) to a job."""
        self._touched.append(pool)
        pool.free &= ~mask
        self.chips[pool.chip].rebucket(pool)

    def release_whole(self, pool: Pool, mask: int) -> None:
        """Undo :meth:`take_whole` (used for the backfill hold, never for running jobs)."""
        self._touched.append(pool)
        pool.free |= mask & pool.usable
        self.chips[pool.chip].rebucket(pool)

    def tentative(self, parts: list[tuple[list[tuple[Pool, int]], list[tuple[Pool, int]]]]) -> Tentative:
        """Lend held cards to a try; see :class:`Tentative` (``with state.tentative(parts) as lent: ...``)."""
        return Tentative(self, parts)

    def take_slice(self, pool: Pool, i: int, tmpl: VnpuTemplate) -> None:
        chip = self.chips[pool.chip]
        bit = 1 << i
        old_left: int | None = None
        if not self._released:  # (a released layout may be another tick's by now)
            self._layout.sliced.add(pool)
        if pool.slices[i]:
            old_left = self._slice_left(chip, pool, i)
        elif pool.free & bit:
            self.take_whole(pool, bit)
        pool.used_cores[i] += tmpl.ai_cores
        pool.used_mem[i] += tmpl.memory_mb
        pool.used_cpus[i] += tmpl.ai_cpus
        pool.slices[i] += 1
        self._rebucket_slice(chip, pool, i, old_left)


class Tentative:
    """Free-state changes tried and put back: held cards released for a try, held again on exit.

    Kueue's ``SimulateWorkloadRemoval`` and Volcano's ``Statement`` for the change a
    tick tries: lending the cards of backfill holds to one placement. Each *part*
    (one hold) is a list of ``(pool, mask)`` whole cards and a list of
    ``(pool, card)`` sliced cards. Entering releases the masks and shows the
    slices, part by part; leaving hides the slices again, then takes back, part by
    part, the lent cards still free except those given away (:meth:`give`: the
    cards the tried placement is about to start on). :attr:`kept` then holds, per
    part, the ``(pool, mask)`` pairs held again. The order of these steps is the
    order of the buckets later placements walk, so it is kept as it is.
    """

    def __init__(self, state: ClusterState, parts: list[tuple[list[tuple[Pool, int]], list[tuple[Pool, int]]]]) -> None:
        self.state = state
        self.parts = parts
        self.given: dict[Pool, int] = {}
        self.kept: list[list[tuple[Pool, int]]] = []

    def give(self, cards: list[tuple[Pool, int]]) -> None:
        """Commit these lent cards to the try: they are not held again on exit."""
        given = self.given
        for pool, i in cards:
            given[pool] = given.get(pool, 0) | (1 << i)

    def __enter__(self) -> Tentative:
        state = self.state
        for wholes, sliced in self.parts:
            for pool, mask in wholes:
                state.release_whole(pool, mask)
            for pool, i in sliced:
                state.show_slices(pool, i)
        return self

    def __exit__(self, kind: object, value: object, trace: object) -> None:
        state = self.state
        for _, sliced in self.parts:
            for pool, i in sliced:
                state.hide_slices(pool, i)
        given = self.given
        for wholes, _ in self.parts:
            kept: list[tuple[Pool, int]] = []
            for pool, mask in wholes:
                rest = mask & ~given.get(pool, 0) & pool.free
                if rest:
                    state.take_whole(pool, rest)
                    kept.append((pool, rest))
            self.kept.append(kept)


def _card_jobs_add(cj: dict[int, list[int]], occ: Occupant) -> None:
    """Put ``occ``'s job on its cards in a ``card_jobs`` map.

    The lists of the map are never changed in place, only replaced: so the cards a
    job has to itself share one list (a whole-card job of 8 cards makes one, not 8;
    a tick's 10,000 such lists were a tenth of its allocations).
    """
    jid = occ.job.id
    mine: list[int] | None = None
    for pool, i, _ in occ.cards:
        pool.jobs_changed += 1
        dev = pool.ids[i]
        jobs = cj.get(dev)
        if jobs is None:
            if mine is None:
                mine = [jid]
            cj[dev] = mine
        else:
            cj[dev] = [*jobs, jid]


def _card_jobs_drop(cj: dict[int, list[int]], occ: Occupant) -> None:
    """Take ``occ``'s job off its cards in a ``card_jobs`` map (replacing lists, see :func:`_card_jobs_add`)."""
    jid = occ.job.id
    for pool, i, _ in occ.cards:
        pool.jobs_changed += 1
        dev = pool.ids[i]
        jobs = cj.get(dev)
        if jobs is not None and jid in jobs:
            rest = [j for j in jobs if j != jid]
            if rest:
                cj[dev] = rest
            else:
                del cj[dev]


def _add_total(totals: dict[str, list], occ: Occupant, sign: float) -> None:
    """Add (``sign`` 1) or take away (-1) one whole-card job in :meth:`ClusterState.running_totals`."""
    team = occ.job.team
    units = sign * occ.units
    row = totals.get(team)
    if row is None:
        row = totals[team] = [0.0, {}, 0]
    row[0] += units
    chips = row[1]
    left = chips.get(occ.chip, 0.0) + units
    if left:
        chips[occ.chip] = left
    else:
        chips.pop(occ.chip, None)
    row[2] += 1 if sign > 0 else -1
    if not row[2]:
        del totals[team]


def expected_end(job: JobState, now: float) -> float:
    """When a running job should end: start + estimate, or + max duration, never before now.

    A job that overran its estimate is expected to run to its max duration; one
    that overran both is taken to end "now" for planning, one that has neither
    has no known end (``inf``). A leaving job ends at its grace deadline at the
    latest.
    """
    start = job.started_at if job.started_at is not None else now
    end = start + job.estimated_duration_s if job.estimated_duration_s > 0 else float("inf")
    if end <= now and job.max_duration_s:
        end = start + job.max_duration_s
    if end == float("inf") and job.max_duration_s:
        end = start + job.max_duration_s
    end = max(end, now)
    if job.preempt_deadline is not None:
        end = min(end, max(job.preempt_deadline, now))
    return end


def end_of(occ: Occupant, now: float) -> float:
    """When ``occ``'s cards come free: its expected end, or its grace deadline if earlier.

    ``expected_end`` is kept with the time it was worked out at: it depends on ``now``
    only where ``now`` clamps it (an overrun estimate, a deadline already passed), so a
    value that lies after a later ``now``, worked out for the same deadline, is still
    right then (a running set carried from tick to tick reuses it).
    """
    end = occ.expected_end
    if (
        end is None
        or occ.job.preempt_deadline != occ.end_deadline
        or (now != occ.end_now and not (now > occ.end_now and end > now))
    ):
        end = occ.expected_end = expected_end(occ.job, now)
        occ.end_now = now
        occ.end_deadline = occ.job.preempt_deadline
    leaving = occ.leaving
    return end if leaving is None else min(end, leaving)


def ends_of(occs: list[Occupant], now: float) -> list[float]:
    """``[end_of(occ, now) for occ in occs]``, inlined: a shadow time needs it for every running job."""
    inf = float("inf")
    out: list[float] = []
    append = out.append
    for occ in occs:
        end = occ.expected_end
        if (
            end is None
            or occ.job.preempt_deadline != occ.end_deadline
            or (now != occ.end_now and not (now > occ.end_now and end > now))
        ):
            job = occ.job
            start = job.started_at if job.started_at is not None else now
            est = job.estimated_duration_s
            end = start + est if est > 0 else inf
            longest = job.max_duration_s
            if longest and (end <= now or end == inf):
                end = start + longest
            if end < now:
                end = now
            deadline = job.preempt_deadline
            if deadline is not None:
                end = min(end, max(deadline, now))
            occ.expected_end = end
            occ.end_now = now
            occ.end_deadline = deadline
        leaving = occ.leaving
        append(end if leaving is None or end <= leaving else leaving)
    return out


def slot_units(state: ClusterState, device_id: int, template: str | None) -> float:
    """Device units of one slot (1 for a whole card)."""
    if template is None:
        return 1.0
    loc = state.where.get(device_id)
    if loc is None:
        return 1.0
    chip = state.chips[loc[0].chip]
    tmpl = state.templates.get((chip.name, template))
    return chip.slice_units(tmpl) if tmpl is not None else 1.0
