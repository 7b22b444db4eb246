"""The retry queue of one spider in Redis: its writes, claims and reads, one script per operation.

Every operation on a spider's tasks is one Lua script (``lua/<name>.lua``), so
a crash between two steps cannot lose or duplicate a task; beside them, a few
plain reads (counts, one task, the dead set, the nodes). A write's script call
is built in :mod:`.write`, a claim's in :mod:`.claim`; key names come from
:mod:`.keys`. Calls are blocking; the Scrapy glue runs them off the reactor thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import redis

from ..decision import kinds
from ..secure.signing import KeyRing
from ..settings.defaults import (
    DEAD_LETTERS_LIMIT,
    EVENTS_MAXLEN,
    LEARNED_HALF_LIFE,
    LEARNED_MAX_RECORDS,
    PROBE_RECHECK_MS,
    QUEUE_BATCH,
    REPLAY_RECORDS,
    REPLAY_WINDOW,
    SIGNATURE_SAMPLE,
)
from ..values import as_text
from .claim import Claimed, RetryBudget, claim_call, parse_claimed
from .envelope import Task
from .keys import Keys, all_keys, keys_for
from .signature import signed_key_id
from .taskinfo import host_of
from .wire import (
    SNIPPETS,
    envelope_text,
    envelope_url,
    load_script_source,
    task_id_text,
    wire_id,
)
from .write import Write, WriteCalls

__all__ = [
    "SCRIPT_NAMES",
    "SNIPPETS",
    "Claimed",
    "Counts",
    "RedisDelayedQueue",
    "RetryBudget",
    "Write",
    "envelope_text",
    "envelope_url",
    "load_script_source",
    "task_id_text",
    "wire_id",
]

SCRIPT_NAMES = (
    "schedule",
    "claim",
    "renew",
    "ack",
    "reschedule",
    "deadletter",
    "reap",
    "release",
    "unclaim",
    "retry_now",
    "cancel",
    "adopt",
)


@dataclass(slots=True)
class Counts:
    due: int
    due_now: int
    leased: int
    dead: int
    next_due: int | None


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
        events_maxlen: int = EVENTS_MAXLEN,
        learned_half_life: float = LEARNED_HALF_LIFE,
        learned_max_records: int = LEARNED_MAX_RECORDS,
        project: str = "",
        signing: KeyRing | None = None,
        finished_keep: float = REPLAY_WINDOW,
        finished_max: int = REPLAY_RECORDS,
    ) -> None:
        """*signing*: RETRYQUEUE_SIGNING_KEYS as a key ring (None: nothing is signed);
        *finished_keep* (s) and *finished_max* bound the records of finished tasks
        that replays are told by (kept with signing only)."""
        self.client = client
        self.keys: Keys = keys_for(spider, project)
        self.node_id = node_id
        self.events_maxlen = events_maxlen
        self.learned_half_life_ms = int(learned_half_life * 1000)
        self.learned_max_records = learned_max_records
        self.signing = signing
        self._calls = WriteCalls(
            self.keys,
            node_id,
            events_maxlen,
            self.learned_half_life_ms,
            learned_max_records,
            ring=signing,
            finished_keep_ms=int(finished_keep * 1000),
            finished_max=finished_max,
            encoding=_wire_encoding(client),
        )
        self._scripts = {
            name: client.register_script(load_script_source(name)) for name in SCRIPT_NAMES
        }

    def adopt_unnamespaced(self) -> int:
        """Move the spider's queue from the layout without a namespace into the
        project's, when only the former exists: the keys moved (0: none to adopt;
        -1: there is one, but the project's queue exists, so it stays where it is)."""
        if not self.keys.project:
            return 0
        old, new = all_keys(keys_for(self.keys.spider)), all_keys(self.keys)
        return int(self._run("adopt", [*old, *new], [len(old)]))

    def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self._scripts[name](keys=keys, args=args)

    def apply(self, writes: Sequence[Write]) -> list[bool]:
        """Apply *writes* in order; True for each that took effect.

        Consecutive writes of one kind share one script call (up to
        ``QUEUE_BATCH`` each), so a burst of failures costs a few round trips, not
        one per request. A refused write (False) is a duplicate or a stale lease.
        """
        results: list[bool] = []
        for op, run in itertools.groupby(writes, key=attrgetter("op")):
            run_list = list(run)
            for start in range(0, len(run_list), QUEUE_BATCH):
                chunk = run_list[start : start + QUEUE_BATCH]
                keys, args = self._calls.call(op, chunk)
                results += [bool(x) for x in self._run(op, keys, args)]
        return results

    def schedule(self, task: Task, *, now: int) -> bool:
        """Park a new task due at ``task.due``; False when one with its id is live."""
        return self.apply([Write.for_task("schedule", task, None, now)])[0]

    def reschedule(self, task: Task, token: str, *, now: int) -> bool:
        return self.apply([Write.for_task("reschedule", task, token, now)])[0]

    def ack(
        self,
        task_id: str,
        token: str,
        *,
        now: int,
        kind: str = "",
        url: str = "",
        created: int | None = None,
        learn: str = "",
        prior: int | None = None,
        version: int | None = None,
    ) -> bool:
        """The task's request succeeded; *version*: the ``updated`` of the envelope it was
        claimed with, recorded as the one it finished with (RETRYQUEUE_SIGNING_KEYS)."""
        write = Write(
            *("ack", task_id, now, token),
            kind=kind,
            url=url,
            created=created,
            host=host_of(url),
            learn=learn,
            prior=prior,
            version=version,
        )
        return self.apply([write])[0]

    def deadletter(self, task: Task, token: str | None, *, now: int) -> bool:
        """Keep *task* as a dead letter; *token* None for a request never parked."""
        return self.apply([Write.for_task("deadletter", task, token, now)])[0]

    def deadletter_raw(
        self,
        task_id: str,
        envelope: str,
        token: str | None,
        *,
        now: int,
        kind: str,
        url: str,
        dead_id: str = "",
    ) -> bool:
        """Dead-letter an envelope as it is (a malformed one keeps its raw text); no
        finished record is kept of it. *dead_id*: the id it is kept under, when not
        *task_id* (a forged entry's)."""
        write = Write(
            "deadletter",
            task_id,
            now,
            token,
            envelope=envelope,
            kind=kind,
            url=url,
            dead_id=dead_id,
        )
        return self.apply([write])[0]

    def claim(
        self,
        *,
        now: int,
        limit: int,
        lease_until: int,
        token: str,
        cooldowns: bool = False,
        recheck_ms: int = PROBE_RECHECK_MS,
        deferral_max_wait_ms: int = 0,
        budget: RetryBudget | None = None,
        requests: Mapping[str, int] | None = None,
    ) -> Claimed:
        """Lease up to *limit* due tasks; also report the queue's counts.

        With *cooldowns*, tasks of a domain cooling down are moved to the end
        of its cooldown instead (see claim.lua and domains.py). With *budget*,
        *requests* (domain -> fresh requests this node sent since its last claim)
        are added to the domains' budget records first, and tasks of a domain
        over its budget are moved to the budget's next slice (retrybudget.py).
        """
        keys, args = claim_call(
            self.keys,
            node_id=self.node_id,
            events_maxlen=self.events_maxlen,
            now=now,
            limit=limit,
            lease_until=lease_until,
            token=token,
            cooldowns=cooldowns,
            recheck_ms=recheck_ms,
            deferral_max_wait_ms=deferral_max_wait_ms,
            budget=budget,
            requests=requests,
            records=self.signing is not None,
        )
        return parse_claimed(self._run("claim", keys, args))

    def budget_records(self) -> dict[Any, Any]:
        """The retry budget's records as stored (domain -> record), for people to read."""
        return dict(self.client.hgetall(self.keys.budget))

    def renew(self, leases: dict[str, str], *, lease_until: int) -> list[str]:
        """Extend the leases in *leases* (task id → token); return the ids lost."""
        if not leases:
            return []
        k = self.keys
        args: list[Any] = [lease_until]
        for task_id, token in leases.items():
            args += [wire_id(task_id), token]
        return [task_id_text(x) for x in self._run("renew", [k.leased, k.owners], args)]

    def reap(self, *, now: int, limit: int, max_reclaims: int) -> tuple[list[str], list[str]]:
        """Return expired leases to due; returns (reclaimed ids, poisoned ids)."""
        k = self.keys
        reclaimed, poisoned = self._run(
            "reap",
            [
                *(k.due, k.leased, k.tasks, k.owners, k.reclaims, k.dead, k.deadtasks, k.events),
                *(k.taskinfo, k.deadkinds, k.versions, k.finished),
            ],
            [now, limit, max_reclaims, self.events_maxlen, self.node_id, kinds.POISON],
        )
        return [task_id_text(x) for x in reclaimed], [task_id_text(x) for x in poisoned]

    def release(self, leases: dict[str, str], *, now: int) -> int:
        """Hand back held tasks (task id → token) so another node takes them at once."""
        if not leases:
            return 0
        k = self.keys
        args: list[Any] = [now, self.node_id, self.events_maxlen]
        for task_id, token in leases.items():
            args += [wire_id(task_id), token]
        return int(self._run("release", [k.due, k.leased, k.owners, k.events], args))

    def unclaim(self, tokens: Sequence[str], *, now: int) -> list[str]:
        """Hand back the tasks leased under *tokens*, claims whose reply was lost; their ids."""
        if not tokens:
            return []
        k = self.keys
        args: list[Any] = [now, self.node_id, self.events_maxlen, *tokens]
        raw = self._run("unclaim", [k.due, k.leased, k.owners, k.events], args)
        return [task_id_text(x) for x in raw]

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
        return None if raw is None else as_text(raw)

    def dead_letters(self, *, limit: int = DEAD_LETTERS_LIMIT) -> list[tuple[str, str]]:
        """(task id, raw envelope) of dead letters, oldest first."""
        if limit <= 0:
            # ZRANGE 0 -1 would be the whole set.
            return []
        ids = [as_text(x) for x in self.client.zrange(self.keys.dead, 0, limit - 1)]
        if not ids:
            return []
        raws = self.client.hmget(self.keys.deadtasks, ids)
        return [(i, as_text(r)) for i, r in zip(ids, raws, strict=True) if r is not None]

    def retry_now(self, task_ids: Sequence[str], *, now: int) -> list[bool]:
        """Make waiting tasks due at *now*; True for each that was waiting."""
        k = self.keys
        ids = list(task_ids)
        results: list[bool] = []
        for start in range(0, len(ids), QUEUE_BATCH):
            args = [self.node_id, self.events_maxlen, now, *ids[start : start + QUEUE_BATCH]]
            results += [bool(x) for x in self._run("retry_now", [k.due, k.tasks, k.events], args)]
        return results

    def cancel(self, task_ids: Sequence[str], *, now: int) -> list[bool]:
        """Remove live tasks (waiting or leased) for good; True for each that was live.

        Each one's ``cancelled`` event names its URL, read here from its envelope
        (no script parses one); a task whose envelope is unreadable gets ``""``.
        """
        k = self.keys
        keys = [k.due, k.leased, k.tasks, k.owners, k.reclaims, k.events, k.taskinfo]
        keys += [k.versions, k.finished]
        ids = list(task_ids)
        results: list[bool] = []
        for start in range(0, len(ids), QUEUE_BATCH):
            chunk = ids[start : start + QUEUE_BATCH]
            raws = self.client.hmget(k.tasks, chunk) if chunk else []
            args: list[Any] = [self.node_id, self.events_maxlen, now]
            for task_id, raw in zip(chunk, raws, strict=True):
                url = envelope_url(raw)
                args += [task_id, url, self._calls.cancelled_sig(task_id, url, now)]
            results += [bool(x) for x in self._run("cancel", keys, args)]
        return results

    def heartbeat(
        self,
        *,
        now: int,
        last_busy: int,
        registered: int = 0,
        learned: list[Any] | None = None,
    ) -> dict[str, tuple[int, int, int]]:
        """Say this node is crawling (when it last had work, when it registered: its first
        heartbeat); return every node's ``(heartbeat ms, last busy ms, registered ms)``,
        this one included (registered 0 when a node did not write it). One round trip.

        With *learned* (a list), the learned recovery records are read in the same
        round trip and appended to it as one mapping (field -> raw record)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.keys.nodes, self.node_id, f"{now} {last_busy} {registered or now}")
        pipe.hgetall(self.keys.nodes)
        if learned is not None:
            pipe.hgetall(self.keys.recovery)
        _, raw, *rest = pipe.execute()
        if learned is not None:
            learned.append(rest[0])
        nodes: dict[str, tuple[int, int, int]] = {}
        for node, value in raw.items():
            try:
                fields = [int(x) for x in as_text(value).split()]
            except ValueError:
                continue  # not a heartbeat this version wrote: ignore it
            if len(fields) == 2:
                fields.append(0)  # an older version's heartbeat: no registration time
            if len(fields) == 3:
                nodes[as_text(node)] = (fields[0], fields[1], fields[2])
        return nodes

    def signature_key_ids(self, sample: int = SIGNATURE_SAMPLE) -> set[str]:
        """The key ids that sign some of the spider's stored entries (live tasks, frontier
        requests), read from one page of each of their hashes (HSCAN of about *sample*
        fields): which keys a node needs to act on them. Empty when none is signed."""
        found: set[str] = set()
        for key in (self.keys.tasks, self.keys.frontier_requests):
            _, page = self.client.hscan(key, 0, count=sample)
            for raw in page.values():
                kid = signed_key_id(envelope_text(raw))
                if kid is not None:
                    found.add(kid)
        return found

    def probe(self) -> None:
        """Raise the client's error unless the node serving this spider's slot answers.

        A read of one of the spider's keys: on a cluster it goes to the slot's
        owner (a PING would reach any node, and answer while that one is down).
        """
        self.client.exists(self.keys.due)

    def leave(self) -> None:
        """This node stops crawling the spider: the others stop waiting for it."""
        self.client.hdel(self.keys.nodes, self.node_id)


def _wire_encoding(client: Any) -> str | None:
    """The encoding *client* writes text in, when its errors are strict (WriteCalls
    then makes the ARGV bytes itself); None when it cannot tell."""
    try:
        encoder = client.get_encoder()
    except Exception:
        return None
    encoding = getattr(encoder, "encoding", None)
    strict = getattr(encoder, "encoding_errors", None) == "strict"
    return encoding if strict and isinstance(encoding, str) else None
