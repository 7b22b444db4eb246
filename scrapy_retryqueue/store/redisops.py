"""The store writer's own Redis side: the spiders with events, its consumer group on
their events streams, and the removal of dead letters once the store holds them.

Only the store writer uses it: it reads and acknowledges events through the
``store`` consumer group and deletes stored dead letters with its own script
(``store/lua/forget_dead.lua``). The retry queue's writes are
:mod:`scrapy_retryqueue.queue.delayed`'s, people's reads :mod:`scrapy_retryqueue.view.live`'s;
key names come from :mod:`scrapy_retryqueue.queue.keys`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

import redis

from ..queue.connection import is_cluster_client
from ..queue.delayed import task_id_text
from ..queue.keys import Keys, keys_for, scan_pattern, spider_of
from ..settings.defaults import STORE_CONSUMER_GROUP
from ..values import as_text

Entry = tuple[Any, Any]


def spiders_with_streams(client: redis.Redis | Any, project: str = "") -> set[str]:
    """The spiders of *project* ("": keys without a namespace) that have an events
    stream in Redis (every node of a cluster)."""
    found = set()
    for key in client.scan_iter(match=scan_pattern("events", project), count=1000):
        spider = spider_of(key, project)
        if spider is not None:
            found.add(spider)
    return found


def has_work(
    client: redis.Redis | Any, spider: str, *, project: str = "", group: str = STORE_CONSUMER_GROUP
) -> bool:
    """Whether *spider* has anything for the store: a dead letter in Redis, or events
    its consumer group has not written (read and unacknowledged, or not read yet).

    Read-only, two round trips at most, and no SQL: a crawl's writer asks this
    until the answer is yes before it loads the store (a healthy crawl never
    does). When Redis cannot tell (a lag it lost count of), the answer is yes.
    """
    keys = keys_for(spider, project)
    if client.zcard(keys.dead):
        return True
    try:
        groups = client.xinfo_groups(keys.events)
    except redis.ResponseError:
        return False  # no events stream: nothing was ever written
    for info in groups:
        if as_text(info.get("name", info.get(b"name", b""))) == group:
            lag = info.get("lag")
            return bool(info.get("pending")) or lag is None or int(lag) > 0
    return bool(client.xlen(keys.events))  # a stream no writer has read yet


def load_script(name: str) -> str:
    """The source of ``store/lua/<name>.lua`` (the store's own scripts)."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


class EventStream:
    """One spider's events stream, read through the store's consumer group."""

    def __init__(
        self,
        client: redis.Redis | Any,
        spider: str,
        *,
        consumer: str,
        group: str = STORE_CONSUMER_GROUP,
        project: str = "",
    ) -> None:
        self.client = client
        self.spider = spider
        self.keys: Keys = keys_for(spider, project)
        self.consumer = consumer
        self.group = group
        self._forget = client.register_script(load_script("forget_dead"))
        self._group_ready = False

    def ensure_group(self) -> None:
        """Create the consumer group (from the stream's start) unless it exists."""
        if self._group_ready:
            return
        try:
            self.client.xgroup_create(self.keys.events, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _read(self, start: str, count: int, block_ms: int | None) -> list[Entry]:
        if is_cluster_client(self.client):
            # A cluster client asks a server where XREADGROUP's keys are (COMMAND
            # GETKEYS, twice per call: its keys are "movable"), which tripled the
            # servers' CPU per read; the stream's node is known here.
            args: list[Any] = ["XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count]
            if block_ms is not None:
                args += ["BLOCK", block_ms]
            node = self.client.get_node_from_key(self.keys.events)
            reply = self.client.execute_command(
                *args, "STREAMS", self.keys.events, start, target_nodes=node
            )
        else:
            reply = self.client.xreadgroup(
                self.group, self.consumer, {self.keys.events: start}, count=count, block=block_ms
            )
        if not reply:
            return []
        # [[stream, [(id, fields), ...]]] (RESP2) or {stream: [[...]]} (RESP3)
        if isinstance(reply, dict):
            streams = list(reply.values())
            return list(streams[0][0]) if streams and streams[0] else []
        return list(reply[0][1])

    def read_own_pending(self, count: int, after: Any = "0") -> list[Entry]:
        """Entries delivered to this consumer and not acknowledged (a failed write),
        from the one after *after* on."""
        self.ensure_group()
        return self._read(as_text(after), count, None)

    def read_new(self, count: int, block_ms: int) -> list[Entry]:
        self.ensure_group()
        return self._read(">", count, block_ms or None)

    def claim_stale(
        self, count: int, min_idle_ms: int, cursor: str = "0-0"
    ) -> tuple[str, list[Entry], list[str]]:
        """Take over entries another consumer read and never acknowledged.

        Returns (next cursor, entries, ids of entries trimmed from the stream).
        """
        self.ensure_group()
        reply = self.client.xautoclaim(
            self.keys.events, self.group, self.consumer, min_idle_ms, start_id=cursor, count=count
        )
        next_cursor = as_text(reply[0])
        entries = [e for e in reply[1] if e and e[1]]
        deleted = [as_text(x) for x in (reply[2] if len(reply) > 2 else [])]
        deleted += [as_text(e[0]) for e in reply[1] if e and not e[1]]
        return next_cursor, entries, deleted

    def ack(self, ids: Sequence[Any]) -> int:
        if not ids:
            return 0
        return int(self.client.xack(self.keys.events, self.group, *ids))

    def pending_count(self) -> int:
        """Entries read by some consumer of the group and not acknowledged."""
        self.ensure_group()
        info = self.client.xpending(self.keys.events, self.group)
        return int(info["pending"] if isinstance(info, dict) else info[0])

    def lag(self) -> int | None:
        """Entries not yet delivered to the group (None when Redis cannot tell)."""
        for group in self.client.xinfo_groups(self.keys.events):
            name = as_text(group.get("name", group.get(b"name", b"")))
            if name == self.group:
                lag = group.get("lag")
                return None if lag is None else int(lag)
        return None

    def envelopes(
        self, task_ids: Iterable[str], dead_ids: Iterable[str]
    ) -> tuple[list[Any], list[Any]]:
        """Raw envelopes of live tasks and of dead letters, in the order asked."""
        task_ids, dead_ids = list(task_ids), list(dead_ids)
        if not task_ids and not dead_ids:
            return [], []
        pipe = self.client.pipeline(transaction=False)
        if task_ids:
            pipe.hmget(self.keys.tasks, task_ids)
        if dead_ids:
            pipe.hmget(self.keys.deadtasks, dead_ids)
        replies = pipe.execute()
        tasks = replies.pop(0) if task_ids else []
        dead = replies.pop(0) if dead_ids else []
        return tasks, dead

    def forget_dead(self, deaths: Sequence[tuple[str, int]], acks: Sequence[Any] = ()) -> int:
        """Remove dead letters (task id, time of death) that the store holds, and
        acknowledge the entries *acks* (the batch that stored them) in the same call.

        One script call per batch (per 500 dead letters at most): a round trip
        per batch, not per event, keeps the writer thread off the crawl's GIL.
        """
        removed = 0
        acks = [as_text(entry_id) for entry_id in acks]
        chunks = [deaths[start : start + 500] for start in range(0, len(deaths), 500)] or [[]]
        for n, chunk in enumerate(chunks):
            # The entries go with the last chunk: acknowledged once every death is gone.
            ack = acks if n == len(chunks) - 1 else []
            if not chunk and not ack:
                continue
            args: list[Any] = [self.group if ack else "", len(chunk)]
            for task_id, ts in chunk:
                args += [task_id, ts]
            args += ack
            keys = [self.keys.dead, self.keys.deadtasks, self.keys.events, self.keys.deadkinds]
            reply = self._forget(keys=keys, args=args)
            removed += int(reply[0])
        return removed

    def dead_letters(
        self, *, older_than_ms: int, skip: int, count: int
    ) -> list[tuple[str, float, Any, Any]]:
        """Dead letters still in Redis, oldest first: (task id, time of death,
        envelope, kind it died of from deadkinds: None for one an older version wrote).

        As Redis holds them, for the caller to judge: an id that is not UTF-8
        keeps its bytes as surrogates (:func:`~scrapy_retryqueue.queue.delayed.task_id_text`),
        the time of death is the score (a float, maybe not a time at all).
        """
        rows = self.client.zrangebyscore(
            self.keys.dead, "-inf", older_than_ms, start=skip, num=count, withscores=True
        )
        if not rows:
            return []
        ids = [raw_id for raw_id, _ in rows]
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.deadtasks, ids)
        pipe.hmget(self.keys.deadkinds, ids)
        envelopes, kinds = pipe.execute()
        return [
            (task_id_text(raw_id), score, env, kind)
            for (raw_id, score), env, kind in zip(rows, envelopes, kinds, strict=True)
        ]
