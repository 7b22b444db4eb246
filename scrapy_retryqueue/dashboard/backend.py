"""What the app asks of the dashboard's data: one object over the store and Redis, opened on first use.

No web framework here: plain data in, plain data (JSON-ready dicts) out, so the
HTML pages, the JSON API, /metrics and the tests share one implementation.
:class:`Backend` holds the connections (:mod:`.connections`); each question is answered by its own
module: :mod:`.overview`, :mod:`.recovery`, :mod:`.tasks` (reads) and
:mod:`.actions` (changes). Redis is read through :mod:`scrapy_retryqueue.view.live`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..store.queries import Filters
from . import actions, overview, recovery, tasks
from .actions import ACTIONS
from .connections import Connections
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


class Backend(Connections):
    """The connections, and one method per question the app asks of the data."""

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
