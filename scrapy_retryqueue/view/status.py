"""Per spider, the live queue (Redis) beside its history (the store), either side optional.

What ``scrapy retryqueue status`` and the dashboard's overview and metrics
start from. A side that cannot be opened is left out with a note saying why,
and the other is still read. The learned recovery times and the retry budget of
a spider are read here too, for ``status`` and the dashboard's /recovery page alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis

from ..config import Config, learned_backoff_settings
from ..decision.learned import LearnedBackoff
from ..decision.recovery import read_records
from ..decision.recoverysummary import MAX_SHOWN, malformed_line, summarise
from ..exceptions import RetryQueueError
from ..queue.connection import is_outage
from ..queue.keys import keys_for
from ..store.db import Store
from ..store.queries import status_counts
from ..values import as_text, now_ms
from . import live as view

#: Said when the embedded server is down: counts are left out, not started for.
EMBEDDED_DOWN = (
    "the embedded Redis server is not running (scrapy retryqueue server start); "
    "live queue counts are not shown"
)


@dataclass(slots=True)
class Status:
    #: The spiders found (or the ones asked for that were found), sorted.
    spiders: list[str]
    #: Redis, None when it cannot be read.
    client: Any
    #: Per spider, the queue now; empty when Redis cannot be read.
    live: dict[str, view.QueueCounts]
    #: Per spider, :func:`~scrapy_retryqueue.store.queries.status_counts`; None
    #: when the store cannot be read.
    history: dict[str, dict[str, Any]] | None
    #: Why a side is missing.
    notes: list[str] = field(default_factory=list)
    #: The time (ms) "due now" counts against.
    now_ms: int = 0
    #: The spiders asked for that have nothing in Redis or in the store, in the
    #: order asked (a spider never crawled, or a wrong name).
    missing: list[str] = field(default_factory=list)
    #: The namespace of the spiders' keys (Config.namespace).
    project: str = ""


def local_midnight() -> datetime:
    """Start of today, local time: what "succeeded today" counts from."""
    return datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)


def collect(
    open_redis: Callable[[], Any],
    open_store: Callable[[], Store],
    spiders: Sequence[str] = (),
    *,
    top: int = 5,
    project: str = "",
) -> Status:
    """Both sides for every spider found, or for *spiders*.

    *open_redis* returns a client or None (the embedded server is not
    running); either callable raises a RetryQueueError (ConfigError,
    SourceError, StoreError, ...) when its side cannot be opened.
    """
    now = now_ms()
    notes: list[str] = []
    client = None
    try:
        client = open_redis()
        if client is None:
            notes.append(EMBEDDED_DOWN)
    except RetryQueueError as exc:
        notes.append(str(exc))
    history: dict[str, dict[str, Any]] | None = None
    try:
        store = open_store()
        with store.connect() as conn:
            history = status_counts(
                conn, list(spiders) or None, since_today=local_midnight(), top=top
            )
    except RetryQueueError as exc:
        notes.append(str(exc))
    names = (view.spiders(client, project) if client is not None else set()) | set(history or {})
    if spiders:
        names = {name for name in spiders if name in names or view.has_keys(client, name, project)}
    found = sorted(names)
    missing = [name for name in dict.fromkeys(spiders) if name not in names]
    live = (
        {} if client is None else {name: view.counts(client, name, now, project) for name in found}
    )
    return Status(found, client, live, history, notes, now, missing, project)


def learned_strategy(config: Config, settings: Any) -> LearnedBackoff:
    """A LearnedBackoff of its own (summarise hands it the records it shows; readers may
    run at once): the project's one's parameters when RETRYQUEUE_BACKOFF is an instance,
    else its RETRYQUEUE_LEARNED_* settings. What it would pick is shown either way."""
    if isinstance(config.backoff, LearnedBackoff):
        theirs = config.backoff
        return LearnedBackoff(
            try_cost=theirs.try_cost,
            min_outages=theirs.min_outages,
            fallback=theirs.fallback,
        )
    try_cost, outages = learned_backoff_settings(settings if settings is not None else {})
    return LearnedBackoff(try_cost=try_cost, min_outages=outages)


def learned_recovery(
    client: Any,
    spider: str,
    *,
    config: Config,
    strategy: LearnedBackoff,
    now: int | None = None,
    limit: int = MAX_SHOWN,
) -> dict[str, Any]:
    """What the fleet has learned of *spider*'s recovery times (recoverysummary.summarise),
    with ``notes``: one line for its malformed records, one for a hash that cannot be
    read or was cut short. Never raises for what is in Redis; a Redis that does not
    answer is a note too."""
    now = now_ms() if now is None else now
    # Twice the records a crawl keeps: a hash past that is another writer's doing.
    bound = 2 * max(1, config.learned_max_records)
    notes: list[str] = []
    try:
        stored = view.recovery_hash(client, spider, config.namespace, limit=bound)
    except Exception as exc:
        if not (isinstance(exc, redis.RedisError) or is_outage(exc)):
            raise
        stored = view.RecoveryHash({}, problem=f"Redis does not answer ({exc})")
    if stored.problem:
        notes.append(f"{spider}: {stored.problem}; nothing learned is shown")
    if stored.truncated:
        notes.append(
            f"{spider}: the learned recovery hash holds more than {bound:,} records; "
            f"the first {bound:,} read are used"
        )
    stats, malformed = read_records(stored.fields, now=now, half_life=config.learned_half_life)
    if malformed:
        notes.append(malformed_line(spider, malformed))
    updated: dict[tuple[str, str], int] = {}
    for raw_field, value in stored.fields.items():
        try:
            parts = as_text(raw_field).rpartition(" ")
            if (parts[0], parts[2]) in stats.records:
                # The stored time, before read_records decayed the record to now.
                updated[(parts[0], parts[2])] = int(as_text(value).split(None, 1)[0])
        except (UnicodeDecodeError, ValueError, IndexError):
            continue  # malformed: reported by read_records
    table = config.policy_table
    summary = summarise(
        stats,
        policy_for=lambda kind, domain: table.policy_for(kind, domain),
        strategy=strategy,
        updated=updated,
        limit=limit,
    )
    uses = isinstance(config.backoff, LearnedBackoff) or config.backoff is LearnedBackoff
    return {**summary, "unreadable": len(malformed), "in_use": uses, "notes": notes}


#: Domains one note on unreadable budget records names, at most.
_BUDGET_NAMED = 5
#: Characters of a domain a note shows (anything may be in Redis).
_DOMAIN_SHOWN = 60


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One spider's retry budget now, JSON-ready (``entry``), and why it could not be
    read (``problem``: a key of another type, a Redis that does not answer)."""

    entry: dict[str, Any]
    problem: str | None = None


