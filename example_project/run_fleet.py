"""Run a fleet: the flaky site and N `scrapy crawl flaky_fleet` nodes started at the same moment.

    python example_project/run_fleet.py [--nodes 3] [--pages 300] [--late 0]
                                        [--redis-url redis://host:6379/0]

The nodes share one Redis: scrapy-redis's frontier and dupefilter hand each page
to one node, and scrapy-retryqueue shares the failures. Without --redis-url the
project's embedded server is that Redis (all nodes run on this machine). With
--late N, the last node starts N seconds after the others have begun crawling
(their shared dupefilter holds a request) and joins a crawl in progress. At the end it prints, per node, what it fetched, parsed and retried,
then the totals: pages parsed more than once (duplicates) and pages that never
got their final answer (lost).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent
sys.path.insert(0, str(PROJECT))
from flaky_site import spawn  # noqa: E402

#: Short delays and leases so the example finishes in seconds.
NODE_SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 8,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    "DOWNLOAD_TIMEOUT": 1,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_LEASE_TIME": 3,
    "RETRYQUEUE_IDLE_TIMEOUT": 30,
    "RETRYQUEUE_FLEET_WAIT": 15,
    "RETRYQUEUE_STORE_ENABLED": False,
    "LOG_LEVEL": "INFO",
    "RETRYQUEUE_POLICIES": {
        kind: {"base_delay": 0.3, "max_delay": 2}
        for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
    },
}


@dataclass
class Node:
    name: str
    returncode: int
    items: list[dict[str, Any]]
    stats: dict[str, int]
    log: str

    @property
    def fetched(self) -> int:
        return self.stats.get("downloader/response_count", 0)

    @property
    def retried(self) -> int:
        return self.stats.get("retryqueue/reinjected", 0)


@dataclass
class Fleet:
    nodes: list[Node]
    #: Pages the site says a crawler can parse (not 404 / 403 / gone).
    parseable: set[str]
    seconds: float
    parsed: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node in self.nodes:
            for item in node.items:
                self.parsed[item["url"]] = self.parsed.get(item["url"], 0) + 1

    @property
    def duplicates(self) -> int:
        return sum(count - 1 for count in self.parsed.values() if count > 1)

    @property
    def lost(self) -> set[str]:
        return self.parseable - set(self.parsed)

    def report(self) -> str:
        lines = [f"{'node':<10} {'fetched':>8} {'parsed':>7} {'retried':>8}  exit"]
        for node in self.nodes:
            lines.append(
                f"{node.name:<10} {node.fetched:>8} {len(node.items):>7} {node.retried:>8}  "
                f"{node.returncode}"
            )
        lines.append(
            f"{'total':<10} {sum(n.fetched for n in self.nodes):>8} "
            f"{sum(len(n.items) for n in self.nodes):>7} {sum(n.retried for n in self.nodes):>8}"
        )
        lines.append(
            f"{len(self.parsed)} of {len(self.parseable)} parseable pages parsed in "
            f"{self.seconds:.1f}s; duplicates: {self.duplicates}; lost: {len(self.lost)}"
        )
        return "\n".join(lines)


def _stats(log: str) -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(r"'([\w/.-]+)': (\d+),?\n", log)}


def _wait_until_crawling(
    client: Any, spider: str, processes: list[tuple[str, subprocess.Popen[bytes], Path]]
) -> None:
    deadline = time.monotonic() + 120
    while not client.exists(f"{spider}:dupefilter"):
        if time.monotonic() > deadline or any(p.poll() is not None for _, p, _ in processes):
            return
        time.sleep(0.05)


def run_fleet(
    *,
    nodes: int,
    pages: int,
    redis_url: str,
    workdir: Path,
    late: float = 0.0,
    spider: str | None = None,
    site_options: dict[str, Any] | None = None,
    node_settings: dict[str, Any] | None = None,
) -> Fleet:
    """Start the site and the nodes, wait for every node to finish, read what each did."""
    import redis

    spider = spider or f"fleet{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    options = {"pages": pages, "slow": 2, "retry_after": 1, "latency": 0.05, **(site_options or {})}
    try:
        with spawn(**options) as site:
            processes: list[tuple[str, subprocess.Popen[bytes], Path]] = []
            started = time.monotonic()
            for n in range(nodes):
                if late and n == nodes - 1:
                    # Late relative to the crawl, not to the launch: a loaded machine
                    # can take seconds to start Scrapy, and a fixed sleep could let the
                    # first nodes finish before the late one arrives.
                    _wait_until_crawling(client, spider, processes)
                    time.sleep(late)
                name = f"node-{n}"
                out = workdir / f"{spider}-{name}.jsonl"
                command = [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky_fleet"]
                command += ["-a", f"site={site.url}", "-a", f"name={spider}", "-O", str(out)]
                settings = {
                    **NODE_SETTINGS,
                    **(node_settings or {}),
                    "REDIS_URL": redis_url,
                    "RETRYQUEUE_REDIS_URL": redis_url,
                    "RETRYQUEUE_NODE_ID": name,
                    "LOG_FILE": str(out.with_suffix(".log")),
                }
                for key, value in settings.items():
                    text = json.dumps(value) if isinstance(value, dict) else str(value)
                    command += ["-s", f"{key}={text}"]
                processes.append((name, subprocess.Popen(command, cwd=PROJECT), out))
            results = []
            for name, process, out in processes:
                returncode = process.wait(600)
                log_path = out.with_suffix(".log")
                log = log_path.read_text() if log_path.exists() else ""
                items = (
                    [json.loads(line) for line in out.read_text().splitlines()]
                    if out.exists()
                    else []
                )
                results.append(Node(name, returncode, items, _stats(log), log))
            seconds = time.monotonic() - started
            scenarios = site.get_json("/__scenarios")
        parseable = {
            site.url + path for path, info in scenarios.items() if info["expected"] == "parsed"
        }
        return Fleet(results, parseable, seconds)
    finally:
        client.delete(
            *client.keys(f"retryqueue:{{{spider}}}:*") or [f"{spider}:none"],
            f"{spider}:requests",
            f"{spider}:dupefilter",
        )
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3, help="crawl processes (default 3)")
    parser.add_argument("--pages", type=int, default=300, help="pages of the site (default 300)")
    parser.add_argument(
        "--late", type=float, default=0.0, help="start the last node this many seconds later"
    )
    parser.add_argument(
        "--redis-url", help="the fleet's Redis (default: this project's embedded server)"
    )
    args = parser.parse_args()
    redis_url = args.redis_url
    if redis_url is None:
        from scrapy_retryqueue import embedded

        redis_url = embedded.ensure_server(PROJECT / ".scrapy" / "retryqueue")
    with tempfile.TemporaryDirectory() as tmp:
        fleet = run_fleet(
            nodes=args.nodes,
            pages=args.pages,
            redis_url=redis_url,
            workdir=Path(tmp),
            late=args.late,
        )
    print(fleet.report())
    return 0 if not fleet.lost and not fleet.duplicates else 1


if __name__ == "__main__":
    raise SystemExit(main())
