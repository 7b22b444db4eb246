"""Redis: key names, envelopes and events, the Lua scripts, the delayed queue, the frontier, spool, connection.

Every write to Redis goes through this layer, one script per operation (``lua/``).
``scrapy_retryqueue.queue`` was the delayed queue's own module before the package
had rooms: its names are still answered here, from :mod:`.delayed`, on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The old module's names (only these: a submodule's name must not load it).
_DELAYED = frozenset(
    {
        "SCRIPT_NAMES",
        "SNIPPETS",
        "Claimed",
        "Counts",
        "RedisDelayedQueue",
        "RetryBudget",
        "Write",
        "envelope_text",
        "envelope_url",
        "load_script_source",
        "task_id_text",
        "wire_id",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _DELAYED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".delayed", __name__), name)
