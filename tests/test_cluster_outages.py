"""Redis Cluster outages in real crawls: a cluster must keep every promise one Redis keeps.

One local cluster of this module's own (three masters, a replica each,
``appendonly everysec``, ``cluster-node-timeout`` 2 s) serves every test; each
test breaks it in its own way while a ``scrapy crawl`` of the flaky site runs,
and the cluster is made whole again before the next. In each: every page the
site lets parse is parsed, every page that dies is a dead letter in Redis, the
log says once that Redis went and once that it came back, nothing is left in
the queue or the spool, and the crawl exits 0 with ``finish_reason: finished``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import RedisCluster

from scrapy_retryqueue.queue.connection import open_client
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for

from . import crawling
from .crawling import Crawl, Site, flaky_site, read_crawl, start_crawl
from .servers import LocalCluster, RedisServer
from .waiting import POLL

pytestmark = pytest.mark.e2e

POLICIES = {
    kind: {"base_delay": 0.3, "max_delay": 2}
    for kind in ("timeout", "connection", "rate_limited", "server_error", "parse")
}
SETTINGS: dict[str, Any] = {
    # Dead letters stay in Redis, where these tests count them.
    "RETRYQUEUE_STORE_ENABLED": False,
    "RETRYQUEUE_REDIS_CLUSTER": True,
    "RETRYQUEUE_POLL_INTERVAL": 0.2,
    "RETRYQUEUE_LEASE_TIME": 3,
    "RETRYQUEUE_IDLE_TIMEOUT": 60,
    "RETRYQUEUE_POLICIES": POLICIES,
    "CONCURRENT_REQUESTS": 8,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    "DOWNLOAD_TIMEOUT": 1,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "INFO",
}
PAGES = 150


def until(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Wait for *condition*, which may raise anything while the cluster is broken."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except Exception:
            pass
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    workdir = Path(tempfile.mkdtemp(prefix="retryqueue-cluster-ha-"))
    nodes = LocalCluster(workdir)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def heal(cluster: LocalCluster) -> None:
    """Every node up, every master with its replica, whatever a test broke."""
    for node in cluster.nodes:
        if node.process is not None:
            cluster.thaw(node)
    cluster.start_stopped()
    cluster.wait_healthy()


@pytest.fixture
def whole(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster, whole before the test and again after it."""
    heal(cluster)
    yield cluster
    heal(cluster)


@pytest.fixture
def spider(whole: LocalCluster) -> Iterator[str]:
    name = f"cl{uuid.uuid4().hex[:8]}"
    yield name
    heal(whole)
    client = RedisCluster.from_url(whole.url)
    client.delete(*all_keys(keys_for(name)))
    client.close()


class Run:
    """One crawl of the flaky site against the cluster, and what a test reads of it."""

    def __init__(self, cluster: LocalCluster, spider: str, tmp_path: Path, **settings: Any):
        self.cluster = cluster
        self.spider = spider
        self.local = tmp_path / "local"
        self.settings = {
            **SETTINGS,
            "RETRYQUEUE_REDIS_URL": cluster.url,
            # The URL's node may be the one a test kills before the crawl opens.
            "RETRYQUEUE_REDIS_CLUSTER_NODES": cluster.addresses,
            "RETRYQUEUE_EMBEDDED_DIR": str(self.local),
            **settings,
        }
        self.tmp_path = tmp_path
        self.key = keys_for(spider).due
        self.site: Site | None = None
        self.log: Path | None = None

    def start(self, site: Site) -> Any:
        self.site = site
        process, out = start_crawl(site.url, self.spider, self.tmp_path, self.settings)
        self.log = out.with_suffix(".log")
        return process, out

    def says(self, text: str) -> bool:
        return self.log is not None and self.log.exists() and text in self.log.read_text()

    def served(self) -> int:
        assert self.site is not None
        return len(self.site.get_json("/__log"))

    def goes_on(self, more: int = 20) -> None:
        """Wait until the crawl fetched *more* pages: it goes on without Redis."""
        served = self.served()
        until(lambda: self.served() >= served + more, "the crawl to go on without Redis")

    def spooled(self) -> int:
        """Writes in the crawl's spool file (all of them with RETRYQUEUE_SPOOL_MEMORY=0)."""
        return sum(p.read_text().count("\n") for p in self.local.rglob("*.jsonl"))

    def events(self) -> int:
        client = RedisCluster.from_url(self.cluster.live_url())
        try:
            return int(client.xlen(keys_for(self.spider).events))
        finally:
            client.close()


