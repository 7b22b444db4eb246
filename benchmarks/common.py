"""What the benchmarks share: a Redis of their own, the flaky site, crawls, statistics."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from scrapy_retryqueue.envelope import Task
from scrapy_retryqueue.keys import all_keys, keys_for
from scrapy_retryqueue.queue import RedisDelayedQueue, Write

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "example_project"
sys.path.insert(0, str(PROJECT))
# Re-exported: the benchmarks start the site through this module.
from flaky_site import spawn as flaky_site  # noqa: E402, F401

#: Settings every benchmark crawl shares, ours and stock alike: nothing that
#: would skew a comparison (no telnet console, no remote control port, quiet log).
CRAWL_SETTINGS: dict[str, Any] = {
    "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False,
    "CONCURRENT_REQUESTS": 64,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
    "DOWNLOAD_TIMEOUT": 5,
    "RETRYQUEUE_STORE_ENABLED": False,
}
STOCK: dict[str, Any] = {"ADDONS": {}}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def own_redis() -> Iterator[str]:
    """A Redis server of the benchmarks' own, on a free port, gone afterwards."""
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is needed: run `bash scripts/ensure-services`")
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="retryqueue-bench-redis-"))
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
        + ["--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        process.terminate()
        process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def crawl_process(
    site_url: str, spider: str, settings: dict[str, Any], workdir: Path, *args: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``scrapy crawl flaky``; its final stats land in the returned path."""
    stats = workdir / f"stats-{spider}-{os.urandom(3).hex()}.json"
    extensions = {"benchmarks.probes.StatsDump": 0, **settings.pop("EXTENSIONS", {})}
    merged = {
        **CRAWL_SETTINGS,
        **settings,
        "EXTENSIONS": extensions,
        "BENCH_STATS_FILE": str(stats),
    }
    command = [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky"]
    command += ["-a", f"site={site_url}", "-a", f"name={spider}", *args]
    for name, value in merged.items():
        text = json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)
        command += ["-s", f"{name}={text}"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen(command, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL)
    return process, stats


def run_crawl(
    site_url: str, spider: str, settings: dict[str, Any], workdir: Path, *args: str
) -> dict[str, Any]:
    process, stats = crawl_process(site_url, spider, settings, workdir, *args)
    if process.wait(900) != 0:
        raise SystemExit(f"a benchmark crawl failed (exit {process.returncode})")
    return json.loads(stats.read_text())


def preload(
    client: redis.Redis, spider: str, urls: Sequence[str], *, due_ms: Sequence[int]
) -> None:
    """Park one task per URL (as its first failure would), due at the given times."""
    queue = RedisDelayedQueue(client, spider, node_id="bench")
    now = int(time.time() * 1000)
    writes = []
    for url, due in zip(urls, due_ms, strict=True):
        task = Task(
            id=hashlib.sha1(url.encode()).hexdigest(),
            spider=spider,
            request={"url": url, "callback": "parse_page"},
            attempts={"server_error": 1},
            kind="server_error",
            node="bench",
            created=now,
            updated=now,
            due=due,
        )
        writes.append(Write.for_task("schedule", task, None, now))
        if len(writes) >= 5000:
            queue.apply(writes)
            writes = []
    queue.apply(writes)


def forget(client: redis.Redis, spider: str) -> None:
    client.delete(*all_keys(keys_for(spider)))


@dataclass
class Figure:
    """One measured figure: its values over the runs and what it is held against."""

    name: str
    unit: str
    values: list[float]
    target: str = ""
    met: bool | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> str:
        if len(self.values) < 2:
            return "-"
        return f"{min(self.values):.3g} to {max(self.values):.3g}"


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
