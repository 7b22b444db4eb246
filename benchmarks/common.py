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
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for

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
#: Stock Scrapy with its heap frozen while the engine runs, as the add-on freezes a
#: crawl's (RETRYQUEUE_FREEZE_HEAP): against it, the add-on's own cost, without the
#: collector's gain the freeze gives stock's objects as much as the add-on's.
STOCK_FROZEN: dict[str, Any] = {**STOCK, "EXTENSIONS": {"benchmarks.probes.FreezeHeap": 0}}

#: The baselines the overhead, dead-letter and retry sections crawl at, each on
#: top of CRAWL_SETTINGS: "lean" is what a production crawl runs with (issue 22:
#: LOG_LEVEL WARNING, 32 concurrent requests), "suite" the settings these
#: sections used before (64 concurrent requests). Both log at WARNING.
BASELINES: dict[str, dict[str, Any]] = {
    "lean": {"CONCURRENT_REQUESTS": 32, "CONCURRENT_REQUESTS_PER_DOMAIN": 32},
    "suite": {},
}
#: The baselines this run measures (``python -m benchmarks --baselines``).
RUN_BASELINES: list[str] = list(BASELINES)
#: A setting only the benchmarks read: the database URL of a ``scrapy retryqueue
#: writer`` process that serves this crawl's spider (the crawl's store is off).
WRITER = "BENCH_WRITER_DATABASE_URL"
#: Longest a benchmark crawl may run before it is killed, seconds.
CRAWL_TIMEOUT = 900


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
    """Run one crawl to its end; its final stats, with ``bench/cpu``: the CPU
    seconds (user + system, every thread) the crawler process used from the
    spider's opening to its exit, read from the child's resource usage."""
    settings = dict(settings)
    writer_database = settings.pop(WRITER, None)
    writer = None
    if writer_database is not None:
        writer = WriterProcess(str(settings["RETRYQUEUE_REDIS_URL"]), writer_database, spider)
    process, stats = crawl_process(site_url, spider, settings, workdir, *args)
    # The crawl stops by itself; a stuck one is killed after CRAWL_TIMEOUT.
    watchdog = threading.Timer(CRAWL_TIMEOUT, process.kill)
    watchdog.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        watchdog.cancel()
        writer_cpu = writer.finish() if writer is not None else None
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"a benchmark crawl failed (exit {process.returncode})")
    result = json.loads(stats.read_text())
    # wait4 counts the processes the crawl reaped too: the store writer it forks.
    total = usage.ru_utime + usage.ru_stime
    result["bench/cpu"] = total - result.get("bench/cpu_at_open", 0.0)
    result["bench/cpu_total"] = total
    if writer_cpu is not None:
        result["bench/writer_cpu"] = writer_cpu
    return result


