"""The retry queue's writes and claims in Redis: one Lua script per operation.

Every operation on a spider's tasks is one script (``lua/<name>.lua``), so a
crash between two steps cannot lose or duplicate a task; beside them, a few
plain reads (counts, one task, the dead set). Key names come from
:mod:`scrapy_retryqueue.queue.keys`. Calls are blocking; the Scrapy glue runs them
off the reactor thread.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from operator import attrgetter
from typing import Any

import redis

from ..decision import kinds
from ..decision.recovery import field_name, observation
from ..decision.retrybudget import SLOTS, slice_ms
from ..settings.defaults import (
    DEAD_LETTERS_LIMIT,
    ENVELOPE_VERSION,
    EVENTS_MAXLEN,
    LEARNED_HALF_LIFE,
    LEARNED_MAX_RECORDS,
    PROBE_RECHECK_MS,
    QUEUE_BATCH,
)
from ..values import as_text
from .envelope import Task
from .keys import Keys, all_keys, keys_for
from .taskinfo import host_of, taskinfo_value

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


#: The shared Lua snippets (``lua/lib/<snippet>.lua``) a script calls, by script name:
#: each is prepended to the script's own text, so the one copy serves every caller.
SNIPPETS: Mapping[str, tuple[str, ...]] = {
    "ack": ("recovery",),
    "reschedule": ("recovery",),
    "deadletter": ("recovery",),
}


def load_script_source(name: str) -> str:
    """The text of ``lua/<name>.lua`` as Redis runs it, shipped in the package: the
    snippets it calls (:data:`SNIPPETS`), then its own text. Its SHA is the whole text's."""
    lua = resources.files(__package__).joinpath("lua")
    parts = [
        lua.joinpath("lib", f"{snippet}.lua").read_text("utf-8")
        for snippet in SNIPPETS.get(name, ())
    ]
    return "".join(parts) + lua.joinpath(f"{name}.lua").read_text("utf-8")


@dataclass(frozen=True, slots=True)
class Write:
    """One change to a task: the unit the queue applies, batches and spools."""

    #: schedule, reschedule, ack or deadletter
    op: str
    task_id: str
    now: int
    #: The lease token (reschedule, ack; deadletter of a leased task).
    token: str | None = None
    #: The task envelope (JSON); empty for an ack.
    envelope: str = ""
    due: int = 0
    kind: str = ""
    attempt: int = 0
    url: str = ""
    #: When the task was created (its first failure, ms); None when not known.
    #: Kept in taskinfo (schedule, reschedule); an ack's wait is counted from it.
    created: int | None = None
    #: The request's host (:func:`~.taskinfo.host_of`): taskinfo, an ack's domain.
    host: str = ""
    #: The kind whose recovery record this outcome updates (ack, reschedule,
    #: deadletter of a task); "" when it teaches nothing (recovery.py).
    learn: str = ""
    #: Ms from the task's first failure to its previous one: the bins it reached then.
    prior: int | None = None

    @classmethod
    def for_task(
        cls, op: str, task: Task, token: str | None, now: int, *, host: str | None = None
    ) -> Write:
        """The write of *task*; *host*: its URL's host when the caller has it parsed
        (taskinfo.host_word), else parsed here (taskinfo.host_of)."""
        kind = task.dead_kind or task.kind if op == "deadletter" else task.kind
        return cls(
            op,
            task.id,
            now,
            token,
            envelope=task.to_json(),
            due=task.due,
            kind=kind,
            attempt=task.attempts.get(task.kind, 0),
            url=task.url,
            created=task.created,
            host=host_of(task.url) if host is None else host,
        )


def task_id_text(raw: Any) -> str:
    """A task id from Redis as ``str``; one that is not UTF-8 keeps its bytes as
    surrogates (``surrogateescape``), so :func:`wire_id` writes it back unchanged."""
    if isinstance(raw, bytes):
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return raw.decode("utf-8", "surrogateescape")
    return str(raw)


def wire_id(task_id: str) -> str | bytes:
    """A task id as it goes to Redis: the bytes it was read as (see :func:`task_id_text`)."""
    if task_id.isascii():
        return task_id
    return task_id.encode("utf-8", "surrogateescape")