def retry_budget_state(client: Any, spider: str, *, config: Config, now: int) -> BudgetState | None:
    """The retry budget of each domain of *spider* with requests or retries in the
    window now (view.budgets), with the limit its retries are held to; None when the
    budget is off in *config*. Never raises for what is in Redis."""
    if not config.retry_budget:
        return None
    entry: dict[str, Any] = {
        "share": config.retry_budget,
        "floor": config.retry_budget_floor,
        "window": config.retry_budget_window,
        "domains": [],
        "unreadable": [],
    }
    try:
        states, malformed = view.budgets(
            client,
            spider,
            now,
            share=config.retry_budget,
            floor=config.retry_budget_floor,
            window=config.retry_budget_window,
            project=config.namespace,
        )
    except redis.ResponseError as exc:  # WRONGTYPE: another writer's key
        key = as_text(keys_for(spider, config.namespace).budget)
        return BudgetState(entry, f"{spider}: {key} cannot be read as a hash ({exc})")
    except Exception as exc:
        if not (isinstance(exc, redis.RedisError) or is_outage(exc)):
            raise
        return BudgetState(entry, f"{spider}: Redis does not answer ({exc}); no budget is shown")
    entry["domains"] = [
        {
            "domain": s.domain,
            "requests": s.requests,
            "retries": s.retries,
            "limit": s.limit,
            "allowance": s.allowance,
        }
        for s in states
    ]
    entry["unreadable"] = malformed
    return BudgetState(entry)


def budget_malformed_line(spider: str, domains: Sequence[str]) -> str:
    """The one report line of a spider's retry budget records that do not read."""
    shown = ", ".join(
        repr(d if len(d) <= _DOMAIN_SHOWN else d[:_DOMAIN_SHOWN] + "…")
        for d in domains[:_BUDGET_NAMED]
    )
    more = f" and {len(domains) - _BUDGET_NAMED} more" if len(domains) > _BUDGET_NAMED else ""
    return (
        f"{spider}: {len(domains)} retry budget record(s) do not read and are not shown "
        f"(the next claim starts each over): {shown}{more}"
    )
