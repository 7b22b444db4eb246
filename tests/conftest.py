"""Shared fixtures: the real Redis and PostgreSQL the tests run against, and per-test
namespaces.

Every test that touches Redis gets its own spider name, so its keys live in a
namespace of their own and are deleted when it ends: tests run in any order,
and in parallel, against one server.

Every test gets exactly one tier marker here: unit, integration or e2e (tests/tiers.py).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis
from redis.cluster import RedisCluster

from scrapy_retryqueue import heap
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for

from .crawling import reap_crawls
from .reactorthread import ReactorThread
from .servers import RedisServer
from .tiers import mark_tiers
from .waiting import wait_for

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def pytest_configure(config: pytest.Config) -> None:
    # The asyncio reactor, as in a crawl: the in-process component tests run it
    # (reactor_thread), and Scrapy 2.13's test helpers (get_crawler) refuse to run
    # without an installed reactor.
    from scrapy.utils.reactor import install_reactor, is_reactor_installed

    if not is_reactor_installed():
        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")


@pytest.hookimpl(tryfirst=True)  # before -m selects tests by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_tiers(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # A background crawl (tests/crawling.py's start_crawl, or one a test tracks)
    # still running when its test ends, a wait having failed, is killed here:
    # after the test, before its fixtures clean up the keys it could still write.
    yield
    reap_crawls()


@pytest.fixture(autouse=True)
def _heap_left_unfrozen() -> Iterator[None]:
    """No test leaves the process's heap frozen (scrapy_retryqueue/heap.py): the
    next tests' garbage would never be collected."""
    yield
    if gc.get_freeze_count() or heap.holds():
        heap.reset()
        pytest.fail("the test left the process's heap frozen", pytrace=False)


