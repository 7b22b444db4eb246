"""The overview: live counts beside the store's history, by spider, kind, domain and node, and the chart.

Redis and the store are read through :func:`scrapy_retryqueue.view.status.collect`
(either side may be missing: the other is still shown, with a note); the chart
counts the spiders' events streams; the times to recover come from the store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, select

from ..exceptions import RetryQueueError
from ..queue import events
from ..store.models import tasks_table
from ..store.queries import recovery_times, shown
from ..view import live as view
from ..view.status import collect, local_midnight
from .errors import DashboardError
from .filters import checked_spiders
from .times import ms_iso

if TYPE_CHECKING:
    from .connections import Connections

#: How far back the chart looks (seconds), and how many buckets it has at most.
WINDOWS = {"hour": (3600, 60), "day": (86400, 144)}
#: Bucket sizes (seconds) the chart picks from: the smallest that fits the span of
#: the activity in the window in its buckets, so a burst of one minute is not one spike.
CHART_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
#: The chart shows at least this span (seconds), even if the activity is shorter.
CHART_MIN_SPAN = 60
#: Events read from one spider's stream for the chart, at most.
CHART_MAX_EVENTS = 200_000
#: Recovered tasks (the newest) whose time to recover the "By kind" figures use, at most.
RECOVERY_SAMPLE = 20_000


def read(backend: Connections, window: str = "hour", spiders: Sequence[str] = ()) -> dict[str, Any]:
    """Totals, breakdowns and the chart, of every spider or of *spiders*."""
    if window not in WINDOWS:
        raise DashboardError(f"window must be one of {', '.join(WINDOWS)}, got {shown(window)}")
    spiders = checked_spiders(spiders)
    project = backend.project
    status = collect(backend.redis, backend.store, spiders, top=10, project=project)
    client, db, notes = status.client, status.history, status.notes
    failures_today = None
    recovered_by_kind: dict[str, int] = {}
    recovery: dict[str, list[float]] = {}
    if db is not None:
        try:
            failures_today, recovered_by_kind, recovery = _history(backend, spiders)
        except RetryQueueError as exc:
            notes.append(str(exc))
    per_spider: dict[str, Any] = {}
    by_kind: dict[str, dict[str, Any]] = {}
    domains: dict[str, dict[str, int]] = {}
    nodes: Counter[str] = Counter()
    cooling: list[dict[str, Any]] = []
    totals = Counter[str]()
    for spider in status.spiders:
        live = status.live.get(spider)
        history = (db or {}).get(spider, {})
        statuses = history.get("statuses", {})
        entry = {
            "due": live.due if live else None,
            "due_now": live.due_now if live else None,
            "leased": live.leased if live else None,
            "dead": statuses.get("dead", 0) + (live.dead_in_redis if live else 0),
            "succeeded": statuses.get("succeeded", 0),
            "succeeded_today": history.get("succeeded_today", 0),
            "cancelled": statuses.get("cancelled", 0),
            "events_unwritten": live.events_unwritten if live else None,
        }
        per_spider[spider] = entry
        for c in live.cooling if live else []:
            cooling.append({"spider": spider, **c})
        for name in ("due", "due_now", "leased", "dead", "succeeded", "cancelled"):
            totals[name] += entry[name] or 0
        for kind, n in history.get("by_kind", {}).items():
            slot = by_kind.setdefault(kind, {"pending": 0, "dead": 0})
            slot["pending"] += n["pending"]
            slot["dead"] += n["dead"]
        for d in history.get("top_domains", []):
            slot = domains.setdefault(d["domain"], {"pending": 0, "dead": 0})
            slot["pending"] += d["pending"]
            slot["dead"] += d["dead"]
        if client is not None:
            nodes.update(view.lease_holders(client, spider, project))
    for kind, n in recovered_by_kind.items():
        by_kind.setdefault(kind, {"pending": 0, "dead": 0})["recovered"] = n
    for kind, slot in by_kind.items():
        slot.setdefault("recovered", 0)
        finished = slot["recovered"] + slot["dead"]
        slot["recovery_rate"] = slot["recovered"] / finished if finished else None
        times = recovery.get(kind, [])
        slot["recover_median_s"] = percentile(times, 0.5)
        slot["recover_p90_s"] = percentile(times, 0.9)
    recovered, dead = totals["succeeded"], totals["dead"]
    # Over the retried kinds only: a 404 that was never retried is neither a
    # recovery nor a failure to recover.
    given_up = sum(
        slot["dead"]
        for kind, slot in by_kind.items()
        if (record := backend.kind_table.get(kind)) is not None and record.retry
    )
    rate = recovered / (recovered + given_up) if recovered + given_up else None
    top_domains = sorted(domains.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:10]
    order = {"pending": 0, "dead": 0, "recovered": 0}
    return {
        "generated_at": ms_iso(status.now_ms),
        "totals": {
            "pending": totals["due"] if client is not None else None,
            "due_now": totals["due_now"] if client is not None else None,
            "leased": totals["leased"] if client is not None else None,
            "failures_today": failures_today,
            "recovered": recovered,
            "dead": dead,
            "success_rate": rate,
            # Dead letters of the retried kinds: the rate's other half.
            "given_up": given_up,
        },
        "spiders": per_spider,
        "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -sum(kv[1][k] for k in order))),
        "top_domains": [{"domain": d, **n} for d, n in top_domains],
        "nodes": [{"node": n, "leased": c} for n, c in sorted(nodes.items())],
        "cooling": sorted(cooling, key=lambda c: c["until"]),
        "chart": chart(client, status.spiders, window, status.now_ms, project=project),
        "notes": notes,
    }


def _history(
    backend: Connections, spiders: Sequence[str]
) -> tuple[int, dict[str, int], dict[str, list[float]]]:
    """Failures first seen today, recovered tasks by kind, and the times to recover
    (seconds, sorted) of the newest RECOVERY_SAMPLE recovered tasks, by kind."""
    c = tasks_table.c
    where = c.created_at >= local_midnight()
    done = c.status == "succeeded"
    if spiders:
        where = and_(where, c.spider.in_(list(spiders)))
        done = and_(done, c.spider.in_(list(spiders)))
    with backend.store().connect() as conn:
        recovered_by_kind = {
            kind or "?": int(n)
            for kind, n in conn.execute(select(c.kind, func.count()).where(done).group_by(c.kind))
        }
        failures_today = int(
            conn.execute(select(func.count()).select_from(tasks_table).where(where)).scalar_one()
        )
        times = recovery_times(conn, spiders, limit=RECOVERY_SAMPLE)
    return failures_today, recovered_by_kind, times


def chart(
    client: Any, spiders: Sequence[str], window: str, now_ms: int, *, project: str
) -> dict[str, Any]:
    """Scheduled, recovered and dead per bucket, from the events streams.

    The chart looks back over *window*; it spans the activity found there (at
    least CHART_MIN_SPAN) in buckets of the smallest of CHART_STEPS that fits it
    in the window's number of buckets; no activity: the whole window.
    """
    span, most = WINDOWS[window]
    since = now_ms - span * 1000
    names = {events.SCHEDULED: "scheduled", events.SUCCEEDED: "recovered", events.DEAD: "dead"}
    truncated = False
    seen: list[tuple[int, str]] = []
    if client is not None:
        for spider in spiders:
            typed, cut = view.event_types_since(
                client, spider, since, limit=CHART_MAX_EVENTS, project=project
            )
            truncated |= cut
            seen += [(ms, names[t]) for ms, t in typed if t in names and ms >= since]
    shown_s = span
    if seen:
        first = min(ms for ms, _ in seen)
        shown_s = min(span, max(CHART_MIN_SPAN, -(-(now_ms - first) // 1000)))
    step = next((s for s in CHART_STEPS if shown_s / s <= most), span // most)
    step_ms = step * 1000
    start = (now_ms - shown_s * 1000) // step_ms * step_ms
    buckets = (now_ms - start) // step_ms + 1
    series = {name: [0] * buckets for name in ("scheduled", "recovered", "dead")}
    for ms, name in seen:
        index = (ms - start) // step_ms
        if 0 <= index < buckets:
            series[name][index] += 1
    return {
        "window": window,
        "start": start,
        "step_seconds": step,
        "span_seconds": shown_s,
        "series": series,
        "truncated": truncated,
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The *q* quantile (0-1) of sorted *values*, interpolated between ranks; None if empty."""
    if not values:
        return None
    rank = q * (len(values) - 1)
    low = int(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)
