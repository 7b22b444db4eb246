"""The dashboard's FastAPI application put together: settings, security middleware, error answers, routes.

:func:`create_app` only wires things together: no connection is opened until a
request needs one. Every request must name the dashboard in its ``Host`` header
(:mod:`.hosts`); writes need the token (:mod:`.guard`). The routes are the HTML
pages (:mod:`.pages`), the sign-in forms (:mod:`.guard`), and the JSON API with
/metrics (:mod:`.api`); the data behind them is the :class:`~.backend.Backend`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles

from .. import __version__
from .api import ASCIIJSONResponse, add_api
from .auth import Sessions, WrongTokens
from .backend import Backend
from .errors import DashboardError
from .guard import CSRF_COOKIE, SESSION_COOKIE, Guard
from .hosts import AllowedHosts, HostCheck
from .pages import CSP, Renderer, add_pages
from .params import STATUSES, filter_query_for, validation_message, validation_status
from .settings import DashboardConfig, load_dashboard_config
from .signin import add_sign_in

#: CSS, JavaScript and the icon, served under /static: nothing comes from a CDN.
STATIC = Path(__file__).resolve().parent / "static"
# Names other code imports from here (the tests, the dashboard command).
__all__ = ["CSP", "CSRF_COOKIE", "SESSION_COOKIE", "create_app"]


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
    sessions = Sessions(config.session_ttl)
    wrong_tokens = WrongTokens()
    guard = Guard(config, sessions, wrong_tokens)
    page = Renderer(config, guard)

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
    app.state.guard = guard
    app.add_middleware(HostCheck, allowed=AllowedHosts.for_config(config))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api") or request.url.path == "/metrics"

    @app.exception_handler(DashboardError)
    async def _dashboard_error(request: Request, exc: DashboardError) -> Any:
        if wants_json(request):
            return ASCIIJSONResponse({"detail": str(exc)}, status_code=exc.status)
        return page(request, "error.html", exc.status, message=str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        message = validation_message(exc, {"status": STATUSES, "kind": backend.known_kinds})
        status = validation_status(exc)
        if wants_json(request):
            return ASCIIJSONResponse({"detail": message}, status_code=status)
        return page(request, "error.html", status, message=message)

    # One dependency for the pages and the API: the kind filter takes this app's kinds.
    filter_query = filter_query_for(backend.known_kinds)
    # In this order: a route matches in the order it was added.
    add_pages(app, backend, config, page, filter_query)
    add_sign_in(app, guard, page)
    add_api(app, backend, config, filter_query)
    return app
