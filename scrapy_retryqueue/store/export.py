"""Export rows of the store as CSV, JSON lines or JSON: inert for spreadsheets, secrets masked.

Rows come from :func:`~.queries.stream_rows` (EXPORT_COLUMNS order, JSON
columns as their JSON text), so a million rows stream in constant memory.
The stored request in each row's envelope has the values of its secret
headers masked (:func:`scrapy_retryqueue.secure.redact.mask_request`) unless the
caller passes no secret names.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import IO, Any

from ..secure.redact import mask_envelope, mask_raw
from .queries import EXPORT_COLUMNS, JSON_COLUMNS, TIME_COLUMNS

FORMATS = ("csv", "jsonl", "json")
#: A cell starting with one of these is a formula to a spreadsheet.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def escape_cell(value: str) -> str:
    """*value* made inert for spreadsheets (OWASP CSV injection): a leading quote."""
    return "'" + value if value.startswith(_FORMULA_START) else value


_json_str = json.encoder.encode_basestring  # the C string encoder


def _kind(name: str) -> str:
    if name in JSON_COLUMNS:
        return "json"
    if name in TIME_COLUMNS:
        return "time"
    return "value"


_KINDS = [_kind(name) for name in EXPORT_COLUMNS]


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: text made inert for spreadsheets, None empty."""
    if value is None:
        return ""
    if isinstance(value, str):
        return escape_cell(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def json_value(value: Any, kind: str) -> str:
    """A value as JSON text; JSON columns arrive as JSON text already."""
    if value is None:
        return "null"
    if kind == "json":
        return value
    if isinstance(value, str):
        return _json_str(value)
    if isinstance(value, datetime):
        return f'"{value.isoformat()}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_KEYS = [_json_str(name) + ":" for name in EXPORT_COLUMNS]


def json_object(row: tuple[Any, ...]) -> str:
    return (
        "{"
        + ",".join(
            key + json_value(value, kind)
            for key, value, kind in zip(_KEYS, row, _KINDS, strict=True)
        )
        + "}"
    )


#: The column that holds the stored request (its envelope's ``request``).
_ENVELOPE = EXPORT_COLUMNS.index("envelope")


def csv_header() -> str:
    """The first line of a csv export, as written (line end included)."""
    line = io.StringIO()
    csv.writer(line).writerow(EXPORT_COLUMNS)
    return line.getvalue()


@functools.lru_cache(maxsize=8)
def _needles(secret: frozenset[str]) -> tuple[str, ...]:
    """Lower-case text that the JSON of an envelope holding a secret header contains.

    The bare names, without their quotes (a needle ending in a quote is slow
    to find in JSON), and none that contains another: "authorization" finds
    "proxy-authorization" too, "cookie" finds the "cookies" that
    mask_request also masks. A name found elsewhere (in a URL, say) only
    costs the row a decoding.
    """
    names = sorted(secret, key=len)
    needles: list[str] = []
    for name in names:
        if not any(needle in name for needle in needles):
            needles.append(name)
    return tuple(needles)


def masked_envelope(text: str | None, secret: frozenset[str]) -> str | None:
    """An envelope's JSON text with the values of its secret request headers masked.

    Text that cannot hold one (no secret name appears in it, whatever the
    case) is returned as it is, without decoding: most rows of a large export
    are not decoded at all. This package's json.dumps and PostgreSQL's jsonb
    output escape no ASCII letter, but a hostile writer's envelope may spell a
    name with escapes (``"\\u0041uthorization"``), and a malformed dead
    letter's bytes are kept as base64 (``"raw_base64"``), where no name shows:
    text holding either is decoded and masked too (mask_envelope reads both).
    """
    if text is None or not secret:
        return text
    lowered = text.lower()
    if "\\u" not in text and '"raw_base64"' not in text:
        for needle in _needles(secret):
            if needle in lowered:
                break
        else:
            return text
    try:
        envelope = json.loads(text)
    except (ValueError, RecursionError):
        # Not JSON (a malformed dead letter keeps its raw text): shown as stored,
        # but for the secret values that text may still show (mask_raw).
        shown = mask_raw(text, secret)
        return text if shown == text else shown
    masked = mask_envelope(envelope, secret)
    if masked is envelope:
        return text
    return json.dumps(masked, ensure_ascii=False, separators=(",", ":"))


def masked_rows(
    rows: Iterator[tuple[Any, ...]], secret: frozenset[str]
) -> Iterator[tuple[Any, ...]]:
    """*rows* with the stored request of each masked (see :func:`masked_envelope`)."""
    for row in rows:
        text = row[_ENVELOPE]
        shown = masked_envelope(text, secret)
        if shown is not text:
            row = (*row[:_ENVELOPE], shown, *row[_ENVELOPE + 1 :])
        yield row


def write_rows(
    rows: Iterator[tuple[Any, ...]],
    fmt: str,
    out: IO[str],
    advance: Callable[[], None],
    *,
    secret: frozenset[str] = frozenset(),
    header: bool = True,
) -> int:
    """Write rows (EXPORT_COLUMNS order) as csv, jsonl or json; returns how many.

    *advance* is called after each row (a progress line). The values of the
    request headers named in *secret* (lower case, RETRYQUEUE_SECRET_HEADERS)
    are masked; an empty *secret* writes them as stored. *header*: False
    leaves out the csv header (rows appended to an export).
    """
    if secret:
        rows = masked_rows(rows, secret)
    n = 0
    if fmt == "csv":
        writer = csv.writer(out)
        if header:
            writer.writerow(EXPORT_COLUMNS)
        for row in rows:
            writer.writerow([csv_cell(value) for value in row])
            n += 1
            advance()
    elif fmt == "jsonl":
        for row in rows:
            out.write(json_object(row))
            out.write("\n")
            n += 1
            advance()
    else:
        out.write("[")
        for row in rows:
            out.write(",\n" if n else "\n")
            out.write(json_object(row))
            n += 1
            advance()
        out.write("\n]\n" if n else "]\n")
    return n
