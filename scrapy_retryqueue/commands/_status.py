"""``scrapy retryqueue status``: per spider, what waits, what is held, what died, as a table or JSON.

Live counts come from Redis (due, due now, leased, dead letters not yet in the
store, events not yet written); history from the store (dead letters,
succeeded today, by kind, top domains); both through :mod:`scrapy_retryqueue.view.status`.
Either side may be missing: the other is still shown, with a note. A spider of
the project that was never crawled is shown with nothing yet.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..view import live as view
from ..view.sources import Sources
from ..view.status import Status, collect, learned_recovery, learned_strategy, retry_budget_state
from ._common import EXIT_NO_MATCH, CommandFailed


def report(sources: Sources, spiders: list[str], settings: Any = None) -> dict[str, Any]:
    """Per spider: live counts and history (JSON-ready), and notes on what is missing.

    A spider asked for that has nothing anywhere is shown with zeros when it is
    a spider of the project (*settings*' SPIDER_MODULES): it was never crawled
    with the queue. Any other name is an error (exit code 1), as is nothing at all.
    """
    status = collect(
        lambda: sources.redis(start_embedded=False),
        sources.store,
        spiders,
        project=sources.config.namespace,
    )
    if status.client is None and status.history is None:
        raise CommandFailed("; ".join(status.notes))
    out: dict[str, Any] = {"spiders": {}, "notes": status.notes, "nothing_yet": []}
    for spider in status.spiders:
        out["spiders"][spider] = _entry(status, spider)
        out["spiders"][spider]["budget"] = budget_entry(status, spider, sources, out["notes"])
        learned_section(out, sources, status, spider, settings)
    if status.missing:
        known = project_spiders(settings)
        unknown = [name for name in status.missing if known is None or name not in known]
        for name in status.missing:
            if name not in unknown:
                out["spiders"][name] = _entry(status, name, nothing=True)
                out["nothing_yet"].append(name)
                out["notes"].append(f"{name}: {NOTHING_YET}")
        if unknown:
            line = _unknown_line(unknown, known)
            if not out["spiders"]:
                raise CommandFailed(line, EXIT_NO_MATCH)
            out["notes"].append(line)
        out["spiders"] = dict(sorted(out["spiders"].items()))
    if not out["spiders"]:
        raise CommandFailed("no spider has anything in the queue or the store yet", EXIT_NO_MATCH)
    return out


#: Said of a spider of the project with nothing in Redis or in the store.
NOTHING_YET = (
    "nothing recorded yet: it was never crawled with the retry queue "
    "(or everything it left was purged)"
)


def _entry(status: Status, spider: str, *, nothing: bool = False) -> dict[str, Any]:
    """One spider's line; a spider with *nothing* gets zeros from each side that answered."""
    db = status.history
    live = status.live.get(spider)
    if live is None and nothing and status.client is not None:
        # All zeros, read to be sure.
        live = view.counts(status.client, spider, status.now_ms, status.project)
    history = (db or {}).get(spider) if db is not None else None
    statuses = (history or {}).get("statuses", {})
    return {
        "due": live.due if live else None,
        "due_now": live.due_now if live else None,
        "leased": live.leased if live else None,
        "dead": (statuses.get("dead", 0) if db is not None else 0)
        + (live.dead_in_redis if live else 0),
        "dead_in_store": statuses.get("dead", 0) if db is not None else None,
        "dead_in_redis": live.dead_in_redis if live else None,
        "events_unwritten": live.events_unwritten if live else None,
        "cooling": live.cooling if live else None,
        "succeeded_today": (history or {}).get("succeeded_today", 0) if db is not None else None,
        "by_kind": (history or {}).get("by_kind", {}) if db is not None else None,
        "top_domains": (history or {}).get("top_domains", []) if db is not None else None,
    }


#: Domains the budget part of the table names, at most (the busiest).
BUDGET_DOMAINS_SHOWN = 5


def budget_entry(
    status: Status, spider: str, sources: Sources, notes: list[str] | None = None
) -> dict[str, Any] | None:
    """The retry budget per domain (RETRYQUEUE_RETRY_BUDGET), JSON-ready; None when the
    budget is off in these settings or Redis cannot be read. A budget key that cannot
    be read is a line in *notes*."""
    if status.client is None:
        return None
    state = retry_budget_state(status.client, spider, config=sources.config, now=status.now_ms)
    if state is None:
        return None
    if state.problem and notes is not None:
        notes.append(state.problem)
    return state.entry


def budget_lines(entry: dict[str, Any]) -> list[str]:
    """The table's budget part of one spider: its busiest domains, one line."""
    budget = entry.get("budget")
    if not budget or not (budget["domains"] or budget["unreadable"]):
        return []
    shown = budget["domains"][:BUDGET_DOMAINS_SHOWN]
    parts = [
        f"{d['domain']} {d['retries']} retries / {d['requests']} requests"
        + (", over budget" if d["allowance"] <= 0 else f", {d['allowance']} more allowed")
        for d in shown
    ]
    if len(budget["domains"]) > len(shown):
        parts.append(f"{len(budget['domains']) - len(shown)} more domains")
    if budget["unreadable"]:
        parts.append(f"{len(budget['unreadable'])} unreadable records (started over at next claim)")
    head = f"  retry budget ({budget['share']:g} of requests + {budget['floor']:g}/s, "
    return [head + f"last {budget['window']:g}s): " + "; ".join(parts)]


def learned_section(
    out: dict[str, Any], sources: Sources, status: Status, spider: str, settings: Any
) -> None:
    """The spider's learned recovery times (status.learned_recovery) under ``learned``;
    None when Redis cannot be read. Its notes (malformed records) join the report's."""
    entry = out["spiders"][spider]
    if status.client is None:
        entry["learned"] = None
        return
    config = sources.config
    learned = learned_recovery(
        status.client,
        spider,
        config=config,
        strategy=learned_strategy(config, settings),
        now=status.now_ms,
    )
    out["notes"].extend(learned.pop("notes"))
    entry["learned"] = learned


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} s" if value < 60 else f"{value / 60:.1f} min"


