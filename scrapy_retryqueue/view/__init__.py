"""What people read: the live queue in Redis beside the store's history, opened from settings.

The commands and the dashboard read through this layer; it never imports the crawl
stack (``crawl``, ``runtime``) nor Scrapy's engine. ``scrapy_retryqueue.view`` was the
live view's own module before the package had rooms: its names are still answered
here, from :mod:`.live`, on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The old module's names (only these: a submodule's name must not load it).
_LIVE = frozenset(
    {
        "QueueCounts",
        "RecoveryHash",
        "TaskPlace",
        "budgets",
        "counts",
        "event_types_since",
        "has_keys",
        "lease_holders",
        "recovery_hash",
        "spiders",
        "spiders_with_events",
        "task_events",
        "task_place",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _LIVE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".live", __name__), name)
