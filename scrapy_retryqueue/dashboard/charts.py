"""The recovery page's charts, drawn on the server: SVG geometry of curves and budget bars.

Pure: numbers in, coordinates and labels out; the template (recovery.html) writes
the SVG elements, so the page needs no script and no inline style (the CSP).
A curve's time runs on a log scale (outages last from seconds to hours), share over on
a linear one from 0 to 100 %.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

#: The chart's size in SVG units, and its margins (left, bottom, right, top).
WIDTH, HEIGHT = 360, 150
LEFT, BOTTOM, RIGHT, TOP = 34, 18, 8, 6
#: Where the time axis starts, s (bin 0 of the records ends at 0.5 s).
T_MIN = 0.25
#: Candidate time ticks, s, and their labels.
TICKS = (
    (1, "1s"),
    (10, "10s"),
    (60, "1m"),
    (600, "10m"),
    (3600, "1h"),
    (6 * 3600, "6h"),
    (86400, "1d"),
)


@dataclass(frozen=True, slots=True)
class Chart:
    """What recovery.html draws for one curve."""

    width: int
    height: int
    #: The curve: "x,y x,y ..." for a polyline.
    points: str
    #: (x, label) of the time axis; (y, label) of the share axis.
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    #: x of LearnedBackoff's first delay, None when it has none or it is off the chart.
    pick_x: float | None = None
    #: The plot area: left, right, top, bottom.
    box: tuple[float, float, float, float] = (0, 0, 0, 0)


def recovery_chart(
    points: Sequence[Sequence[float]], pick_s: float | None = None, longest: float = 0.0
) -> Chart:
    """The chart of (t, share over after t) *points* (recoverysummary's), with a mark at
    *pick_s*; the time axis reaches the last point (or *longest*, or the pick)."""
    right_edge, bottom_edge = WIDTH - RIGHT, HEIGHT - BOTTOM
    top_t = max([T_MIN * 4, longest, *(p[0] for p in points), pick_s or 0.0])
    span = math.log(top_t / T_MIN)

    def x(t: float) -> float:
        t = min(max(t, T_MIN), top_t)
        return LEFT + (right_edge - LEFT) * math.log(t / T_MIN) / span

    def y(share: float) -> float:
        share = min(max(share, 0.0), 1.0)
        return bottom_edge - (bottom_edge - TOP) * share

    # From nothing over at the axis' start, through each bin's upper edge.
    coords = [(x(T_MIN), y(0.0))] + [(x(t), y(share)) for t, share in points]
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        points=" ".join(f"{a:.1f},{b:.1f}" for a, b in coords),
        x_ticks=[(round(x(t), 1), label) for t, label in TICKS if T_MIN < t <= top_t],
        y_ticks=[(round(y(s), 1), f"{s:.0%}") for s in (0.0, 0.5, 1.0)],
        pick_x=round(x(pick_s), 1) if pick_s is not None and pick_s > 0 else None,
        box=(LEFT, right_edge, TOP, bottom_edge),
    )


#: A budget bar's size in SVG units, and its end margins.
BAR_WIDTH, BAR_HEIGHT = 240, 16
BAR_PAD = 2


@dataclass(frozen=True, slots=True)
class BudgetBar:
    """What recovery.html draws for one domain's retry budget: the limit as a track,
    the retries counted as a bar over it (past it when the domain is over budget)."""

    width: int
    height: int
    #: x where the bar starts; x where the limit ends; x where the retries end.
    start: float
    limit_x: float
    used_x: float
    #: The retries have reached the limit: no more are claimed until some slide out.
    over: bool


def budget_bar(retries: int, limit: int) -> BudgetBar:
    """The bar of *retries* against *limit* (floor x window + share x requests): the
    scale is the domain's own (the larger of the two fills the width), so a domain of
    a few requests reads as plainly as a busy one."""
    retries, limit = max(0, retries), max(0, limit)
    full = max(retries, limit, 1)
    span = BAR_WIDTH - 2 * BAR_PAD

    def x(count: int) -> float:
        return round(BAR_PAD + span * count / full, 1)

    return BudgetBar(
        width=BAR_WIDTH,
        height=BAR_HEIGHT,
        start=BAR_PAD,
        limit_x=x(limit),
        used_x=x(retries),
        over=retries >= limit,
    )
