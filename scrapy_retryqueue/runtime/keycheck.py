"""Whether this node may touch its spider's queue: the signing keys the queue's entries need.

A node started without RETRYQUEUE_SIGNING_KEYS, or with a ring that shares no
key with the signed entries it finds, would refuse every entry the fleet wrote
(as forged) and write entries the fleet refuses. It stops at start instead,
with one ERROR line, before it reads, writes or fetches anything
(:func:`~.startup.stop_at_start`). A sample of the stored entries tells (their
signatures name their keys: :meth:`RedisDelayedQueue.signature_key_ids`).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from ..secure.signing import SETTING

if TYPE_CHECKING:
    from ..config import Config


def key_problem(config: Config, spider: str, found: Collection[str]) -> str | None:
    """Why this node must not touch the queue of *spider*, whose entries are signed with
    the keys *found* (ids); None when it may."""
    if not found:
        return None
    ids = ", ".join(sorted(found)[:5]) + (", ..." if len(found) > 5 else "")
    ring = config.signing
    if ring is None:
        return (
            f"the queue of spider {spider!r} holds entries signed with key(s) {ids}, and "
            f"{SETTING} is not set on this node, which would refuse them all and write "
            f"entries the fleet refuses; it touched nothing. Set {SETTING} to the fleet's "
            "keys (docs/deploy.md)"
        )
    if not set(found) & set(ring.ids):
        return (
            f"the queue of spider {spider!r} holds entries signed with key(s) {ids}, none of "
            f"which {SETTING} lists on this node (it lists {', '.join(ring.ids)}); it touched "
            f"nothing. Add the fleet's keys to {SETTING} (docs/deploy.md, rotating keys)"
        )
    return None


def check_at_start(config: Config, spider: str | None, directory: Path) -> None:
    """Stop the crawl at start (one ERROR line, exit status 1) when the queue of *spider*
    holds signed entries this node has no key for. Reads one page of two hashes; a
    Redis that does not answer is left to the crawl (it spools), and an embedded
    server that is not running holds nothing a fleet wrote to it meanwhile."""
    from ..queue import embedded
    from ..queue.connection import is_outage, open_client
    from ..queue.delayed import RedisDelayedQueue
    from ..settings.defaults import REDIS_START_TIMEOUT
    from .startup import stop_at_start

    if not spider:
        return
    if config.redis_url is not None:
        url, client_settings = config.redis_url, config.redis_client_settings
    elif embedded.is_running(directory):
        url, client_settings = embedded.server_url(directory), {}
    else:
        return
    client = open_client(
        url,
        client_settings,
        cluster=config.redis_cluster,
        cluster_nodes=config.redis_cluster_nodes,
        socket_timeout=REDIS_START_TIMEOUT,
        connect_timeout=REDIS_START_TIMEOUT,
    )
    try:
        queue = RedisDelayedQueue(client, spider, node_id=config.node_id, project=config.namespace)
        found = queue.signature_key_ids()
    except Exception as exc:
        if is_outage(exc) or isinstance(exc, OSError):
            return
        raise
    finally:
        client.close()
    problem = key_problem(config, spider, found)
    if problem is not None:
        stop_at_start(problem)
