"""The routes a program calls: the JSON API and /metrics, each answer it may give in the OpenAPI schema.

Reads answer JSON (every non-ASCII character escaped); a write needs the token,
checked before its body is read (:class:`~.guard.WriteRoute`). Every refusal is
``{"detail": ...}`` naming the parameter and its value (:class:`ErrorAnswer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Security
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from .actions import ACTIONS
from .backend import Backend
from .errors import DashboardError
from .filters import FILTER_NAMES, parse_filters
from .guard import WriteRoute, bearer
from .params import MAX_IDENT, MAX_PAGE, Action, QueryValue, Window, names, page_query
from .settings import MAX_PAGE_SIZE, DashboardConfig
from .tasks import SORTABLE

#: Largest body of an action request (bytes): 10,000 ids and filters fit well within it.
MAX_ACTION_BODY = 2_000_000


class ASCIIJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: any text (even a lone surrogate
    from a hostile request) renders, and the answer is the same JSON value."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode()


class ActionRequest(BaseModel):
    """Which tasks an action touches: ids, or a filter (the tasks page's), or both."""

    ids: list[str] = Field(default_factory=list, description="row ids or task ids")
    filters: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="spider, status, kind, domain, http_status, node, since, until, id, q",
    )
    dry_run: bool = Field(False, description="only count what it would touch")


class ErrorAnswer(BaseModel):
    """What every refusal answers: one line that names the parameter and its value."""

    detail: str = Field(description="what was wrong, naming the parameter and its value")


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return {"model": ErrorAnswer, "description": description, **extra}


#: The answers every API route may give besides its own (documented in the schema).
READ_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error(
        "a query parameter is out of its bounds or names nothing (the detail names it and "
        "its value), or the Host header is not a name of this dashboard"
    ),
    503: _error("the store or Redis does not answer"),
}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **READ_ERRORS,
    401: _error(
        "no token, or a wrong one",
        headers={"WWW-Authenticate": {"schema": {"type": "string"}}},
    ),
    403: _error("the dashboard is read-only, or a page's X-CSRF-Token is missing or wrong"),
    404: _error("no such action"),
    413: _error(f"the body is larger than {MAX_ACTION_BODY:,} bytes"),
    422: _error("the body is not the JSON object the action takes (the detail names the field)"),
    429: _error(
        "too many wrong tokens from this client: try again after Retry-After seconds",
        headers={"Retry-After": {"schema": {"type": "integer"}}},
    ),
}


async def tasks_answer(
    backend: Backend,
    config: DashboardConfig,
    filters: dict[str, list[str]],
    paging: dict[str, Any],
) -> Any:
    """The tasks the query string asks for (its filters and page), as ``/api/tasks`` answers."""
    parsed = parse_filters(filters, known_kinds=backend.known_kinds)
    return await run_in_threadpool(
        backend.tasks,
        parsed,
        sort=paging["sort"] or "id",
        order=paging["order"] or "desc",
        page=paging["page"] or 1,
        per_page=paging["per_page"] or config.page_size,
    )


async def recovery_answer(
    backend: Backend, spider: Sequence[str], kind: Sequence[str], domain: Sequence[str]
) -> Any:
    """The learned recovery times and budgets, as ``/api/recovery`` answers."""
    return await run_in_threadpool(backend.recovery, names(spider), names(kind), names(domain))


