"""Plain value conversions every layer shares: the clock in ms, Redis replies as text."""

from __future__ import annotations

import time
from typing import Any


def now_ms() -> int:
    """Milliseconds since the epoch: the unit of every time the queue stores."""
    return int(time.time() * 1000)


def as_text(value: Any) -> str:
    """A Redis reply (bytes unless the client decodes) as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)
