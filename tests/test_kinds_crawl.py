"""A project's own kind and a backoff class of its own, in real crawls.

Each crawl (tests/kinds_crawl.py, in a subprocess) runs against a small site
served here, which records when each of its URLs was fetched, and the real
Redis: (a) a kind ``captcha`` the project declares, met by a callback's
``RetryLater("captcha")`` and by a status mapped to it, retried by its policy,
counted under its name, and its dead letter exported with
``scrapy deadletters export --kind captcha``; (b) that RetryLater told as its
kind in one line, never as a spider error, and the items a generator callback
yielded before it raised kept; (c) a RETRYQUEUE_BACKOFF class that returns
0.7 s sets the gap between two fetches of a failing URL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .sitecrawl import Site, run_crawl, serving, spider_named
from .storecli import scrapy

CAPTCHA_PAGE = b"<html><body><form>Prove you are human</form></body></html>"
CAPTCHA_POLICY = {
    "retry": True,
    "base_delay": 0.3,
    "max_delay": 0.6,
    "max_retries": 3,
    "jitter": "none",
}
KINDS = {"captcha": CAPTCHA_POLICY}


def answer(path: str, query: dict[str, list[str]], times: list[float]) -> tuple[int, bytes]:
    """``/captcha/NAME?times=N`` (or ``/midway/NAME``) is a captcha page N times, then a
    page; ``/status/NAME?times=N&code=C`` answers C N times, then 200."""
    failing = len(times) <= int(query.get("times", ["0"])[0])
    if failing and path.startswith(("/captcha/", "/midway/")):
        return 200, CAPTCHA_PAGE
    if failing and path.startswith("/status/"):
        return int(query["code"][0]), b"<html>no</html>"
    return 200, b"<html><body><h1>a page</h1></body></html>"


@pytest.fixture
def site() -> Iterator[Site]:
    with serving(Site(answer)) as served:
        yield served


@pytest.fixture
def spider(redis_url: str) -> Iterator[str]:
    with spider_named("kinds", redis_url) as name:
        yield name


def test_a_declared_kind_is_retried_by_its_policy_counted_and_exported(
    site: Site, spider: str, redis_url: str, tmp_path: Path
) -> None:
    database = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_DATABASE_URL": database,
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        "RETRYQUEUE_KINDS": KINDS,
        "RETRYQUEUE_STATUS_KINDS": {"499": "captcha"},
    }
    urls = [
        f"{site.url}/captcha/twice?times=2",
        f"{site.url}/status/once?times=1&code=499",
        f"{site.url}/captcha/forever?times=100",
    ]
    crawl = run_crawl(spider, urls, settings, tmp_path)

    assert sorted(crawl["parsed"]) == sorted(urls[:2])
    assert [e["url"] for e in crawl["errbacks"] if e["error"] != "RequestParked"] == []
    # Retried by captcha's policy: 3 retries, 0.3 s then 0.6 s (its cap) apart.
    assert len(site.hits["/captcha/twice"]) == 3
    assert len(site.hits["/status/once"]) == 2
    forever = site.gaps("/captcha/forever")
    assert len(forever) == 3, forever
    for gap, planned in zip(forever, (0.3, 0.6, 0.6), strict=True):
        assert planned - 0.02 <= gap < planned + 3.0, forever
    stats = crawl["stats"]
    assert stats["retryqueue/scheduled/captcha"] == 2 + 1 + 3
    # Recovered once the callback ran without failing (docs/stats.md): the two pages
    # parsed; a captcha again is rescheduled under the lease, not recovered.
    assert stats["retryqueue/recovered/captcha"] == 2
    assert stats["retryqueue/dead/captcha"] == 1
    assert "retryqueue/scheduled/parse" not in stats
    assert "retryqueue/undeclared_kind" not in stats
    assert "captcha" in crawl["log"]  # the end-of-crawl table of retries by kind
    # Given up, too, it is the project's signal: its dead letter's line, no traceback.
    assert "Traceback" not in crawl["log"] and crawl["spider_errors"] == []
    assert (
        f"dead letter {urls[2]} (captcha: gave up after 3 retries; the site served"
        in (crawl["log"])
    )

    cli = {
        "RETRYQUEUE_DATABASE_URL": database,
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_KINDS": json.dumps(KINDS),
    }
    args = ("deadletters", "export", "--format", "jsonl", "--spider", spider)
    done = scrapy(*args, "--kind", "captcha", cwd=tmp_path, settings=cli)
    assert done.code == 0, done.err
    [row] = [json.loads(line) for line in done.out.splitlines()]
    assert (row["kind"], row["url"], row["status"]) == ("captcha", urls[2], "dead")
    assert row["attempts"] == {"captcha": 3}
    # A project that does not declare the kind cannot filter on it.
    refused = scrapy(
        *args, "--kind", "captcha", cwd=tmp_path, settings={**cli, "RETRYQUEUE_KINDS": "{}"}
    )
    assert refused.code != 0 and "--kind 'captcha' is not a kind" in refused.err


def test_retry_later_is_told_as_its_kind_not_as_a_spider_error(
    site: Site, spider: str, redis_url: str, tmp_path: Path
) -> None:
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        "RETRYQUEUE_KINDS": KINDS,
    }
    urls = [f"{site.url}/captcha/once?times=1", f"{site.url}/midway/once?times=1"]
    crawl = run_crawl(spider, urls, settings, tmp_path)

    # Recovered on the retry.
    assert sorted(crawl["parsed"]) == sorted(urls)
    stats = crawl["stats"]
    assert stats["retryqueue/recovered/captcha"] == 2
    assert stats["retryqueue/raised/captcha"] == 2
    # No spider error: no traceback, no spider_error signal, no spider_exceptions/*.
    log = crawl["log"]
    assert "Traceback" not in log
    assert crawl["spider_errors"] == []
    assert not [name for name in stats if name.startswith("spider_exceptions/")]
    # One INFO line each, naming the kind, the URL and when it comes back.
    lines = [line for line in log.splitlines() if "asked for a retry later" in line]
    assert len(lines) == 2, lines
    for url in urls:
        [line] = [line for line in lines if f"the callback of {url} asked" in line]
        assert " INFO: " in line and "; captcha: retry 1 of 3, due in 0.3s" in line, line
    # What the generator yielded before it raised went on; on the retry, all of it.
    assert [item["part"] for item in crawl["items"]] == ["before", "before", "after"]


def test_a_backoff_class_of_the_project_sets_the_gap_between_attempts(
    site: Site, spider: str, redis_url: str, tmp_path: Path
) -> None:
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_POLL_INTERVAL": 0.1,
        "RETRYQUEUE_BACKOFF": "__main__.ConstantBackoff",
    }
    url = f"{site.url}/status/flaky?times=2&code=500"
    crawl = run_crawl(spider, [url], settings, tmp_path)

    assert crawl["parsed"] == [url]
    gaps = site.gaps("/status/flaky")
    assert len(gaps) == 2, gaps
    # server_error's own backoff would wait 5 to 10 s before the first retry.
    for gap in gaps:
        assert 0.69 <= gap < 4.0, gaps
    assert crawl["stats"]["retryqueue/scheduled/server_error"] == 2
    assert crawl["stats"]["retryqueue/recovered"] == 1
    assert "RETRYQUEUE_BACKOFF" not in crawl["log"]  # no error line about the strategy
