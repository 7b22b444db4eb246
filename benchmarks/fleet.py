"""Fleet scenario: N crawl processes share one Redis on the flaky site.

    python -m benchmarks.fleet [--pages 600] [--nodes 1 2 3] [--redis redis://127.0.0.1:6379/0]

Each run starts a fresh flaky site and N ``scrapy crawl flaky_fleet`` nodes
(scrapy-redis scheduler over the leased frontier, scrapy-retryqueue failures) and prints, per N:
pages/s (parsed pages over wall time), retries/s (re-injections over wall
time), duplicates (fetches beyond what the fault mix needs), and lost pages
(neither parsed nor dead-lettered). A last run kills one of three nodes with
SIGKILL a few seconds in. It is a scenario, not a timed test: the figures are
for comparing N within one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from scrapy_retryqueue.queue import events
from scrapy_retryqueue.queue.keys import all_keys, keys_for

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "example_project"
#: The example project's namespace in the Redis keys: its BOT_NAME.
DEMO_NAMESPACE = "demo"
sys.path.insert(0, str(PROJECT))
from flaky_site import SCENARIOS  # noqa: E402

#: Requests each scenario needs before its final answer, with no duplicates.
NEEDED = {
    "ok": 1,
    "server_error_twice": 3,
    "rate_limited": 2,
    "timeout_once": 2,
    "drop_once": 2,
    "server_error_once": 2,
    "not_found": 1,
    "forbidden": 1,
    "parse_once": 2,
    "gone": 1,
}
assert set(NEEDED) == set(SCENARIOS)

NODE_SETTINGS = {
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
    "DOWNLOAD_TIMEOUT": 1,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_LEASE_TIME": 3,
    "RETRYQUEUE_IDLE_TIMEOUT": 30,
    "RETRYQUEUE_STORE_ENABLED": False,
    "SCHEDULER_IDLE_BEFORE_CLOSE": 3,
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "RETRYQUEUE_POLICIES": {
        kind: {"base_delay": 0.3, "max_delay": 2}
        for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
    },
}


@dataclass
class Outcome:
    nodes: int
    killed: bool
    seconds: float
    parsed: int
    dead: int
    reinjected: int
    duplicates: int
    #: Pages that never got their final answer (the frontier's losses included).
    lost: int
    #: Retry tasks scheduled but neither acknowledged nor dead-lettered.
    lost_retries: int

    def row(self) -> str:
        label = f"{self.nodes}" + (" (one killed)" if self.killed else "")
        return (
            f"| {label} | {self.parsed / self.seconds:.0f} | {self.reinjected / self.seconds:.0f} "
            f"| {self.duplicates} | {self.lost} | {self.lost_retries} | {self.seconds:.1f} |"
        )


def start_site(pages: int) -> tuple[subprocess.Popen[str], str]:
    site = subprocess.Popen(
        [sys.executable, str(PROJECT / "flaky_site.py"), "--port", "0", "--pages", str(pages)]
        + ["--slow", "2", "--retry-after", "1", "--latency", "0.02"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert site.stdout is not None
    return site, site.stdout.readline().strip().removeprefix("listening on ")


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def run(pages: int, nodes: int, redis_url: str, *, kill: bool, workdir: Path) -> Outcome:
    site, site_url = start_site(pages)
    spider = f"fleet{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    processes = []
    started = time.monotonic()
    try:
        for n in range(nodes):
            out = workdir / f"{spider}-{n}.jsonl"
            command = [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky_fleet"]
            command += ["-a", f"site={site_url}", "-a", f"name={spider}", "-O", str(out)]
            settings = {
                **NODE_SETTINGS,
                "REDIS_URL": redis_url,
                "RETRYQUEUE_NODE_ID": f"node-{n}",
                "LOG_FILE": str(out.with_suffix(".log")),
            }
            for key, value in settings.items():
                text = json.dumps(value) if isinstance(value, dict) else str(value)
                command += ["-s", f"{key}={text}"]
            processes.append((subprocess.Popen(command, cwd=PROJECT), out))
            if n == 0:
                # The first node seeds the shared frontier with the index's links.
                time.sleep(1.0)
        if kill:
            time.sleep(3.0)
            processes[1][0].send_signal(signal.SIGKILL)
        for process, _ in processes:
            process.wait(600)
        seconds = time.monotonic() - started
        scenarios = get_json(site_url + "/__scenarios")
        log = get_json(site_url + "/__log")
    finally:
        site.terminate()
        site.wait(10)
    assert isinstance(scenarios, dict) and isinstance(log, list)
    reinjected = 0
    for _, out in processes:
        text = out.with_suffix(".log").read_text() if out.with_suffix(".log").exists() else ""
        match = re.search(r"'retryqueue/reinjected': (\d+)", text)
        reinjected += int(match[1]) if match else 0
    fetched: dict[str, int] = {}
    for entry in log:
        fetched[entry["path"]] = fetched.get(entry["path"], 0) + 1
    duplicates = sum(
        max(0, fetched.get(path, 0) - NEEDED[info["scenario"]]) for path, info in scenarios.items()
    )
    # A killed node never writes its feed, so pages are counted from the
    # site's side: a page got its final answer when it was fetched as often
    # as its scenario needs.
    answered = {p for p, i in scenarios.items() if fetched.get(p, 0) >= NEEDED[i["scenario"]]}
    parsed = {p for p in answered if scenarios[p]["expected"] == "parsed"}
    dead = len(answered) - len(parsed)
    lost = len(scenarios) - len(answered)
    settled: set[str] = set()
    scheduled: set[str] = set()
    for event in events.parse_entries(client.xrange(keys_for(spider, DEMO_NAMESPACE).events)):
        if isinstance(event, events.MalformedEvent):
            continue
        if event.type == events.SCHEDULED:
            scheduled.add(event.task_id)
        elif event.type in (events.SUCCEEDED, events.DEAD):
            settled.add(event.task_id)
    lost_retries = len(scheduled - settled)
    client.delete(
        *all_keys(keys_for(spider, DEMO_NAMESPACE)), f"{spider}:requests", f"{spider}:dupefilter"
    )
    client.close()
    return Outcome(
        nodes, kill, seconds, len(parsed), dead, reinjected, duplicates, lost, lost_retries
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=600)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.nodes:
            rows.append(run(args.pages, n, args.redis, kill=False, workdir=Path(tmp)))
        rows.append(run(args.pages, 3, args.redis, kill=True, workdir=Path(tmp)))
    print(f"{args.pages} pages, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print("| nodes | pages/s | retries/s | duplicates | lost pages | lost retries | seconds |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(row.row())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
