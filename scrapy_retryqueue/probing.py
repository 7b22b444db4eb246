"""The next attempt's time that minimises failed attempts and lag under a learned recovery curve.

Pure, no I/O. The classic optimal inspection schedule: an outage ends at an
unknown time T whose survival curve S is learned (recovery.py); attempts at
t1 < t2 < ... each cost *cost* seconds' worth when they fail, and the one that
succeeds costs its lag past T. With the task failing at age a, j attempts left
and its failure after the last one a dead letter (worth *dead_cost*),

    W_j(a) = min over t in [a + earliest, a + latest] of
             (t - a) S(a) - ∫_a^t S  +  cost S(t)  +  W_{j-1}(t),      W_0(t) = dead_cost S(t)

(the first two terms are E[(t - T); a < T <= t], the lag; W is unnormalised,
the expected cost given T > a is W / S(a)). :class:`Schedule` solves it by
dynamic programming once per curve and policy, on a grid of ages; :meth:`Schedule.next`
then picks the first step exactly at the task's own age.
"""

from __future__ import annotations

import bisect
import math

from .recovery import EDGES, Curve, bin_of

#: Ages of the grid per octave, and delays tried per step.
_AGES_PER_OCTAVE = 4
_DELAYS = 16
#: Where the grid of ages starts, seconds (below it: one point at 0).
_FIRST_AGE = 0.25
#: A survival this small is an outage over for certain.
_EPSILON = 1e-9


class Schedule:
    """The cost-to-go of every age on a grid for one curve and one policy's bounds.

    *base* and *latest* bound each delay after the first (the policy's
    base_delay and max_delay); *depth* is how many attempts ahead it looks (the
    policy's max_retries, capped by the caller).
    """

    __slots__ = (
        "_ages",
        "_cumulative",
        "_knots",
        "_survival",
        "_values",
        "base",
        "cost",
        "curve",
        "dead_cost",
        "depth",
        "horizon",
        "latest",
    )

    def __init__(
        self,
        curve: Curve,
        *,
        base: float,
        latest: float,
        depth: int,
        cost: float,
        dead_cost: float,
    ) -> None:
        self.curve = curve
        self.base = max(base, 1e-3)
        self.latest = max(latest, self.base)
        self.depth = max(1, depth)
        self.cost = cost
        self.dead_cost = dead_cost
        bins = len(curve.at_risk)
        # Survival is linear in each bin (Curve.survival): its integral is exact
        # by trapezoids between the bins' edges.
        top = EDGES[bins] if bins < len(EDGES) else EDGES[-1] * math.sqrt(2)
        self._knots = [*EDGES[:bins], top] if bins else [0.0]
        self._survival = [curve.survival(x) for x in self._knots]
        cumulative = [0.0]
        knots, survival = self._knots, self._survival
        for b in range(len(knots) - 1):
            width = knots[b + 1] - knots[b]
            cumulative.append(cumulative[-1] + width * (survival[b] + survival[b + 1]) / 2)
        self._cumulative = cumulative
        #: Past the last age the curve has seen, it says nothing: a task still
        #: failing there is taken as lost whatever is tried.
        self.horizon = top
        octaves = max(0.0, math.log2(top / _FIRST_AGE))
        count = int(octaves * _AGES_PER_OCTAVE) + 1
        self._ages = [0.0] + [_FIRST_AGE * 2 ** (i / _AGES_PER_OCTAVE) for i in range(count)]
        self._values: list[list[float]] = [[dead_cost] * len(self._ages)]
        self._solve()

    # -- the curve, exactly -------------------------------------------------------------

    def survival(self, t: float) -> float:
        return self.curve.survival(t)

    def integral(self, t: float) -> float:
        """∫_0^t S."""
        knots = self._knots
        if t >= knots[-1]:
            return self._cumulative[-1] + (t - knots[-1]) * self._survival[-1]
        b = min(bin_of(t), len(knots) - 2)
        x0 = knots[b]
        return self._cumulative[b] + (t - x0) * (self._survival[b] + self.curve.survival(t)) / 2

    # -- the dynamic programme ----------------------------------------------------------

    def _delays(self, earliest: float) -> list[float]:
        earliest = min(max(earliest, 1e-3), self.latest)
        if self.latest <= earliest * 1.0001:
            return [earliest]
        ratio = (self.latest / earliest) ** (1 / (_DELAYS - 1))
        return [earliest * ratio**i for i in range(_DELAYS)]

    def _value(self, j: int, t: float) -> float:
        """V_j(t) = W_j(t) / S(t), interpolated on the grid of ages."""
        if t >= self.horizon:
            return self.dead_cost
        ages, row = self._ages, self._values[j]
        i = bisect.bisect_right(ages, t)
        if i >= len(ages):
            return row[-1]
        lo, hi = ages[i - 1], ages[i]
        share = (t - lo) / (hi - lo)
        return row[i - 1] + (row[i] - row[i - 1]) * share

    def _step(self, a: float, j: int, delays: list[float]) -> tuple[float, float]:
        """The best next attempt for a task failing at age *a* with *j* attempts left:
        (its time, W_j(a))."""
        s_a, i_a = self.survival(a), self.integral(a)
        best_t, best = a + delays[0], math.inf
        # Within a bin the cost is convex in t: its least is at a bin's edge or
        # near a point of the grid of delays, so both are tried.
        lo, hi = a + delays[0], a + delays[-1]
        edges = [k for k in self._knots if lo < k < hi]
        for t in sorted({a + d for d in delays}.union(edges)):
            d = t - a
            s_t = self.survival(t)
            cost = d * s_a - (self.integral(t) - i_a) + s_t * (self.cost + self._value(j - 1, t))
            if cost < best:
                best_t, best = t, cost
        return best_t, best

    def _solve(self) -> None:
        delays = self._delays(self.base)
        for j in range(1, self.depth + 1):
            row = []
            for a in self._ages:
                s_a = self.survival(a)
                if s_a <= _EPSILON:
                    row.append(0.0)
                    continue
                row.append(self._step(a, j, delays)[1] / s_a)
            self._values.append(row)

    # -- the answer ---------------------------------------------------------------------

    def next(self, since: float, *, earliest: float, attempts: int) -> float | None:
        """The age (seconds since the first failure) of the best next attempt for a task
        failing at *since*, waiting at least *earliest*, with *attempts* left (this one
        included); None when the curve has seen no outage last past *since*."""
        if since >= self.horizon or self.survival(since) <= _EPSILON:
            return None
        j = min(max(1, attempts), self.depth)
        return self._step(since, j, self._delays(max(earliest, self.base)))[0]