def crawl_through(
    cluster: LocalCluster,
    spider: str,
    tmp_path: Path,
    fault: Callable[[Run], None],
    *,
    started: bool = True,
    latency: float = 0.05,
    **settings: Any,
) -> tuple[Crawl, dict[str, str], Run]:
    """Crawl the flaky site, calling *fault* once the crawl has parked retries in
    the cluster (at once when not *started*); returns the crawl and what each page
    of the site should end as. A *latency* per page makes the crawl last longer."""
    run = Run(cluster, spider, tmp_path, **settings)
    with flaky_site(pages=PAGES, latency=latency, slow=2, retry_after=1) as site:
        expected = {
            site.url + p: info["expected"] for p, info in site.get_json("/__scenarios").items()
        }
        process, out = run.start(site)
        if started:
            until(lambda: run.events() >= 10, "retries to be parked in the cluster")
        fault(run)
        process.wait(240)
        crawl = read_crawl(out, process.returncode, process.stderr.read() if process.stderr else "")
    return crawl, expected, run


def assert_nothing_lost(crawl: Crawl, expected: dict[str, str], run: Run) -> None:
    """0 pages lost, 0 dead letters missing, one line each way, nothing left behind."""
    assert crawl.returncode == 0, crawl.log[-3000:]
    assert "'finish_reason': 'finished'" in crawl.log, crawl.log[-3000:]
    # (A callback's traceback is in the log, as Scrapy logs it; no error of ours is.)
    for unhandled in ("never retrieved", "Unhandled error", "RedisClusterException"):
        assert unhandled not in crawl.log, crawl.log[-3000:]
    assert crawl.log.count("Redis is unreachable") == 1, crawl.log[-3000:]
    assert crawl.log.count("Redis answers again") == 1, crawl.log[-3000:]
    parsed = [item["url"] for item in crawl.items]
    should_parse = {url for url, outcome in expected.items() if outcome == "parsed"}
    assert should_parse - set(parsed) == set(), "pages lost"
    assert set(parsed) <= should_parse
    client = open_client(run.cluster.live_url(), {}, cluster=True)
    try:
        queue = RedisDelayedQueue(client, run.spider, node_id="test")
        dead = {task_id for task_id, _ in queue.dead_letters(limit=10_000)}
        should_die = sum(1 for outcome in expected.values() if outcome.startswith("dead:"))
        assert len(dead) == should_die, "dead letters missing"
        counts = queue.counts(now=int(time.time() * 1000))
        assert (counts.due, counts.leased) == (0, 0)
    finally:
        client.close()
    assert not [p for p in run.local.rglob("*.jsonl") if p.read_text().strip()], "spool left"
    duplicates = len(parsed) - len(set(parsed))
    print(f"parsed {len(set(parsed))}/{len(should_parse)}, duplicates {duplicates}")


def test_a_master_killed_fails_over_and_nothing_is_lost(
    whole: LocalCluster, spider: str, tmp_path: Path
) -> None:
    def kill_the_master(run: Run) -> None:
        master = whole.master_of(run.key)
        whole.kill(master)
        until(lambda: run.says("Redis is unreachable"), "the crawl to notice")
        # The replica takes over within seconds (cluster-node-timeout 2 s).
        until(lambda: whole.master_of(run.key) is not master, "the failover")

    crawl, expected, run = crawl_through(whole, spider, tmp_path, kill_the_master)
    assert_nothing_lost(crawl, expected, run)