def envelope_text(raw: Any) -> str | bytes:
    """An envelope from Redis as ``str``, or its bytes as they are when not UTF-8.

    Decoded one by one: a stored envelope that is not UTF-8 text must not fail
    the claim of the others (the reader dead-letters it as ``malformed``).
    """
    if isinstance(raw, bytes):
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return raw
    return str(raw)


def envelope_url(raw: Any) -> str:
    """The request URL of a stored envelope, ``""`` when it cannot be read."""
    if raw is None:
        return ""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return ""
    request = doc.get("request") if isinstance(doc, dict) else None
    url = request.get("url") if isinstance(request, dict) else None
    return url if isinstance(url, str) else ""


@dataclass(slots=True)
class Claimed:
    """What one claim call returned."""

    #: (task id, raw envelope) pairs now leased to the caller; an envelope that
    #: is not UTF-8 text is handed out as its bytes (see :func:`envelope_text`).
    tasks: list[tuple[str, str | bytes]] = field(default_factory=list)
    due: int = 0
    leased: int = 0
    #: Due time (ms) of the earliest task still waiting, None when there is none.
    next_due: int | None = None
    #: Ghosts: due ids without an envelope, now malformed dead letters (claim.lua).
    ghosts: list[str] = field(default_factory=list)
    #: Ghosts whose id already had a dead letter: dropped from due, that one kept.
    ghosts_kept: list[str] = field(default_factory=list)
    #: Domain -> tasks the retry budget moved to later instead of claiming them.
    budget_deferred: dict[str, int] = field(default_factory=dict)
    #: Domains whose budget record was malformed: started over (claim.lua).
    budget_malformed: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """The retry budget a claim enforces (retrybudget.py): a share of each domain's
    fresh requests, the retries a window always allows, the window (s)."""

    share: float
    floor: float
    window: float

    def args(self, requests: Mapping[str, int]) -> list[Any]:
        """claim.lua's ARGV[13..]: the budget, then *requests* (domain -> fresh requests)."""
        args: list[Any] = [self.share, self.floor * self.window, slice_ms(self.window), SLOTS]
        for domain, count in requests.items():
            args += [domain, count]
        return args


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
    ) -> None:
        self.client = client
        self.keys: Keys = keys_for(spider, project)
        self.node_id = node_id
        self.events_maxlen = events_maxlen
        self.learned_half_life_ms = int(learned_half_life * 1000)
        self.learned_max_records = learned_max_records
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
                keys, args = self._write_call(op, chunk)
                results += [bool(x) for x in self._run(op, keys, args)]
        return results

    def _write_call(self, op: str, chunk: list[Write]) -> tuple[list[str], list[Any]]:
        k = self.keys
        args: list[Any] = [self.node_id, self.events_maxlen]
        if op == "schedule":
            for w in chunk:
                args += [wire_id(w.task_id), w.envelope, w.due, w.now, w.kind, w.attempt, w.url]
                args.append(taskinfo_value(w.created, w.host, w.url))
            return [k.due, k.leased, k.tasks, k.events, k.taskinfo], args
        if op == "reschedule":
            for w in chunk:
                args += [wire_id(w.task_id), w.token, w.envelope, w.due, w.now, w.kind]
                args += [w.attempt, w.url, taskinfo_value(w.created, w.host, w.url)]
                args += self._learning(w, recovered=False)
            keys = [k.due, k.leased, k.tasks, k.owners, k.reclaims, k.events, k.taskinfo]
            return [*keys, k.recovery], args
        if op == "ack":
            for w in chunk:
                # The outcome learned from: how long the task took to recover, where.
                created = w.created
                wait = max(0, w.now - created) if isinstance(created, int) and created > 0 else ""
                args += [wire_id(w.task_id), w.token, w.now, w.kind, w.url, wait, w.host]
                args += self._learning(w, recovered=True)
            return [k.leased, k.tasks, k.owners, k.reclaims, k.events, k.taskinfo, k.recovery], args
        if op == "deadletter":
            for w in chunk:
                args += [wire_id(w.task_id), w.token or "", w.envelope, w.now, w.kind, w.url]
                args += self._learning(w, recovered=False)
            keys = [k.due, k.leased, k.tasks, k.owners, k.reclaims, k.dead, k.deadtasks, k.events]
            return [*keys, k.taskinfo, k.deadkinds, k.recovery], args
        raise ValueError(f"unknown queue write {op!r}")

    def _learning(self, w: Write, *, recovered: bool) -> list[Any]:
        """The learning update's ARGV for one outcome: how long the task's outage has
        lasted so far, as the bins it newly reached (recovery.py); none without a
        kind to learn, a host or a known first failure."""
        created = w.created
        if not w.learn or not w.host or not isinstance(created, int) or created <= 0:
            return ["", 0, -1, 0, 0, 0]
        first, last = observation(w.prior, w.now - created, recovered)
        field = field_name(w.learn, w.host)
        return [field, first, last, 1 if recovered else 0, *self._learning_limits]

    @property
    def _learning_limits(self) -> tuple[int, int]:
        return self.learned_half_life_ms, self.learned_max_records

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
    ) -> bool:
        write = Write(
            *("ack", task_id, now, token),
            kind=kind,
            url=url,
            created=created,
            host=host_of(url),
            learn=learn,
            prior=prior,
        )
        return self.apply([write])[0]

    def deadletter(self, task: Task, token: str | None, *, now: int) -> bool:
        """Keep *task* as a dead letter; *token* None for a request never parked."""
        return self.apply([Write.for_task("deadletter", task, token, now)])[0]

    def deadletter_raw(
        self, task_id: str, envelope: str, token: str | None, *, now: int, kind: str, url: str
    ) -> bool:
        """Dead-letter an envelope as it is (a malformed one keeps its raw text)."""
        write = Write("deadletter", task_id, now, token, envelope=envelope, kind=kind, url=url)
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
        k = self.keys
        raw = self._run(
            "claim",
            [
                *(k.due, k.leased, k.tasks, k.owners, k.events, k.cooling, k.probes),
                *(k.dead, k.deadtasks, k.reclaims, k.taskinfo, k.deadkinds, k.budget),
            ],
            [
                *(now, limit, lease_until, token, self.node_id, self.events_maxlen),
                *(1 if cooldowns else 0, recheck_ms, deferral_max_wait_ms, ENVELOPE_VERSION),
                *(kinds.RATE_LIMITED, kinds.MALFORMED),
                *(budget.args(requests or {}) if budget is not None else []),
            ],
        )
        over = raw[5]
        pairs = raw[7:]
        return Claimed(
            tasks=[
                (task_id_text(pairs[i]), envelope_text(pairs[i + 1]))
                for i in range(0, len(pairs), 2)
            ],
            due=int(raw[0]),
            leased=int(raw[1]),
            next_due=None if int(raw[2]) < 0 else int(raw[2]),
            ghosts=[task_id_text(x) for x in raw[3]],
            ghosts_kept=[task_id_text(x) for x in raw[4]],
            budget_deferred={
                task_id_text(over[i]): int(over[i + 1]) for i in range(0, len(over) - 1, 2)
            },
            # Domains come from taskinfo, which a hostile writer may fill with any bytes.
            budget_malformed=[task_id_text(x) for x in raw[6]],
        )

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
                *(k.taskinfo, k.deadkinds),
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
        ids = list(task_ids)
        results: list[bool] = []
        for start in range(0, len(ids), QUEUE_BATCH):
            chunk = ids[start : start + QUEUE_BATCH]
            raws = self.client.hmget(k.tasks, chunk) if chunk else []
            args: list[Any] = [self.node_id, self.events_maxlen, now]
            for task_id, raw in zip(chunk, raws, strict=True):
                args += [task_id, envelope_url(raw)]
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

    def probe(self) -> None:
        """Raise the client's error unless the node serving this spider's slot answers.

        A read of one of the spider's keys: on a cluster it goes to the slot's
        owner (a PING would reach any node, and answer while that one is down).
        """
        self.client.exists(self.keys.due)

    def leave(self) -> None:
        """This node stops crawling the spider: the others stop waiting for it."""
        self.client.hdel(self.keys.nodes, self.node_id)
