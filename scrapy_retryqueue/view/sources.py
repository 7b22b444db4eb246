"""Opening the store and Redis from settings, for the commands and the dashboard.

Nothing is opened until it is asked for, and what was opened is kept: the
commands open one side or both once; the dashboard keeps them for its lifetime
and asks from several threads.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import redis

from ..config import Config, load_config, redact_url
from ..exceptions import RetryQueueError
from ..queue import embedded
from ..queue.connection import client_for, embedded_dir, is_outage
from ..store.config import StoreConfig, load_store_config, sqlite_path
from ..store.db import Store


class SourceError(RetryQueueError):
    """The store or Redis cannot be opened; the message says why and what to do."""


class Sources:
    """Settings-derived configuration, the store and Redis, opened on demand.

    Reading the settings raises :class:`~scrapy_retryqueue.exceptions.ConfigError`
    for a bad value; opening raises :class:`SourceError` or the store's
    :class:`~scrapy_retryqueue.store.db.StoreError`.
    """

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.config: Config = load_config(settings)
        self.store_config: StoreConfig = load_store_config(settings)
        self.directory: Path = embedded_dir(self.config.embedded_dir)
        self._store: Store | None = None
        self._redis: Any = None
        #: True while this process holds the embedded server (embedded.hold): a
        #: command or the dashboard stops it on close when no crawl uses it.
        self._held = False
        self._lock = threading.Lock()

    @property
    def database_url(self) -> str:
        return self.store_config.url_for(self.directory)

    def store(self, *, check_schema: bool = True, create: bool = False) -> Store:
        """The store; without *create*, the default SQLite file must exist already."""
        with self._lock:
            if self._store is None:
                self._store = self._open_store(check_schema=check_schema, create=create)
            return self._store

    def _open_store(self, *, check_schema: bool, create: bool) -> Store:
        url = self.database_url
        file = sqlite_path(url)
        path = Path(file) if file else None
        # A read never makes a database: SQLite would create an empty file (and
        # its folders) for a path that names none, default or not.
        if path is not None and not create and not path.exists():
            if self.store_config.database_url:
                raise SourceError(
                    f"no store database at {path}: RETRYQUEUE_DATABASE_URL names a "
                    "SQLite file that does not exist"
                )
            raise SourceError(
                f"no store database here: {path} does not exist (run a crawl with the "
                "add-on first, or set RETRYQUEUE_DATABASE_URL, e.g. "
                "-s RETRYQUEUE_DATABASE_URL=postgresql://user@host/db)"
            )
        store = Store(url)
        store.ping()
        if check_schema:
            store.raise_for(store.schema_state())
        return store

    def redis(self, *, start_embedded: bool = True) -> Any:
        """A Redis client; None when the embedded server is not running and may not start."""
        with self._lock:
            if self._redis is None:
                url = self.config.redis_url
                if url is None and not start_embedded and not embedded.is_running(self.directory):
                    return None
                if url is None and not self._held:
                    embedded.hold(self.directory, keep=self.config.embedded_keep)
                    self._held = True
                client, url = client_for(self.config, embedded_directory=self.directory)
                try:
                    client.ping()
                except Exception as exc:
                    if not (isinstance(exc, (redis.RedisError, OSError)) or is_outage(exc)):
                        raise
                    raise SourceError(
                        f"Redis at {redact_url(url)} does not answer ({exc})"
                    ) from None
                self._redis = client
            return self._redis

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
            if self._redis is not None:
                self._redis.close()
                self._redis = None
            if self._held:
                self._held = False
                embedded.let_go(self.directory, keep=self.config.embedded_keep)