# -- Redis -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    """RETRYQUEUE_TEST_REDIS_URL, else the local server; fails (not skips) when it is down."""
    url = os.environ.get("RETRYQUEUE_TEST_REDIS_URL") or DEFAULT_REDIS_URL
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    error: Exception | None = None
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        error = exc
    finally:
        client.close()
    if error is not None:
        pytest.fail(
            f"the tests need a Redis server at {url} (RETRYQUEUE_TEST_REDIS_URL) and it does "
            f"not answer ({error}); run `bash scripts/ensure-services` to start it",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A local three-master Redis Cluster on its own ports, for this session only."""
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail("redis-server and redis-cli are needed: run `bash scripts/ensure-services`")
    workdir = Path(tempfile.mkdtemp(prefix="retryqueue-cluster-"))
    nodes: list[RedisServer] = []
    try:
        for n in range(3):
            node = RedisServer(
                workdir / f"node{n}",
                *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                *("--save", "", "--appendonly", "no"),
            )
            nodes.append(node)
            node.start()  # a free port (and its cluster bus port + 10000) or another try
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{node.port}" for node in nodes)]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        # Each node reaches "ok" on its own once the bus has spread the slots; a node
        # that has not yet answers CLUSTERDOWN, so wait for every one of them.
        probes = [redis.Redis(port=node.port) for node in nodes]
        try:
            wait_for(
                lambda: all(p.cluster("info")["cluster_state"] == "ok" for p in probes),
                "every node of the cluster to be ready",
                timeout=60,
            )
        finally:
            for probe in probes:
                probe.close()
        yield nodes[0].url
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def reactor_thread() -> Iterator[ReactorThread]:
    """The Twisted reactor, running on a thread for the rest of the session
    (it cannot be restarted); ``reactor_thread.run(fn, *args)`` runs *fn* there."""
    thread = ReactorThread()
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture
def redis_kind() -> str:
    """Which Redis ``redis_client`` talks to; a module overrides it to add "cluster"."""
    return "single"


@pytest.fixture
def new_redis_client(
    request: pytest.FixtureRequest, redis_url: str, redis_kind: str
) -> Callable[[], Any]:
    """Makes a new client of the Redis that ``redis_client`` talks to (one per thread)."""
    if redis_kind == "cluster":
        cluster_url = request.getfixturevalue("redis_cluster_url")
        return lambda: RedisCluster.from_url(cluster_url)
    return lambda: redis.Redis.from_url(redis_url)


@pytest.fixture
def redis_client(new_redis_client: Callable[[], Any]) -> Iterator[Any]:
    """A client of the single server, or of the local cluster (see ``redis_kind``)."""
    client = new_redis_client()
    yield client
    client.close()


@pytest.fixture
def spider_name(redis_client: redis.Redis) -> Iterator[str]:
    """A spider name unique to this test; its Redis namespace is deleted afterwards."""
    name = f"t{uuid4().hex[:10]}"
    yield name
    redis_client.delete(*all_keys(keys_for(name)))


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A spider name of its own for a real crawl against the single Redis server, so the
    crawl's keys are this test's alone; they are deleted afterwards (without a namespace,
    and in the example project's own, its BOT_NAME, for a crawl that does not set one)."""
    name = f"c{uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    client.delete(*all_keys(keys_for(name)), *all_keys(keys_for(name, "demo")))
    client.close()


@pytest.fixture
def queue(redis_client: redis.Redis, spider_name: str) -> RedisDelayedQueue:
    return RedisDelayedQueue(redis_client, spider_name, node_id="node-a")


@pytest.fixture
def make_task(spider_name: str) -> Callable[..., Task]:
    """``make_task(id, url=..., kind=..., due=..., **other Task fields)``."""

    def make(
        task_id: str,
        *,
        url: str | None = None,
        kind: str = "timeout",
        due: int = 0,
        **fields: Any,
    ) -> Task:
        fields.setdefault("spider", spider_name)
        fields.setdefault("attempts", {kind: 1})
        fields.setdefault("node", "node-a")
        return Task(
            id=task_id,
            request={"url": url or f"https://example.com/{task_id}"},
            kind=kind,
            due=due,
            **fields,
        )

    return make


# -- PostgreSQL and SQLite, for the SQL store ------------------------------------

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """RETRYQUEUE_TEST_DATABASE_URL, else the local server; fails (not skips) when it is down."""
    import sqlalchemy

    url = os.environ.get("RETRYQUEUE_TEST_DATABASE_URL") or DEFAULT_DATABASE_URL
    engine = sqlalchemy.create_engine(
        sqlalchemy.make_url(url).set(drivername="postgresql+psycopg2"),
        connect_args={"connect_timeout": 3},
    )
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    except sqlalchemy.exc.OperationalError as exc:
        pytest.fail(
            f"the tests need PostgreSQL at {url} (RETRYQUEUE_TEST_DATABASE_URL) and it does not "
            f"answer ({exc.orig}); run `bash scripts/ensure-services` to start it",
            pytrace=False,
        )
    finally:
        engine.dispose()
    return url


@pytest.fixture(scope="session")
def new_pg_database(pg_admin_url: str) -> Iterator[Callable[[], str]]:
    """Makes a PostgreSQL database of its own (``rq_<hex>``) and returns its URL;
    every database made is dropped when the session ends."""
    import sqlalchemy

    admin = sqlalchemy.create_engine(
        sqlalchemy.make_url(pg_admin_url).set(drivername="postgresql+psycopg2"),
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=True,  # a test may restart the server
    )
    made: list[str] = []

    def make() -> str:
        name = f"rq_{uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        return sqlalchemy.make_url(pg_admin_url).set(database=name).render_as_string(False)

    yield make
    with admin.connect() as conn:
        for name in made:
            conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, new_pg_database: Callable[[], str]
) -> str:
    """An empty database of each backend the store supports."""
    if request.param == "postgresql":
        return new_pg_database()
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


# -- The dashboard ---------------------------------------------------------------


@pytest.fixture
def dashboard_database_url(new_pg_database: Callable[[], str]) -> str:
    """The store ``dashboard_data`` fills: a PostgreSQL database of its own. A module
    overrides it with ``database_url`` to run its dashboard tests on every backend."""
    return new_pg_database()


