"""What the app asks of the dashboard's data: one object over the store and Redis, opened on first use.

No web framework here: plain data in, plain data (JSON-ready dicts) out, so the
HTML pages, the JSON API, /metrics and the tests share one implementation.
:class:`Backend` holds the connections; each question is answered by its own
module: :mod:`.overview`, :mod:`.recovery`, :mod:`.tasks` (reads) and
:mod:`.actions` (changes). Redis is read through :mod:`scrapy_retryqueue.view.live`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ..config import kinds_setting, secret_headers_setting
from ..exceptions import ConfigError, RetryQueueError
from ..store.db import Store
from ..store.queries import Filters
from ..view.sources import Sources
from . import actions, overview, recovery, tasks
from .actions import ACTIONS
from .errors import DashboardError
from .filters import FILTER_NAMES, parse_filters
from .overview import WINDOWS, percentile
from .tasks import SORTABLE

# The names this module held before it was split, for code that imports them here.
__all__ = [
    "ACTIONS",
    "FILTER_NAMES",
    "SORTABLE",
    "WINDOWS",
    "Backend",
    "DashboardError",
    "parse_filters",
    "percentile",
]


class Backend:
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

    # -- connections -------------------------------------------------------------

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

    # -- reads -------------------------------------------------------------------

    def overview(self, window: str = "hour", spiders: Sequence[str] = ()) -> dict[str, Any]:
        """Totals, breakdowns and the chart, of every spider or of *spiders*."""
        return overview.read(self, window, spiders)

    def chart(
        self, client: Any, spiders: Sequence[str], window: str, now_ms: int
    ) -> dict[str, Any]:
        """Scheduled, recovered and dead per bucket of *window*, from the events streams."""
        return overview.chart(client, spiders, window, now_ms, project=self.project)

    def recovery(
        self,
        spiders: Sequence[str] = (),
        kinds: Sequence[str] = (),
        domains: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Per spider, the learned recovery curves and each domain's retry budget now."""
        return recovery.read(self, spiders, kinds, domains)

    def tasks(
        self,
        filters: Filters,
        *,
        sort: str = "id",
        order: str = "desc",
        page: int = 1,
        per_page: int = 50,
    ) -> dict[str, Any]:
        """One page of the tasks matching *filters*, sorted, with their total."""
        return tasks.listing(self, filters, sort=sort, order=order, page=page, per_page=per_page)

    def task(self, ident: str) -> dict[str, Any]:
        """One task by row id or task id: the row, live state, request and timeline."""
        return tasks.one(self, ident)

    # -- changes -----------------------------------------------------------------

    def action_filters(self, action: str, filters: Filters) -> Filters:
        return actions.applicable(action, filters)

    def count_for(self, action: str, filters: Filters) -> int:
        return actions.count_for(self, action, filters)

    def run_action(self, action: str, filters: Filters, *, dry_run: bool = False) -> dict[str, Any]:
        """Apply *action* to the matching tasks it applies to; says how many it touched."""
        return actions.run(self, action, filters, dry_run=dry_run)

    def sync(self, client: Any, spiders: set[str]) -> None:
        """Write the spiders' waiting events into the store now, so the change shows."""
        actions.sync(self, client, spiders)