def learned_lines(learned: dict[str, Any] | None) -> list[str]:
    """The table's lines of one spider's learned recovery times (none when nothing is learned)."""
    if not learned or not learned["curves"]:
        return []
    how = "in use" if learned["in_use"] else "is not RETRYQUEUE_BACKOFF; what it would pick"
    lines = [f"  learned recovery (LearnedBackoff {how}):"]
    for c in learned["curves"]:
        nxt = c["next"]
        then = ", ".join(_seconds(t) for t in nxt["plan_s"][1:])
        pick = "-" if nxt["delay_s"] is None else f"waits {_seconds(nxt['delay_s'])}"
        if then:
            pick += f", then tries at {then} if it keeps failing"
        lines.append(
            f"    {c['kind']} at {c['domain']}: {c['outages']:.0f} outages "
            f"({c['recovered']:.0f} seen to end), median {_seconds(c['median_s'])}, "
            f"p90 {_seconds(c['p90_s'])}; next: {pick}"
        )
        lines.append(f"      why: {nxt['reason']}")
    if learned["shown"] < learned["records"]:
        lines.append(
            f"    ({learned['records'] - learned['shown']} less observed records not shown)"
        )
    return lines


def project_spiders(settings: Any) -> set[str] | None:
    """The names of the project's spiders; None outside a project (no SPIDER_MODULES)."""
    if settings is None or not settings.getlist("SPIDER_MODULES"):
        return None
    from scrapy.spiderloader import get_spider_loader

    try:
        return set(get_spider_loader(settings).list())
    except Exception as exc:  # the project's own code: any error, said in one line
        raise CommandFailed(
            f"the project's spiders cannot be loaded to look the name up "
            f"({type(exc).__name__}: {exc})"
        ) from None


def _unknown_line(names: list[str], known: set[str] | None) -> str:
    shown = ", ".join(repr(name) for name in names)
    if known is None:
        return (
            f"nothing is recorded for spider {shown} in the queue or the store (run the "
            "command in the project to tell a spider never crawled from a wrong name)"
        )
    spiders = ", ".join(sorted(known)) or "none"
    return (
        f"no spider named {shown} in this project (its spiders: {spiders}), and nothing "
        "is recorded for it in the queue or the store"
    )


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
        details.extend(budget_lines(e))
        details.extend(learned_lines(e.get("learned")))
        if details:
            lines.append("")
            lines.append(f"{spider}:")
            lines.extend(details)
    for note in report["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)
