"""Per-domain cooldowns: do healthy sites keep their speed while another throttles?

    python -m benchmarks.cooldown [--pages 300] [--repeats 3]

Each round runs the same two-node fleet (tests/domains_crawl.py nodes sharing a
Redis of their own, RETRYQUEUE_DOMAIN_COOLDOWN on) twice on the same machine:
once over two healthy sites (127.0.0.3, 127.0.0.4) alone, and once over the
same two plus a third (127.0.0.2) that answers 429 with Retry-After to every
page for 10 s after a burst. The figure is the healthy sites' pages per second
(pages over the span of their request logs) with the throttled site, divided by
the same without it: the issue's target is >= 0.95. Also printed: requests the
throttled site got while throttling after the first in-flight ones (probes),
and whether every URL was fetched.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from .common import ROOT, flaky_site, own_redis

NODE = ROOT / "tests" / "domains_crawl.py"
THROTTLE_FOR = 10.0


def _settings(redis_url: str, node: str) -> dict[str, Any]:
    return {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_NODE_ID": node,
        "RETRYQUEUE_STORE_ENABLED": False,
        "RETRYQUEUE_DOMAIN_COOLDOWN": True,
        "RETRYQUEUE_COOLDOWN_BASE": 5.0,
        "RETRYQUEUE_POLL_INTERVAL": 0.2,
        "RETRYQUEUE_LEASE_TIME": 5,
        "RETRYQUEUE_IDLE_TIMEOUT": 60,
        "RETRYQUEUE_POLICIES": {"rate_limited": {"base_delay": 0.5, "max_delay": 2}},
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "CONCURRENT_ITEMS": 10,
        "DOWNLOAD_TIMEOUT": 5,
        "LOG_LEVEL": "WARNING",
    }


def _fleet(redis_url: str, urls: list[str], workdir: Path) -> list[dict[str, Any]]:
    spider = f"bench{uuid.uuid4().hex[:8]}"
    nodes = []
    for i in range(2):
        out = workdir / f"{spider}-{i}.json"
        settings = json.dumps(_settings(redis_url, f"node-{i}"))
        process = subprocess.Popen(
            [sys.executable, str(NODE), json.dumps(urls[i::2]), spider, settings, str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        nodes.append((process, out))
    results = []
    for process, out in nodes:
        process.wait(600)
        results.append(json.loads(out.read_text()))
    return results


def _rate(logs: list[list[dict[str, Any]]]) -> float:
    times = [e["t"] for log in logs for e in log if e["status"] == 200]
    return len(times) / (max(times) - min(times))


def one_round(pages: int, latency: float) -> dict[str, float]:
    options = {"mix": "healthy", "pages": pages, "latency": latency}
    with tempfile.TemporaryDirectory() as tmp, own_redis() as redis_url:
        workdir = Path(tmp)
        with (
            flaky_site(host="127.0.0.3", **options) as a,
            flaky_site(host="127.0.0.4", **options) as b,
        ):
            urls = [f"{s.url}/page/{n}" for n in range(pages) for s in (a, b)]
            _fleet(redis_url, urls, workdir)
            alone = _rate([a.get_json("/__log"), b.get_json("/__log")])
        with (
            flaky_site(
                host="127.0.0.2",
                throttle_after=pages // 10,
                throttle_for=THROTTLE_FOR,
                **options,
            ) as hot,
            flaky_site(host="127.0.0.3", **options) as a,
            flaky_site(host="127.0.0.4", **options) as b,
        ):
            urls = [f"{s.url}/page/{n}" for n in range(pages) for s in (hot, a, b)]
            results = _fleet(redis_url, urls, workdir)
            together = _rate([a.get_json("/__log"), b.get_json("/__log")])
            hot_log = hot.get_json("/__log")
        first = min(e["t"] for e in hot_log if e["status"] == 429)
        reopened = min(e["t"] for e in hot_log if e["status"] == 200 and e["t"] > first)
        parsed = {p["url"] for node in results for p in node["parsed"]}
    return {
        "healthy pages/s alone": alone,
        "healthy pages/s with throttled site": together,
        "ratio": together / alone,
        "probes while throttled": sum(1 for e in hot_log if first + 1.0 < e["t"] < reopened),
        "all fetched": float(len(parsed) == 3 * pages),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=300, help="pages per site")
    parser.add_argument("--latency", type=float, default=0.02, help="added to every page, s")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rounds = [one_round(args.pages, args.latency) for _ in range(args.repeats)]
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        print(
            f"{name:40} median {statistics.median(values):8.3f}   "
            f"(min {min(values):.3f}, max {max(values):.3f})"
        )


if __name__ == "__main__":
    main()
