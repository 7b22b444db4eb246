"""Several crawlers in one CrawlerProcess, the store writer at its default ("auto").

    python tests/several_crawl.py SITE SETTINGS_JSON NAME [NAME ...]

Each crawler crawls the flaky site (the example project's spider) as a spider of
its own NAME, all in one process, for tests/test_store_process_crawl.py. A
subprocess, because a Twisted reactor cannot be restarted inside the test process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scrapy.crawler import CrawlerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "example_project"))
from demo.spiders.flaky import FlakySpider


def main() -> None:
    site, settings_json, *names = sys.argv[1:]
    settings = {
        "ADDONS": {"scrapy_retryqueue.Addon": 0},
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **json.loads(settings_json),
    }
    process = CrawlerProcess(settings)
    for name in names:
        process.crawl(FlakySpider, site=site, name=name)
    process.start()


if __name__ == "__main__":
    main()
