"""A fuzzer of what is read back from Redis: any stored value is a task or the package's own error.

Every reader of a stored entry (the crawl's envelope reader, the store writer's
envelope and row building, the events parser) gets the checked-in corpus
(tests/corpus/entries: one file per hostile case an attacker with write access
to Redis tried, and a sound envelope) and, from hypothesis, mutations of it
(bytes changed, inserted, cut; any JSON value, NaN and Infinity included, put in
any field). Each must give a valid value or EnvelopeError / a MalformedEvent;
nothing else may be raised, no module may be imported, and what the store
writer would write must be JSON a database takes.

Derandomized, without an example database: the same examples on every run.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import scrapy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scrapy_retryqueue.exceptions import EncryptionKeyError, EnvelopeError
from scrapy_retryqueue.queue import events
from scrapy_retryqueue.queue.envelope import (
    read_document,
    request_from_json,
    task_from_json,
)
from scrapy_retryqueue.secure.encryption import cipher_for
from scrapy_retryqueue.settings.defaults import ENVELOPE_MAX_DEPTH
from scrapy_retryqueue.store.writer import Event, build_batch, parse_envelope

CORPUS_DIR = Path(__file__).parent / "corpus" / "entries"
CORPUS = {path.name: path.read_bytes() for path in sorted(CORPUS_DIR.iterdir())}
#: Corpus entries the crawl's reader must accept (everything else is malformed).
SOUND = {"valid.json", "valid-dead-letter.json", "class-form-request.json", "nul-in-text.json"}
SOUND_FOR_THE_STORE = SOUND | {
    # The store is lenient about fields (it shows what it can): only what is no
    # sound JSON object is kept as malformed.
    name
    for name in CORPUS
    if name.startswith(("class-", "callback-", "errback-", "headers-", "body-", "method-"))
    or name.startswith(("priority-", "meta-", "flags-", "cookies-", "url-not", "url-empty"))
    or name.startswith(("first-error-", "kind-", "node-", "version-", "sealed-", "encoding-"))
    or name in ("attempts-huge.json", "attempts-negative.json", "created-past-9999.json")
    or name in ("created-text.json", "duplicate-keys.json")
}
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: One key that opens nothing the corpus holds: sealed entries must be
#: EncryptionKeyError (sound, another node's) or EnvelopeError (malformed).
CIPHER = cipher_for([b"ZmDfcTF7_60GrrY167zsiPd67pEvs0aGOv2oasOM1Pg="])


class FuzzSpider(scrapy.Spider):
    name = "fuzz"

    def parse(self, response: Any) -> None:
        return None


SPIDER = FuzzSpider()


def crawl_reads(raw: bytes | str) -> scrapy.Request | None:
    """What a poll does with a claimed envelope; None when it is malformed."""
    try:
        task = task_from_json(raw)
        return request_from_json(task.request, SPIDER, cipher=CIPHER)
    except (EnvelopeError, EncryptionKeyError):
        return None


def store_reads(raw: bytes | str) -> dict[str, Any]:
    """What the store writer makes of a dead letter: its row, and that the
    envelope it writes is JSON a database takes."""
    doc = parse_envelope(raw, task_id="fuzz", node="w")
    assert doc is not None
    # The text written to the envelope column: strict JSON, sound by the same reader.
    assert read_document(doc.raw) == json.loads(doc.raw)
    dead = Event("1-0", "fuzz", {events.TYPE: events.DEAD, events.ID: "fuzz", events.TS: "1"})
    batch = build_batch([dead], {("fuzz", "dead", "fuzz"): doc})
    (row,) = batch.generations[0]
    for name, value in row.items():
        if isinstance(value, int) and not isinstance(value, bool):
            assert -(2**63) <= value < 2**63, name
        if isinstance(value, float):
            assert math.isfinite(value), name
        if isinstance(value, str):
            value.encode()  # no lone surrogate reaches a column
            assert "\x00" not in value, name
    return row


def reads_everything(raw: bytes | str) -> None:
    loaded = set(sys.modules)
    crawl_reads(raw)
    store_reads(raw)
    # Reading an entry never imports anything (its top-level code would run).
    assert set(sys.modules) == loaded


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_corpus_entry_is_a_task_or_malformed_for_the_crawl_and_the_store(name: str) -> None:
    raw = CORPUS[name]
    loaded = set(sys.modules)
    request = crawl_reads(raw)
    assert (request is not None) == (name in SOUND), name
    row = store_reads(raw)
    assert set(sys.modules) == loaded
    malformed = row["last_error_kind"] == "malformed" and row["url"] is None
    assert malformed == (name not in SOUND_FOR_THE_STORE), name


def test_the_corpus_holds_the_cases_of_the_report() -> None:
    # Each hostile case the issue lists, so that a change of the corpus cannot drop one.
    for name in (
        "created-infinity.json",
        "due-1e999.json",
        "nested-10000-in-meta.json",
        "class-not-a-class.json",
        "class-runs-code.json",
        "url-lone-surrogate.json",
    ):
        assert name in CORPUS and name not in SOUND


def test_a_request_class_is_never_imported_to_be_checked(tmp_path: Path) -> None:
    # A module whose top-level code leaves a mark; on the path, not imported yet.
    marker = tmp_path / "ran"
    (tmp_path / "rq_fuzz_side_effect.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport scrapy\nclass Request(scrapy.Request): pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        raw = json.dumps(
            {
                **json.loads(CORPUS["valid.json"]),
                "request": {"url": "http://example.com/", "_class": "rq_fuzz_side_effect.Request"},
            }
        )
        with pytest.raises(EnvelopeError, match="not a scrapy Request class"):
            request_from_json(task_from_json(raw).request, SPIDER)
        assert not marker.exists()
        assert "rq_fuzz_side_effect" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("rq_fuzz_side_effect", None)


def test_nesting_is_refused_as_deep_as_it_is_read_and_no_deeper() -> None:
    def nested(depth: int) -> str:
        # The envelope, its request and its meta are 3 levels; the rest in meta.
        inner = "[" * (depth - 3) + "]" * (depth - 3)
        doc = json.loads(CORPUS["valid.json"])
        text = json.dumps(doc)
        return text.replace('"callback": "parse"', f'"callback": "parse", "meta": {{"x": {inner}}}')

    assert crawl_reads(nested(ENVELOPE_MAX_DEPTH)) is not None
    with pytest.raises(EnvelopeError, match="nested deeper"):
        task_from_json(nested(ENVELOPE_MAX_DEPTH + 1))


def _mutate(seed: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    data = bytearray(seed)
    for where, cut, insert in edits:
        at = where % (len(data) + 1)
        data[at : at + cut] = insert
    return bytes(data)


@FUZZ
@given(
    seed=st.sampled_from(sorted(CORPUS)),
    edits=st.lists(
        st.tuples(
            st.integers(0, 2**16),
            st.integers(0, 8),
            st.binary(max_size=6)
            | st.sampled_from(
                [
                    b"Infinity",
                    b"NaN",
                    b"1e999",
                    b"\\ud800",
                    b"[[[[",
                    b"{",
                    b'"',
                    b"\xff",
                    b"\\u0000",
                ]
            ),
        ),
        max_size=4,
    ),
)
def test_mutated_corpus_entries_never_raise_anything_but_the_packages_error(
    seed: str, edits: list[tuple[int, int, bytes]]
) -> None:
    reads_everything(_mutate(CORPUS[seed], edits))


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)
FIELDS = [
    ("v",),
    ("id",),
    ("spider",),
    ("kind",),
    ("attempts",),
    ("attempts", "timeout"),
    ("first_error",),
    ("last_error", "message"),
    ("node",),
    ("created",),
    ("updated",),
    ("due",),
    ("dead_kind",),
    ("max_retries",),
    ("request",),
    ("request", "url"),
    ("request", "method"),
    ("request", "headers"),
    ("request", "headers", 0),
    ("request", "body"),
    ("request", "callback"),
    ("request", "errback"),
    ("request", "meta"),
    ("request", "cb_kwargs"),
    ("request", "cookies"),
    ("request", "priority"),
    ("request", "encoding"),
    ("request", "flags"),
    ("request", "_class"),
    ("request", "encrypted"),
]


@FUZZ
@given(
    path=st.sampled_from(FIELDS),
    value=JSON_VALUES,
    ascii_only=st.booleans(),
)
def test_any_json_value_in_any_field_is_a_task_or_malformed(
    path: tuple[Any, ...], value: Any, ascii_only: bool
) -> None:
    doc = json.loads(CORPUS["valid.json"])
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    # allow_nan: NaN and Infinity as a hostile writer's JSON library writes them.
    raw = json.dumps(doc, ensure_ascii=ascii_only, allow_nan=True)
    try:
        raw.encode()
    except UnicodeEncodeError:
        raw = json.dumps(doc, ensure_ascii=True, allow_nan=True)  # a lone surrogate, escaped
    reads_everything(raw)


@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(sorted({events.TYPE, *events.INTEGER_FIELDS, events.ID, events.IDS}))
        | st.binary(max_size=6),
        st.sampled_from([b"dead", b"claimed", b"scheduled", b"succeeded"])
        | st.binary(max_size=24)
        | st.integers(-(2**70), 2**70).map(lambda n: str(n).encode()),
        max_size=6,
    ),
    entry_id=st.binary(max_size=24) | st.sampled_from([b"18446744073709551615-0", b"1-1"]),
)
def test_any_stream_entry_is_events_or_a_malformed_event(
    fields: dict[Any, Any], entry_id: bytes
) -> None:
    parsed = events.parse_entry(entry_id, fields)
    spider_events = []
    for item in parsed:
        assert isinstance(item, (events.Event, events.MalformedEvent))
        if isinstance(item, events.Event):
            for number in (item.ts, *item.position, item.due, item.attempt, item.wait_ms):
                assert number is None or -(2**63) <= number < 2**63
            spider_events.append(Event(item.stream_id, "fuzz", item.fields))
    # The store writer makes rows of them without raising.
    build_batch(spider_events, {})
