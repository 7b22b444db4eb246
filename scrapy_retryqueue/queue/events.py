"""Lifecycle events of the events stream: the one place their types and fields are named.

The Lua scripts append the entries (``XADD``, in Redis); every Python reader
(the store writer, the view, the dashboard, the demo) turns them into
:class:`Event` values with :func:`parse_entry` / :func:`parse_entries` instead
of reading field names of its own. A test holds that every ``XADD`` of every
script writes a type declared here, with fields declared for it here.

Entries are read back from a shared Redis and may be hostile (written around
the scripts, truncated, not UTF-8): parsing never raises; an entry it cannot
read is a :class:`MalformedEvent` that says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# -- the types -----------------------------------------------------------------

#: A task was parked: a first failure, a failure again, a requeue, a "retry now".
SCHEDULED = "scheduled"
#: A claim leased a batch of tasks (one entry for the batch, ``ids``).
CLAIMED = "claimed"
#: A re-injected request succeeded (recovered or dropped on purpose): its task is done.
SUCCEEDED = "succeeded"
#: A task became a dead letter.
DEAD = "dead"
#: A person removed a live task.
CANCELLED = "cancelled"
#: A lease expired unacknowledged: the task is due again.
RECLAIMED = "reclaimed"
#: A closing node handed a task back.
RELEASED = "released"
#: A domain changed state (per-domain cooldowns); no task.
DOMAIN = "domain"

# -- the fields ----------------------------------------------------------------

TYPE = "type"
ID = "id"
#: Task ids of a claim's batch, separated by spaces (``claimed`` only).
IDS = "ids"
NODE = "node"
#: When the script ran (ms), the caller's clock.
TS = "ts"
KIND = "kind"
URL = "url"
DUE = "due"
ATTEMPT = "attempt"
RECLAIMS = "reclaims"
#: ``retry_now`` on a scheduled event a person asked for.
MANUAL = "manual"
#: ``succeeded``: ms from the task's first failure (its envelope's ``created``)
#: to its success; empty when the node did not know when it was created.
WAIT = "wait"
#: ``succeeded``: the request's host (lower case); ``domain``: the domain.
DOMAIN_NAME = "domain"
STATE = "state"
PREVIOUS = "previous"
UNTIL = "until"
LEVEL = "level"
REASON = "reason"
#: The signature of an event a node composed (RETRYQUEUE_SIGNING_KEYS): over its
#: other fields (queue/signature.py); empty when the node signs nothing. Events a
#: script composes itself (claimed, reclaimed, released, a poison or ghost death)
#: carry none: the key never goes to Redis.
SIG = "sig"


@dataclass(frozen=True, slots=True)
class EventType:
    """One event type: the fields every entry of it has, and those some have."""

    name: str
    #: Written by every script and every version that writes the type.
    required: tuple[str, ...]
    #: Written by some scripts or versions only.
    optional: tuple[str, ...] = ()

    @property
    def fields(self) -> frozenset[str]:
        return frozenset((TYPE, *self.required, *self.optional))


TYPES: dict[str, EventType] = {
    t.name: t
    for t in (
        # schedule.lua, reschedule.lua: kind, attempt, url; retry_now.lua: manual.
        EventType(SCHEDULED, (ID, DUE, NODE, TS), (KIND, ATTEMPT, URL, MANUAL, SIG)),
        EventType(CLAIMED, (IDS, NODE, TS)),
        # wait and domain since the outcome is learned from; older entries lack them.
        EventType(SUCCEEDED, (ID, KIND, NODE, TS, URL), (WAIT, DOMAIN_NAME, SIG)),
        # deadletter.lua, claim.lua: url; reap.lua (poison): reclaims, no url.
        EventType(DEAD, (ID, KIND, NODE, TS), (URL, RECLAIMS, SIG)),
        EventType(CANCELLED, (ID, NODE, TS, URL), (SIG,)),
        EventType(RECLAIMED, (ID, RECLAIMS, NODE, TS)),
        EventType(RELEASED, (ID, NODE, TS)),
        EventType(DOMAIN, (DOMAIN_NAME, STATE, PREVIOUS, UNTIL, LEVEL, REASON, NODE, TS)),
    )
}

#: Fields that hold a whole number; an empty value means "not known".
INTEGER_FIELDS = frozenset({TS, DUE, ATTEMPT, RECLAIMS, WAIT, UNTIL, LEVEL})
_INTEGER_ORDER = tuple(sorted(INTEGER_FIELDS))
#: Types that are about one task (all but ``domain``).
TASK_TYPES = frozenset(name for name, t in TYPES.items() if DOMAIN_NAME not in t.required)

#: Longest integer text read: a longer one is no time in ms, and int() of a
#: huge text costs quadratic time.
_INT_DIGITS = 19


def _int(text: str) -> int | None:
    if not text or len(text) > _INT_DIGITS + 1:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    # A signed 64-bit integer, as Redis and SQL's BIGINT hold: a stream id's
    # time can be larger (Redis keeps it unsigned), which no column holds.
    return value if -(2**63) <= value < 2**63 else None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        # Replaced, not refused: one value that is not UTF-8 (a URL written
        # around the scripts) must not lose the rest of the event.
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TypeError(type(value).__name__)


class Event:
    """One lifecycle event of one task (or one domain), its fields as text.

    A ``claimed`` entry names a batch; :func:`parse_entries` gives one Event
    per task id of it, each with its own ``id``.
    """

    __slots__ = ("fields", "stream_id")

    def __init__(self, stream_id: str, fields: Mapping[str, str]) -> None:
        self.stream_id = stream_id
        self.fields = fields

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.stream_id!r}, {dict(self.fields)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (self.stream_id, dict(self.fields)) == (other.stream_id, dict(other.fields))

    __hash__ = None  # type: ignore[assignment]

    def _get(self, name: str) -> str:
        return self.fields.get(name, "")

    def _number(self, name: str) -> int | None:
        return _int(self.fields.get(name, ""))

    @property
    def type(self) -> str:
        return self._get(TYPE)

    @property
    def task_id(self) -> str:
        return self._get(ID)

    @property
    def node(self) -> str:
        return self._get(NODE)

    @property
    def ts(self) -> int:
        """When it happened (ms); 0 when the entry does not say."""
        return self._number(TS) or 0

    @property
    def position(self) -> tuple[int, int]:
        """The entry's stream id as (ms, sequence); (0, 0) for one that is none."""
        ms, _, seq = self.stream_id.partition("-")
        return _int(ms) or 0, _int(seq) or 0

    @property
    def kind(self) -> str:
        return self._get(KIND)

    @property
    def url(self) -> str:
        return self._get(URL)

    @property
    def due(self) -> int | None:
        return self._number(DUE)

    @property
    def attempt(self) -> int | None:
        return self._number(ATTEMPT)

    @property
    def reclaims(self) -> int | None:
        return self._number(RECLAIMS)

    @property
    def manual(self) -> str:
        return self._get(MANUAL)

    @property
    def wait_ms(self) -> int | None:
        """``succeeded``: ms from the first failure to the success, None when not known."""
        return self._number(WAIT)

    @property
    def signature(self) -> str:
        """The event's signature, ``""`` when it carries none (see :data:`SIG`)."""
        return self._get(SIG)

    @property
    def domain(self) -> str:
        """``succeeded``: the request's host; ``domain``: the domain that changed."""
        return self._get(DOMAIN_NAME)


