"""The events module: every event a script writes is declared there, and its parser
turns any stream entry, hostile ones too, into events or a malformed result."""

from __future__ import annotations

import random
import re
from importlib import resources
from pathlib import Path

import pytest

from scrapy_retryqueue.queue import events
from scrapy_retryqueue.queue.events import (
    Event,
    MalformedEvent,
    entry_ms,
    entry_type,
    parse_entry,
)

PACKAGE = Path(str(resources.files("scrapy_retryqueue")))
#: Every Lua script of the package (the queue's, the domains', the store's).
SCRIPTS = sorted(PACKAGE.rglob("*.lua"))

_XADD = re.compile(r"redis\.call\(\s*'XADD'(.*?)\)\s*$", re.S | re.M)
_STRING = re.compile(r"'([^']*)'")


def _arguments(text: str) -> list[str]:
    """*text* split at its top-level commas (not those in calls or strings)."""
    out, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        current += char
    return [*out, current.strip()]


def _written_events() -> list[tuple[str, str, list[str]]]:
    """(script, type, field names) of every XADD in the scripts."""
    found = []
    for path in SCRIPTS:
        source = path.read_text("utf-8")
        for call in _XADD.finditer(source):
            # , KEYS[n], 'MAXLEN', '~', ARGV[n], '*', then name, value pairs.
            args = _arguments(call.group(1))[1:]
            assert args[1:5] == ["'MAXLEN'", "'~'", args[3], "'*'"], (path.name, args[:5])
            pairs = args[5:]
            names = [_STRING.fullmatch(name) for name in pairs[0::2]]
            assert all(names), f"{path.name}: a field name that is no literal in {pairs}"
            fields = [m.group(1) for m in names if m]
            assert fields[0] == events.TYPE, path.name
            type_ = _STRING.fullmatch(pairs[1])
            assert type_, f"{path.name}: an event type that is no literal"
            found.append((path.name, type_.group(1), fields[1:]))
    return found


def test_the_scripts_are_found() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"ack.lua", "claim.lua", "reap.lua", "domain_fail.lua"} <= names
    assert len(_written_events()) >= 12


@pytest.mark.parametrize(("script", "type_", "fields"), _written_events())
def test_every_event_a_script_writes_is_declared_with_its_fields(
    script: str, type_: str, fields: list[str]
) -> None:
    declared = events.TYPES.get(type_)
    assert declared is not None, f"{script} writes an undeclared event type {type_!r}"
    assert len(set(fields)) == len(fields), f"{script}: a field written twice"
    assert set(fields) <= declared.fields - {events.TYPE}, (
        f"{script} writes undeclared {type_} fields {sorted(set(fields) - declared.fields)}"
    )
    missing = set(declared.required) - set(fields)
    assert not missing, f"{script} leaves out {type_} fields {sorted(missing)}"


def test_every_declared_field_is_written_by_some_script() -> None:
    written: dict[str, set[str]] = {}
    for _, type_, fields in _written_events():
        written.setdefault(type_, set()).update(fields)
    for name, declared in events.TYPES.items():
        # Exactly: nothing declared that no script writes (older versions' fields
        # would be listed here on purpose, with a comment; there are none).
        assert written.get(name, set()) | {events.TYPE} == declared.fields, name


# -- the parser --------------------------------------------------------------------


def test_an_entry_becomes_a_typed_event() -> None:
    entry = {
        b"type": b"scheduled",
        b"id": b"a",
        b"kind": b"timeout",
        b"attempt": b"2",
        b"due": b"1500",
        b"node": b"n1",
        b"ts": b"1000",
        b"url": b"https://x.test/",
    }
    [event] = parse_entry(b"1000-3", entry)
    assert isinstance(event, Event)
    assert (event.type, event.task_id, event.kind, event.node) == (
        "scheduled",
        "a",
        "timeout",
        "n1",
    )
    assert (event.ts, event.due, event.attempt, event.url) == (1000, 1500, 2, "https://x.test/")
    assert event.position == (1000, 3)
    assert event.reclaims is None and event.wait_ms is None and event.manual == ""


def test_a_claims_entry_is_one_event_per_task() -> None:
    entry = {"type": "claimed", "ids": "a b  c", "node": "n", "ts": "5"}
    parsed = parse_entry("7-1", entry)
    assert [(e.task_id, e.type, e.position) for e in parsed if isinstance(e, Event)] == [
        ("a", "claimed", (7, 1)),
        ("b", "claimed", (7, 1)),
        ("c", "claimed", (7, 1)),
    ]


