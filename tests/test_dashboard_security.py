"""Who may read and act on the dashboard: the Host check, sessions, the wait after
wrong tokens, writes refused before their body is read, the CSP and the OpenAPI
security scheme; and what a reader sees of a stored request (secret headers
masked, meta as readable text)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import insert, select

from scrapy_retryqueue.dashboard.app import CSRF_COOKIE, SESSION_COOKIE, create_app
from scrapy_retryqueue.dashboard.auth import Sessions, WrongTokens
from scrapy_retryqueue.dashboard.hosts import AllowedHosts, split_host
from scrapy_retryqueue.dashboard.settings import load_dashboard_config
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.store.db import Store

from .dashboardroutes import every_operation

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "http://127.0.0.1"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def app(dashboard_data: dict[str, Any]) -> FastAPI:
    return create_app({**dashboard_data["settings"], "RETRYQUEUE_DASHBOARD_TOKEN": TOKEN})


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, base_url=BASE) as test_client:
        yield test_client


def sign_in(client: TestClient) -> tuple[str, str]:
    """Signs in through the form; returns (session cookie, CSRF token)."""
    client.get("/login")
    csrf = client.cookies.get(CSRF_COOKIE)
    assert csrf
    reply = client.post("/login", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False)
    assert reply.status_code == 303, reply.text
    session = client.cookies.get(SESSION_COOKIE)
    assert session
    return session, csrf


# -- the Host header -----------------------------------------------------------------


def test_a_foreign_host_is_refused_before_anything_is_read(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    row = dashboard_data["rows"]["d1"]
    for path in (f"/api/tasks/{row}", "/", "/tasks", "/metrics", "/openapi.json", "/static/app.js"):
        reply = client.get(path, headers={"Host": "evil.example"})
        assert reply.status_code == 400, path
        assert "'evil.example' is not a name this dashboard is served under" in reply.text
        assert "RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS" in reply.json()["detail"]
        assert dashboard_data["ids"]["d1"] not in reply.text
    # A rebinding page's write is refused too, whatever it carries.
    write = client.post(
        "/api/actions/purge",
        json={"filters": {"status": "all"}},
        headers={**AUTH, "Host": "evil.example:8787"},
    )
    assert write.status_code == 400
    for host in ("127.0.0.1:8787", "localhost", "LOCALHOST:1", "[::1]:8787", "127.0.0.2"):
        assert client.get(f"/api/tasks/{row}", headers={"Host": host}).status_code == 200, host


@pytest.mark.parametrize(
    ("bind", "allowed", "header", "ok"),
    [
        ("127.0.0.1", [], "localhost:8787", True),
        ("127.0.0.1", [], "127.0.0.1", True),
        ("127.0.0.1", [], "[::1]:8787", True),
        ("127.0.0.1", [], "evil.example", False),
        ("127.0.0.1", [], "localhost.evil.example", False),
        ("127.0.0.1", [], "127.0.0.1.evil.example", False),
        ("127.0.0.1", [], "192.168.1.5", False),
        ("127.0.0.1", [], "", False),
        ("127.0.0.1", [], None, False),
        # Listening on every address: the machine's addresses are its names; a page
        # cannot rebind an address, only a name.
        ("0.0.0.0", [], "192.168.1.5:8787", True),
        ("0.0.0.0", [], "my-host.lan:8787", False),
        ("::", [], "[fe80::1]:8787", True),
        ("192.168.1.5", [], "192.168.1.5:8787", True),
        ("192.168.1.5", [], "192.168.1.6", False),
        ("dash.internal", [], "DASH.internal.:8787", True),
        ("0.0.0.0", ["my-host.lan"], "my-host.lan:8787", True),
        ("0.0.0.0", [".corp.example"], "a.b.corp.example", True),
        ("0.0.0.0", [".corp.example"], "corp.example", True),
        ("0.0.0.0", [".corp.example"], "evilcorp.example", False),
        ("127.0.0.1", ["*"], "anything.example", True),
    ],
)
def test_allowed_hosts(bind: str, allowed: list[str], header: str | None, ok: bool) -> None:
    config = load_dashboard_config(
        {"RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS": allowed}, host=bind, token=TOKEN
    )
    assert AllowedHosts.for_config(config)(header) is ok


def test_allowed_hosts_setting() -> None:
    assert split_host("[::1]:8787") == "::1" and split_host("Example.COM.:80") == "example.com"
    config = load_dashboard_config({"RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS": "a.example, .b.example"})
    assert config.allowed_hosts == ("a.example", ".b.example")
    for bad in (["https://a.example"], ["a.example:8787"], ["a.example/x"], "", 5):
        if bad == "":
            assert (
                load_dashboard_config({"RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS": bad}).allowed_hosts
                == ()
            )
            continue
        with pytest.raises(ConfigError, match="RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS"):
            load_dashboard_config({"RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS": bad})


# -- sessions --------------------------------------------------------------------------


def test_every_sign_in_gets_its_own_session_and_sign_out_revokes_it(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    body = {"ids": [dashboard_data["ids"]["w1"]], "dry_run": True}
    first, csrf = sign_in(client)
    second, _ = sign_in(client)
    assert first != second and len(first) >= 40  # random, not derived from the token
    assert TOKEN not in first
    # Signing in again ends the session it replaces.
    client.cookies.set(SESSION_COOKIE, first)
    refused = client.post("/api/actions/retry_now", json=body, headers={"X-CSRF-Token": csrf})
    assert refused.status_code == 401
    client.cookies.set(SESSION_COOKIE, second)
    ok = client.post("/api/actions/retry_now", json=body, headers={"X-CSRF-Token": csrf})
    assert ok.status_code == 200, ok.text
    out = client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303
    # The browser would drop the cookie; a copy of it (a thief's) no longer works either.
    client.cookies.set(SESSION_COOKIE, second)
    after = client.post("/api/actions/retry_now", json=body, headers={"X-CSRF-Token": csrf})
    assert after.status_code == 401
    assert "Sign out" not in client.get("/tasks").text


def test_a_session_expires(dashboard_data: dict[str, Any]) -> None:
    app = create_app(
        {
            **dashboard_data["settings"],
            "RETRYQUEUE_DASHBOARD_TOKEN": TOKEN,
            "RETRYQUEUE_DASHBOARD_SESSION_TTL": 600,
        }
    )
    clock = Clock()
    app.state.sessions.clock = clock
    with TestClient(app, base_url=BASE) as client:
        client.get("/login")
        csrf = client.cookies.get(CSRF_COOKIE)
        reply = client.post("/login", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False)
        assert "max-age=600" in reply.headers["set-cookie"].lower()
        body = {"ids": ["nothing"], "dry_run": True}
        clock.now += 599
        assert (
            client.post(
                "/api/actions/cancel", json=body, headers={"X-CSRF-Token": csrf}
            ).status_code
            == 200
        )
        clock.now += 2
        expired = client.post("/api/actions/cancel", json=body, headers={"X-CSRF-Token": csrf})
        assert expired.status_code == 401
        assert len(app.state.sessions) == 0  # forgotten, not only refused


def test_sessions_and_their_setting() -> None:
    clock = Clock()
    sessions = Sessions(60, clock=clock, limit=3)
    ids = [sessions.new() for _ in range(4)]
    assert len(set(ids)) == 4
    assert not sessions.valid(ids[0])  # the oldest made room
    assert all(sessions.valid(i) for i in ids[1:])
    sessions.revoke(ids[1])
    assert not sessions.valid(ids[1]) and not sessions.valid("") and not sessions.valid(None)
    clock.now += 61
    assert not sessions.valid(ids[2])
    assert load_dashboard_config({}).session_ttl == 43200
    for bad in (0, "soon", 59, 400 * 86400):
        with pytest.raises(ConfigError, match="RETRYQUEUE_DASHBOARD_SESSION_TTL"):
            load_dashboard_config({"RETRYQUEUE_DASHBOARD_SESSION_TTL": bad})


# -- wrong tokens -------------------------------------------------------------------------


def test_wrong_tokens_make_the_client_wait_without_sleeping(
    app: FastAPI, client: TestClient
) -> None:
    clock = Clock()
    app.state.wrong_tokens.clock = clock
    body = {"ids": ["nothing"], "dry_run": True}
    wrong = {"Authorization": "Bearer wrong-wrong-wrong"}
    started = time.monotonic()
    for _ in range(3):  # free
        assert client.post("/api/actions/cancel", json=body, headers=wrong).status_code == 401
    assert client.post("/api/actions/cancel", json=body, headers=AUTH).status_code == 200
    for _ in range(4):
        assert client.post("/api/actions/cancel", json=body, headers=wrong).status_code == 401
    # The fourth wrong one in a row: wait 1 s. Even the right token waits.
    locked = client.post("/api/actions/cancel", json=body, headers=AUTH)
    assert locked.status_code == 429 and locked.headers["retry-after"] == "1"
    assert "too many wrong tokens" in locked.json()["detail"]
    assert time.monotonic() - started < 5  # refused at once: nothing slept
    clock.now += 1
    assert client.post("/api/actions/cancel", json=body, headers=wrong).status_code == 401
    again = client.post("/api/actions/cancel", json=body, headers=AUTH)
    assert again.status_code == 429 and again.headers["retry-after"] == "2"  # doubled
    # The sign-in form waits the same way, and says so on the page.
    client.get("/login")
    csrf = client.cookies.get(CSRF_COOKIE)
    page = client.post("/login", data={"token": TOKEN, "csrf": csrf})
    assert page.status_code == 429 and page.headers["retry-after"] == "2"
    assert "too many wrong tokens" in page.text
    clock.now += 2
    assert client.post("/api/actions/cancel", json=body, headers=AUTH).status_code == 200
    # The right token started the count again: three free wrong ones.
    for _ in range(3):
        assert client.post("/api/actions/cancel", json=body, headers=wrong).status_code == 401
    assert client.post("/api/actions/cancel", json=body, headers=AUTH).status_code == 200


def test_wrong_tokens_cap_and_forget() -> None:
    clock = Clock()
    tokens = WrongTokens(clock=clock, free=0, wait=1, max_wait=60, forget=900, limit=2)
    waits = [tokens.wrong("a") for _ in range(9)]
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert tokens.retry_after("a") == 60 and tokens.retry_after("b") == 0
    clock.now += 1000
    assert tokens.retry_after("a") == 0 and tokens.wrong("a") == 1  # forgotten after 900 s
    tokens.wrong("b")
    tokens.wrong("c")  # the oldest client is dropped past the limit
    assert tokens.retry_after("a") == 0 and tokens.retry_after("c") == 1


# -- writes: the token before the body ---------------------------------------------------


def test_a_write_without_the_token_is_refused_before_its_body_is_read(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    readonly = create_app(dashboard_data["settings"])
    with TestClient(readonly, base_url=BASE) as read_only:
        # Every write route of the app, as its schema lists them.
        writes = [op for op in every_operation(client.app) if op["method"] == "POST"]  # type: ignore[arg-type]
        api_writes = [op for op in writes if op["path"].startswith("/api/")]
        assert [op["path"] for op in api_writes] == ["/api/actions/{action}"]
        for op in api_writes:
            path = op["path"].replace("{action}", "purge")
            for body in (b"{not json", b'{"ids": 5}', b"\xff"):
                headers = {"content-type": "application/json"}
                missing = client.post(path, content=body, headers=headers)
                assert missing.status_code == 401, missing.text
                assert missing.headers["www-authenticate"] == "Bearer"
                bad = client.post(
                    path, content=body, headers={**headers, "Authorization": "Bearer nope-nope"}
                )
                assert bad.status_code == 401
                client.app.state.wrong_tokens.right("testclient")  # type: ignore[attr-defined]
                refused = read_only.post(path, content=body, headers={**headers, **AUTH})
                assert refused.status_code == 403 and "read-only" in refused.json()["detail"]
    # With the token, the same body is read and found wrong.
    invalid = client.post(
        "/api/actions/purge",
        content=b'{"ids": 5}',
        headers={**AUTH, "content-type": "application/json"},
    )
    assert invalid.status_code == 422 and invalid.json()["detail"].startswith("ids:")


def test_csp_and_openapi_security_scheme(client: TestClient) -> None:
    for path in ("/", "/tasks", "/login"):
        csp = client.get(path).headers["content-security-policy"]
        assert "base-uri 'none'" in csp and "frame-ancestors 'none'" in csp
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "RETRYQUEUE_DASHBOARD_TOKEN (or --token) of the running dashboard",
    }
    assert schema["paths"]["/api/actions/{action}"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in schema["paths"]["/api/tasks"]["get"]  # reading needs nothing
    params = {p["name"] for p in schema["paths"]["/api/tasks"]["get"]["parameters"]}
    assert {"spider", "status", "id", "q", "since", "page", "per_page", "sort"} <= params


# -- what a reader sees of a stored request -----------------------------------------------

SECRETS = ("sekret-authz", "sekret-cookie-header", "sekret-proxy", "sekret-api-key", "sekret-jar")


def add_task(database_url: str, spider: str, task_id: str, request: dict[str, Any]) -> int:
    """A dead letter written straight into the store; returns its row id."""
    now = datetime.now(UTC)
    store = Store(database_url)
    try:
        with store.begin() as conn:
            conn.execute(
                insert(store.table).values(
                    spider=spider,
                    task_id=task_id,
                    url=request["url"],
                    domain="shop.example",
                    method="GET",
                    status="dead",
                    kind="forbidden",
                    attempts={"forbidden": 1},
                    attempts_total=1,
                    created_at=now - timedelta(minutes=5),
                    updated_at=now,
                    finished_at=now,
                    envelope={
                        "id": task_id,
                        "spider": spider,
                        "request": request,
                        "attempts": {"forbidden": 1},
                    },
                )
            )
            return conn.execute(
                select(store.table.c.id).where(store.table.c.task_id == task_id)
            ).scalar_one()
    finally:
        store.close()


REQUEST = {
    "url": "https://shop.example/account",
    "method": "GET",
    "headers": [
        ["Authorization", "Bearer sekret-authz"],
        ["cookie", "sid=sekret-cookie-header"],
        ["Proxy-Authorization", "Basic sekret-proxy"],
        ["X-Api-Key", "sekret-api-key"],
        ["Accept", "text/html"],
    ],
    "cookies": {"sid": "sekret-jar"},
    "meta": {"note": "<b>café</b> ünïcode & more", "depth": 2},
    "cb_kwargs": {"who": "</pre><script>alert(1)</script>"},
    "callback": "parse_account",
}


@pytest.mark.parametrize(
    ("secret_setting", "shown_key"),
    # X-Api-Key is in the default list; a project's own list may leave it out.
    [(None, False), (["Authorization", "Cookie", "Proxy-Authorization"], True)],
)
def test_secret_header_values_show_on_no_page_or_answer(
    dashboard_data: dict[str, Any], secret_setting: list[str] | None, shown_key: bool
) -> None:
    spider = dashboard_data["spider"]
    row = add_task(dashboard_data["database_url"], spider, f"{spider}-secret", REQUEST)
    settings = {**dashboard_data["settings"], "RETRYQUEUE_DASHBOARD_TOKEN": TOKEN}
    if secret_setting is not None:
        settings["RETRYQUEUE_SECRET_HEADERS"] = secret_setting
    with TestClient(create_app(settings), base_url=BASE) as client:
        sign_in(client)  # a signed-in reader sees no more than an anonymous one
        answers = {
            "page": client.get(f"/tasks/{row}"),
            "api": client.get(f"/api/tasks/{row}"),
            "by task id": client.get(f"/api/tasks/{spider}-secret"),
            "list": client.get("/api/tasks", params={"spider": spider}),
            "tasks page": client.get("/tasks", params={"spider": spider}),
            "dry run": client.post(
                "/api/actions/purge", json={"ids": [str(row)], "dry_run": True}, headers=AUTH
            ),
        }
        for name, reply in answers.items():
            assert reply.status_code == 200, (name, reply.text[:300])
            hidden = SECRETS if not shown_key else SECRETS[:3] + SECRETS[4:]
            for secret in hidden:
                assert secret not in reply.text, (name, secret)
        detail = answers["api"].json()
        assert detail["request"]["headers"] == [
            ["Authorization", "***"],
            ["cookie", "***"],
            ["Proxy-Authorization", "***"],
            ["X-Api-Key", "sekret-api-key" if shown_key else "***"],
            ["Accept", "text/html"],
        ]
        envelope = detail["task"]["envelope"]["request"]
        assert envelope["headers"] == detail["request"]["headers"]
        assert envelope["cookies"] == {"sid": "***"}
        assert ("sekret-api-key" in answers["page"].text) is shown_key
        assert "<th>Authorization</th><td>***</td>" in answers["page"].text
    # Masking is for people: the store keeps the values, so the request can be replayed.
    store = Store(dashboard_data["database_url"])
    with store.connect() as conn:
        kept = conn.execute(
            select(store.table.c.envelope).where(store.table.c.id == row)
        ).scalar_one()
    store.close()
    assert kept["request"]["headers"][0] == ["Authorization", "Bearer sekret-authz"]


def test_meta_and_cb_kwargs_read_as_text(
    client: TestClient, dashboard_data: dict[str, Any]
) -> None:
    spider = dashboard_data["spider"]
    row = add_task(dashboard_data["database_url"], spider, f"{spider}-meta", REQUEST)
    page = client.get(f"/tasks/{row}").text
    meta = re.search(r'<pre id="task-meta">(.*?)</pre>', page, re.S)
    assert meta is not None
    # Readable JSON (no \u escapes), escaped as HTML: the markup stays text.
    assert meta.group(1) == (
        "{\n  &#34;depth&#34;: 2,\n  &#34;note&#34;: &#34;&lt;b&gt;café&lt;/b&gt; ünïcode &amp; more&#34;\n}"
    )
    kwargs = re.search(r'<pre id="task-cb-kwargs">(.*?)</pre>', page, re.S)
    assert kwargs is not None
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in kwargs.group(1)
    assert "\\u003c" not in page and "<script>alert(1)" not in page
    assert json.loads(client.get(f"/api/tasks/{row}").text)["request"]["meta"]["note"] == (
        "<b>café</b> ünïcode & more"
    )


def test_an_encrypted_request_shows_as_encrypted(
    client: TestClient, dashboard_data: dict[str, Any], redis_client: Any
) -> None:
    from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
    from scrapy_retryqueue.queue.envelope import Task
    from scrapy_retryqueue.secure.encryption import RequestCipher, generate_key
    from scrapy_retryqueue.store.sync import EventSync

    spider, now = dashboard_data["spider"], dashboard_data["now"]
    sealed = RequestCipher([generate_key()]).seal(
        {"url": "https://shop.example/e", "headers": [["Authorization", "Bearer hunter2"]]}
    )
    error = {"kind": "not_found", "type": "HttpStatus", "message": "HTTP 404", "status": 404}
    task = Task(id=f"{spider}-e1", spider=spider, request=sealed, attempts={}, kind="not_found",
                first_error=error, last_error=error, node="node-a", created=now, updated=now,
                due=now, dead_kind="not_found")  # fmt: skip
    RedisDelayedQueue(redis_client, spider, node_id="node-a").deadletter(task, None, now=now)
    store = Store(dashboard_data["database_url"])
    EventSync(store, redis_client, spider, consumer="fixture").drain()
    store.close()
    page = client.get(f"/tasks/{spider}-e1")
    assert page.status_code == 200
    assert "(encrypted)" in page.text and "hunter2" not in page.text
    api = client.get(f"/api/tasks/{spider}-e1")
    assert api.status_code == 200 and "hunter2" not in api.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer sekret-authz", "Accept": "text/html"},
        [["Authorization", "Bearer sekret-authz", "sekret-authz-2"], ["Accept", "text/html"]],
    ],
)
def test_secrets_of_envelopes_not_shaped_as_ours_show_nowhere(
    dashboard_data: dict[str, Any], headers: Any
) -> None:
    """A hostile writer's shapes (headers as a dict, pairs of three) and a URL's password."""
    spider = dashboard_data["spider"]
    request = {"url": "https://bob:sekret-pw@shop.example/account", "headers": headers}
    row = add_task(dashboard_data["database_url"], spider, f"{spider}-odd", request)
    with TestClient(create_app(dashboard_data["settings"]), base_url=BASE) as client:
        for path in (f"/tasks/{row}", f"/api/tasks/{row}", f"/api/tasks?spider={spider}", "/tasks"):
            reply = client.get(path)
            assert reply.status_code == 200, (path, reply.text[:300])
            for secret in ("sekret-authz", "sekret-pw"):
                assert secret not in reply.text, (path, secret)
        detail = client.get(f"/api/tasks/{row}").json()
        assert ["Authorization", "***"] in detail["request"]["headers"] or [
            "Authorization",
            "***, ***",
        ] in detail["request"]["headers"]
        assert ["Accept", "text/html"] in detail["request"]["headers"]
        assert detail["request"]["url"] == "https://bob:***@shop.example/account"
