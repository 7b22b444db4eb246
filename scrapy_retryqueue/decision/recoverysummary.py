"""What the fleet has learned of recovery times, as people read it: per (kind, domain) curve and figures.

Pure, no I/O: the records come decoded (recovery.read_records); the reader
(status.learned_recovery) fetched them. For each (kind, domain): the weighted
outages seen and how many of them were seen to end, the median and 90th
percentile recovery time read off the curve (None when the curve does not
reach that share: too many outages still on or dead-lettered), the chart's
points (share of outages over after t seconds), and what LearnedBackoff would
do with a task of that kind and domain failing now: its first delay, the
ages of the attempts after it should they fail too, and why.
JSON-ready dicts, shared by ``scrapy retryqueue status`` and the dashboard.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .backoff import BackoffContext
from .learned import LearnedBackoff
from .policy import Policy
from .recovery import Curve, RecoveryStats

#: (kind, domain) curves summarised per spider, at most: the most observed first.
MAX_SHOWN = 50
#: Attempts of the plan shown after the first, at most.
PLAN_SHOWN = 5
#: Characters of a malformed field's name a report line shows.
FIELD_SHOWN = 60


def _mid(_: Any = None) -> float:
    # The middle of the jitter's range: what is shown is the strategy's aim,
    # not one random draw of it.
    return 0.5


def quantile(curve: Curve, share: float) -> float | None:
    """The time (s) by which *share* of the outages seen were over; None when fewer were."""
    return curve.next_time(0.0, share)


def longest_seen(curve: Curve) -> float:
    """The upper edge (s) of the last bin an outage was seen to last into."""
    points = curve.points()
    last = max((b for b, n in enumerate(curve.at_risk) if n > 0), default=-1)
    return points[last][0] if last >= 0 else 0.0


def next_pick(
    strategy: LearnedBackoff, kind: str, domain: str | None, policy: Policy
) -> dict[str, Any]:
    """What *strategy* does with a task of *kind* at *domain* failing now, and after."""
    if not policy.retry or policy.max_retries < 1:
        return {"delay_s": None, "plan_s": [], "reason": f"{kind}: not retried by policy"}
    since, plan = 0.0, []
    first: tuple[float, str] | None = None
    for attempt in range(min(policy.max_retries, PLAN_SHOWN + 1)):
        ctx = BackoffContext(
            kind=kind,
            attempt=attempt,
            policy=policy,
            domain=domain,
            retry_after=None,
            since_first=since,
            rand=_mid,
        )
        delay, reason = strategy.delay_and_reason(ctx)
        if first is None:
            first = (delay, reason)
        since += delay
        plan.append(round(since, 3))
    assert first is not None
    return {"delay_s": round(first[0], 3), "plan_s": plan, "reason": first[1]}


def summarise_curve(curve: Curve) -> dict[str, Any]:
    median, p90 = quantile(curve, 0.5), quantile(curve, 0.9)
    return {
        "outages": round(curve.outages, 3),
        "recovered": round(curve.recoveries, 3),
        "median_s": None if median is None else round(median, 3),
        "p90_s": None if p90 is None else round(p90, 3),
        "longest_seen_s": round(longest_seen(curve), 3),
        # (t, share of outages over after t): the chart.
        "points": [[round(t, 3), round(share, 6)] for t, share in curve.points()],
    }


def summarise(
    stats: RecoveryStats,
    *,
    policy_for: Callable[[str, str | None], Policy],
    strategy: LearnedBackoff,
    updated: Mapping[tuple[str, str], int] | None = None,
    limit: int = MAX_SHOWN,
) -> dict[str, Any]:
    """Every (kind, domain) of one spider (the *limit* most observed), and each kind
    over all its domains (the strategy's fallback). *updated*: when each record was
    last written (ms), as the scripts dated it."""
    strategy.learned(stats)
    order = sorted(stats.curves.items(), key=lambda kv: (-kv[1].outages, kv[0]))
    curves = []
    for (kind, domain), curve in order[: max(0, limit)]:
        entry = {"kind": kind, "domain": domain, **summarise_curve(curve)}
        entry["updated_ms"] = (updated or {}).get((kind, domain))
        entry["next"] = next_pick(strategy, kind, domain, policy_for(kind, domain))
        curves.append(entry)
    kinds = [
        {
            "kind": kind,
            "domains": sum(1 for k, _ in stats.curves if k == kind),
            **summarise_curve(c),
        }
        for kind, c in sorted(stats.kinds.items())
    ]
    return {"curves": curves, "kinds": kinds, "records": len(stats), "shown": len(curves)}


def malformed_line(spider: str, fields: list[str]) -> str:
    """The one report line of a spider's malformed records (anything may be in Redis)."""
    shown = ", ".join(
        repr(f if len(f) <= FIELD_SHOWN else f[:FIELD_SHOWN] + "…") for f in fields[:5]
    )
    more = f" and {len(fields) - 5} more" if len(fields) > 5 else ""
    return (
        f"{spider}: {len(fields)} learned recovery record(s) are malformed and ignored: "
        f"{shown}{more}"
    )
