"""The sign-in page and form, and sign-out: a session cookie for the pages' writes.

What a session allows is :mod:`.guard`'s to check; the page itself is rendered as
every other page is (:mod:`.pages`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from .auth import same
from .guard import CSRF_COOKIE, READ_ONLY, SESSION_COOKIE, Guard

if TYPE_CHECKING:
    from .pages import Renderer


def add_sign_in(app: FastAPI, guard: Guard, page: Renderer) -> None:
    """The sign-in page and form, and sign-out: a session cookie for the pages' writes."""
    config, sessions = guard.config, guard.sessions

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
            right = guard.token_is_right(request, token)
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
