"""``tick_memo.RankMemo`` answers as the dict it replaced, written rank by rank, did.

The memo of a group's waits used to write a stable wait to its rank and to every rank above, up
to the number of shadow times; :class:`RankMemo` keeps one entry for "this rank and up". These
tests write random sequences of both kinds to both and compare every rank read after each write.
"""

from __future__ import annotations

import random

import pytest

from scheduling.engine.snapshot import Wait
from scheduling.engine.tick_memo import MemoWait, RankMemo


def _wait(n: int) -> MemoWait:
    return MemoWait(("910B4",), n, Wait("Resources", f"wait {n}"), n, 0.0, -1.0)


@pytest.mark.parametrize("seed", range(20))
def test_rank_memo_reads_as_writes_to_every_rank_did(seed: int) -> None:
    """Every rank the old memo had reads the same wait; a rank it did not have reads nothing, or a
    wait from before the last hold was added (its version is gone: the tick takes it for none)."""
    rng = random.Random(seed)
    memo = RankMemo()
    plain: dict[int, MemoWait] = {}
    top = rng.randint(1, 20)  # shadow times so far (ranks 0..top); holds only add more
    grown_at = 0  # the write count when the last hold was added (a new version)
    for n in range(200):
        if rng.random() < 0.05:
            top += 1
            grown_at = n
        rank = rng.randint(-1, top)
        wait = _wait(n)
        if rank >= 0 and rng.random() < 0.5:
            memo.put(rank, wait, upward=True)
            for r in range(rank, top + 1):
                plain[r] = wait
        else:
            memo.put(rank, wait)
            plain[rank] = wait
        for r in range(-1, top + 1):
            got = memo.get(r)
            if r in plain:
                assert got is plain[r], f"rank {r} after write {n}"
            else:
                assert got is None or got.version < grown_at, f"rank {r} after write {n}"


def test_a_later_write_at_a_rank_wins_and_a_later_write_from_below_covers_it() -> None:
    memo = RankMemo()
    first, second, third = _wait(1), _wait(2), _wait(3)
    memo.put(2, first, upward=True)
    assert memo.get(1) is None and memo.get(2) is first and memo.get(7) is first
    memo.put(5, second)
    assert memo.get(5) is second and memo.get(4) is first and memo.get(6) is first
    memo.put(1, third, upward=True)
    assert memo.get(5) is third and memo.get(1) is third and memo.get(0) is None
    assert memo.get(-1) is None
