"""Resume without duplicates for a spider that starts from its start URLs again.

The example spider always requests the site's index first, as most spiders
written by others do. A crawl that stops with retries pending leaves them in
Redis; the next crawl requests every page afresh *and* resumes those retries.
With Scrapy's JOBDIR the fresh requests the first crawl made are filtered out
(its dupefilter is persisted), so each page is parsed once; without it the
crawl says at start that a page may be parsed twice (docs/guarantees.md).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .crawling import crawl, flaky_site

pytestmark = pytest.mark.e2e

SETTINGS: dict[str, Any] = {
    "RETRYQUEUE_STORE_ENABLED": False,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    # Parse retries come back 20 s later: the first crawl does not wait for them.
    "RETRYQUEUE_POLICIES": {
        "timeout": {"base_delay": 0.3, "max_delay": 1},
        "connection": {"base_delay": 0.3, "max_delay": 1},
        "rate_limited": {"base_delay": 0.3, "max_delay": 1},
        "server_error": {"base_delay": 0.3, "max_delay": 1},
        "parse": {"base_delay": 20, "max_delay": 20, "jitter": "none"},
    },
    "DOWNLOAD_TIMEOUT": 1,
}


def test_with_jobdir_a_resumed_crawl_parses_each_page_once(
    redis_url: str, spider_name: str, tmp_path: Path
) -> None:
    settings = {
        **SETTINGS,
        "RETRYQUEUE_REDIS_URL": redis_url,
        "JOBDIR": str(tmp_path / "job"),
    }
    with flaky_site(pages=40, slow=2) as site:
        table = site.get_json("/__scenarios")
        parseable = {site.url + p for p, i in table.items() if i["expected"] == "parsed"}
        parse_pages = {site.url + p for p, i in table.items() if i["scenario"] == "parse_once"}
        assert parse_pages

        first = crawl(site.url, spider_name, tmp_path, {**settings, "RETRYQUEUE_IDLE_TIMEOUT": 1})
        assert first.returncode == 0, first.log[-3000:]
        assert "'finish_reason': 'retryqueue_work_left'" in first.log
        assert not parse_pages & {item["url"] for item in first.items}

        # The same command again, start URLs and all.
        second = crawl(site.url, spider_name, tmp_path, {**settings, "RETRYQUEUE_IDLE_TIMEOUT": 60})
    assert second.returncode == 0, second.log[-3000:]
    parsed = Counter(item["url"] for run in (first, second) for item in run.items)
    # Every page parsed, none twice: the retries came back, the fresh requests did not.
    assert set(parsed) == parseable
    assert [url for url, n in parsed.items() if n > 1] == []
    assert parse_pages <= {item["url"] for item in second.items}
    assert "parsed twice" not in second.log