def add_api(
    app: FastAPI,
    backend: Backend,
    config: DashboardConfig,
    filter_query: Callable[..., dict[str, list[str]]],
) -> None:
    """The API's routes and /metrics; *filter_query* is the app's
    (:func:`.params.filter_query_for`)."""

    @app.get(
        "/api/overview",
        tags=["read"],
        responses=READ_ERRORS,
        summary="Live counts, breakdowns and the chart",
        description="window: hour or day (how far back the chart looks; its buckets fit "
        "the activity); spider (repeat or comma-separate) to show only some spiders.",
    )
    async def api_overview(
        spider: Annotated[
            list[QueryValue],
            Query(description="spider name(s), repeated or comma-separated", default_factory=list),
        ],
        window: Annotated[Window, Query(description="hour (default) or day")] = "hour",
    ) -> Any:
        return await run_in_threadpool(backend.overview, window or "hour", names(spider))

    @app.get(
        "/api/recovery",
        tags=["read"],
        responses=READ_ERRORS,
        summary="The learned recovery curves, per spider, kind and domain, and each "
        "domain's retry budget",
        description="What the fleet has learned of how long outages last (the records "
        "LearnedBackoff reads; docs/backoff.md). Per spider: `curves`, one per (kind, "
        "domain), the most observed first: `outages` and `recovered` (weighted), "
        "`median_s` and `p90_s` (null when fewer outages were seen to end), "
        "`longest_seen_s`, `points` ([t seconds, share of outages over after t]), "
        "`updated_at`, and `next`: what LearnedBackoff would do with a task failing now "
        "(`delay_s`, `plan_s` the ages of the attempts after it, `reason`); `kinds`, each "
        "kind over all its domains; `records`, `shown`, `unreadable` (records ignored), "
        "`in_use` (RETRYQUEUE_BACKOFF is LearnedBackoff). `notes`: unreadable records and "
        "keys that cannot be read, one line each. Each spider's `budget`: the retry "
        "budget of each domain now (RETRYQUEUE_RETRY_BUDGET; docs/backoff.md), null when "
        "it is off: `domains` with requests or retries in the window, the busiest first "
        "(`domain`, `requests` and `retries` counted in the window, `limit` = floor x "
        "window + share x requests, `allowance`: retries still allowed, 0 when over "
        "budget), `unreadable` (records not shown, named in `notes`). The top-level "
        "`budget`: its `share`, `floor` and `window`, null when it is off. Filters "
        "(repeat or comma-separate): spider, kind, domain (its subdomains match too; "
        "kind leaves the budget, which is per domain, whole).",
    )
    async def api_recovery(
        spider: Annotated[
            list[QueryValue],
            Query(description="spider name(s), repeated or comma-separated", default_factory=list),
        ],
        kind: Annotated[
            list[QueryValue],
            Query(description="failure kind(s), repeated or comma-separated", default_factory=list),
        ],
        domain: Annotated[
            list[QueryValue],
            Query(description="host name(s); subdomains match too", default_factory=list),
        ],
    ) -> Any:
        return await recovery_answer(backend, spider, kind, domain)

    @app.get(
        "/api/tasks",
        tags=["read"],
        responses=READ_ERRORS,
        summary="Tasks and dead letters, filtered, sorted and paginated",
        description="Filters (repeat or comma-separate): spider, status (all by default), kind, "
        "domain, http_status, node, since, until, id, q (URL substring). "
        f"sort: one of {', '.join(SORTABLE)}; order: asc or desc; page (1-{MAX_PAGE}); "
        f"per_page (1-{MAX_PAGE_SIZE}).",
    )
    async def api_tasks(
        paging: Annotated[dict[str, Any], Depends(page_query)],
        # A default, not Annotated: this app's own dependency (its kinds) is a local
        # name, which FastAPI cannot read back from a string annotation.
        filters: dict[str, list[str]] = Depends(filter_query),  # noqa: B008
    ) -> Any:
        return await tasks_answer(backend, config, filters, paging)

    @app.get(
        "/api/tasks/{ident}",
        tags=["read"],
        summary="One task by row id or task id",
        responses={**READ_ERRORS, 404: _error("no task has this row id or task id")},
    )
    async def api_task(
        ident: Annotated[str, Path(description="row id or task id", max_length=MAX_IDENT)],
    ) -> Any:
        return await run_in_threadpool(backend.task, ident)

    @app.get(
        "/api/actions/{action}/count",
        tags=["actions"],
        summary="How many tasks an action would touch (for a confirmation)",
        responses={**READ_ERRORS, 404: _error("no such action")},
    )
    async def api_action_count(
        action: Annotated[Action, Path(description=", ".join(ACTIONS))],
        filters: dict[str, list[str]] = Depends(filter_query),  # noqa: B008 (see api_tasks)
    ) -> Any:
        parsed = parse_filters(filters, known_kinds=backend.known_kinds)
        matched = await run_in_threadpool(backend.count_for, action, parsed)
        return {"action": action, "matched": matched}

    async def api_action(
        action: Annotated[Action, Path(description=", ".join(ACTIONS))], body: ActionRequest
    ) -> Any:
        params: dict[str, Any] = dict(body.filters)
        unknown = set(params) - {*FILTER_NAMES, "q"}
        if unknown:
            shown = ", ".join(name[:40] for name in sorted(unknown)[:5])
            raise DashboardError(f"unknown filter(s): {shown}; known: {', '.join(FILTER_NAMES)}, q")
        if body.ids:
            params["id"] = body.ids
        if not params:
            raise DashboardError("give ids or filters (status=all for every task)")
        filters = parse_filters(params, known_kinds=backend.known_kinds)
        return await run_in_threadpool(backend.run_action, action, filters, dry_run=body.dry_run)

    app.router.add_api_route(
        "/api/actions/{action}",
        api_action,
        methods=["POST"],
        # The token is checked before the body is read (WriteRoute).
        route_class_override=WriteRoute,
        dependencies=[Security(bearer)],
        max_body_size=MAX_ACTION_BODY,
        tags=["actions"],
        responses=WRITE_ERRORS,
        summary="retry_now, cancel, requeue or purge the matching tasks (token needed)",
        description="retry_now: waiting tasks become due now. cancel: waiting or retrying "
        "tasks are removed from the queue (status cancelled). requeue: dead letters go back "
        "to the queue, due now, with a fresh budget. purge: finished tasks (succeeded, dead, "
        "cancelled) are deleted from the store. Each action touches only the matching tasks "
        "in the statuses it applies to.",
    )

    @app.get(
        "/metrics",
        tags=["read"],
        summary="Prometheus metrics (text format 0.0.4)",
        response_class=PlainTextResponse,
        responses={
            200: {
                "description": "the metrics, in Prometheus's text format 0.0.4",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            # A Host refused is JSON whatever the route (hosts.py).
            400: {
                "description": READ_ERRORS[400]["description"],
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorAnswer"}}
                },
            },
        },
    )
    async def metrics() -> Any:
        from .metrics import CONTENT_TYPE, render

        text = await run_in_threadpool(render, backend)
        return Response(text, media_type=CONTENT_TYPE)
