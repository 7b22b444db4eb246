"""The picture of docs/backoff.md: a learned curve, the true one, and the tries each strategy makes.

    python -m benchmarks.backoff_picture docs/backoff-learned.svg

One distribution of the outage family (benchmarks/outage_family.py, bimodal: 70 % of
outages about 2 s, 30 % about 40 s, a task failing at a random moment in its outage):
the share of outages still on t seconds after a task's first failure, as LearnedBackoff
learned it in the family's simulation and as it truly is; under it, for a task whose
outage ends 30 s after its first failure, the tries of the default exponential backoff
(jitter at its middle), of LearnedBackoff over the learned curve, of the distribution
oracle (the same plan over the true curve) and of the perfect oracle (one try at the end).
Failed tries are hollow, the one that finds the site up is filled.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from scrapy_retryqueue.decision.backoff import ExponentialBackoff
from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.decision.learned import LearnedBackoff
from scrapy_retryqueue.decision.recovery import Record, RecoveryStats

from . import outage_family as family

CASE = "bimodal 2 s / 40 s"
OUTAGE = 30.0
WIDTH, HEIGHT = 760, 400
LEFT, RIGHT, TOP, PLOT_H = 170, 730, 40, 190
T_MIN, T_MAX = 0.5, 600.0
LANE_TOP, LANE_H = 280, 26
COLOURS = {"learned": "#1f77b4", "true": "#888", "default": "#d62728", "oracle": "#2ca02c"}


def _x(t: float) -> float:
    t = min(max(t, T_MIN), T_MAX)
    return LEFT + (RIGHT - LEFT) * math.log(t / T_MIN) / math.log(T_MAX / T_MIN)


def _y(share: float) -> float:
    return TOP + PLOT_H * (1 - share)


def tries(strategy: Any, outage: float) -> list[float]:
    """The times (s since the first failure) of a task's tries until one finds it over."""
    table = family._table(strategy)
    failure = FailureInfo(family.KIND, "HttpStatus", "HTTP 503", status=503)
    t, attempts, out = 0.0, 0, []
    while True:
        decision = table.decide(
            failure,
            {family.KIND: attempts},
            domain="site.example",
            rand=lambda: 0.5,
            since_first=t,
        )
        if not decision.retry:
            return out
        attempts += 1
        t += decision.delay
        out.append(t)
        if t >= outage:
            return out


def _polyline(points: list[tuple[float, float]], colour: str, dash: str = "") -> str:
    path = " ".join(f"{_x(t):.1f},{_y(s):.1f}" for t, s in points if T_MIN <= t <= T_MAX)
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{extra}/>'


def render() -> str:
    records: dict[tuple[str, str], Record] = {}
    family.simulate(CASE, "learned", 1, family.LEARNED_TRY_COST, records)
    stats = RecoveryStats(records)
    curve = stats.curve(family.KIND, "site.example")
    assert curve is not None
    truth = family.true_knots(family.FAMILY[CASE][0], f"{CASE}-0", at_start=False)
    learned = LearnedBackoff()
    learned.learned(stats)
    oracle = family.OracleBackoff(truth, family.LEARNED_TRY_COST)
    lanes = [
        ("default exponential", COLOURS["default"], tries(ExponentialBackoff(), OUTAGE)),
        ("LearnedBackoff", COLOURS["learned"], tries(learned, OUTAGE)),
        ("distribution oracle", COLOURS["oracle"], tries(oracle, OUTAGE)),
        ("perfect oracle", "#000", [OUTAGE]),
    ]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-weight="bold">Share of outages still on, t s after a '
        f"task's first failure ({CASE})</text>",
        f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{PLOT_H}" fill="none" '
        'stroke="#888"/>',
    ]
    for share in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = _y(share)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{share:.0%}</text>')
    for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500):
        x = _x(t)
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{LANE_TOP + 4 * LANE_H}" '
            'stroke="#f2f2f2"/>'
        )
        out.append(f'<text x="{x:.1f}" y="{TOP + PLOT_H + 14}" text-anchor="middle">{t:g}</text>')
    out.append(
        f'<text x="{(LEFT + RIGHT) / 2}" y="{TOP + PLOT_H + 30}" text-anchor="middle">'
        "seconds since the task's first failure (log scale)</text>"
    )
    out.append(_polyline(truth, COLOURS["true"], "5,4"))
    out.append(_polyline(curve.knots(), COLOURS["learned"]))
    legend_y = TOP + 14
    for label, colour, dash in (
        (f"learned ({curve.outages:.0f} task outages)", COLOURS["learned"], ""),
        ("true", COLOURS["true"], "5,4"),
    ):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{RIGHT - 170}" y1="{legend_y}" x2="{RIGHT - 145}" y2="{legend_y}" '
            f'stroke="{colour}" stroke-width="2"{extra}/>'
        )
        out.append(f'<text x="{RIGHT - 140}" y="{legend_y + 4}">{label}</text>')
        legend_y += 16
    x_end = _x(OUTAGE)
    out.append(
        f'<line x1="{x_end:.1f}" y1="{LANE_TOP - 14}" x2="{x_end:.1f}" '
        f'y2="{LANE_TOP + 4 * LANE_H - 10}" stroke="#000" stroke-dasharray="2,3"/>'
    )
    out.append(
        f'<text x="{x_end + 4:.1f}" y="{LANE_TOP - 6}">this outage ends ({OUTAGE:g} s)</text>'
    )
    for lane, (label, colour, times) in enumerate(lanes):
        y = LANE_TOP + lane * LANE_H + 8
        failed = len(times) - 1
        out.append(
            f'<text x="{LEFT - 6}" y="{y + 4}" text-anchor="end">{label}: {failed} failed</text>'
        )
        for n, t in enumerate(times):
            fill = colour if n == len(times) - 1 else "white"
            out.append(
                f'<circle cx="{_x(t):.1f}" cy="{y}" r="4.5" fill="{fill}" '
                f'stroke="{colour}" stroke-width="1.5"/>'
            )
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/backoff-learned.svg")
    target.write_text(render())
    print(f"written: {target}")
