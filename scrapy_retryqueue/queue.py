"""The Redis delayed queue: the only module that talks to Redis.

Every operation is one Lua script (``lua/<name>.lua``) so that a crash between
two steps cannot lose or duplicate a task. Calls are blocking; the Scrapy glue
runs them off the reactor thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import redis

from .envelope import Task
from .keys import Keys, all_keys, keys_for

SCRIPT_NAMES = (
    "schedule",
    "claim",
    "renew",
    "ack",
    "reschedule",
    "deadletter",
    "reap",
    "release",
)


def load_script_source(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@dataclass(slots=True)
class Claimed:
    """What one claim call returned."""

    #: (task id, raw envelope) pairs now leased to the caller.
    tasks: list[tuple[str, str]] = field(default_factory=list)
    due: int = 0
    leased: int = 0
    #: Due time (ms) of the earliest task still waiting, None when there is none.
    next_due: int | None = None


@dataclass(slots=True)
class Counts:
    due: int
    due_now: int
    leased: int
    dead: int
    next_due: int | None


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisDelayedQueue:
    """One spider's retry tasks in Redis.

    Times are milliseconds since the epoch, passed in by the caller, so every
    node and every test agrees on what "now" means for a call.
    """

    def __init__(
        self,
        client: redis.Redis | Any,
        spider: str,
        *,
        node_id: str,
        events_maxlen: int = 1_000_000,
    ) -> None:
        self.client = client
        self.keys: Keys = keys_for(spider)
        self.node_id = node_id
        self.events_maxlen = events_maxlen
        self._scripts = {
            name: client.register_script(load_script_source(name)) for name in SCRIPT_NAMES
        }

    def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self._scripts[name](keys=keys, args=args)

    def schedule(self, task: Task, *, now: int) -> bool:
        """Park a new task due at ``task.due``; False when one with its id is live."""
        k = self.keys
        return bool(
            self._run(
                "schedule",
                [k.due, k.leased, k.tasks, k.events],
                [
                    task.id,
                    task.to_json(),
                    task.due,
                    now,
                    task.kind,
                    task.attempts.get(task.kind, 0),
                    self.node_id,
                    task.url,
                    self.events_maxlen,
                ],
            )
        )

    def claim(self, *, now: int, limit: int, lease_until: int, token: str) -> Claimed:
        """Lease up to *limit* due tasks; also report the queue's counts."""
        k = self.keys
        raw = self._run(
            "claim",
            [k.due, k.leased, k.tasks, k.owners, k.events],
            [now, limit, lease_until, token, self.node_id, self.events_maxlen],
        )
        pairs = raw[3:]
        return Claimed(
            tasks=[(_s(pairs[i]), _s(pairs[i + 1])) for i in range(0, len(pairs), 2)],
            due=int(raw[0]),
            leased=int(raw[1]),
            next_due=None if int(raw[2]) < 0 else int(raw[2]),
        )

    def renew(self, leases: dict[str, str], *, lease_until: int) -> list[str]:
        """Extend the leases in *leases* (task id → token); return the ids lost."""
        if not leases:
            return []
        k = self.keys
        args: list[Any] = [lease_until]
        for task_id, token in leases.items():
            args += [task_id, token]
        return [_s(x) for x in self._run("renew", [k.leased, k.owners], args)]

    def ack(self, task_id: str, token: str, *, now: int, kind: str = "", url: str = "") -> bool:
        k = self.keys
        return bool(
            self._run(
                "ack",
                [k.leased, k.tasks, k.owners, k.reclaims, k.events],
                [task_id, token, now, self.node_id, kind, url, self.events_maxlen],
            )
        )

    def reschedule(self, task: Task, token: str, *, now: int) -> bool:
        k = self.keys
        return bool(
            self._run(
                "reschedule",
                [k.due, k.leased, k.tasks, k.owners, k.reclaims, k.events],
                [
                    task.id,
                    token,
                    task.to_json(),
                    task.due,
                    now,
                    task.kind,
                    task.attempts.get(task.kind, 0),
                    self.node_id,
                    task.url,
                    self.events_maxlen,
                ],
            )
        )

    def deadletter(self, task: Task, token: str | None, *, now: int) -> bool:
        """Keep *task* as a dead letter; *token* None for a request never parked."""
        return self.deadletter_raw(
            task.id, task.to_json(), token, now=now, kind=task.dead_kind or task.kind, url=task.url
        )

    def deadletter_raw(
        self, task_id: str, envelope: str, token: str | None, *, now: int, kind: str, url: str
    ) -> bool:
        """Dead-letter an envelope as it is (a malformed one keeps its raw text)."""
        k = self.keys
        return bool(
            self._run(
                "deadletter",
                [k.due, k.leased, k.tasks, k.owners, k.reclaims, k.dead, k.deadtasks, k.events],
                [task_id, token or "", envelope, now, kind, self.node_id, url, self.events_maxlen],
            )
        )

    def reap(self, *, now: int, limit: int, max_reclaims: int) -> tuple[list[str], list[str]]:
        """Return expired leases to due; returns (reclaimed ids, poisoned ids)."""
        k = self.keys
        reclaimed, poisoned = self._run(
            "reap",
            [k.due, k.leased, k.tasks, k.owners, k.reclaims, k.dead, k.deadtasks, k.events],
            [now, limit, max_reclaims, self.events_maxlen],
        )
        return [_s(x) for x in reclaimed], [_s(x) for x in poisoned]

    def release(self, leases: dict[str, str], *, now: int) -> int:
        """Hand back held tasks (task id → token) so another node takes them at once."""
        if not leases:
            return 0
        k = self.keys
        args: list[Any] = [now, self.node_id, self.events_maxlen]
        for task_id, token in leases.items():
            args += [task_id, token]
        return int(self._run("release", [k.due, k.leased, k.owners, k.events], args))

    def counts(self, *, now: int) -> Counts:
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(k.due)
        pipe.zcount(k.due, "-inf", now)
        pipe.zcard(k.leased)
        pipe.zcard(k.dead)
        pipe.zrange(k.due, 0, 0, withscores=True)
        due, due_now, leased, dead, first = pipe.execute()
        return Counts(
            due=int(due),
            due_now=int(due_now),
            leased=int(leased),
            dead=int(dead),
            next_due=int(first[0][1]) if first else None,
        )

    def get_task(self, task_id: str) -> str | None:
        raw = self.client.hget(self.keys.tasks, task_id)
        return None if raw is None else _s(raw)

    def dead_letters(self, *, limit: int = 1000) -> list[tuple[str, str]]:
        """(task id, raw envelope) of dead letters, oldest first."""
        if limit <= 0:
            # ZRANGE 0 -1 would be the whole set.
            return []
        ids = [_s(x) for x in self.client.zrange(self.keys.dead, 0, limit - 1)]
        if not ids:
            return []
        raws = self.client.hmget(self.keys.deadtasks, ids)
        return [(i, _s(r)) for i, r in zip(ids, raws, strict=True) if r is not None]

    def clear(self) -> None:
        """Delete every key of this spider's namespace (tests, purges)."""
        self.client.delete(*all_keys(self.keys))
