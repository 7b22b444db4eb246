"""The queue's writes: one change to one task (:class:`Write`), and the script call of a batch.

A :class:`Write` is what the crawl's write path batches, spools while Redis is
down and replays; :meth:`WriteCalls.call` turns a run of writes of one kind into
the KEYS and ARGV of its script (``schedule``, ``reschedule``, ``ack``,
``deadletter``). With RETRYQUEUE_SIGNING_KEYS it signs there, as the write
leaves for Redis: each envelope, the version recorded beside it, and the event
the script appends (:mod:`.signature`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..decision.recovery import field_name, observation
from ..secure.signing import KeyRing
from . import events
from .envelope import Task
from .keys import Keys
from .signature import sign_envelope, sign_event
from .taskinfo import host_of, taskinfo_value
from .wire import wire_id

#: The learning update's ARGV when the outcome teaches nothing (WriteCalls._learning).
_NO_LEARNING = ("", 0, -1, 0, 0, 0)


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
    #: The version (``updated``, ms) of the envelope written (schedule, reschedule,
    #: deadletter) or finished (ack): the replay records (RETRYQUEUE_SIGNING_KEYS);
    #: None records none (a forged or malformed entry's dead letter).
    version: int | None = None
    #: A dead letter's own id, when it is not the task's ("": the task's). A forged
    #: entry is kept under one, so it never replaces the dead letter of a task it
    #: poses as (its SQL row neither).
    dead_id: str = ""

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
            version=task.updated,
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
    #: RETRYQUEUE_SIGNING_KEYS; None: nothing is signed and no replay record is kept.
    ring: KeyRing | None = None
    #: How long (ms) and how many finished records are kept (replays are told by them).
    finished_keep_ms: int = 0
    finished_max: int = 0
    #: The client's encoding (strict errors), for the ARGV made bytes here (:meth:`_wire`);
    #: None: the client encodes each value itself.
    encoding: str | None = None

    def call(self, op: str, chunk: list[Write]) -> tuple[list[str], list[Any]]:
        keys, args = self._call(op, chunk)
        return keys, args if self.encoding is None else self._wire(args)

    def _wire(self, args: list[Any]) -> list[Any]:
        """*args* as the bytes redis-py's Encoder makes of them (a text in the client's
        encoding, an int as its repr); anything else is left to it. Its packer looks
        at each value, and encodes one that is not bytes in a call of its own: about
        6 µs of a dead letter's 15 values, against 1.5 here."""
        encoding = self.encoding
        out: list[Any] = []
        append = out.append
        for value in args:
            kind = type(value)
            if kind is str:
                append(value.encode(encoding))
            elif kind is int:
                append(repr(value).encode())
            else:
                append(value)
        return out

    def _call(self, op: str, chunk: list[Write]) -> tuple[list[str], list[Any]]:
        k = self.keys
        args: list[Any] = [self.node_id, self.events_maxlen]
        if op in ("ack", "deadletter"):
            keep = self.finished_keep_ms if self.ring is not None else 0
            args += [keep, self.finished_max]
        if op == "schedule":
            for w in chunk:
                args += [wire_id(w.task_id), self._envelope(w), w.due, w.now, w.kind, w.attempt]
                args += [w.url, taskinfo_value(w.created, w.host, w.url), self._version(w)]
                args.append(self._scheduled_sig(w))
            return [k.due, k.leased, k.tasks, k.events, k.taskinfo, k.versions], args
        if op == "reschedule":
            for w in chunk:
                args += [wire_id(w.task_id), w.token, self._envelope(w), w.due, w.now, w.kind]
                args += [w.attempt, w.url, taskinfo_value(w.created, w.host, w.url)]
                args += self._learning(w, recovered=False)
                args += [self._version(w), self._scheduled_sig(w)]
            keys = [k.due, k.leased, k.tasks, k.owners, k.reclaims, k.events, k.taskinfo]
            return [*keys, k.recovery, k.versions], args
        if op == "ack":
            for w in chunk:
                # The outcome learned from: how long the task took to recover, where.
                created = w.created
                wait = max(0, w.now - created) if isinstance(created, int) and created > 0 else ""
                args += [wire_id(w.task_id), w.token, w.now, w.kind, w.url, wait, w.host]
                args += self._learning(w, recovered=True)
                # Where the recovery is spread from: the task's last failure.
                args.append(w.prior if isinstance(w.prior, int) and w.prior > 0 else 0)
                if self.ring is None:
                    args += ["", ""]
                    continue
                fields = {events.ID: w.task_id, events.KIND: w.kind, events.URL: w.url}
                fields.update({events.WAIT: wait, events.DOMAIN_NAME: w.host})
                args += [self._version(w), self._event_sig(events.SUCCEEDED, w, fields)]
            keys = [k.leased, k.tasks, k.owners, k.reclaims, k.events, k.taskinfo, k.recovery]
            return [*keys, k.versions, k.finished], args
        if op == "deadletter":
            for w in chunk:
                args += [wire_id(w.task_id), w.token or "", self._envelope(w), w.now, w.kind]
                args.append(w.url)
                args += self._learning(w, recovered=False)
                if self.ring is None:
                    args += ["", "", wire_id(w.dead_id) if w.dead_id else ""]
                    continue
                fields = {events.ID: w.dead_id or w.task_id, events.KIND: w.kind, events.URL: w.url}
                args += [self._version(w), self._event_sig(events.DEAD, w, fields)]
                args.append(wire_id(w.dead_id) if w.dead_id else "")
            keys = [k.due, k.leased, k.tasks, k.owners, k.reclaims, k.dead, k.deadtasks, k.events]
            return [*keys, k.taskinfo, k.deadkinds, k.recovery, k.versions, k.finished], args
        raise ValueError(f"unknown queue write {op!r}")

    def _envelope(self, w: Write) -> str:
        if self.ring is None:
            return w.envelope
        return sign_envelope(w.envelope, self.ring, self.keys.project)

    def _version(self, w: Write) -> Any:
        return w.version if self.ring is not None and w.version is not None else ""

    def _scheduled_sig(self, w: Write) -> str:
        if self.ring is None:
            return ""
        fields = {events.ID: w.task_id, events.KIND: w.kind, events.ATTEMPT: w.attempt}
        fields.update({events.DUE: w.due, events.URL: w.url})
        return self._event_sig(events.SCHEDULED, w, fields)

    def cancelled_sig(self, task_id: str, url: str, now: int) -> str:
        """The signature of the ``cancelled`` event of *task_id* (cancel.lua)."""
        if self.ring is None:
            return ""
        fields = {events.TYPE: events.CANCELLED, events.ID: task_id, events.NODE: self.node_id}
        fields.update({events.TS: now, events.URL: url})
        return sign_event(fields, self.ring, self.keys.project, self.keys.spider)

    def _event_sig(self, type_: str, w: Write, fields: dict[str, Any]) -> str:
        """The signature of the event the script appends for *w*: exactly its fields."""
        if self.ring is None:
            return ""
        fields.update({events.TYPE: type_, events.NODE: self.node_id, events.TS: w.now})
        return sign_event(fields, self.ring, self.keys.project, self.keys.spider)

    def _learning(self, w: Write, *, recovered: bool) -> Sequence[Any]:
        """The learning update's ARGV for one outcome: how long the task's outage has
        lasted so far, as the bins it newly reached (recovery.py); none without a
        kind to learn, a host or a known first failure."""
        created = w.created
        if not w.learn or not w.host or not isinstance(created, int) or created <= 0:
            return _NO_LEARNING
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
