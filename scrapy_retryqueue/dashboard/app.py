"""The dashboard's FastAPI application: HTML pages, the JSON API, /metrics.

:func:`create_app` only wires things together: no connection is opened until
a request needs one. Writes need the token: ``Authorization: Bearer <token>``
on the API, or the session cookie a sign-in sets plus the ``X-CSRF-Token``
header (double submit of the ``rq_csrf`` cookie) from the pages' JavaScript.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..defaults import TASK_STATUSES
from .backend import ACTIONS, FILTER_NAMES, SORTABLE, Backend, DashboardError, parse_filters
from .settings import MAX_PAGE_SIZE, DashboardConfig, load_dashboard_config

HERE = Path(__file__).resolve().parent
SESSION_COOKIE = "rq_session"
CSRF_COOKIE = "rq_csrf"
CSRF_HEADER = "x-csrf-token"
STATUSES = ("all", *TASK_STATUSES)
READ_ONLY = (
    "the dashboard is read-only: start it with a token (RETRYQUEUE_DASHBOARD_TOKEN or "
    "--token) to act on tasks"
)


class ActionRequest(BaseModel):
    """Which tasks an action touches: ids, or a filter (the tasks page's), or both."""

    ids: list[str] = Field(default_factory=list, description="row ids or task ids")
    filters: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="spider, status, kind, domain, http_status, node, since, until, q",
    )
    dry_run: bool = Field(False, description="only count what it would touch")


def _session_value(token: str) -> str:
    return hmac.new(token.encode(), b"scrapy-retryqueue-dashboard", hashlib.sha256).hexdigest()


def _same(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(str(a).encode(), str(b).encode())


def duration(seconds: Any) -> str:
    """3164.9 -> '52 min 45 s'."""
    try:
        left = round(float(seconds))
    except (TypeError, ValueError):
        return ""
    if left < 60:
        return f"{left} s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size} {unit}")
            left %= size
    return " ".join(parts[:2])


