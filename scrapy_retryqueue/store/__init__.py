"""The SQL store: the failure history and dead letters (SQLAlchemy 2.x).

PostgreSQL in production (RETRYQUEUE_DATABASE_URL), SQLite under the embedded
dir when nothing is set. See docs/store.md. The names below are imported on
first use: a crawl loads SQLAlchemy only when its store writer starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import StoreConfig, load_store_config
    from .db import Store, StoreError, StoreUnavailable

__all__ = ["Store", "StoreConfig", "StoreError", "StoreUnavailable", "load_store_config"]

_HOMES = {
    "Store": ".db",
    "StoreError": ".db",
    "StoreUnavailable": ".db",
    "StoreConfig": ".config",
    "load_store_config": ".config",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