def test_a_succeeded_event_carries_the_wait_and_the_domain_and_older_ones_need_not() -> None:
    base = {"type": "succeeded", "id": "a", "kind": "timeout", "node": "n", "ts": "9", "url": ""}
    [new] = parse_entry("9-0", {**base, "wait": "1200", "domain": "x.test"})
    assert isinstance(new, Event) and (new.wait_ms, new.domain) == (1200, "x.test")
    [unknown] = parse_entry("9-0", {**base, "wait": "", "domain": ""})
    assert isinstance(unknown, Event) and unknown.wait_ms is None
    [older] = parse_entry("9-0", base)  # written before the fields existed
    assert isinstance(older, Event) and (older.wait_ms, older.domain) == (None, "")


def test_a_deleted_entry_is_no_event() -> None:
    assert parse_entry("1-0", None) == []
    assert parse_entry("1-0", {}) == []


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"id": "a", "ts": "1"}, "unknown event type ''"),
        ({"type": "rebalanced", "id": "a"}, "unknown event type 'rebalanced'"),
        ({b"type": b"\xff\xfe", b"id": b"a"}, "unknown event type"),
        ({"type": "released", "id": "a", "node": "n"}, "released event without ts"),
        ({"type": "released", "id": "", "node": "n", "ts": "1"}, "empty id"),
        ({"type": "released", "id": "a", "node": "n", "ts": "soon"}, "'ts' is not a whole"),
        ({"type": "released", "id": "a", "node": "n", "ts": "9" * 40}, "'ts' is not a whole"),
        ({"type": "released", "id": "a", "node": "n", "ts": 1.5}, "a float"),
        ({"type": "released", "id": ["a"], "node": "n", "ts": "1"}, "a list"),
        ("type=dead", "not a map"),
        ([("type", "dead")], "not a map"),
    ],
)
def test_a_hostile_entry_is_a_malformed_event_that_says_why(fields: object, why: str) -> None:
    [parsed] = parse_entry(b"3-0", fields)
    assert isinstance(parsed, MalformedEvent)
    assert parsed.stream_id == "3-0"
    assert why in parsed.reason


def test_a_value_that_is_not_utf8_is_kept_replaced_not_refused() -> None:
    entry = {b"type": b"dead", b"id": b"a", b"kind": b"x", b"node": b"n", b"ts": b"1"}
    [event] = parse_entry(b"1-0", {**entry, b"url": b"http://x/\xff"})
    assert isinstance(event, Event) and event.url == "http://x/\ufffd"


def test_parse_entries_survives_entries_that_are_no_pairs() -> None:
    entries = [("1-0", {"type": "released", "id": "a", "node": "n", "ts": "1"}), None, ("x",)]
    parsed = list(events.parse_entries(entries))  # type: ignore[arg-type]
    assert isinstance(parsed[0], Event)
    assert [type(p) for p in parsed[1:]] == [MalformedEvent, MalformedEvent]


def test_random_entries_never_raise() -> None:
    rand = random.Random(18)
    names = [b"type", b"id", b"ids", b"ts", b"due", b"node", b"kind", b"url", b"\xff", b""]
    values = [t.encode() for t in events.TYPES] + [b"", b"1", b"-1", b"x", b"\xff\xfe", b"9" * 30]
    for _ in range(5000):
        fields = {rand.choice(names): rand.choice(values) for _ in range(rand.randrange(8))}
        for parsed in parse_entry(rand.choice([b"1-0", b"x", b"", 7]), fields):
            assert isinstance(parsed, (Event, MalformedEvent))
            if isinstance(parsed, Event):
                # Every accessor answers.
                _ = (parsed.ts, parsed.due, parsed.attempt, parsed.reclaims, parsed.position)


def test_the_type_alone_for_the_chart() -> None:
    assert entry_type({b"type": b"dead"}) == "dead"
    assert entry_type({"type": "scheduled"}) == "scheduled"
    assert entry_type({b"type": b"\xff"}) == entry_type({b"type": b"nope"}) == ""
    assert entry_type(None) == entry_type([]) == ""
    assert entry_ms(b"1700-2") == 1700 and entry_ms("junk") == 0
