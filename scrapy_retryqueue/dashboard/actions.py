"""The changes people make from the dashboard: retry now, cancel, requeue, purge.

Each applies to the matching tasks in the statuses it acts on
(:mod:`scrapy_retryqueue.store.actions`, the same code as ``scrapy deadletters``);
the spiders' waiting events are then written into the store at once, so the page
shows the new status on reload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from ..store import actions
from ..store.db import StoreError
from ..store.queries import Filters, count, shown
from ..store.service import event_sync
from .errors import DashboardError

if TYPE_CHECKING:
    from .connections import Connections

ACTIONS = actions.ACTIONS


def applicable(action: str, filters: Filters) -> Filters:
    """*filters* narrowed to the statuses *action* acts on; an unknown action is a 404."""
    if action not in ACTIONS:
        raise DashboardError(f"unknown action {shown(action)}; known: {', '.join(ACTIONS)}", 404)
    return actions.applicable(action, filters)


def count_for(backend: Connections, action: str, filters: Filters) -> int:
    """How many tasks *action* would touch."""
    narrowed = applicable(action, filters)
    with backend.store().connect() as conn:
        return count(conn, narrowed)


def run(
    backend: Connections, action: str, filters: Filters, *, dry_run: bool = False
) -> dict[str, Any]:
    """Apply *action* to the matching tasks it applies to; says how many it touched."""
    narrowed = applicable(action, filters)
    matched = count_for(backend, action, filters)
    result: dict[str, Any] = {
        "action": action,
        "filter": narrowed.describe(),
        "matched": matched,
        "changed": 0,
        "skipped": 0,
        "dry_run": dry_run,
    }
    if dry_run or not matched:
        return result
    store = backend.store()
    if action == "purge":
        result["changed"] = actions.purge(store, narrowed)
        return result
    client = backend.redis()
    if client is None:
        raise DashboardError("the embedded Redis server is not running", 503)
    config = backend.sources().config
    # Its events say who changed the queue: the dashboard of this node.
    node_id = f"{config.node_id}:dashboard"
    if action == "requeue":
        # With a fresh budget, as ``scrapy deadletters requeue`` does by default.
        requeued = actions.requeue(
            store,
            client,
            narrowed,
            node_id=node_id,
            events_maxlen=config.events_maxlen,
            project=config.namespace,
            signing=config.signing,
        )
        # Malformed, forged (only `scrapy deadletters requeue --kind forged --force`
        # puts one back), or a live retry of the same request is queued already.
        changed = requeued.moved
        skipped = requeued.live + len(requeued.malformed) + requeued.forged
        spiders = requeued.spiders
    else:
        op = actions.retry_now if action == "retry_now" else actions.cancel
        done = op(
            store,
            client,
            narrowed,
            node_id=node_id,
            events_maxlen=config.events_maxlen,
            project=config.namespace,
            signing=config.signing,
        )
        changed, skipped, spiders = done.changed, done.skipped, done.spiders
    sync(backend, client, spiders)
    result["changed"], result["skipped"] = changed, skipped
    return result


def sync(backend: Connections, client: Any, spiders: set[str]) -> None:
    """Write the spiders' waiting events into the store now, so the change shows."""
    sources = backend.sources()
    store = backend.store()
    for spider in sorted(spiders):
        try:
            event_sync(
                store,
                client,
                spider,
                sources.store_config,
                consumer=f"{sources.config.node_id}:dashboard",
                project=sources.config.namespace,
            ).drain()
        except (redis.RedisError, StoreError):
            # The change is in Redis; the next writer run stores it.
            continue
