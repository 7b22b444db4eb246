"""Plain value conversions every layer shares: the clock in ms, Redis replies as text,
a value as an error line shows it."""

from __future__ import annotations

import time
from typing import Any


def now_ms() -> int:
    """Milliseconds since the epoch: the unit of every time the queue stores."""
    return int(time.time() * 1000)


def as_text(value: Any) -> str:
    """A Redis reply (bytes unless the client decodes) as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def shown(value: Any, limit: int = 200) -> str:
    """*value*'s repr for an error line: at most *limit* characters, however
    deep or long the value (a repr of a value nested thousands deep would fail)."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deeply to show>"
    if len(text) > limit:
        return f"{text[:limit]}… ({len(text)} characters)"
    return text
