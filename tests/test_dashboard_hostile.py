"""Hostile input never makes the dashboard fail: every route, every query, path and
body parameter, on SQLite and PostgreSQL, answers a 4xx (or a 2xx), never a 5xx; and
the inputs once measured as 500s get a 4xx whose message names the parameter.

The routes and their parameters are read from the application itself (its OpenAPI
schema, hidden pages included), so a new route or parameter is walked without
touching this file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from scrapy_retryqueue.dashboard.app import CSRF_COOKIE, create_app

from .dashboardroutes import every_operation

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "http://127.0.0.1"

#: Values sent in every parameter, already percent-encoded for a URL (the last one
#: is not UTF-8 at all, which only a raw escape can carry).
HOSTILE_TEXT = (
    "\x00",  # PostgreSQL text cannot hold it
    "a\x00b",
    "²",  # str.isdigit() says yes, int() says no
    "١٢٣",  # Arabic-Indic digits: int() takes them, SQL does not
    "9223372036854775807",  # the largest BIGINT
    "9" * 400,  # beyond any integer a database holds (and Python's int() of a str)
    "-1",
    "0",
    "99999999999d",  # a relative time beyond any date
    "9999-12-31T23:59:59-05:00",  # year 10000 in UTC
    "0001-01-01T00:00:00+05:00",  # year 0 in UTC
    "x" * 10_000,
    "\ud800",  # a lone surrogate: not encodable; sent as its (invalid) UTF-8 bytes
)
RAW_INVALID_UTF8 = "%FF%FE%C0%AF"


def encoded(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


HOSTILE = (*(encoded(v) for v in HOSTILE_TEXT), RAW_INVALID_UTF8)
#: For JSON bodies: the same values as JSON strings (a lone surrogate as its escape).
HOSTILE_JSON: tuple[Any, ...] = (*HOSTILE_TEXT, -1, 10**30, None, True, [], {})


@pytest.fixture
def dashboard_database_url(database_url: str) -> str:
    """The dashboard_data fixture on PostgreSQL and on SQLite."""
    return database_url


@pytest.fixture
def app(dashboard_data: dict[str, Any]) -> FastAPI:
    return create_app({**dashboard_data["settings"], "RETRYQUEUE_DASHBOARD_TOKEN": TOKEN})


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    # A 500 must come back as an answer to assert on, not as the server's exception.
    with TestClient(app, base_url=BASE, raise_server_exceptions=False) as test_client:
        yield test_client


def fill_path(path: str, names: list[str], hostile: dict[str, str] | None = None) -> str:
    """*path* with each {name} replaced: the hostile value for it, else a plain one."""
    plain = {"action": "cancel"}
    for name in names:
        value = (hostile or {}).get(name, plain.get(name, "1"))
        path = path.replace("{" + name + "}", value)
    return path


def test_every_route_and_parameter_survives_hostile_values(
    app: FastAPI, client: TestClient
) -> None:
    started = time.monotonic()
    operations = every_operation(app)
    walked: set[tuple[str, str, str]] = set()
    failures: list[str] = []
    client.get("/login")  # the CSRF cookie, so sign-in forms reach their token check
    csrf = client.cookies.get(CSRF_COOKIE)

    def send(op: dict[str, Any], url: str, label: str, **kw: Any) -> None:
        # Writes carry the token, so their bodies are read; a client that sent too many
        # wrong tokens (the sign-in form's walk) would be refused before that.
        app.state.wrong_tokens.right("testclient")
        headers = {**AUTH, **kw.pop("headers", {})} if op["method"] == "POST" else {}
        reply = client.request(op["method"], url, headers=headers, **kw)
        if reply.status_code >= 500:
            failures.append(f"{op['method']} {url[:120]} {label}: {reply.status_code}")

    def plain_body(op: dict[str, Any]) -> Any:
        if op["body"] == "application/json":
            return {"json": {"dry_run": True, "ids": ["nothing-matches"]}}
        if op["body"]:
            return {"data": {"csrf": csrf or ""}}
        return {}

    for op in operations:
        base_path = fill_path(op["path"], op["path_params"])
        send(op, base_path, "plain", **plain_body(op))
        for name in op["path_params"]:
            walked.add((op["method"], op["path"], name))
            for value in HOSTILE:
                url = fill_path(op["path"], op["path_params"], {name: value})
                send(op, url, f"{name}=<hostile>", **plain_body(op))
        for name in op["query"]:
            walked.add((op["method"], op["path"], name))
            for value in HOSTILE:
                send(op, f"{base_path}?{name}={value}", f"?{name}", **plain_body(op))
            # Repeated, as lists are given: many values at once.
            many = "&".join(f"{name}={HOSTILE[i % len(HOSTILE)]}" for i in range(40))
            send(op, f"{base_path}?{many}", f"?{name} x40", **plain_body(op))
        if op["body"] == "application/json":
            for field in op["fields"]:
                walked.add((op["method"], op["path"], field))
                for value in HOSTILE_JSON:
                    for shaped in (value, [value], {"q": value, "spider": value}):
                        body = json.dumps({"dry_run": True, field: shaped})  # \ud800 escaped
                        send(op, base_path, f"{field}={shaped!r:.40}", content=body,
                             headers={"content-type": "application/json"})  # fmt: skip
                if field == "filters":
                    for filter_name in (
                        "spider", "status", "kind", "domain", "http_status", "node",
                        "since", "until", "id", "q", "unknown",
                    ):  # fmt: skip
                        for value in HOSTILE_TEXT:
                            body = json.dumps({"dry_run": True, "filters": {filter_name: value}})
                            send(op, base_path, f"filters.{filter_name}", content=body,
                                 headers={"content-type": "application/json"})  # fmt: skip
            for raw in (b"\xff\xfe{", b"{", b'{"ids": ["\\ud800"]', b"[]", b"null", b"x" * 100_000):
                send(op, base_path, f"raw body {raw[:10]!r}", content=raw,
                     headers={"content-type": "application/json"})  # fmt: skip
        elif op["body"]:
            for field in op["fields"]:
                walked.add((op["method"], op["path"], field))
                for value in HOSTILE:
                    form = f"csrf={quote(csrf or '')}&{field}={value}".encode()
                    send(op, base_path, f"form {field}", content=form,
                         headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    elapsed = time.monotonic() - started
    assert failures == [], "\n".join(failures[:30])
    # The walk reached the parameters that were once 500s, read from the app itself.
    for expected in (
        ("GET", "/api/tasks", "page"),
        ("GET", "/api/tasks", "id"),
        ("GET", "/api/tasks", "since"),
        ("GET", "/tasks", "q"),
        ("GET", "/api/tasks/{ident}", "ident"),
        ("GET", "/tasks/{ident}", "ident"),
        ("GET", "/api/overview", "spider"),
        ("GET", "/api/actions/{action}/count", "q"),
        ("POST", "/api/actions/{action}", "ids"),
        ("POST", "/api/actions/{action}", "filters"),
        ("POST", "/login", "token"),
        ("GET", "/static/{path}", "path"),
    ):
        assert expected in walked, expected
    assert elapsed < 90, f"the walk took {elapsed:.0f} s"


# -- the inputs that were measured as 500s: a 4xx that names the parameter ----------


@pytest.mark.parametrize(
    ("method", "url", "body", "names"),
    [
        ("GET", "/api/tasks?q=%00", None, "q '\\x00' holds a NUL character"),
        ("GET", "/api/tasks?spider=%00", None, "spider '\\x00' holds a NUL"),
        ("GET", "/api/tasks?node=%00", None, "node '\\x00' holds a NUL"),
        ("GET", "/api/tasks?id=%00", None, "id '\\x00' holds a NUL"),
        ("GET", "/api/tasks/%00", None, "id '\\x00' holds a NUL"),
        ("GET", "/tasks/%00", None, "id &#39;\\x00&#39; holds a NUL"),
        ("GET", "/api/overview?spider=%00", None, "spider '\\x00' holds a NUL"),
        ("GET", "/api/actions/purge/count?q=%00", None, "q '\\x00' holds a NUL"),
        ("POST", "/api/actions/cancel", {"ids": ["\x00"], "dry_run": True}, "id '\\x00'"),
        ("GET", "/api/tasks?page=%C2%B2", None, "page must be a positive whole number"),
        ("GET", "/api/tasks?per_page=%C2%B2", None, "per_page must be a positive whole"),
        ("GET", "/api/tasks?http_status=%C2%B2", None, "http_status '²' is not an HTTP"),
        ("GET", "/api/tasks?id=%C2%B2", None, "id '²' is not a row id"),
        ("GET", "/tasks/%C2%B2", None, "id &#39;²&#39; is not a row id"),
        ("GET", "/api/tasks/%C2%B2", None, "id '²' is not a row id"),
        ("POST", "/api/actions/cancel", {"ids": ["²"], "dry_run": True}, "id '²' is not a row"),
        (
            "POST",
            "/api/actions/cancel",
            {"filters": {"http_status": "²"}, "dry_run": True},
            "http_status '²' is not an HTTP status",
        ),
        (
            "GET",
            "/api/actions/cancel/count?id=%C2%B2",
            None,
            "id '²' is not a row id",
        ),
        ("GET", "/api/tasks?page=9223372036854775807", None, "page must be a positive whole"),
        ("GET", "/api/tasks?since=99999999999d", None, "since '99999999999d' is out of range"),
        (
            "GET",
            "/api/tasks?since=9999-12-31T23:59:59-05:00",
            None,
            "since '9999-12-31T23:59:59-05:00' is out of range",
        ),
        (
            "GET",
            "/api/tasks?until=0001-01-01T00:00:00%2B05:00",
            None,
            "until '0001-01-01T00:00:00+05:00' is out of range",
        ),
        (
            "POST",
            "/api/actions/purge",
            {"filters": {"since": "99999999999d"}, "dry_run": True},
            "since '99999999999d' is out of range",
        ),
        (
            "POST",
            "/api/actions/cancel",
            {"ids": "\ud800", "dry_run": True},
            "ids: Input should be a valid list",
        ),
        ("POST", "/api/actions/cancel", {"ids": ["\ud800"], "dry_run": True}, "not valid Unicode"),
    ],
)
def test_once_a_500_now_a_4xx_naming_the_parameter(
    client: TestClient, method: str, url: str, body: Any, names: str
) -> None:
    if body is None:
        reply = client.request(method, url)
    else:
        reply = client.request(
            method,
            url,
            content=json.dumps(body),
            headers={**AUTH, "content-type": "application/json"},
        )
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text[:300])
    text = reply.json()["detail"] if url.startswith("/api") else reply.text
    assert names in text, text[:300]
