"""The cheapest retry plan over a survival curve: when to try next, given how long a failure has lasted.

Pure, no I/O. The classic optimal-inspection problem (Barlow and Proschan): an
outage ends at an unknown time T whose survival S(t) = P(T > t) is known
(piecewise linear, from the learned records or from a true distribution); each
try that finds it still on costs *try_cost* seconds' worth, and every second
between T and the try that finds it over costs one. A small dynamic program over
a grid of the curve's points gives, for each grid point, the least expected cost
of what is left once a try there failed (unnormalised: weighted by S), once per
curve; the next try after *elapsed* seconds is then one pass over the points in
reach. Gaps between tries stay within the policy's ``[base_delay, max_delay]``.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import pairwise

#: Grid points per segment of the curve (its survival is linear between knots, so
#: more points only refine where a try may fall, not the model).
SUBDIVISIONS = 2
#: Grid points per max_delay at least, where the curve's segments are longer.
PER_MAX_DELAY = 4
#: At most this many grid points: a segment is cut finer only while the grid is smaller.
GRID_MAX = 400
#: Levels of tries left the recursion keeps at most (past them, the last one's costs).
LEVELS_MAX = 64


def horizon(max_retries: int, *, base_delay: float, multiplier: float, max_delay: float) -> float:
    """Seconds from a task's first failure to the last try of the policy's exponential
    schedule without jitter: the furthest the default backoff reaches."""
    total, delay = 0.0, base_delay
    for _ in range(max_retries):
        total += min(delay, max_delay)
        delay = min(delay * multiplier, max_delay * 2)  # no overflow however many retries
    return total


def not_before(horizon_s: float, tries_left: int, *, max_delay: float) -> float:
    """The earliest time (s since the first failure) the next try may come so that the
    tries left after it, *max_delay* apart, still reach *horizon_s*: a plan that
    keeps to it never runs out of attempts before the default backoff would."""
    return horizon_s - max(0, tries_left - 1) * max_delay


class Schedule:
    """The optimal-inspection plan's costs over one survival curve and one policy.

    *knots*: (t, S(t)) with t rising from 0 and S not rising; S is linear between
    them and the last knot is where the plan ends (the end of what the curve knows).
    The state of the recursion is a grid point where a try failed and the tries
    left after it; a state from which those tries, *max_delay* apart, cannot reach
    *reach* (the policy's own last try, :func:`horizon`) is not allowed, so a plan
    never runs out of attempts before the default backoff would. A task whose tries
    are spent past *reach* is dead-lettered: what is left of it is priced as if it
    waited until the curve's end.
    """

    __slots__ = (
        "_ahead_rows",
        "_area",
        "_cost",
        "_s",
        "_t",
        "base_delay",
        "max_delay",
        "reach",
        "try_cost",
    )

    def __init__(
        self,
        knots: Sequence[tuple[float, float]],
        *,
        try_cost: float,
        base_delay: float,
        max_delay: float,
        reach: float = 0.0,
        max_tries: int = LEVELS_MAX,
    ) -> None:
        if len(knots) < 2:
            raise ValueError("a curve needs at least two knots")
        self.try_cost = float(try_cost)
        self.base_delay = float(base_delay)
        self.max_delay = max(float(max_delay), 1e-3)
        self.reach = float(reach)
        times, survival = _grid(knots, self.max_delay)
        self._t = times
        self._s = survival
        # The area under S up to each point: the lag of the tasks recovering between
        # two tries is S(a) * (b - a) - (area(b) - area(a)).
        area = [0.0]
        for k in range(1, len(times)):
            area.append(area[-1] + (times[k] - times[k - 1]) * (survival[k] + survival[k - 1]) / 2)
        self._area = area
        #: _cost[k][i]: the least expected cost (unnormalised) after a failed try at
        #: point i with k tries left; levels past the last are the last one's.
        self._cost: list[list[float]] = []
        self._ahead_rows: list[list[float]] = []
        self._fill_costs(max(0, min(max_tries, LEVELS_MAX)))

    @property
    def end(self) -> float:
        """The last grid point: the plan's last try, the end of what the curve knows."""
        return self._t[-1]

    def survival(self, t: float) -> float:
        times, s = self._t, self._s
        if t >= times[-1]:
            return s[-1]
        if t <= times[0]:
            return s[0]
        k = bisect_right(times, t) - 1
        share = (t - times[k]) / (times[k + 1] - times[k])
        return s[k] + (s[k + 1] - s[k]) * share

    def _area_at(self, t: float) -> float:
        times = self._t
        if t >= times[-1]:
            return self._area[-1] + (t - times[-1]) * self._s[-1]
        k = max(0, bisect_right(times, t) - 1)
        return self._area[k] + (t - times[k]) * (self._s[k] + self.survival(t)) / 2

    def _dead(self, t: float, s_t: float, area_t: float) -> float:
        """A task given up after a failed try at *t* (past reach): as if it waited to the end."""
        if t >= self._t[-1]:
            return 0.0
        return s_t * (self._t[-1] - t) - (self._area[-1] - area_t)

    def _level(self, k: int) -> list[float]:
        return self._cost[min(k, len(self._cost) - 1)]

    def _ahead(self, k: int) -> list[float]:
        """Per point j, what a next try there adds whatever the last one was, with *k*
        tries left after it: try_cost * S(j) - area(j) + cost(j, k). The lag from a failed
        try at t is then s_t * (t_j - t) + area(t) - area(j)."""
        k = min(k, len(self._cost) - 1)
        while len(self._ahead_rows) <= k:
            level = self._cost[len(self._ahead_rows)]
            c = self.try_cost
            self._ahead_rows.append(
                [c * s - a + rest for s, a, rest in zip(self._s, self._area, level, strict=True)]
            )
        return self._ahead_rows[k]

    def _from(self, t: float, s_t: float, area_t: float, k: int, j0: int) -> float:
        """The least cost after a failed try at *t* with *k* tries left, its next try
        among the points from *j0* within max_delay (inf when the tries left cannot
        reach far enough; a task given up when none is left)."""
        times = self._t
        n = len(times)
        if t + k * self.max_delay < self.reach - 1e-9:
            return math.inf
        if k == 0 or t >= times[-1]:
            return self._dead(t, s_t, area_t)
        ahead = self._ahead(k - 1)
        hi = bisect_right(times, t + self.max_delay, j0)
        if hi <= j0:
            hi = min(j0 + 1, n)  # a grid coarser than max_delay: the next point
        best = min([a + s_t * x for a, x in zip(ahead[j0:hi], times[j0:hi], strict=True)])
        return best + area_t - s_t * t

    def _fill_costs(self, levels: int) -> None:
        """The backward recursion, level by level (tries left), until a level is its
        predecessor again: more tries than the plan wants change nothing."""
        times, s, area = self._t, self._s, self._area
        n = len(times)
        last = times[-1]
        starts = [
            min(bisect_left(times, t + self.base_delay, i + 1), n - 1) for i, t in enumerate(times)
        ]
        for k in range(levels + 1):
            row = [0.0] * n
            self._cost.append(row)
            row[n - 1] = 0.0 if last + k * self.max_delay >= self.reach - 1e-9 else math.inf
            for i in range(n - 1):
                row[i] = self._from(times[i], s[i], area[i], k, starts[i])
            if k > self.reach / self.max_delay + 1 and row == self._cost[k - 1]:
                self._cost.pop()
                break

    def cost_from(self, t: float, tries_left: int) -> float:
        """The least expected cost (unnormalised) of what is left after a failed try at
        *t* with *tries_left* tries."""
        if t >= self._t[-1]:
            return 0.0 if t + tries_left * self.max_delay >= self.reach - 1e-9 else math.inf
        j0 = min(bisect_left(self._t, t + self.base_delay), len(self._t) - 1)
        return self._from(t, self.survival(t), self._area_at(t), tries_left, j0)

    def next_try(
        self, elapsed: float, *, earliest: float, latest: float, tries_left: int
    ) -> float | None:
        """When (s since the first failure) to try next after a failure *elapsed* s old
        with *tries_left* tries (this one included): the cheapest point in [earliest,
        latest]; None once *elapsed* is past the curve's end or it holds no outage
        lasting that long (the caller's fallback)."""
        if elapsed >= self._t[-1] or self.survival(elapsed) <= 0 or tries_left < 1:
            return None
        latest = max(latest, earliest)
        times = self._t
        s_e, area_e = self.survival(elapsed), self._area_at(elapsed)
        c = self.try_cost
        after = tries_left - 1

        lag = s_e * (earliest - elapsed) - (self._area_at(earliest) - area_e)
        best_at = earliest
        best = c * self.survival(earliest) + lag + self.cost_from(earliest, after)
        ahead = self._ahead(after)
        lo, hi = bisect_left(times, earliest), bisect_right(times, latest)
        if hi > lo:
            values = [a + s_e * x for a, x in zip(ahead[lo:hi], times[lo:hi], strict=True)]
            j = min(range(len(values)), key=values.__getitem__)
            if values[j] + area_e - s_e * elapsed < best:
                best_at = times[lo + j]
        return best_at


def _grid(
    knots: Sequence[tuple[float, float]], max_delay: float
) -> tuple[list[float], list[float]]:
    """The knots with points between them (S linear there), cut where S reaches 0."""
    times: list[float] = []
    survival: list[float] = []
    span = knots[-1][0] - knots[0][0]
    # Fine enough that a try may fall every quarter of max_delay, within GRID_MAX.
    step = max(max_delay / PER_MAX_DELAY, span / GRID_MAX if span > 0 else 0.0)
    for (t0, s0), (t1, s1) in pairwise(knots):
        if t1 <= t0:
            continue
        pieces = max(SUBDIVISIONS, math.ceil((t1 - t0) / step)) if step > 0 else SUBDIVISIONS
        for p in range(pieces):
            times.append(t0 + (t1 - t0) * p / pieces)
            survival.append(s0 + (s1 - s0) * p / pieces)
        if s1 <= 0:
            times.append(t1)
            survival.append(0.0)
            return times, survival
    times.append(knots[-1][0])
    survival.append(max(0.0, knots[-1][1]))
    return times, survival
