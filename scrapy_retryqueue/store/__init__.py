"""The SQL store: the failure history and dead letters (SQLAlchemy 2.x).

PostgreSQL in production (RETRYQUEUE_DATABASE_URL), SQLite under the embedded
dir when nothing is set. See docs/store.md.
"""

from __future__ import annotations

from .config import StoreConfig, load_store_config
from .db import Store, StoreError, StoreUnavailable

__all__ = ["Store", "StoreConfig", "StoreError", "StoreUnavailable", "load_store_config"]
