"""One node interrupted with SIGINT (Ctrl-C) anywhere in its crawl, then run again:
every parseable page is parsed exactly once across the runs.

The example project's ``flaky_resumable`` spider keeps its frontier in Redis
(scrapy_retryqueue.crawl.frontier.LeasedScheduler), so what the interrupted crawl had not
fetched yet waits there beside its pending retries.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .crawling import PROJECT, flaky_site, track
from .waiting import wait_for

pytestmark = pytest.mark.e2e

SETTINGS: dict[str, Any] = {
    "RETRYQUEUE_STORE_ENABLED": False,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_LEASE_TIME": 3,
    "RETRYQUEUE_IDLE_TIMEOUT": 30,
    "CONCURRENT_REQUESTS": 4,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
    "DOWNLOAD_TIMEOUT": 1,
    "LOG_LEVEL": "INFO",
    "FEED_EXPORTERS": {"jsonl": "demo.exporters.FlushingJsonLinesItemExporter"},
    "RETRYQUEUE_POLICIES": {
        kind: {"base_delay": 0.3, "max_delay": 2}
        for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
    },
}


def _start(site_url: str, spider: str, redis_url: str, out: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky_resumable"]
    command += ["-a", f"site={site_url}", "-a", f"name={spider}", "-O", str(out)]
    settings = {**SETTINGS, "RETRYQUEUE_REDIS_URL": redis_url, "LOG_FILE": out.with_suffix(".log")}
    for name, value in settings.items():
        command += ["-s", f"{name}={json.dumps(value) if isinstance(value, dict) else value}"]
    return track(subprocess.Popen(command, cwd=PROJECT))


def _items(out: Path) -> list[str]:
    if not out.exists():
        return []
    return [json.loads(line)["url"] for line in out.read_text().splitlines() if line]


def _notes(runs: list[Path]) -> str:
    """What each run's log says of leases, hand-backs and closing: where a page parsed
    twice came from."""
    words = ("lease", "released", "reclaimed", "could not", "is down", "Closing spider", "is done")
    lines = []
    for n, out in enumerate(runs):
        log = out.with_suffix(".log").read_text().splitlines()
        lines += [f"[{n}] {line}" for line in log if any(w in line for w in words)]
    return "\n".join(lines[-80:])


def _opened(out: Path) -> bool:
    log = out.with_suffix(".log")
    return log.exists() and "Spider opened" in log.read_text()


#: Where Ctrl-C falls: as the spider opens (the start page not fetched yet),
#: after a few pages, and late in the crawl.
POINTS = {"at_open": 0, "early": 5, "late": 50}


@pytest.mark.parametrize("parsed_before", POINTS.values(), ids=POINTS.keys())
def test_interrupted_then_resumed_parses_every_page_once(
    redis_url: str, namespace: str, tmp_path: Path, parsed_before: int
) -> None:
    with flaky_site(pages=100, slow=2, retry_after=1, latency=0.05) as site:
        first = tmp_path / "first.jsonl"
        process = _start(site.url, namespace, redis_url, first)
        if parsed_before:
            wait_for(lambda: len(_items(first)) >= parsed_before, f"{parsed_before} items", 120)
        else:
            wait_for(lambda: _opened(first), "the spider opened", 120)
        process.send_signal(signal.SIGINT)
        assert process.wait(120) == 0
        first_log = first.with_suffix(".log").read_text()
        runs = [first]
        # Run again until a crawl ends with nothing left (normally the second one).
        for n in range(3):
            again = tmp_path / f"again{n}.jsonl"
            assert _start(site.url, namespace, redis_url, again).wait(300) == 0
            runs.append(again)
            if "frontier is done" in again.with_suffix(".log").read_text():
                break
        scenarios = site.get_json("/__scenarios")
    parseable = {site.url + p for p, info in scenarios.items() if info["expected"] == "parsed"}
    parsed = Counter(url for out in runs for url in _items(out))
    report = f"runs: {[len(_items(out)) for out in runs]}; first log tail:\n{first_log[-1500:]}"
    assert set(parsed) == parseable, report
    twice = {
        u: [n for n, out in enumerate(runs) if u in _items(out)] for u, c in parsed.items() if c > 1
    }
    assert not twice, f"parsed twice (url: runs): {twice}; {report}\n{_notes(runs)}"
    # The interrupt fell where it was meant to: part of the crawl was left to resume.
    assert len(_items(first)) < len(parseable), report


def test_a_node_paused_past_its_leases_parses_no_page_twice(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    # A crawl frozen longer than RETRYQUEUE_LEASE_TIME (a loaded machine, a laptop
    # that slept), then thawed: its leases ran out while nobody else crawled. It
    # renews them before it reaps, so it fetches none of its own requests again.
    with flaky_site(pages=60, slow=2, retry_after=1, latency=0.05) as site:
        out = tmp_path / "out.jsonl"
        process = _start(site.url, namespace, redis_url, out)
        try:
            wait_for(lambda: len(_items(out)) >= 5, "5 items", 120)
            process.send_signal(signal.SIGSTOP)
            time.sleep(SETTINGS["RETRYQUEUE_LEASE_TIME"] + 2)
        finally:
            process.send_signal(signal.SIGCONT)
        assert process.wait(300) == 0
        scenarios = site.get_json("/__scenarios")
    parseable = {site.url + p for p, info in scenarios.items() if info["expected"] == "parsed"}
    parsed = Counter(_items(out))
    log = out.with_suffix(".log")
    assert set(parsed) == parseable, _notes([out])
    assert max(parsed.values()) == 1, f"{[u for u, c in parsed.items() if c > 1]}\n{_notes([out])}"
    assert "frontier is done" in log.read_text()