def test_the_whole_cluster_restarted_loses_nothing(
    whole: LocalCluster, spider: str, tmp_path: Path
) -> None:
    def restart_everything(run: Run) -> None:
        whole.kill(*whole.nodes)
        until(lambda: run.says("Redis is unreachable"), "the crawl to notice")
        run.goes_on()
        whole.start_stopped()

    crawl, expected, run = crawl_through(whole, spider, tmp_path, restart_everything)
    assert "'retryqueue/spooled'" in crawl.log
    assert_nothing_lost(crawl, expected, run)


def test_a_double_fault_keeps_the_spool_until_the_slot_is_served(
    whole: LocalCluster, spider: str, tmp_path: Path
) -> None:
    def two_shards_down(run: Run) -> None:
        master = whole.master_of(run.key)
        other_master, other_replica = whole.other_shard(run.key)
        # Another shard goes whole: the spider's own shard is fine, but the
        # cluster refuses every slot ("CLUSTERDOWN", cluster-require-full-coverage).
        whole.kill(other_master, other_replica)
        until(lambda: run.says("Redis is unreachable"), "the crawl to notice")
        # Then the spider's master: no majority of masters is left to promote
        # its replica; the slot is served again only once they come back.
        whole.kill(master)
        # Long enough for the spool to hold what a replay would once have thrown away.
        until(lambda: run.spooled() >= 20, "failures to wait in the spool")
        whole.start_stopped()

    # Slow pages: the crawl still fetches fresh pages, and fails some, all along.
    crawl, expected, run = crawl_through(
        whole, spider, tmp_path, two_shards_down, latency=0.4, RETRYQUEUE_SPOOL_MEMORY=0
    )
    assert "spooled write(s) failed" not in crawl.log
    assert_nothing_lost(crawl, expected, run)


def test_a_frozen_master_is_an_outage_and_is_not_retried_blindly(
    whole: LocalCluster, spider: str, tmp_path: Path
) -> None:
    frozen: list[RedisServer] = []

    def freeze_the_master(run: Run) -> None:
        master = whole.master_of(run.key)
        whole.freeze(master)  # SIGSTOP: it accepts connections and answers nothing
        frozen.append(master)
        # The call in flight times out (the queue's 10 s socket timeout), once.
        until(lambda: run.says("Redis is unreachable"), "the crawl to notice", timeout=60)
        until(lambda: run.says("Redis answers again"), "the replica to serve the slot")
        whole.thaw(master)

    crawl, expected, run = crawl_through(whole, spider, tmp_path, freeze_the_master)
    assert_nothing_lost(crawl, expected, run)


def test_a_cluster_unreachable_at_start_with_start_without_redis_spools_until_it_answers(
    whole: LocalCluster, spider: str, tmp_path: Path
) -> None:
    whole.kill(*whole.nodes)

    def come_back_later(run: Run) -> None:
        until(lambda: run.says("Redis is unreachable"), "the crawl to notice")
        run.goes_on()
        whole.start_stopped()

    crawl, expected, run = crawl_through(
        whole,
        spider,
        tmp_path,
        come_back_later,
        started=False,
        RETRYQUEUE_START_WITHOUT_REDIS=True,
    )
    assert "not open" not in crawl.log
    assert "'retryqueue/spooled'" in crawl.log
    assert_nothing_lost(crawl, expected, run)


def test_a_cluster_unreachable_at_start_stops_the_crawl_with_one_line(
    whole: LocalCluster, spider: str, tmp_path: Path
) -> None:
    whole.kill(*whole.nodes)
    run = Run(whole, spider, tmp_path)
    with flaky_site(pages=10) as site:
        process, out = run.start(site)
        process.wait(120)
        crawl = read_crawl(out, process.returncode, process.stderr.read() if process.stderr else "")
        fetched = run.served()
    assert crawl.returncode == 1, crawl.log[-3000:]
    assert crawl.log.count("does not answer") == 1, crawl.log[-3000:]
    assert "RETRYQUEUE_START_WITHOUT_REDIS" in crawl.log
    assert "Traceback" not in crawl.log and "never retrieved" not in crawl.log, crawl.log[-3000:]
    assert "scrapy-retryqueue is not open" not in crawl.log
    assert fetched == 0


