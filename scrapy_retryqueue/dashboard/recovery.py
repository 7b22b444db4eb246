"""The recovery page's data: the learned recovery curves and each domain's retry budget now.

Per spider, what :func:`scrapy_retryqueue.view.status.learned_recovery` reads of the
records LearnedBackoff learns from, with its next pick, and what
:func:`~scrapy_retryqueue.view.status.retry_budget_state` reads of the retry budget;
filtered by spider, kind and domain. Records that do not read are notes, never errors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis

from ..config import Config
from ..exceptions import ConfigError
from ..store.queries import FilterError, check_text, shown
from ..values import now_ms
from ..view import live as view
from ..view.status import (
    EMBEDDED_DOWN,
    budget_malformed_line,
    learned_recovery,
    learned_strategy,
    retry_budget_state,
)
from .errors import DashboardError
from .filters import MAX_OVERVIEW_SPIDERS, checked_spiders
from .times import ms_iso

if TYPE_CHECKING:
    from .connections import Connections


def read(
    backend: Connections,
    spiders: Sequence[str] = (),
    kinds: Sequence[str] = (),
    domains: Sequence[str] = (),
) -> dict[str, Any]:
    """Per spider, the learned recovery curve of each (kind, domain) with its
    figures and LearnedBackoff's next pick (status.learned_recovery), and each
    domain's retry budget now (status.retry_budget_state; ``budget`` is None when
    it is off); *kinds* and *domains* (a domain matches its subdomains too) keep
    only some of them (the budget is per domain: *kinds* leave it whole)."""
    spiders = checked_spiders(spiders)
    try:
        domains = [check_text("domain", d.strip().lower()) for d in domains if d.strip()]
    except FilterError as exc:
        raise DashboardError(str(exc)) from None
    known = backend.known_kinds
    unknown = [kind for kind in kinds if kind not in known]
    if unknown:
        raise DashboardError(f"kind {shown(unknown[0])} is not a kind; known: {', '.join(known)}")
    now = now_ms()
    config = backend.sources().config
    out: dict[str, Any] = {
        "generated_at": ms_iso(now),
        # The budget's settings (the project's, as the nodes read them), None: off.
        "budget": (
            {
                "share": config.retry_budget,
                "floor": config.retry_budget_floor,
                "window": config.retry_budget_window,
            }
            if config.retry_budget
            else None
        ),
        "spiders": {},
        "notes": [],
    }
    client = backend.redis()
    if client is None:
        out["notes"].append(EMBEDDED_DOWN)
        return out
    try:
        strategy = learned_strategy(config, backend.settings)
        names = sorted(set(spiders) if spiders else view.spiders(client, backend.project))
    except ConfigError as exc:
        raise DashboardError(str(exc), 500) from None
    except redis.RedisError as exc:
        raise DashboardError(f"Redis does not answer: {exc}", 503) from None

    def in_domains(domain: str | None) -> bool:
        return not domains or (
            domain is not None and any(domain == d or domain.endswith("." + d) for d in domains)
        )

    def wanted(kind: str, domain: str | None) -> bool:
        return (not kinds or kind in kinds) and in_domains(domain)

    for spider in names[:MAX_OVERVIEW_SPIDERS]:
        learned = learned_recovery(client, spider, config=config, strategy=strategy, now=now)
        out["notes"].extend(learned.pop("notes"))
        learned["curves"] = [c for c in learned["curves"] if wanted(c["kind"], c["domain"])]
        learned["kinds"] = [k for k in learned["kinds"] if not kinds or k["kind"] in kinds]
        for curve in learned["curves"]:
            curve["updated_at"] = ms_iso(curve.pop("updated_ms"))
        learned["budget"] = _budget(client, spider, config, now, in_domains, out["notes"])
        budget = learned["budget"] or {}
        if (
            learned["records"]
            or learned["unreadable"]
            or budget.get("domains")
            or budget.get("unreadable")
            or spiders
        ):
            out["spiders"][spider] = learned
    return out


def _budget(
    client: Any,
    spider: str,
    config: Config,
    now: int,
    wanted: Callable[[str], bool],
    notes: list[str],
) -> dict[str, Any] | None:
    """*spider*'s retry budget per domain (the *wanted* ones), None when it is off;
    records that do not read are counted, and named in one line of *notes*."""
    state = retry_budget_state(client, spider, config=config, now=now)
    if state is None:
        return None
    if state.problem:
        notes.append(state.problem)
    unreadable = state.entry["unreadable"]
    if unreadable:
        notes.append(budget_malformed_line(spider, unreadable))
    return {
        "domains": [d for d in state.entry["domains"] if wanted(d["domain"])],
        "unreadable": len(unreadable),
    }
