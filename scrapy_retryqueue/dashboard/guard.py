"""Who may change things, per request: a bearer token, or a signed-in session with its CSRF header.

Writes need the token: ``Authorization: Bearer <token>`` on the API, or the session
cookie a sign-in sets plus the ``X-CSRF-Token`` header (double submit of the
``rq_csrf`` cookie) from the pages' JavaScript. A write is checked before its body is
read (:class:`WriteRoute`). The sign-in and sign-out forms are :mod:`.signin`'s; what
they keep (sessions, the wait after wrong tokens) is :mod:`.auth`'s, and who a client
is, :mod:`.clients`'.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer

from .auth import Sessions, WrongTokens, same
from .clients import ClientResolver
from .settings import DashboardConfig

SESSION_COOKIE = "rq_session"
CSRF_COOKIE = "rq_csrf"
CSRF_HEADER = "x-csrf-token"
READ_ONLY = (
    "the dashboard is read-only: start it with a token (RETRYQUEUE_DASHBOARD_TOKEN or "
    "--token) to act on tasks"
)

# The OpenAPI schema says how writes authenticate; the check itself is WriteRoute's.
bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="RETRYQUEUE_DASHBOARD_TOKEN (or --token) of the running dashboard",
)


class Guard:
    """One dashboard's checks of who is asking: its token, sessions and waiting clients."""

    def __init__(
        self, config: DashboardConfig, sessions: Sessions, wrong_tokens: WrongTokens
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.wrong_tokens = wrong_tokens
        self._clients = ClientResolver(config.trusted_proxies)

    def signed_in(self, request: Request) -> bool:
        return self.config.token is not None and self.sessions.valid(
            request.cookies.get(SESSION_COOKIE)
        )

    def client_of(self, request: Request) -> str:
        # Behind a listed proxy, the address it forwarded; else the connection's own.
        return self._clients(
            request.client.host if request.client else None,
            request.headers.getlist("x-forwarded-for"),
        )

    def token_is_right(self, request: Request, given: str) -> bool:
        """Check a token; a client that sent too many wrong ones waits first (429)."""
        client = self.client_of(request)
        wait = self.wrong_tokens.retry_after(client)
        if wait:
            raise HTTPException(
                429,
                f"too many wrong tokens from {client}: try again in {wait} s",
                headers={"Retry-After": str(wait)},
            )
        if same(given, self.config.token):
            self.wrong_tokens.right(client)
            return True
        self.wrong_tokens.wrong(client)
        return False

    def require_write(self, request: Request) -> None:
        """Return if *request* may change things; else the HTTPException that says why."""
        if self.config.token is None:
            raise HTTPException(403, READ_ONLY)
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            if self.token_is_right(request, auth[7:].strip()):
                return
            raise HTTPException(401, "wrong token", headers={"WWW-Authenticate": "Bearer"})
        if self.signed_in(request):
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
    """A route that changes something: the app's :class:`Guard` (``app.state.guard``)
    checks the token before the request's body is read or validated, so nobody learns
    anything from a refused write."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            request.app.state.guard.require_write(request)
            return await handler(request)

        return guarded