class WriterProcess:
    """A ``scrapy retryqueue writer`` serving one spider (the fleet set-up: the
    crawl runs with its store off), started now; :meth:`finish` waits until it
    has written every event and dead letter, stops it, and says its CPU."""

    def __init__(self, redis_url: str, database_url: str, spider: str) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.keys = keys_for(spider, DEMO_NAMESPACE)
        command = [sys.executable, "-m", "scrapy.cmdline", "retryqueue", "writer"]
        command += ["--spider", spider, "--consumer", f"bench-{spider}"]
        for name, value in {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": database_url,
        }.items():
            command += ["-s", f"{name}={value}"]
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.process = subprocess.Popen(
            command, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def _caught_up(self) -> bool:
        events = self.keys.events
        groups = self.client.xinfo_groups(events) if self.client.exists(events) else []
        store = [g for g in groups if g["name"] in (b"store", "store")]
        return (
            bool(store)
            and store[0]["pending"] == 0
            and store[0]["lag"] == 0
            and (not self.client.zcard(self.keys.dead))
        )

    def finish(self, timeout: float = 300) -> float:
        """CPU seconds (user + system) the writer used from its start to its exit."""
        import signal

        deadline = time.monotonic() + timeout
        try:
            while not self._caught_up() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self._caught_up():
                raise SystemExit("the benchmark's store writer did not catch up")
        finally:
            self.client.close()
            self.process.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(self.process.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the benchmark's store writer failed ({status})")
        return usage.ru_utime + usage.ru_stime


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


#: The example project's namespace in the Redis keys (its BOT_NAME): its crawls'
#: queues are there; queues these scripts fill by hand have none.
DEMO_NAMESPACE = "demo"


def forget(client: redis.Redis, spider: str) -> None:
    client.delete(*all_keys(keys_for(spider)), *all_keys(keys_for(spider, DEMO_NAMESPACE)))


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


@dataclass
class CrawlCost:
    """What one crawl of a known number of pages cost, from its stats."""

    pages: int
    stats: dict[str, Any]
    #: CPU seconds nginx used meanwhile (None: not served by nginx).
    site_cpu: float | None = None

    @property
    def pages_per_s(self) -> float:
        """Pages over the time from the spider's opening to its last response: the
        crawl's own pace (how long it then takes to close is a figure of its own)."""
        busy = self.stats["bench/open_to_close"] - self.stats["bench/last_response_to_close"]
        return self.pages / busy

    @property
    def cpu_ms_per_page(self) -> float:
        """User + system CPU of the crawler process (every thread) and of the store
        writer it forked, from the spider's opening to the process's exit (the store's
        final flush included), per page: crawl + writer."""
        return self.stats["bench/cpu"] / self.pages * 1000

    @property
    def writer_cpu(self) -> float:
        """CPU seconds of the store writer process the crawl forked (none: 0), from the
        fork to its exit: the crawl reaped it, so its resource usage is the crawl's
        RUSAGE_CHILDREN (benchmarks.probes reads it as the crawl exits)."""
        return float(self.stats.get("bench/children_cpu", 0.0))

    @property
    def crawl_cpu_ms_per_page(self) -> float:
        """:attr:`cpu_ms_per_page` less the forked writer's: the crawl's own CPU."""
        return (self.stats["bench/cpu"] - self.writer_cpu) / self.pages * 1000

    @property
    def crawl_cpu_total(self) -> float:
        """:attr:`cpu_total` less the forked writer's."""
        return self.cpu_total - self.writer_cpu

    @property
    def cpu_total(self) -> float:
        """CPU seconds of the crawler process from its start to its exit, with the
        store writer it forked (wait4 counts the children the crawl reaped)."""
        return float(self.stats["bench/cpu_total"])

    @property
    def startup_cpu(self) -> float:
        """CPU seconds of the crawler process from its start to its first request."""
        return float(self.stats["bench/cpu_at_first_request"])

    @property
    def close_s(self) -> float:
        """Seconds from the crawl's last response to the spider's close."""
        return float(self.stats["bench/last_response_to_close"])

    @property
    def site_share(self) -> float:
        """The site's CPU as a fraction of the crawler's: well under 1 when the
        crawler, not the site, is the bottleneck."""
        return (self.site_cpu or 0.0) / self.stats["bench/cpu"]


def measured_crawl(site: Any, section: str, pages: int, spider: str, settings: dict[str, Any],
                   workdir: Path, *args: str, size: int | None = None) -> CrawlCost:  # fmt: skip
    """Crawl one section of the static site (benchmarks.static_site) and read its cost;
    *size*: its index of that many pages (one of the site's sizes)."""
    before = site.worker_cpu()
    stats = run_crawl(site.section(section, size), spider, settings, workdir, *args)
    return CrawlCost(pages, stats, site.worker_cpu() - before)


def marginal_ms(small: CrawlCost, large: CrawlCost) -> float:
    """CPU ms per page of the slope between two crawls of different sizes (whole
    process, start to exit): what one more page costs, start-up and close apart."""
    return (large.cpu_total - small.cpu_total) / (large.pages - small.pages) * 1000


def crawl_marginal_ms(small: CrawlCost, large: CrawlCost) -> float:
    """:func:`marginal_ms` of the crawl's own CPU, its forked writer's left out."""
    return (large.crawl_cpu_total - small.crawl_cpu_total) / (large.pages - small.pages) * 1000


def forked_writer_marginal_ms(small: CrawlCost, large: CrawlCost) -> float:
    """The same slope for the store writer each crawl forked."""
    return (large.writer_cpu - small.writer_cpu) / (large.pages - small.pages) * 1000


def writer_marginal_ms(small: CrawlCost, large: CrawlCost) -> float:
    """The same slope for the ``scrapy retryqueue writer`` process of the two crawls."""
    return (
        (large.stats["bench/writer_cpu"] - small.stats["bench/writer_cpu"])
        / (large.pages - small.pages)
        * 1000
    )


@contextmanager
def own_database() -> Iterator[str | None]:
    """A fresh PostgreSQL database of the benchmark's own on the local server (dropped
    afterwards), or None when no PostgreSQL answers there."""
    import sqlalchemy
    from sqlalchemy import text

    url = os.environ.get(
        "RETRYQUEUE_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
    )
    admin_url = sqlalchemy.make_url(url).set(drivername="postgresql+psycopg2")
    admin = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"rq_bench_{os.urandom(4).hex()}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except sqlalchemy.exc.OperationalError:
        admin.dispose()
        yield None
        return
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


#: Which round of a benchmark this is (counted per module): rounds alternate
#: which variant goes first, so neither always meets the machine's load first.
_ROUNDS: dict[str, int] = {}


def alternate(module: str, variants: Sequence[Any]) -> list[Any]:
    """*variants* in order on even rounds of *module*, reversed on odd ones."""
    n = _ROUNDS.get(module, 0)
    _ROUNDS[module] = n + 1
    return list(variants) if n % 2 == 0 else list(reversed(variants))


def side_by_side(
    site: Any,
    runs: Sequence[tuple[str, dict[str, Any]]],
    pages: int,
    workdir: Path,
    client: redis.Redis | None = None,
    size: int | None = None,
) -> list[CrawlCost]:
    """Crawl sections of the static site all at once, one crawler process per
    (section, settings): every crawl meets the same machine load, so the ratio of
    their CPU per page holds still on a shared machine where one crawl's CPU per
    page varies by a quarter from one minute to the next. (Their pages/s would
    not: the first to finish leaves the machine to the others.) Their keys are
    deleted from *client*'s Redis afterwards. *size*: crawl the sections' index
    of that many pages (one of the site's sizes)."""
    results: list[CrawlCost | None] = [None] * len(runs)
    errors: list[BaseException] = []

    def crawl(n: int, section: str, settings: dict[str, Any]) -> None:
        try:
            spider = f"pair{n}{uuid.uuid4().hex[:6]}"
            stats = run_crawl(site.section(section, size), spider, dict(settings), workdir)
            results[n] = CrawlCost(pages, stats)
            if client is not None:
                forget(client, spider)
        except BaseException as exc:
            errors.append(exc)

    run_threads(
        [
            threading.Thread(target=crawl, args=(n, section, settings))
            for n, (section, settings) in enumerate(runs)
        ],
        errors,
    )
    return [r for r in results if r is not None]


def run_threads(threads: list[threading.Thread], errors: list[BaseException]) -> None:
    """Start *threads*, wait for them all, then raise the first error they put in
    *errors* (a thread's exception would otherwise only be printed)."""
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
