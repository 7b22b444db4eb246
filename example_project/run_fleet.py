"""Run a fleet: the flaky site and N `scrapy crawl flaky_fleet` nodes started at the same moment.

    python example_project/run_fleet.py [--nodes 3] [--pages 300] [--late 0]
                                        [--redis-url redis://host:6379/0]
                                        [--cluster-url redis://node:7000/0]
                                        [--writer [--database-url URL]]

The nodes share one Redis: scrapy-redis's scheduler, over scrapy-retryqueue's
leased frontier, hands each page to one node under a lease, and scrapy-retryqueue
shares the failures. Without --redis-url the
project's embedded server is that Redis (all nodes run on this machine). With
--cluster-url, the retry queue lives on that Redis Cluster (any of its nodes)
instead, and the frontier stays on --redis-url: scrapy-redis's frontier cannot
live on a cluster (its scheduler uses MULTI and keys of many slots). With
--late N, the last node starts N seconds after the others have begun crawling
(their shared frontier holds a request) and joins a crawl in progress (one that
finished by then it leaves alone: it crawls nothing). At the end it prints, per node, what it fetched, parsed and retried,
then the totals: pages parsed more than once (duplicates) and pages that never
got their final answer (lost).

The nodes always run with the store off (RETRYQUEUE_STORE_ENABLED = False). With
--writer, one `scrapy retryqueue writer` process writes the fleet's events into
the store (--database-url, else the project's SQLite store), as a fleet set up
that way would, and the report says what the store holds at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent
#: The namespace of the demo project's Redis keys: its BOT_NAME (RETRYQUEUE_NAMESPACE).
NAMESPACE = "demo"
sys.path.insert(0, str(PROJECT))
from flaky_site import spawn  # noqa: E402

from scrapy_retryqueue.queue.keys import all_keys, keys_for, lease_owner  # noqa: E402

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
    # Each item reaches the feed file at once: a node killed with -9 keeps the
    # items of the pages it parsed (demo/exporters.py).
    "FEED_EXPORTERS": {
        fmt: "demo.exporters.FlushingJsonLinesItemExporter" for fmt in ("jsonl", "jsonlines")
    },
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


class Writer:
    """One `scrapy retryqueue writer` process serving the fleet's spider; its stderr
    goes to *log* (appended: a writer killed and started again keeps one log)."""

    def __init__(
        self, *, redis_url: str, database_url: str, spider: str, log: Path, **settings: Any
    ) -> None:
        self.log = log
        self.command = [sys.executable, "-m", "scrapy.cmdline", "retryqueue", "writer"]
        self.command += ["--spider", spider]
        settings = {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": database_url,
            "RETRYQUEUE_STORE_INTERVAL": 0.2,
            **settings,
        }
        for key, value in settings.items():
            self.command += ["-s", f"{key}={value}"]
        self.process: subprocess.Popen[bytes] | None = None
        #: Exit codes of the processes started so far (-9: killed).
        self.exits: list[int] = []

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, cwd=PROJECT, stderr=log)

    def _end(self, sig: int) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(60)
        self.exits.append(code)
        self.process = None
        return code

    def kill(self) -> None:
        """kill -9: what it read and did not acknowledge waits for the next writer."""
        self._end(signal.SIGKILL)

    def stop(self) -> int:
        """Ctrl-C: it finishes the batch in hand and exits."""
        return self._end(signal.SIGINT)

    def wait_caught_up(self, client: Any, spider: str, timeout: float = 120) -> bool:
        """Wait until every event of *spider* is written and acknowledged, and its dead
        letters left Redis; False when that did not happen within *timeout*."""
        keys = keys_for(spider, NAMESPACE)
        events, dead = keys.events, keys.dead
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            groups = client.xinfo_groups(events) if client.exists(events) else []
            store = [g for g in groups if g["name"] in (b"store", "store")]
            caught_up = store and store[0]["pending"] == 0 and store[0]["lag"] == 0
            if caught_up and not client.zcard(dead):
                return True
            time.sleep(0.1)
        return False


@dataclass
class Crawling:
    """The fleet while it crawls, for a *watch* callback of :func:`run_fleet`."""

    #: The retry queue's Redis (where the leased frontier lives too).
    client: Any
    spider: str
    #: node name -> (its process, its feed file; its log is beside it, .log)
    nodes: dict[str, tuple[subprocess.Popen[bytes], Path]]
    #: The flaky site (flaky_site.RunningSite).
    site: Any = None

    def registered(self) -> int:
        """Nodes that have written a heartbeat (they opened the spider and polled)."""
        return int(self.client.hlen(keys_for(self.spider, NAMESPACE).nodes))

    def parsed(self, name: str) -> int:
        """Items the node has written to its feed so far."""
        out = self.nodes[name][1]
        return out.read_bytes().count(b"\n") if out.exists() else 0

    def held(self, name: str) -> int:
        """Frontier requests and retry tasks leased to the node now."""
        keys = keys_for(self.spider, NAMESPACE)
        return sum(
            1
            for owners in (keys.frontier_owners, keys.owners)
            for token in self.client.hvals(owners)
            if lease_owner(token) == name
        )


@dataclass
class Fleet:
    nodes: list[Node]
    #: Pages the site says a crawler can parse (not 404 / 403 / gone).
    parseable: set[str]
    seconds: float
    parsed: dict[str, int] = field(default_factory=dict)
    #: The spider's events stream at the end: task id -> types of its events, in order.
    events: dict[str, list[str]] = field(default_factory=dict)
    #: The URL of each page whose scenario ends in a dead letter -> its kind.
    dead: dict[str, str] = field(default_factory=dict)
    spider: str = ""

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
    while not client.exists(keys_for(spider, NAMESPACE).frontier_seen):
        if time.monotonic() > deadline or any(p.poll() is not None for _, p, _ in processes):
            return
        time.sleep(0.05)


def queue_client(url: str, *, cluster: bool = False) -> Any:
    """A client of the retry queue's Redis: one server, or a Redis Cluster."""
    import redis
    from redis.cluster import RedisCluster

    return RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)