@dataclass(frozen=True, slots=True)
class MalformedEvent:
    """A stream entry that is no event this version reads, and why."""

    stream_id: str
    reason: str


Parsed = Event | MalformedEvent


def _stream_id(raw: Any) -> str:
    try:
        return _text(raw)
    except TypeError:
        return repr(raw)


def _decode(fields: Mapping[Any, Any]) -> dict[str, str]:
    try:
        # The common case, fast: every name and value UTF-8 bytes.
        return {k.decode(): v.decode() for k, v in fields.items()}
    except (AttributeError, UnicodeDecodeError):
        return {_text(k): _text(v) for k, v in fields.items()}


def parse_entry(entry_id: Any, fields: Any) -> list[Parsed]:
    """A raw stream entry ``(id, {field: value})`` as its events (a claim's entry
    is one per task), or one MalformedEvent; ``[]`` for a deleted entry."""
    stream_id = _stream_id(entry_id)
    if not fields:
        return []  # deleted from the stream (XAUTOCLAIM gives its id only)
    if not isinstance(fields, Mapping):
        return [MalformedEvent(stream_id, f"fields are a {type(fields).__name__}, not a map")]
    try:
        decoded = _decode(fields)
    except TypeError as exc:
        return [MalformedEvent(stream_id, f"a field is a {exc}, not text")]
    kind = TYPES.get(decoded.get(TYPE, ""))
    if kind is None:
        return [MalformedEvent(stream_id, f"unknown event type {decoded.get(TYPE, '')[:40]!r}")]
    missing = [name for name in kind.required if name not in decoded]
    if missing:
        return [MalformedEvent(stream_id, f"{kind.name} event without {', '.join(missing)}")]
    for name in _INTEGER_ORDER:
        value = decoded.get(name)
        # The common case skips int(): ASCII digits, not too many of them.
        plain = value and value.isascii() and value.isdigit() and len(value) < _INT_DIGITS
        if value and not plain and _int(value) is None:
            return [MalformedEvent(stream_id, f"field {name!r} is not a whole number")]
    if kind.name == CLAIMED:
        ids = decoded[IDS].split()
        return [Event(stream_id, {**decoded, ID: task_id}) for task_id in ids]
    if kind.name in TASK_TYPES and not decoded[ID]:
        return [MalformedEvent(stream_id, f"{kind.name} event with an empty id")]
    return [Event(stream_id, decoded)]


def parse_entries(entries: Iterable[tuple[Any, Any]]) -> Iterator[Parsed]:
    """Each entry of an XRANGE / XREADGROUP reply as events (see :func:`parse_entry`)."""
    for entry in entries:
        try:
            entry_id, fields = entry
        except (TypeError, ValueError):
            yield MalformedEvent(_stream_id(entry), "not an (id, fields) pair")
            continue
        yield from parse_entry(entry_id, fields)


def entry_type(fields: Any) -> str:
    """Only the type of a raw entry, cheaply (the dashboard's chart reads
    hundreds of thousands): a declared type, or ``""``."""
    if not isinstance(fields, Mapping):
        return ""
    raw = fields.get(b"type", fields.get(TYPE))
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("utf-8", "replace")
    return raw if isinstance(raw, str) and raw in TYPES else ""


def entry_ms(entry_id: Any) -> int:
    """The time (ms) in a stream entry id; 0 for one that is none."""
    ms, _, _ = _stream_id(entry_id).partition("-")
    return _int(ms) or 0