def create_app(
    settings: Any = None,
    *,
    config: DashboardConfig | None = None,
    backend: Backend | None = None,
) -> FastAPI:
    """The dashboard for *settings* (Scrapy Settings or a dict of RETRYQUEUE_* values)."""
    if settings is not None and not hasattr(settings, "getbool"):
        from scrapy.settings import Settings

        settings = Settings(dict(settings))
    config = config or load_dashboard_config(settings)
    backend = backend or Backend(settings)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
    )
    env.filters["duration"] = duration
    templates = Jinja2Templates(env=env)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        backend.close()

    app = FastAPI(
        lifespan=lifespan,
        # FastAPI's /docs and /redoc pages load their scripts from a CDN: the dashboard
        # must work offline, so only the schema is served (/openapi.json).
        docs_url=None,
        redoc_url=None,
        title="scrapy-retryqueue dashboard",
        version=__version__,
        description="The retry queue's live state (Redis) and history (SQL store), and "
        "actions on its tasks. Writes need `Authorization: Bearer <token>`.",
    )
    app.state.backend = backend
    app.state.config = config
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    # -- auth ------------------------------------------------------------------

    def signed_in(request: Request) -> bool:
        return config.token is not None and _same(
            request.cookies.get(SESSION_COOKIE), _session_value(config.token)
        )

    def require_write(request: Request) -> None:
        if config.token is None:
            raise HTTPException(403, READ_ONLY)
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            if _same(auth[7:].strip(), config.token):
                return
            raise HTTPException(401, "wrong token", headers={"WWW-Authenticate": "Bearer"})
        if signed_in(request):
            if _same(request.headers.get(CSRF_HEADER), request.cookies.get(CSRF_COOKIE)):
                return
            raise HTTPException(
                403, "cross-site request refused: the X-CSRF-Token header is missing or wrong"
            )
        raise HTTPException(
            401,
            "a token is needed: Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        context.update(
            writable=config.writable,
            signed_in=signed_in(request),
            csrf=csrf,
            refresh=config.refresh,
            version=__version__,
        )
        response = templates.TemplateResponse(request, name, context, status_code=status)
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(CSRF_COOKIE, csrf, samesite="strict", httponly=False, path="/")
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.exception_handler(DashboardError)
    async def _dashboard_error(request: Request, exc: DashboardError) -> Any:
        if request.url.path.startswith("/api") or request.url.path == "/metrics":
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        return page(request, "error.html", exc.status, message=str(exc))

    def _params(request: Request) -> dict[str, list[str]]:
        return {name: request.query_params.getlist(name) for name in (*FILTER_NAMES, "q")}

    def _int(request: Request, name: str, default: int) -> int:
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return default
        if not raw.isdigit():
            raise DashboardError(f"{name} must be a positive whole number, got {raw!r}")
        return int(raw)

    async def _tasks(request: Request) -> dict[str, Any]:
        filters = parse_filters(_params(request))
        return await run_in_threadpool(
            backend.tasks,
            filters,
            sort=request.query_params.get("sort") or "id",
            order=request.query_params.get("order") or "desc",
            page=_int(request, "page", 1),
            per_page=_int(request, "per_page", config.page_size),
        )

    # -- HTML pages ---------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def overview_page(request: Request) -> Any:
        return page(
            request,
            "overview.html",
            window=request.query_params.get("window") or "hour",
            spider=request.query_params.get("spider") or "",
        )

    @app.get("/tasks", response_class=HTMLResponse, include_in_schema=False)
    async def tasks_page(request: Request) -> Any:
        params = _params(request)
        data = await _tasks(request)
        query = [(k, v) for k, values in params.items() for v in values if v]
        base = [(k, v) for k, v in query]

        def link(**changes: Any) -> str:
            keep = [(k, v) for k, v in base if k not in changes]
            for key in ("sort", "order", "per_page"):
                if key not in changes and request.query_params.get(key):
                    keep.append((key, request.query_params[key]))
            keep += [(k, str(v)) for k, v in changes.items() if v is not None]
            return "/tasks?" + urlencode(keep)

        return page(
            request,
            "tasks.html",
            data=data,
            params={k: (v[-1] if v else "") for k, v in params.items()},
            statuses=STATUSES,
            sortable=SORTABLE,
            link=link,
            filter_query=urlencode(base),
            filter_json={
                k: v for k, v in ((k, vs[-1] if vs else "") for k, vs in params.items()) if v
            },
        )

    @app.get("/tasks/{ident}", response_class=HTMLResponse, include_in_schema=False)
    async def task_page(request: Request, ident: str) -> Any:
        data = await run_in_threadpool(backend.task, ident)
        return page(request, "task.html", data=data)

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    async def login_page(request: Request) -> Any:
        return page(request, "login.html", error=None)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Any:
        form = await request.form()
        if not _same(str(form.get("csrf") or ""), request.cookies.get(CSRF_COOKIE)):
            raise HTTPException(403, "cross-site request refused: reload the sign-in page")
        if config.token is None:
            return page(request, "login.html", 403, error=READ_ONLY)
        if not _same(str(form.get("token") or ""), config.token):
            return page(request, "login.html", 401, error="wrong token")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE, _session_value(config.token), httponly=True, samesite="strict", path="/"
        )
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Any:
        form = await request.form()
        if not _same(str(form.get("csrf") or ""), request.cookies.get(CSRF_COOKIE)):
            raise HTTPException(403, "cross-site request refused")
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    # -- JSON API -------------------------------------------------------------------

    @app.get(
        "/api/overview",
        tags=["read"],
        summary="Live counts, breakdowns and the chart",
        description="window: hour (per minute) or day (per 10 minutes); spider (repeat or "
        "comma-separate) to show only some spiders.",
    )
    async def api_overview(request: Request, window: str = "hour") -> Any:
        spiders = [
            name
            for value in request.query_params.getlist("spider")
            for name in value.split(",")
            if name.strip()
        ]
        return await run_in_threadpool(backend.overview, window, spiders)

    @app.get(
        "/api/tasks",
        tags=["read"],
        summary="Tasks and dead letters, filtered, sorted and paginated",
        description="Filters (repeat or comma-separate): spider, status (all by default), kind, "
        "domain, http_status, node, since, until, id, q (URL substring). "
        f"sort: one of {', '.join(SORTABLE)}; order: asc or desc; page; per_page (1-{MAX_PAGE_SIZE}).",
    )
    async def api_tasks(request: Request) -> Any:
        return await _tasks(request)

    @app.get("/api/tasks/{ident}", tags=["read"], summary="One task by row id or task id")
    async def api_task(ident: str) -> Any:
        return await run_in_threadpool(backend.task, ident)

    @app.get(
        "/api/actions/{action}/count",
        tags=["actions"],
        summary="How many tasks an action would touch (for a confirmation)",
    )
    async def api_action_count(request: Request, action: str) -> Any:
        filters = parse_filters(_params(request))
        matched = await run_in_threadpool(backend.count_for, action, filters)
        return {"action": action, "matched": matched}

    @app.post(
        "/api/actions/{action}",
        tags=["actions"],
        summary="retry_now, cancel, requeue or purge the matching tasks (token needed)",
        description="retry_now: waiting tasks become due now. cancel: waiting or retrying "
        "tasks are removed from the queue (status cancelled). requeue: dead letters go back "
        "to the queue, due now, with a fresh budget. purge: finished tasks (succeeded, dead, "
        "cancelled) are deleted from the store. Each action touches only the matching tasks "
        "in the statuses it applies to.",
    )
    async def api_action(request: Request, action: str, body: ActionRequest) -> Any:
        require_write(request)
        if action not in ACTIONS:
            raise DashboardError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}", 404)
        params: dict[str, Any] = dict(body.filters)
        unknown = set(params) - {*FILTER_NAMES, "q"}
        if unknown:
            raise DashboardError(f"unknown filter(s): {', '.join(sorted(unknown))}")
        if body.ids:
            params["id"] = body.ids
        if not params:
            raise DashboardError("give ids or filters (status=all for every task)")
        filters = parse_filters(params)
        return await run_in_threadpool(backend.run_action, action, filters, dry_run=body.dry_run)

    @app.get(
        "/metrics", response_class=PlainTextResponse, tags=["read"], summary="Prometheus metrics"
    )
    async def metrics() -> Any:
        text = await run_in_threadpool(backend.metrics)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