def test_a_dead_shard_costs_only_the_spiders_on_it(whole: LocalCluster, tmp_path: Path) -> None:
    """With ``cluster-require-full-coverage no`` (docs/fleet.md), a spider whose slot a
    live shard serves keeps writing while another shard is gone, its scripts
    included after a restart emptied the script cache."""
    for node in whole.nodes:
        whole._ask(node, "CONFIG", "SET", "cluster-require-full-coverage", "no")
    healthy = f"ok{uuid.uuid4().hex[:8]}"
    client = open_client(whole.url, {}, cluster=True)
    try:
        queue = RedisDelayedQueue(client, healthy, node_id="n")
        queue.probe()
        dead_master, dead_replica = whole.other_shard(queue.keys.due)
        mine = whole.master_of(queue.keys.due)
        whole.kill(dead_master, dead_replica)
        # The live shard forgot its scripts, as after a restart: NOSCRIPT is
        # answered on the slot's node, not by loading them on every master.
        whole._ask(mine, "SCRIPT", "FLUSH")
        until(
            lambda: "cluster_state:ok" in whole._ask(mine, "CLUSTER", "INFO").decode(),
            "the live shards to serve",
        )
        now = int(time.time() * 1000)
        for n in range(20):
            task = Task(
                id=f"t{n}",
                spider=healthy,
                request={"url": f"https://example.com/{n}"},
                attempts={"timeout": 1},
                kind="timeout",
                node="n",
                created=now,
                updated=now,
                due=now,
            )
            assert queue.schedule(task, now=now)
        claimed = queue.claim(now=now, limit=50, lease_until=now + 3000, token="n:1")
        assert len(claimed.tasks) == 20
        client.delete(*all_keys(queue.keys))
    finally:
        client.close()
        for node in whole.nodes:
            if node.process is not None:
                whole._ask(node, "CONFIG", "SET", "cluster-require-full-coverage", "yes")


def test_the_documented_fleet_set_up_survives_a_failover(
    whole: LocalCluster, redis_url: str, tmp_path: Path
) -> None:
    """docs/fleet.md's cluster set-up, end to end: scrapy-redis's frontier on one Redis,
    the retry queue on the cluster (run_fleet.py --redis-url and --cluster-url), three
    nodes, and the master of the spider's slot killed mid-crawl."""
    import importlib

    assert crawling.PROJECT  # example_project is on sys.path
    run_fleet = importlib.import_module("run_fleet").run_fleet
    spider = f"clf{uuid.uuid4().hex[:6]}"
    key = keys_for(spider).due

    def kill_the_master(_: object) -> None:
        master = whole.master_of(key)
        whole.kill(master)
        until(lambda: whole.master_of(key) is not master, "the failover")

    fleet = run_fleet(
        nodes=3,
        pages=PAGES,
        redis_url=redis_url,
        cluster_url=whole.url,
        workdir=tmp_path,
        spider=spider,
        site_options={"latency": 0.2},
        # A node whose Scrapy starts late may open after the kill: the URL's node
        # may be the dead one, the others are listed.
        node_settings={
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path / "local"),
            "RETRYQUEUE_REDIS_CLUSTER_NODES": whole.addresses,
        },
        during=kill_the_master,
    )
    print(fleet.report())
    for node in fleet.nodes:
        assert node.returncode == 0, node.log[-3000:]
        assert "'finish_reason': 'finished'" in node.log, node.log[-3000:]
        assert node.log.count("Redis is unreachable") <= 1, node.log[-3000:]
        assert node.log.count("Redis answers again") == node.log.count("Redis is unreachable")
    assert any("Redis is unreachable" in node.log for node in fleet.nodes)
    assert fleet.lost == set()
    dead = {task for task, types in fleet.events.items() if "dead" in types}
    assert len(dead) == len(fleet.dead), "dead letters missing"
    assert not [p for p in (tmp_path / "local").rglob("*.jsonl") if p.read_text().strip()]
