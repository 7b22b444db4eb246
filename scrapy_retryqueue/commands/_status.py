"""``scrapy retryqueue status``: per spider, what waits, what is held, what died.

Live counts come from Redis (due, due now, leased, dead letters not yet in the
store, events not yet written); history from the store (dead letters,
succeeded today, by kind, top domains). Either side may be missing: the other
is still shown, with a note.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import redis

from ..keys import all_keys, keys_for
from ..store.db import StoreError
from ..store.queries import status_counts
from ..store.redisops import EventStream
from ._common import EXIT_NO_MATCH, CommandFailed, Context


def _spiders_in_redis(client: Any) -> set[str]:
    spiders = set()
    for key in client.scan_iter(match="retryqueue:{*}:*", count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        head, _, _ = name.rpartition(":")
        if head.startswith("retryqueue:{") and head.endswith("}"):
            spiders.add(head[len("retryqueue:{") : -1])
    return spiders


def _has_keys(client: Any, spider: str) -> bool:
    if client is None:
        return False
    return bool(client.exists(*all_keys(keys_for(spider))))


def redis_counts(client: Any, spider: str, now_ms: int) -> dict[str, Any]:
    k = keys_for(spider)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(k.due)
    pipe.zcount(k.due, "-inf", now_ms)
    pipe.zcard(k.leased)
    pipe.zcard(k.dead)
    pipe.exists(k.events)
    pipe.zrange(k.cooling, 0, -1, withscores=True)
    pipe.hgetall(k.domains)
    due, due_now, leased, dead, has_events, cooling, states = pipe.execute()
    unwritten = None
    if has_events:
        stream = EventStream(client, spider, consumer="status")
        try:
            groups = client.xinfo_groups(k.events)
            if any((g.get("name") in (b"store", "store")) for g in groups):
                unwritten = stream.pending_count() + (stream.lag() or 0)
            else:
                unwritten = int(client.xlen(k.events))
        except redis.ResponseError:
            unwritten = None
    return {
        "due": int(due),
        "due_now": int(due_now),
        "leased": int(leased),
        "dead_in_redis": int(dead),
        "events_unwritten": unwritten,
        "cooling": _cooling(cooling, states),
    }


def _cooling(cooling: list[tuple[Any, float]], states: dict[Any, Any]) -> list[dict[str, Any]]:
    """Domains cooling down or half-open (per-domain cooldowns), soonest end first."""
    out = []
    for raw_domain, until in cooling:
        domain = raw_domain.decode() if isinstance(raw_domain, bytes) else str(raw_domain)
        raw = states.get(raw_domain) or states.get(domain)
        try:
            state = json.loads(raw) if raw else {}
        except ValueError:
            state = {}
        out.append(
            {
                "domain": domain,
                "until": int(until),
                "state": state.get("state", "cooling"),
                "level": state.get("level"),
                "reason": state.get("reason"),
            }
        )
    return out


def collect(context: Context, spiders: list[str]) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    notes: list[str] = []
    client = None
    try:
        client = context.redis(start_embedded=False)
        if client is None:
            notes.append(
                "the embedded Redis server is not running (scrapy retryqueue server start); "
                "live queue counts are not shown"
            )
    except CommandFailed as exc:
        notes.append(str(exc))
    db: dict[str, dict[str, Any]] | None = None
    try:
        store = context.store()
        today = datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
        with store.connect() as conn:
            db = status_counts(conn, spiders or None, since_today=today)
    except (CommandFailed, StoreError) as exc:
        notes.append(str(exc))
    if client is None and db is None:
        raise CommandFailed("; ".join(notes))
    names = (_spiders_in_redis(client) if client is not None else set()) | set(db or {})
    if spiders:
        names = {name for name in spiders if name in names or _has_keys(client, name)}
    report: dict[str, Any] = {"spiders": {}, "notes": notes}
    for spider in sorted(names):
        live = redis_counts(client, spider, now_ms) if client is not None else None
        history = (db or {}).get(spider) if db is not None else None
        statuses = (history or {}).get("statuses", {})
        entry: dict[str, Any] = {
            "due": live["due"] if live else None,
            "due_now": live["due_now"] if live else None,
            "leased": live["leased"] if live else None,
            "dead": (statuses.get("dead", 0) if db is not None else 0)
            + (live["dead_in_redis"] if live else 0),
            "dead_in_store": statuses.get("dead", 0) if db is not None else None,
            "dead_in_redis": live["dead_in_redis"] if live else None,
            "events_unwritten": live["events_unwritten"] if live else None,
            "cooling": live["cooling"] if live else None,
            "succeeded_today": (history or {}).get("succeeded_today", 0)
            if db is not None
            else None,
            "by_kind": (history or {}).get("by_kind", {}) if db is not None else None,
            "top_domains": (history or {}).get("top_domains", []) if db is not None else None,
        }
        report["spiders"][spider] = entry
    if not report["spiders"]:
        raise CommandFailed(
            "no spider found" + (f" named {', '.join(spiders)}" if spiders else ""), EXIT_NO_MATCH
        )
    return report


def _n(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def render_table(report: dict[str, Any]) -> str:
    header = ("spider", "due", "due now", "leased", "dead", "succeeded today", "unwritten")
    rows = [
        (
            spider,
            _n(e["due"]),
            _n(e["due_now"]),
            _n(e["leased"]),
            _n(e["dead"]),
            _n(e["succeeded_today"]),
            _n(e["events_unwritten"]),
        )
        for spider, e in report["spiders"].items()
    ]
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    lines = []

    def fmt(row: tuple[str, ...]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return "  ".join(cells).rstrip()

    lines.append(fmt(header))
    for row in rows:
        lines.append(fmt(row))
    for spider, e in report["spiders"].items():
        details = []
        if e["by_kind"]:
            kinds = sorted(e["by_kind"].items(), key=lambda kv: -(kv[1]["pending"] + kv[1]["dead"]))
            details.append(
                "  by kind:     "
                + ", ".join(f"{k} {v['pending']} pending / {v['dead']} dead" for k, v in kinds)
            )
        if e["top_domains"]:
            details.append(
                "  top domains: "
                + ", ".join(
                    f"{d['domain']} {d['pending']} pending / {d['dead']} dead"
                    for d in e["top_domains"]
                )
            )
        if e.get("cooling"):
            details.append(
                "  cooling:     "
                + ", ".join(
                    f"{c['domain']} until "
                    f"{datetime.fromtimestamp(c['until'] / 1000).astimezone():%H:%M:%S}"
                    + (f" ({c['reason']})" if c.get("reason") else "")
                    for c in e["cooling"]
                )
            )
        if details:
            lines.append("")
            lines.append(f"{spider}:")
            lines.extend(details)
    for note in report["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)
