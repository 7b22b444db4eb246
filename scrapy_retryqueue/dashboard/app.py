"""The dashboard's FastAPI application: HTML pages, the JSON API, /metrics.

:func:`create_app` only wires things together: no connection is opened until
a request needs one. Writes need the token: ``Authorization: Bearer <token>``
on the API, or the session cookie a sign-in sets plus the ``X-CSRF-Token``
header (double submit of the ``rq_csrf`` cookie) from the pages' JavaScript.
Every request must name the dashboard in its ``Host`` header (:mod:`.hosts`).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import jinja2
from fastapi import Depends, FastAPI, Form, HTTPException, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..defaults import TASK_STATUSES
from ..store.queries import is_number
from .auth import Sessions, WrongTokens, same
from .backend import ACTIONS, FILTER_NAMES, SORTABLE, Backend, DashboardError, parse_filters
from .clients import ClientResolver
from .hosts import AllowedHosts, HostCheck
from .settings import MAX_PAGE_SIZE, DashboardConfig, load_dashboard_config

HERE = Path(__file__).resolve().parent
SESSION_COOKIE = "rq_session"
CSRF_COOKIE = "rq_csrf"
CSRF_HEADER = "x-csrf-token"
STATUSES = ("all", *TASK_STATUSES)
#: Largest body of an action request (bytes): 10,000 ids and filters fit well within it.
MAX_ACTION_BODY = 2_000_000
#: Highest page number of the tasks table: its row offset always fits the database's integers.
MAX_PAGE = 1_000_000
READ_ONLY = (
    "the dashboard is read-only: start it with a token (RETRYQUEUE_DASHBOARD_TOKEN or "
    "--token) to act on tasks"
)
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)

# The OpenAPI schema says how writes authenticate; the check itself is WriteRoute's.
bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="RETRYQUEUE_DASHBOARD_TOKEN (or --token) of the running dashboard",
)


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


# -- query parameters: declared, so the OpenAPI schema (and the tests) know every one ----

Many = list[str] | None


def filter_query(
    spider: Annotated[Many, Query(description="spider name (repeat or comma-separate)")] = None,
    status: Annotated[
        Many, Query(description=f"{', '.join(TASK_STATUSES)} or all (the default)")
    ] = None,
    kind: Annotated[Many, Query(description="failure kind")] = None,
    domain: Annotated[Many, Query(description="host name; its subdomains match too")] = None,
    http_status: Annotated[Many, Query(description="HTTP status of the last failure")] = None,
    node: Annotated[Many, Query(description="node that wrote the last event")] = None,
    since: Annotated[
        str | None, Query(description="ISO 8601 time, today, yesterday or 7d / 12h / 30m (ago)")
    ] = None,
    until: Annotated[str | None, Query(description="as since")] = None,
    ids: Annotated[Many, Query(alias="id", description="row id or task id")] = None,
    q: Annotated[str | None, Query(description="a substring of the URL")] = None,
) -> dict[str, list[str]]:
    """The filters of the query string, by name (as :func:`parse_filters` takes them)."""
    given = {
        "spider": spider,
        "status": status,
        "kind": kind,
        "domain": domain,
        "http_status": http_status,
        "node": node,
        "since": [since] if since else None,
        "until": [until] if until else None,
        "id": ids,
        "q": [q] if q else None,
    }
    return {name: list(values or ()) for name, values in given.items()}


def page_query(
    sort: Annotated[str | None, Query(description=f"one of {', '.join(SORTABLE)}")] = None,
    order: Annotated[str | None, Query(description="asc or desc")] = None,
    page: Annotated[str | None, Query(description=f"1-{MAX_PAGE}")] = None,
    per_page: Annotated[str | None, Query(description=f"1-{MAX_PAGE_SIZE}")] = None,
) -> dict[str, str | None]:
    return {"sort": sort, "order": order, "page": page, "per_page": per_page}


def whole_number(name: str, raw: str | None, default: int, highest: int) -> int:
    """A query-string number 1-*highest*; DashboardError names it otherwise."""
    if raw is None or raw == "":
        return default
    if not is_number(raw, len(str(highest))) or not 1 <= int(raw) <= highest:
        shown = repr(raw) if len(raw) <= 40 else repr(raw[:40]) + f"… ({len(raw)} characters)"
        raise DashboardError(f"{name} must be a positive whole number 1-{highest}, got {shown}")
    return int(raw)


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


def _validation_message(exc: RequestValidationError) -> str:
    # Where and what, never the input itself: it may be anything.
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


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
    backend = backend or Backend(settings, secret_headers=config.secret_headers)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
    )
    env.filters["duration"] = duration
    env.filters["pretty"] = pretty_json
    templates = Jinja2Templates(env=env)
    sessions = Sessions(config.session_ttl)
    wrong_tokens = WrongTokens()

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
        default_response_class=ASCIIJSONResponse,
        title="scrapy-retryqueue dashboard",
        version=__version__,
        description="The retry queue's live state (Redis) and history (SQL store), and "
        "actions on its tasks. Writes need `Authorization: Bearer <token>`.",
    )
    app.state.backend = backend
    app.state.config = config
    app.state.sessions = sessions
    app.state.wrong_tokens = wrong_tokens
    app.add_middleware(HostCheck, allowed=AllowedHosts.for_config(config))
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    # -- auth ------------------------------------------------------------------

    def signed_in(request: Request) -> bool:
        return config.token is not None and sessions.valid(request.cookies.get(SESSION_COOKIE))

    client_resolver = ClientResolver(config.trusted_proxies)

    def client_of(request: Request) -> str:
        # Behind a listed proxy, the address it forwarded; else the connection's own.
        return client_resolver(
            request.client.host if request.client else None,
            request.headers.getlist("x-forwarded-for"),
        )

    def token_is_right(request: Request, given: str) -> bool:
        """Check a token; a client that sent too many wrong ones waits first (429)."""
        client = client_of(request)
        wait = wrong_tokens.retry_after(client)
        if wait:
            raise HTTPException(
                429,
                f"too many wrong tokens from {client}: try again in {wait} s",
                headers={"Retry-After": str(wait)},
            )
        if same(given, config.token):
            wrong_tokens.right(client)
            return True
        wrong_tokens.wrong(client)
        return False

    def require_write(request: Request) -> None:
        if config.token is None:
            raise HTTPException(403, READ_ONLY)
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            if token_is_right(request, auth[7:].strip()):
                return
            raise HTTPException(401, "wrong token", headers={"WWW-Authenticate": "Bearer"})
        if signed_in(request):
            if same(request.headers.get(CSRF_HEADER), request.cookies.get(CSRF_COOKIE)):
                return
            raise HTTPException(
                403, "cross-site request refused: the X-CSRF-Token header is missing or wrong"
            )
        raise HTTPException(
            401,
            "a token is needed: Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )

    class WriteRoute(APIRoute):
        """A route that changes something: the token is checked before the request's
        body is read or validated, so nobody learns anything from a refused write."""

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                require_write(request)
                return await handler(request)

            return guarded

    def page(
        request: Request,
        name: str,
        status: int = 200,
        headers: dict[str, str] | None = None,
        **context: Any,
    ) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        context.update(
            writable=config.writable,
            signed_in=signed_in(request),
            csrf=csrf,
            refresh=config.refresh,
            version=__version__,
        )
        response = templates.TemplateResponse(
            request, name, context, status_code=status, headers=headers
        )
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(CSRF_COOKIE, csrf, samesite="strict", httponly=False, path="/")
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api") or request.url.path == "/metrics"

    @app.exception_handler(DashboardError)
    async def _dashboard_error(request: Request, exc: DashboardError) -> Any:
        if wants_json(request):
            return ASCIIJSONResponse({"detail": str(exc)}, status_code=exc.status)
        return page(request, "error.html", exc.status, message=str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        message = _validation_message(exc)
        if wants_json(request):
            return ASCIIJSONResponse({"detail": message}, status_code=422)
        return page(request, "error.html", 422, message=message)

    async def _tasks(filters: dict[str, list[str]], paging: dict[str, str | None]) -> Any:
        parsed = parse_filters(filters, known_kinds=backend.known_kinds)
        return await run_in_threadpool(
            backend.tasks,
            parsed,
            sort=paging["sort"] or "id",
            order=paging["order"] or "desc",
            page=whole_number("page", paging["page"], 1, MAX_PAGE),
            per_page=whole_number("per_page", paging["per_page"], config.page_size, MAX_PAGE_SIZE),
        )

    # -- HTML pages ---------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def overview_page(
        request: Request, window: str | None = None, spider: str | None = None
    ) -> Any:
        return page(request, "overview.html", window=window or "hour", spider=spider or "")

    @app.get("/tasks", response_class=HTMLResponse, include_in_schema=False)
    async def tasks_page(
        request: Request,
        filters: Annotated[dict[str, list[str]], Depends(filter_query)],
        paging: Annotated[dict[str, str | None], Depends(page_query)],
    ) -> Any:
        data = await _tasks(filters, paging)
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

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    async def login_page(request: Request) -> Any:
        return page(request, "login.html", error=None)

    @app.post("/login", include_in_schema=False)
    async def login(
        request: Request,
        token: Annotated[str, Form()] = "",
        csrf: Annotated[str, Form()] = "",
    ) -> Any:
        if not same(csrf, request.cookies.get(CSRF_COOKIE)):
            raise HTTPException(403, "cross-site request refused: reload the sign-in page")
        if config.token is None:
            return page(request, "login.html", 403, error=READ_ONLY)
        try:
            right = token_is_right(request, token)
        except HTTPException as exc:  # waiting after wrong tokens
            return page(request, "login.html", exc.status_code, exc.headers, error=exc.detail)
        if not right:
            return page(request, "login.html", 401, error="wrong token")
        response = RedirectResponse("/", status_code=303)
        sessions.revoke(request.cookies.get(SESSION_COOKIE))
        response.set_cookie(
            SESSION_COOKIE,
            sessions.new(),
            max_age=int(config.session_ttl),
            httponly=True,
            samesite="strict",
            path="/",
        )
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request, csrf: Annotated[str, Form()] = "") -> Any:
        if not same(csrf, request.cookies.get(CSRF_COOKIE)):
            raise HTTPException(403, "cross-site request refused")
        sessions.revoke(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    # -- JSON API -------------------------------------------------------------------

    @app.get(
        "/api/overview",
        tags=["read"],
        summary="Live counts, breakdowns and the chart",
        description="window: hour or day (how far back the chart looks; its buckets fit "
        "the activity); spider (repeat or comma-separate) to show only some spiders.",
    )
    async def api_overview(
        window: Annotated[str | None, Query(description="hour (default) or day")] = None,
        spider: Annotated[Many, Query(description="spider name(s)")] = None,
    ) -> Any:
        spiders = [name for value in spider or () for name in value.split(",") if name.strip()]
        return await run_in_threadpool(backend.overview, window or "hour", spiders)

    @app.get(
        "/api/tasks",
        tags=["read"],
        summary="Tasks and dead letters, filtered, sorted and paginated",
        description="Filters (repeat or comma-separate): spider, status (all by default), kind, "
        "domain, http_status, node, since, until, id, q (URL substring). "
        f"sort: one of {', '.join(SORTABLE)}; order: asc or desc; page (1-{MAX_PAGE}); "
        f"per_page (1-{MAX_PAGE_SIZE}).",
    )
    async def api_tasks(
        filters: Annotated[dict[str, list[str]], Depends(filter_query)],
        paging: Annotated[dict[str, str | None], Depends(page_query)],
    ) -> Any:
        return await _tasks(filters, paging)

    @app.get("/api/tasks/{ident}", tags=["read"], summary="One task by row id or task id")
    async def api_task(ident: str) -> Any:
        return await run_in_threadpool(backend.task, ident)

    @app.get(
        "/api/actions/{action}/count",
        tags=["actions"],
        summary="How many tasks an action would touch (for a confirmation)",
    )
    async def api_action_count(
        action: str, filters: Annotated[dict[str, list[str]], Depends(filter_query)]
    ) -> Any:
        parsed = parse_filters(filters, known_kinds=backend.known_kinds)
        matched = await run_in_threadpool(backend.count_for, action, parsed)
        return {"action": action, "matched": matched}

    async def api_action(action: str, body: ActionRequest) -> Any:
        if action not in ACTIONS:
            raise DashboardError(
                f"unknown action {action[:40]!r}; known: {', '.join(ACTIONS)}", 404
            )
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
        summary="retry_now, cancel, requeue or purge the matching tasks (token needed)",
        description="retry_now: waiting tasks become due now. cancel: waiting or retrying "
        "tasks are removed from the queue (status cancelled). requeue: dead letters go back "
        "to the queue, due now, with a fresh budget. purge: finished tasks (succeeded, dead, "
        "cancelled) are deleted from the store. Each action touches only the matching tasks "
        "in the statuses it applies to.",
    )

    @app.get("/metrics", tags=["read"], summary="Prometheus metrics (text format 0.0.4)")
    async def metrics() -> Any:
        from .metrics import CONTENT_TYPE, render

        text = await run_in_threadpool(render, backend)
        return Response(text, media_type=CONTENT_TYPE)

    return app
