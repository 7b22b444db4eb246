"""The dashboard's FastAPI application: HTML pages, the JSON API, /metrics.

:func:`create_app` only wires things together: no connection is opened until
a request needs one. Writes need the token: ``Authorization: Bearer <token>``
on the API, or the session cookie a sign-in sets plus the ``X-CSRF-Token``
header (double submit of the ``rq_csrf`` cookie) from the pages' JavaScript.
Every request must name the dashboard in its ``Host`` header (:mod:`.hosts`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

import jinja2
from fastapi import Depends, FastAPI, Form, HTTPException, Path, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field, StringConstraints
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..settings.defaults import TASK_STATUSES
from .auth import Sessions, WrongTokens, same
from .backend import (
    ACTIONS,
    FILTER_NAMES,
    SORTABLE,
    WINDOWS,
    Backend,
    DashboardError,
    parse_filters,
)
from .clients import ClientResolver
from .hosts import AllowedHosts, HostCheck
from .settings import MAX_PAGE_SIZE, DashboardConfig, load_dashboard_config

HERE = FilePath(__file__).resolve().parent
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


# -- parameters: declared with the bounds FastAPI checks, so that the OpenAPI schema is
# -- what the API validates with (and the tests know every parameter) -------------------

#: Longest value of one query parameter, characters: a comma-separated list of
#: names fits; a value past it is no name of anything.
MAX_QUERY_VALUE = 1000
#: Longest URL substring (q), characters.
MAX_URL_SUBSTRING = 2000
#: Longest row id or task id in a path, characters.
MAX_IDENT = 128
#: One value of a query parameter (one repeat of it).
QueryValue = Annotated[str, StringConstraints(max_length=MAX_QUERY_VALUE)]
Sort = Literal[SORTABLE]  # type: ignore[valid-type]
Order = Literal["asc", "desc"]
Window = Literal[tuple(WINDOWS)]  # type: ignore[valid-type]
Action = Literal[ACTIONS]  # type: ignore[valid-type]


def comma_list(item: str) -> str:
    """A pattern of comma-separated items matching *item*, blanks and empty items
    allowed, as :func:`parse_filters` reads a list: ``"dead, waiting"``, ``""``."""
    return rf"^[ \t]*({item})?[ \t]*(,[ \t]*({item})?[ \t]*)*$"


def one_of(names: Sequence[str]) -> str:
    return comma_list("|".join(re.escape(name) for name in names))


HTTP_STATUSES = comma_list("[1-5][0-9][0-9]")


def filter_query_for(known_kinds: Sequence[str]) -> Callable[..., dict[str, list[str]]]:
    """The filters of the query string as a dependency, by name (as :func:`parse_filters`
    takes them); the kind filter takes *known_kinds*.

    Its signature is built here from real objects, not annotations in the source:
    this app's kinds are a local value, which FastAPI cannot read back from a string
    annotation (this module's annotations are strings).
    """

    def many(description: str, *, alias: str | None = None, **bounds: Any) -> Any:
        # The bounds hold for each value (each repeat of the parameter).
        value = (
            Annotated[str, StringConstraints(max_length=MAX_QUERY_VALUE, **bounds)]
            if bounds
            else QueryValue
        )
        return Annotated[list[value], Query(description=description, alias=alias)]  # type: ignore[valid-type]

    def single(description: str, longest: int) -> Any:
        return Annotated[str, Query(description=description, max_length=longest)]

    declared: dict[str, Any] = {
        "spider": many("spider name (repeat or comma-separate)"),
        "status": many(
            f"{', '.join(TASK_STATUSES)} or all (the default)", pattern=one_of(STATUSES)
        ),
        "kind": many(f"failure kind: {', '.join(known_kinds)}", pattern=one_of(known_kinds)),
        "domain": many("host name; its subdomains match too"),
        "http_status": many("HTTP status of the last failure (100-599)", pattern=HTTP_STATUSES),
        "node": many("node that wrote the last event"),
        "since": single("ISO 8601 time, today, yesterday or 7d / 12h / 30m (ago)", 64),
        "until": single("as since", 64),
        "ids": many("row id or task id", alias="id"),
        "q": single("a substring of the URL", MAX_URL_SUBSTRING),
    }
    singles = ("since", "until", "q")

    def filter_query(**given: Any) -> dict[str, list[str]]:
        return {
            ("id" if name == "ids" else name): (
                [given[name]] if name in singles and given[name] else list(given[name] or ())
            )
            for name in declared
        }

    filter_query.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            # No null in the schema: a query string cannot tell it from a value.
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default="" if name in singles else [],
                annotation=kind,
            )
            for name, kind in declared.items()
        ]
    )
    return filter_query


def page_query(
    sort: Annotated[Sort | None, Query(description="the column to sort by (id by default)")] = None,
    order: Annotated[Order | None, Query(description="asc or desc (the default)")] = None,
    page: Annotated[int | None, Query(description=f"1-{MAX_PAGE}", ge=1, le=MAX_PAGE)] = None,
    per_page: Annotated[
        int | None, Query(description=f"1-{MAX_PAGE_SIZE}", ge=1, le=MAX_PAGE_SIZE)
    ] = None,
) -> dict[str, Any]:
    return {"sort": sort, "order": order, "page": page, "per_page": per_page}


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


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}… ({len(str(value))} characters)"


#: Whole-number query parameters and their largest value.
_WHOLE = {"page": MAX_PAGE, "per_page": MAX_PAGE_SIZE}


def _parameter_refusal(name: str, value: Any, choices: Mapping[str, Sequence[str]]) -> str | None:
    """The message of a query parameter FastAPI refused, in the words of the filters'
    own checks (the first item of a list that is none of its choices); None: FastAPI's."""
    if name in _WHOLE:
        return f"{name} must be a positive whole number 1-{_WHOLE[name]}, got {_shown(value)}"
    if not isinstance(value, str) or len(value) > MAX_QUERY_VALUE:
        return None
    items = [item.strip(" \t") for item in value.split(",")]
    if name == "http_status":
        bad = next((i for i in items if i and not re.fullmatch("[1-5][0-9][0-9]", i)), value)
        return f"http_status {_shown(bad)} is not an HTTP status (100-599)"
    if name in choices:
        bad = next((i for i in items if i and i not in choices[name]), value)
        what = "a status" if name == "status" else f"a {name}"
        return f"{name} {_shown(bad)} is not {what}; known: {', '.join(choices[name])}"
    return None


def _validation_message(
    exc: RequestValidationError, choices: Mapping[str, Sequence[str]] | None = None
) -> str:
    """Where and what: a parameter with its value (cut short), a body's field alone
    (a body may be anything)."""
    parts = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        msg = error.get("msg", "invalid")
        if loc and loc[0] in ("query", "path") and len(loc) > 1:
            value = error.get("input")
            refusal = loc[0] == "query" and _parameter_refusal(loc[1], value, choices or {})
            parts.append(refusal or f"{loc[1]} {_shown(value)}: {msg}")
        else:
            where = ".".join(part for part in loc if part != "body") or "body"
            parts.append(f"{where}: {msg}")
    return "; ".join(parts[:5]) or "invalid request"


def _validation_status(exc: RequestValidationError) -> int:
    """A bad path is no such resource (404), a bad query parameter bad input (400), a
    body FastAPI cannot read 422."""
    places = {str(error.get("loc", ("",))[0]) for error in exc.errors()}
    if "path" in places:
        return 404
    return 400 if "body" not in places else 422


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
        message = _validation_message(exc, {"status": STATUSES, "kind": backend.known_kinds})
        status = _validation_status(exc)
        if wants_json(request):
            return ASCIIJSONResponse({"detail": message}, status_code=status)
        return page(request, "error.html", status, message=message)

    filter_query = filter_query_for(backend.known_kinds)

    async def _tasks(filters: dict[str, list[str]], paging: dict[str, Any]) -> Any:
        parsed = parse_filters(filters, known_kinds=backend.known_kinds)
        return await run_in_threadpool(
            backend.tasks,
            parsed,
            sort=paging["sort"] or "id",
            order=paging["order"] or "desc",
            page=paging["page"] or 1,
            per_page=paging["per_page"] or config.page_size,
        )

    # -- HTML pages ---------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def overview_page(
        request: Request, window: str | None = None, spider: str | None = None
    ) -> Any:
        return page(request, "overview.html", window=window or "hour", spider=spider or "")

    def _names(values: Sequence[str] | None) -> list[str]:
        return [n.strip() for value in values or () for n in value.split(",") if n.strip()]

    async def _recovery(spider: Any, kind: Any, domain: Any) -> Any:
        return await run_in_threadpool(
            backend.recovery, _names(spider), _names(kind), _names(domain)
        )

    @app.get("/recovery", response_class=HTMLResponse, include_in_schema=False)
    async def recovery_page(
        request: Request,
        spider: Annotated[list[QueryValue], Query(default_factory=list)],
        kind: Annotated[list[QueryValue], Query(default_factory=list)],
        domain: Annotated[list[QueryValue], Query(default_factory=list)],
    ) -> Any:
        from .charts import budget_bar, recovery_chart

        data = await _recovery(spider, kind, domain)
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
                "spider": ", ".join(_names(spider)),
                "kind": ", ".join(_names(kind)),
                "domain": ", ".join(_names(domain)),
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
        spiders = [name for value in spider or () for name in value.split(",") if name.strip()]
        return await run_in_threadpool(backend.overview, window or "hour", spiders)

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
        return await _recovery(spider, kind, domain)

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
        return await _tasks(filters, paging)

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

    return app
