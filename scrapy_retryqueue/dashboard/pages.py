"""The dashboard's HTML pages: overview, tasks, one task, recovery times, rendered from their templates.

Each page shows what the JSON API answers for the same parameters (the overview
fetches ``/api/overview`` itself, to refresh). Every page carries the CSRF cookie
the pages' writes and forms send back, and a Content-Security-Policy that lets in
nothing but the dashboard's own files: no inline script or style, no CDN.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import jinja2
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from .. import __version__
from .api import recovery_answer, tasks_answer
from .backend import Backend
from .guard import CSRF_COOKIE, Guard
from .params import STATUSES, QueryValue, names, page_query
from .settings import DashboardConfig
from .tasks import SORTABLE

#: The pages' Jinja templates, shipped in the package.
TEMPLATES = Path(__file__).resolve().parent / "templates"
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


def duration(seconds: Any) -> str:
    """3164.9 -> '52 min 45 s'."""
    try:
        left = round(float(seconds))
    except (TypeError, ValueError, OverflowError):
        return ""
    if left < 60:
        return f"{left} s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size} {unit}")
            left %= size
    return " ".join(parts[:2])


def pretty_json(value: Any, indent: int | None = 2) -> str:
    """JSON for people: readable characters, not \\u escapes. Jinja's autoescape then
    escapes it as HTML (unlike ``tojson``, whose escapes are for scripts)."""
    return json.dumps(value, indent=indent, ensure_ascii=False, sort_keys=True, default=str)


class Renderer:
    """Renders one page of a dashboard: its template, with what every page shows."""

    def __init__(self, config: DashboardConfig, guard: Guard) -> None:
        self.config = config
        self.guard = guard
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,
        )
        env.filters["duration"] = duration
        env.filters["pretty"] = pretty_json
        self.templates = Jinja2Templates(env=env)

    def __call__(
        self,
        request: Request,
        name: str,
        status: int = 200,
        headers: dict[str, str] | None = None,
        **context: Any,
    ) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        context.update(
            writable=self.config.writable,
            signed_in=self.guard.signed_in(request),
            csrf=csrf,
            refresh=self.config.refresh,
            version=__version__,
        )
        response = self.templates.TemplateResponse(
            request, name, context, status_code=status, headers=headers
        )
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(CSRF_COOKIE, csrf, samesite="strict", httponly=False, path="/")
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def add_pages(
    app: FastAPI,
    backend: Backend,
    config: DashboardConfig,
    page: Renderer,
    filter_query: Callable[..., dict[str, list[str]]],
) -> None:
    """The pages' routes; *filter_query* is the app's (:func:`.params.filter_query_for`)."""

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def overview_page(
        request: Request, window: str | None = None, spider: str | None = None
    ) -> Any:
        return page(request, "overview.html", window=window or "hour", spider=spider or "")

    @app.get("/recovery", response_class=HTMLResponse, include_in_schema=False)
    async def recovery_page(
        request: Request,
        spider: Annotated[list[QueryValue], Query(default_factory=list)],
        kind: Annotated[list[QueryValue], Query(default_factory=list)],
        domain: Annotated[list[QueryValue], Query(default_factory=list)],
    ) -> Any:
        from .charts import budget_bar, recovery_chart

        data = await recovery_answer(backend, spider, kind, domain)
        charts = {
            (name, c["kind"], c["domain"]): recovery_chart(
                c["points"], c["next"]["delay_s"], c["longest_seen_s"]
            )
            for name, learned in data["spiders"].items()
            for c in learned["curves"]
        }
        bars = {
            (name, d["domain"]): budget_bar(d["retries"], d["limit"])
            for name, learned in data["spiders"].items()
            for d in (learned["budget"] or {}).get("domains", ())
        }
        return page(
            request,
            "recovery.html",
            data=data,
            charts=charts,
            bars=bars,
            params={
                "spider": ", ".join(names(spider)),
                "kind": ", ".join(names(kind)),
                "domain": ", ".join(names(domain)),
            },
        )

    @app.get("/tasks", response_class=HTMLResponse, include_in_schema=False)
    async def tasks_page(
        request: Request,
        paging: Annotated[dict[str, Any], Depends(page_query)],
        # A default, not Annotated: this app's own dependency (its kinds) is a local
        # name, which FastAPI cannot read back from a string annotation.
        filters: dict[str, list[str]] = Depends(filter_query),  # noqa: B008
    ) -> Any:
        data = await tasks_answer(backend, config, filters, paging)
        base = [(k, v) for k, values in filters.items() for v in values if v]

        def link(**changes: Any) -> str:
            keep = [(k, v) for k, v in base if k not in changes]
            for key in ("sort", "order", "per_page"):
                if key not in changes and paging.get(key):
                    keep.append((key, paging[key]))
            keep += [(k, str(v)) for k, v in changes.items() if v is not None]
            return "/tasks?" + urlencode(keep)

        last = {k: (v[-1] if v else "") for k, v in filters.items()}
        return page(
            request,
            "tasks.html",
            data=data,
            params=last,
            statuses=STATUSES,
            sortable=SORTABLE,
            link=link,
            filter_query=urlencode(base),
            filter_json={k: v for k, v in last.items() if v},
        )

    @app.get("/tasks/{ident}", response_class=HTMLResponse, include_in_schema=False)
    async def task_page(request: Request, ident: str) -> Any:
        data = await run_in_threadpool(backend.task, ident)
        return page(request, "task.html", data=data)