def is_cluster(url: str) -> bool:
    """Whether the Redis at *url* is a node of a Redis Cluster."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    finally:
        client.close()


def run_fleet(
    *,
    nodes: int,
    pages: int,
    redis_url: str,
    workdir: Path,
    cluster_url: str | None = None,
    late: float = 0.0,
    spider: str | None = None,
    site_options: dict[str, Any] | None = None,
    node_settings: dict[str, Any] | None = None,
    writer: Callable[[str], Writer] | None = None,
    during: Callable[[Writer | None], None] | None = None,
    watch: Callable[[Crawling], None] | None = None,
    on_site: Callable[[Any], None] | None = None,
) -> Fleet:
    """Start the site and the nodes, wait for every node to finish, read what each did.

    *writer* makes the store writer of the spider (its name given): started before
    the nodes, stopped once it wrote everything they left. *during* is called once
    the fleet is crawling, with that writer (to kill it, say); *watch* then, with
    the running nodes (to kill one once it has crawled a share, say). *on_site* is
    called with the site once it serves, before the nodes start. With *cluster_url*
    the retry queue is on that Redis Cluster, the frontier on *redis_url*.
    """
    import redis

    spider = spider or f"fleet{uuid.uuid4().hex[:6]}"
    store_writer = writer(spider) if writer is not None else None
    client = redis.Redis.from_url(redis_url)
    # The retry queue's Redis: the frontier's, or the cluster.
    queue = queue_client(cluster_url, cluster=True) if cluster_url else client
    queue_settings: dict[str, Any] = (
        {"RETRYQUEUE_REDIS_URL": cluster_url, "RETRYQUEUE_REDIS_CLUSTER": True}
        if cluster_url
        else {"RETRYQUEUE_REDIS_URL": redis_url}
    )
    options = {"pages": pages, "slow": 2, "retry_after": 1, "latency": 0.05, **(site_options or {})}
    try:
        with spawn(**options) as site:
            if on_site is not None:
                on_site(site)
            processes: list[tuple[str, subprocess.Popen[bytes], Path]] = []
            started = time.monotonic()
            if store_writer is not None:
                store_writer.start()
            for n in range(nodes):
                if late and n == nodes - 1:
                    # Late relative to the crawl, not to the launch: a loaded machine
                    # can take seconds to start Scrapy, and a fixed sleep could let the
                    # first nodes finish before the late one arrives.
                    _wait_until_crawling(queue, spider, processes)
                    time.sleep(late)
                name = f"node-{n}"
                out = workdir / f"{spider}-{name}.jsonl"
                command = [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky_fleet"]
                command += ["-a", f"site={site.url}", "-a", f"name={spider}", "-O", str(out)]
                settings = {
                    **NODE_SETTINGS,
                    **(node_settings or {}),
                    "REDIS_URL": redis_url,
                    **queue_settings,
                    "RETRYQUEUE_NODE_ID": name,
                    "LOG_FILE": str(out.with_suffix(".log")),
                }
                for key, value in settings.items():
                    text = json.dumps(value) if isinstance(value, dict) else str(value)
                    command += ["-s", f"{key}={text}"]
                processes.append((name, subprocess.Popen(command, cwd=PROJECT), out))
            if during is not None or watch is not None:
                _wait_until_crawling(queue, spider, processes)
            if during is not None:
                during(store_writer)
            if watch is not None:
                nodes_running = {name: (p, out) for name, p, out in processes}
                watch(Crawling(queue, spider, nodes_running, site))
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
        if store_writer is not None:
            if store_writer.process is None:
                store_writer.start()
            store_writer.wait_caught_up(queue, spider)
            store_writer.stop()
        parseable = {
            site.url + path for path, info in scenarios.items() if info["expected"] == "parsed"
        }
        dead = {
            site.url + path: info["expected"].removeprefix("dead:")
            for path, info in scenarios.items()
            if info["expected"].startswith("dead:")
        }
        events: dict[str, list[str]] = {}
        for _, fields in queue.xrange(keys_for(spider, NAMESPACE).events):
            decoded = {k.decode(): v.decode() for k, v in fields.items()}
            for task_id in decoded.get("ids", decoded.get("id", "")).split():
                events.setdefault(task_id, []).append(decoded["type"])
        return Fleet(results, parseable, seconds, events=events, dead=dead, spider=spider)
    finally:
        if store_writer is not None and store_writer.process is not None:
            store_writer.kill()
        client.delete(f"{spider}:requests", f"{spider}:dupefilter")
        # Every key of the spider's namespace: one slot on a cluster, one call.
        queue.delete(*all_keys(keys_for(spider, NAMESPACE)))
        if queue is not client:
            queue.close()
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
    parser.add_argument(
        "--cluster-url",
        help="the retry queue's Redis Cluster (any node); the frontier stays on --redis-url",
    )
    parser.add_argument(
        "--writer",
        action="store_true",
        help="one `scrapy retryqueue writer` process writes the store (default: no store)",
    )
    parser.add_argument(
        "--database-url",
        help="the writer's store (default: the project's SQLite store)",
    )
    args = parser.parse_args()
    redis_url = args.redis_url
    if redis_url is None:
        from scrapy_retryqueue.queue import embedded

        redis_url = embedded.ensure_server(PROJECT / ".scrapy" / "retryqueue")
    if is_cluster(redis_url):
        parser.error(
            f"--redis-url {redis_url} is a Redis Cluster node: scrapy-redis's frontier cannot "
            "live on a cluster; pass the cluster as --cluster-url and a single Redis as "
            "--redis-url"
        )
    queue_url = args.cluster_url or redis_url
    database_url = args.database_url or (
        f"sqlite:///{PROJECT / '.scrapy' / 'retryqueue' / 'retryqueue.sqlite3'}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "writer.log"

        def writer(spider: str) -> Writer:
            cluster = {"RETRYQUEUE_REDIS_CLUSTER": True} if args.cluster_url else {}
            return Writer(
                redis_url=queue_url, database_url=database_url, spider=spider, log=log, **cluster
            )

        fleet = run_fleet(
            nodes=args.nodes,
            pages=args.pages,
            redis_url=redis_url,
            workdir=Path(tmp),
            late=args.late,
            cluster_url=args.cluster_url,
            writer=writer if args.writer else None,
        )
    print(fleet.report())
    if args.writer:
        print(store_report(database_url, fleet))
    return 0 if not fleet.lost and not fleet.duplicates else 1


def store_report(database_url: str, fleet: Fleet) -> str:
    """What the store holds of the fleet's spider, against what the fleet produced."""
    from sqlalchemy import func, select

    from scrapy_retryqueue.config import redact_url
    from scrapy_retryqueue.store.db import Store

    store = Store(database_url)
    try:
        table = store.table
        with store.connect() as conn:
            counts = dict(
                conn.execute(
                    select(table.c.status, func.count())
                    .where(table.c.spider == fleet.spider)
                    .group_by(table.c.status)
                ).all()
            )
    finally:
        store.close()
    return (
        f"store {redact_url(database_url)}: {sum(counts.values())} row(s) for "
        f"{len(fleet.events)} task(s) in the events; {counts.get('dead', 0)} dead letter(s) "
        f"for {len(fleet.dead)} pages that die"
    )


if __name__ == "__main__":
    raise SystemExit(main())
