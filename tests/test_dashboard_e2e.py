"""End to end: a real crawl fills Redis and PostgreSQL, the dashboard runs under
uvicorn, and Debian's headless Chromium (driven by Playwright, no browser
download) looks at the overview, filters the tasks, retries one, and sees its
status change once a crawl has run it. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn

from scrapy_retryqueue.dashboard.app import create_app
from scrapy_retryqueue.queue.keys import keys_for
from scrapy_retryqueue.store.db import Store

from .crawling import ROOT, crawl, flaky_site
from .waiting import wait_for

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "e2e-token-0123456789"
LONG = {"base_delay": 3600, "max_delay": 3600}


@pytest.fixture
def dashboard_server() -> Iterator[Callable[[dict[str, Any]], str]]:
    """Starts the dashboard for some settings under uvicorn in a thread; returns its URL."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(settings: dict[str, Any]) -> str:
        app = create_app(
            {**settings, "RETRYQUEUE_DASHBOARD_TOKEN": TOKEN, "RETRYQUEUE_DASHBOARD_REFRESH": 1}
        )
        server = uvicorn.Server(
            # Port 0: uvicorn binds a free port itself, read back once it listens.
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        wait_for(lambda: server.started, "the dashboard to start", timeout=10)
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def test_browse_filter_and_retry_a_task_in_chromium(
    tmp_path: Path,
    redis_url: str,
    redis_client: redis.Redis,
    spider_name: str,
    new_pg_database: Callable[[], str],
    dashboard_server: Callable[[dict[str, Any]], str],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"this test needs Debian's chromium at {CHROMIUM}; run `bash scripts/ensure-services` "
            "as root to install it",
            pytrace=False,
        )

    database_url = new_pg_database()
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": database_url,
        # Retries wait an hour, so the crawl ends with tasks pending to retry by hand.
        "RETRYQUEUE_POLICIES": {
            kind: LONG
            for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
        },
        "RETRYQUEUE_IDLE_TIMEOUT": 1,
        "RETRYQUEUE_POLL_INTERVAL": 0.2,
    }
    ARTIFACTS.mkdir(exist_ok=True)
    with flaky_site(pages=40, slow=3) as site:
        first = crawl(site.url, spider_name, tmp_path, settings)
        assert first.returncode == 0, first.log[-3000:]
        keys = keys_for(spider_name)
        pending = redis_client.zcard(keys.due)
        # 40 pages: 16 fail once or more, then would answer; 6 never do. The 4 that
        # answer 429 say when to come back (Retry-After, 1 s), which sets their wait
        # whatever the policy: they recover in this crawl, the other 12 wait.
        assert pending == 12, first.log[-3000:]
        store = Store(database_url)
        with store.connect() as conn:
            dead = conn.execute(store.table.select().where(store.table.c.status == "dead")).all()
        store.close()
        assert len(dead) == 6

        base = dashboard_server(settings)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                      "--disable-component-update", "--disable-sync", "--no-first-run"],
            )  # fmt: skip
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.on("dialog", lambda dialog: dialog.accept())
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))

                # The overview fills itself from /api, and keeps refreshing.
                page.goto(f"{base}/?spider={spider_name}")
                expect(page.locator("#t-pending")).to_have_text("12")
                expect(page.locator("#t-dead")).to_have_text("6")
                expect(page.locator("#chart polyline[data-series=scheduled]")).to_have_count(1)
                expect(page.locator("#by-kind tbody tr").first).not_to_have_text("nothing yet")
                # The crawl's activity fits in a minute or two: the chart's buckets follow
                # it (seconds, not one-minute buckets), with several time labels.
                assert "per second" in page.locator("#chart-title").inner_text()
                assert page.locator("#chart text.tick").count() >= 5
                # By kind: recovery rate and times to recover.
                expect(page.locator("#by-kind thead th")).to_have_count(7)
                assert page.locator("#by-kind tbody tr").first.locator("td").count() == 7
                loads = int(page.locator("#overview").get_attribute("data-loaded") or 0)
                # The page refreshes itself (every RETRYQUEUE_DASHBOARD_REFRESH seconds).
                expect(page.locator("#overview")).not_to_have_attribute(
                    "data-loaded", str(loads), timeout=15_000
                )
                page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)
                narrow = browser.new_page(viewport={"width": 420, "height": 900})
                narrow.goto(f"{base}/?spider={spider_name}")
                expect(narrow.locator("#t-pending")).to_have_text("12")
                expect(narrow.locator("#chart polyline[data-series=scheduled]")).to_have_count(1)
                assert narrow.locator("#chart text.tick").count() >= 3
                # Nothing sticks out of a narrow window but the scrolled tables.
                width = narrow.evaluate("document.documentElement.scrollWidth")
                assert width <= 420, width
                narrow.screenshot(path=str(ARTIFACTS / "dashboard-overview-narrow.png"))
                narrow.close()

                # Sign in with the token, then filter the tasks as a person would.
                page.goto(base + "/login")
                page.fill("input[name=token]", TOKEN)
                page.click("button[type=submit]")
                expect(page.get_by_text("Sign out")).to_be_visible()
                page.goto(base + "/tasks")
                page.fill("input[name=spider]", spider_name)
                page.select_option("select[name=status]", "waiting")
                page.fill("input[name=kind]", "server_error")
                page.fill("input[name=http_status]", "500")
                page.click("#apply")
                rows = page.locator("#tasks tbody tr")
                expect(rows).to_have_count(2)  # "500 once": one page in each block of 20
                expect(page.locator("#tasks .status.waiting")).to_have_count(2)
                page.screenshot(path=str(ARTIFACTS / "dashboard-tasks.png"), full_page=True)
                page.set_viewport_size({"width": 420, "height": 900})
                assert page.evaluate("document.documentElement.scrollWidth") <= 420
                page.set_viewport_size({"width": 1280, "height": 900})

                # Retry one now, from its page.
                rows.first.locator("td.url a").click()
                expect(page.locator("#task-status")).to_have_text("waiting")
                url = page.locator("#task-url").inner_text()
                task_page = page.url
                page.click("#task-actions button[data-action=retry_now]")
                expect(page.get_by_text("by hand: retry_now")).to_be_visible(timeout=10_000)
                task_id = page.locator("dd.mono").inner_text()
                due = redis_client.zscore(keys.due, task_id)
                assert due is not None and due <= time.time() * 1000

                # A crawl with nothing else to do takes the task that is due and runs it.
                second = crawl(site.url, spider_name, tmp_path, settings, "-a", "index=false")
                assert second.returncode == 0, second.log[-3000:]
                assert [item["url"] for item in second.items] == [url]
                page.goto(task_page)
                expect(page.locator("#task-status")).to_have_text("succeeded")
                expect(page.locator("#timeline")).to_contain_text("succeeded")
                page.screenshot(path=str(ARTIFACTS / "dashboard-task.png"), full_page=True)
                assert errors == []
            finally:
                browser.close()
    assert redis_client.zcard(keys.due) == 11