@pytest.fixture
def dashboard_data(
    redis_client: redis.Redis,
    redis_url: str,
    spider_name: str,
    dashboard_database_url: str,
) -> dict[str, Any]:
    """A fresh store (``dashboard_database_url``) and one spider's queue holding a task
    in each state, written to the store by the real writer. Returns the settings of a
    dashboard over them, the spider and task ids by name (``ids``) and their row ids
    (``rows``).

    w1, w2 waiting (due in an hour); w3 leased by node-b; s1 recovered; d1, d2 dead.
    d1's URL and error hold HTML, to check that nothing is rendered unescaped.
    """
    import sqlalchemy

    from scrapy_retryqueue.store.db import Store
    from scrapy_retryqueue.store.sync import EventSync

    url = dashboard_database_url
    store = Store(url)
    store.ensure_schema()
    now = int(time.time() * 1000)
    node_a = RedisDelayedQueue(redis_client, spider_name, node_id="node-a")
    node_b = RedisDelayedQueue(redis_client, spider_name, node_id="node-b")

    def task(
        name: str, url_: str, kind: str, due: int, status: int | None = None, **kw: Any
    ) -> Task:
        error = {"kind": kind, "type": "HttpStatus" if status else "TimeoutError",
                 "message": kw.pop("message", f"HTTP {status}" if status else "took too long"),
                 "status": status, "delay": 3600.0}  # fmt: skip
        return Task(id=f"{spider_name}-{name}", spider=spider_name,
                    request={"url": url_, "meta": {"depth": 1}, "callback": "parse_page",
                             "headers": [["User-Agent", "test <agent>"]]},
                    attempts={kind: 1}, kind=kind, first_error=error, last_error=error,
                    node="node-a", created=now - 60_000, updated=now, due=due, **kw)  # fmt: skip

    hour = now + 3_600_000
    node_a.schedule(task("w1", "https://shop.example/a", "timeout", hour), now=now)
    node_a.schedule(task("w2", "https://www.shop.example/b", "server_error", hour, 503), now=now)
    node_a.schedule(task("s1", "https://other.example/s", "timeout", now - 2000), now=now)
    node_a.schedule(task("w3", "https://other.example/w3", "timeout", now - 1000), now=now)
    claimed = node_b.claim(now=now, limit=10, lease_until=now + 600_000, token="node-b:abc123:1")
    assert [i for i, _ in claimed.tasks] == [f"{spider_name}-s1", f"{spider_name}-w3"]
    assert node_b.ack(f"{spider_name}-s1", "node-b:abc123:1", now=now, kind="timeout")
    evil = "https://evil.example/<script>alert(1)</script>"
    d1 = task("d1", evil, "not_found", now, 404, message="<img src=x onerror=alert(1)>")
    d1.dead_kind = "not_found"
    d2 = task("d2", "https://other.example/d2", "forbidden", now, 403)
    d2.dead_kind = "forbidden"
    node_a.deadletter(d1, None, now=now)
    node_a.deadletter(d2, None, now=now)
    EventSync(store, redis_client, spider_name, consumer="fixture").drain()
    names = ("w1", "w2", "w3", "s1", "d1", "d2")
    ids = {n: f"{spider_name}-{n}" for n in names}
    table = store.table
    with store.connect() as conn:
        found = dict(conn.execute(sqlalchemy.select(table.c.task_id, table.c.id)).all())
    store.close()
    assert set(found) == set(ids.values())
    return {
        "settings": {
            "RETRYQUEUE_REDIS_URL": redis_url,
            "RETRYQUEUE_DATABASE_URL": url,
            "RETRYQUEUE_NODE_ID": "dashboard-test",
        },
        "database_url": url,
        "spider": spider_name,
        "ids": ids,
        "rows": {n: found[ids[n]] for n in names},
        "now": now,
    }
