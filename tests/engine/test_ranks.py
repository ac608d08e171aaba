"""``tick_memo.Ranks`` counts the times before a job's end exactly as ``bisect_left`` does.

``Tick.run`` counts the shadow times each waiting job's end passes through a grid over their span
(:class:`Ranks`) once there are eight or more. The grid only says where to start looking: these
tests compare it with ``bisect_left`` on ends at, between, around and beyond the times, with
repeated times and spans from a second to days, where rounding puts an end in the next cell.
"""

from __future__ import annotations

import math
from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine.tick_memo import Ranks, passed

_TIMES = st.lists(
    st.floats(min_value=1.7e9, max_value=1.7e9 + 9 * 86400, allow_nan=False), min_size=0, max_size=60
).map(sorted)


@settings(max_examples=300, deadline=None)
@given(_TIMES, st.lists(st.floats(min_value=1.7e9 - 3600, max_value=1.7e9 + 10 * 86400), max_size=40))
def test_the_count_is_bisect_left_for_any_end(times: list[float], ends: list[float]) -> None:
    ranks = Ranks(times)
    probes = [*ends, *times, *(math.nextafter(t, math.inf) for t in times), *(math.nextafter(t, 0) for t in times)]
    for t in probes:
        assert ranks.count(t) == bisect_left(times, t) == passed(times, t), (times, t)


def test_a_grid_is_built_from_eight_times_and_its_cells_hold_the_counts() -> None:
    times = [100.0 + 10 * i for i in range(8)]  # 100 .. 170: 16 cells of 4.375 s
    ranks = Ranks(times)
    assert ranks.scale > 0 and len(ranks.grid) == 17
    assert ranks.grid[0] == 0 and ranks.grid[-1] == 7  # the last edge is the last time, not before it
    assert [ranks.count(t) for t in (99.0, 100.0, 100.5, 135.0, 169.9, 170.0, 170.1)] == [0, 0, 1, 4, 7, 7, 8]
    assert Ranks(times[:7]).scale == 0.0, "seven times: searched, no grid"
    assert Ranks([*times, math.inf]).scale == 0.0, "a span without an end: searched, no grid"
    assert Ranks([5.0] * 9).count(5.0) == 0 and Ranks([5.0] * 9).count(5.5) == 9
