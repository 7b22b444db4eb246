"""What a request asks the backend for: its filters and spider names, checked.

The filters are the store commands' (:class:`~scrapy_retryqueue.store.queries.Filters`),
plus a URL substring (``q``), read from query-string values or an action's JSON body.
Every refusal is a :class:`~.errors.DashboardError` (400) naming the field and its value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..decision.kinds import BUILTIN_TABLE
from ..exceptions import SpiderNameError
from ..queue.keys import keys_for
from ..store.queries import FilterError, Filters, check_text
from .errors import DashboardError

#: Filter names of the query string / JSON API (the export command's, plus q).
FILTER_NAMES = ("spider", "status", "kind", "domain", "http_status", "node", "since", "until", "id")
#: Values all the filters of one request may hold together, at most: each is a
#: parameter of the SQL query, and SQLite takes about 32,000.
MAX_FILTER_VALUES = 10_000
#: Longest URL substring (q), characters.
MAX_URL_SUBSTRING = 2000
#: Spiders the overview may be asked for at once.
MAX_OVERVIEW_SPIDERS = 200


def checked_spiders(spiders: Sequence[str]) -> list[str]:
    """*spiders* as a filter names them, each checked: at most MAX_OVERVIEW_SPIDERS, and
    a name no queue can have is said (a 400), not a server error."""
    if len(spiders) > MAX_OVERVIEW_SPIDERS:
        raise DashboardError(
            f"spider names {len(spiders)} spiders; at most {MAX_OVERVIEW_SPIDERS} at once"
        )
    try:
        checked = [check_text("spider", name.strip()) for name in spiders]
        for name in checked:
            keys_for(name)
    except (FilterError, SpiderNameError) as exc:
        raise DashboardError(str(exc)) from None
    return checked


def _plain_filter_message(message: str) -> str:
    # The store's messages name command-line options (--http-status); here they are fields.
    return re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), message)


def parse_filters(
    params: Mapping[str, Sequence[str] | str | None],
    *,
    default_status: str = "all",
    known_kinds: Sequence[str] = BUILTIN_TABLE.names,
) -> Filters:
    """Filters (with the URL substring, ``q``) from query-string or JSON values;
    *known_kinds* are the kinds the kind filter accepts (:attr:`Backend.known_kinds`)."""

    def values(name: str) -> list[str]:
        raw = params.get(name)
        if raw is None:
            return []
        if isinstance(raw, (str, int)):
            raw = [str(raw)]
        return [str(v) for v in raw if str(v).strip()]

    given = sum(len(v.split(",")) for name in (*FILTER_NAMES, "q") for v in values(name))
    if given > MAX_FILTER_VALUES:
        raise DashboardError(
            f"the filters hold {given} values; at most {MAX_FILTER_VALUES} in one request"
        )

    def one(name: str) -> str | None:
        got = values(name)
        return got[-1] if got else None

    try:
        filters = Filters.from_options(
            spiders=values("spider"),
            kinds=values("kind"),
            domains=values("domain"),
            http_statuses=values("http_status"),
            nodes=values("node"),
            since=one("since"),
            until=one("until"),
            statuses=values("status") or [default_status],
            ids=values("id"),
            known_kinds=known_kinds,
        )
    except FilterError as exc:
        raise DashboardError(_plain_filter_message(str(exc))) from None
    q = (one("q") or "").strip()
    if len(q) > MAX_URL_SUBSTRING:
        raise DashboardError(f"q is {len(q)} characters long; at most {MAX_URL_SUBSTRING}")
    try:
        filters.url_contains = check_text("q", q)
    except FilterError as exc:
        raise DashboardError(str(exc)) from None
    return filters
