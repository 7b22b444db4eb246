"""What the store writer takes from entries it cannot verify (RETRYQUEUE_SIGNING_KEYS).

The writer turns events and the envelopes beside them into rows. With signing
keys, nothing a writer to Redis without the key made can become a row that looks
like the crawl's own:

- an event a node composes (``scheduled``, ``succeeded``, ``dead``, ``cancelled``)
  carries a signature over its fields; one whose signature does not verify, and
  a ``succeeded`` or ``cancelled`` event without one (nodes sign every one), is
  **quarantined**: no row is made of it, one ERROR line names its stream id, and
  ``retryqueue/store/forged`` counts it;
- an event a script composes (``claimed``, ``reclaimed``, ``released``, a death
  the claim or the reaper wrote, a ``scheduled`` of ``retry_now``) cannot be
  signed: it is *weak*, its URL, attempt and (but for a death's) kind are not
  taken, and it changes only a row that exists and has not finished;
- an envelope (``tasks``, ``deadtasks``) that does not verify gives no column; a
  dead letter's becomes a row of kind ``forged`` that keeps the stored text for
  the audit, never one of the kind it claims.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, select

from ..decision.kinds import FORGED, MALFORMED
from ..exceptions import SignatureError
from ..queue import events as lifecycle
from ..queue.envelope import forged_envelope
from ..queue.signature import verify_envelope, verify_event
from ..secure.signing import KeyRing
from ..settings.defaults import FINAL_TASK_STATUSES
from .writer import STATUS_OF, Batch, EnvelopeDoc, Event, parse_envelope

logger = logging.getLogger("scrapy_retryqueue.store.sync")

#: What the check of an event says: it may make a row; only an unfinished one; none.
TRUSTED, WEAK, REFUSED = "trusted", "weak", "refused"
#: Events no node writes without a signature when it has a key.
ALWAYS_SIGNED = frozenset({lifecycle.SUCCEEDED, lifecycle.CANCELLED})
#: Fields a weak event's row does not take: what it says of the request (a death's
#: kind is taken: poison, rate_limited are the script's own word).
CONTENT_FIELDS = (lifecycle.URL, lifecycle.ATTEMPT, lifecycle.WAIT, lifecycle.DOMAIN_NAME)


@dataclass(slots=True)
class Checked:
    """A batch's events as the store may take them."""

    events: list[Event] = field(default_factory=list)
    #: Task ids whose only events in the batch are weak.
    weak: set[str] = field(default_factory=set)
    quarantined: int = 0


class StoreCheck:
    """The store writer's checks of one spider's entries with a key ring."""

    def __init__(self, ring: KeyRing, namespace: str, spider: str) -> None:
        self.ring = ring
        self.namespace = namespace
        self.spider = spider

    def events(self, events: Iterable[Event]) -> Checked:
        checked = Checked()
        #: Task id -> the status its latest trusted event in this batch gives it.
        latest: dict[str, str | None] = {}
        for event in events:
            if not event.type:
                checked.events.append(event)  # malformed: makes no row anyway
                continue
            verdict = self._event(event)
            if verdict == REFUSED:
                checked.quarantined += 1
                continue
            if verdict == WEAK:
                if latest.get(event.task_id) in FINAL_TASK_STATUSES:
                    continue  # it finished earlier in this batch: a weak event is no news
                if event.task_id not in latest:
                    checked.weak.add(event.task_id)
                dropped = CONTENT_FIELDS
                if event.type != lifecycle.DEAD:
                    dropped = (*dropped, lifecycle.KIND)
                fields = {k: v for k, v in event.fields.items() if k not in dropped}
                event = Event(event.stream_id, event.spider, fields)
            else:
                latest[event.task_id] = STATUS_OF.get(event.type)
                checked.weak.discard(event.task_id)
            checked.events.append(event)
        return checked

    def _event(self, event: Event) -> str:
        signature = event.signature
        if not signature:
            if event.type in ALWAYS_SIGNED:
                self._quarantine(event, "it carries no signature")
                return REFUSED
            return WEAK
        try:
            verify_event(event.fields, self.ring, self.namespace, self.spider)
        except SignatureError as exc:
            self._quarantine(event, str(exc))
            return REFUSED
        return TRUSTED

    def _quarantine(self, event: Event, why: str) -> None:
        logger.error(
            "scrapy-retryqueue: %s event %s of task %s in the events stream of %r is forged "
            "(%s); no row is made of it",
            event.type,
            event.stream_id,
            ascii(event.task_id[:80]),
            self.spider,
            why,
        )

    def envelope(self, raw: Any, doc: EnvelopeDoc | None, *, dead: bool, task_id: str) -> Any:
        """*doc* (the parsed *raw*) when it verifies; for a dead letter that does not, its
        forged wrapper (kind ``forged``, the stored text kept); for a live task, None."""
        if doc is None or doc.problem is not None:
            return doc
        text = raw.decode() if isinstance(raw, bytes) else raw
        if not isinstance(text, str):
            return doc
        if dead and _node_note(doc):
            return doc  # a ghost's note, written by claim.lua: no request, nothing to trust
        try:
            verify_envelope(text, self.ring, self.namespace)
        except SignatureError as exc:
            if not dead:
                return None
            wrapper = forged_envelope(task_id, text, str(exc), "")
            return parse_envelope(wrapper, task_id=task_id)
        return doc


def is_forged(doc: Any) -> bool:
    """Whether a dead letter's document is the forged wrapper :class:`StoreCheck` made."""
    return isinstance(doc, dict) and doc.get("dead_kind") == FORGED and "request" not in doc


def _node_note(doc: EnvelopeDoc) -> bool:
    return doc.get("dead_kind") == MALFORMED and "request" not in doc


def drop_weak(conn: Any, table: Any, batch: Batch, spider: str, weak: set[str]) -> int:
    """Take out of *batch* the rows of *weak* task ids that no unfinished row of the store
    holds (a weak event changes only such a row). Returns how many it took out."""
    if not weak:
        return 0
    alive = {
        task_id
        for (task_id,) in conn.execute(
            select(table.c.task_id).where(
                and_(
                    table.c.spider == spider,
                    table.c.task_id.in_(sorted(weak)),
                    table.c.status.not_in(FINAL_TASK_STATUSES),
                )
            )
        )
    }
    dropped = 0
    for generation in batch.generations:
        kept = [row for row in generation if row["task_id"] not in weak or row["task_id"] in alive]
        dropped += len(generation) - len(kept)
        generation[:] = kept
    return dropped
