"""The dashboard's connections: the store and Redis from settings, opened on first use and kept.

Every question the dashboard answers (:mod:`.overview`, :mod:`.recovery`,
:mod:`.tasks`, :mod:`.actions`) takes these connections; :class:`.backend.Backend`
is them plus one method per question.
"""

from __future__ import annotations

import threading
from typing import Any

from ..config import kinds_setting, secret_headers_setting
from ..exceptions import ConfigError, RetryQueueError
from ..store.db import Store
from ..view.sources import Sources
from .errors import DashboardError


class Connections:
    """Opens the store and Redis on first use (never at construction) and keeps them."""

    def __init__(self, settings: Any, *, secret_headers: frozenset[str] | None = None) -> None:
        self.settings = settings
        #: Header names whose values no answer shows (RETRYQUEUE_SECRET_HEADERS).
        self.secret_headers = (
            secret_headers
            if secret_headers is not None
            else secret_headers_setting(settings if settings is not None else {})
        )
        #: The built-in kinds and RETRYQUEUE_KINDS': what a filter may name, and
        #: which kinds are retried (the success rate counts only those).
        self.kind_table = kinds_setting(settings if settings is not None else {})
        self.known_kinds: tuple[str, ...] = self.kind_table.names
        self._sources: Sources | None = None
        self._lock = threading.Lock()

    def sources(self) -> Sources:
        with self._lock:
            if self._sources is None:
                try:
                    self._sources = Sources(self.settings)
                except ConfigError as exc:
                    raise DashboardError(str(exc), 500) from None
            return self._sources

    def store(self) -> Store:
        sources = self.sources()
        try:
            return sources.store()
        except RetryQueueError as exc:  # SourceError, StoreError: no store to read
            raise DashboardError(str(exc), 503) from None

    @property
    def project(self) -> str:
        """The namespace of the spiders' keys (RETRYQUEUE_NAMESPACE, else BOT_NAME)."""
        return self.sources().config.namespace

    def redis(self) -> Any:
        """A Redis client, or None when the embedded server is not running."""
        sources = self.sources()
        try:
            return sources.redis(start_embedded=False)
        except RetryQueueError as exc:  # SourceError: Redis does not answer
            raise DashboardError(str(exc), 503) from None

    def close(self) -> None:
        if self._sources is not None:
            self._sources.close()
            self._sources = None
