"""The queue's writes: one change to one task (:class:`Write`), and the script call of a batch.

A :class:`Write` is what the crawl's write path batches, spools while Redis is
down and replays; :func:`write_call` turns a run of writes of one kind into the
KEYS and ARGV of its script (``schedule``, ``reschedule``, ``ack``, ``deadletter``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..decision.recovery import field_name, observation
from .envelope import Task
from .keys import Keys
from .taskinfo import host_of, taskinfo_value
from .wire import wire_id


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


@dataclass(frozen=True, slots=True)
class WriteCalls:
    """Builds the script calls of one spider's writes (:meth:`RedisDelayedQueue.apply`)."""

    keys: Keys
    node_id: str
    events_maxlen: int
    #: The learning update's limits (recovery.py): half-life (ms), max records.
    learned_half_life_ms: int
    learned_max_records: int

    def call(self, op: str, chunk: list[Write]) -> tuple[list[str], list[Any]]:
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
        return [
            field,
            first,
            last,
            1 if recovered else 0,
            self.learned_half_life_ms,
            self.learned_max_records,
        ]
