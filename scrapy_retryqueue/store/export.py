"""Export rows of the store as CSV, JSON lines or JSON, inert for spreadsheets.

Rows come from :func:`~.queries.stream_rows` (EXPORT_COLUMNS order, JSON
columns as their JSON text), so a million rows stream in constant memory.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import IO, Any

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


def write_rows(
    rows: Iterator[tuple[Any, ...]], fmt: str, out: IO[str], advance: Callable[[], None]
) -> int:
    """Write rows (EXPORT_COLUMNS order) as csv, jsonl or json; returns how many.

    *advance* is called after each row (a progress line).
    """
    n = 0
    if fmt == "csv":
        writer = csv.writer(out)
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
