"""Redis clients from settings: scrapy-redis's REDIS_PARAMS, REDIS_DB and REDIS_ENCODING are
honoured through scrapy-redis's own connection helper, the queue's own arguments win, and
RETRYQUEUE_REDIS_URL still names the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import pytest
import redis
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    MasterDownError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.queue import embedded
from scrapy_retryqueue.queue.connection import (
    check_reachable,
    client_for,
    is_outage,
    queue_identity,
    same_queue,
)
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.settings.defaults import REDIS_CONNECT_TIMEOUT, REDIS_SOCKET_TIMEOUT

#: A database of the shared Redis other than the tests' own 0; only this test's keys
#: are written there, and they are deleted afterwards.
OTHER_DB = 9


def client_of(settings: dict[str, Any], tmp_path: Path) -> Any:
    return client_for(load_config(Settings(settings)), embedded_directory=tmp_path)[0]


def kwargs_of(client: Any) -> dict[str, Any]:
    return client.connection_pool.connection_kwargs


def without_db(url: str) -> str:
    """*url* with no database in its path, so that REDIS_PARAMS or REDIS_DB chooses it."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


# -- which arguments a client gets (no server needed: redis-py connects lazily) ----------


def test_redis_params_reach_the_client_and_the_queue_keeps_its_own_arguments(
    tmp_path: Path,
) -> None:
    params = {
        "db": 4,
        "password": "s3cret",
        "client_name": "crawler",
        # The queue's own: ignored.
        "socket_timeout": 99,
        "socket_connect_timeout": 99,
        "retry_on_timeout": True,
        "decode_responses": True,
    }
    client = client_of(
        {"REDIS_URL": "redis://redis.internal:6380", "REDIS_PARAMS": params}, tmp_path
    )
    kwargs = kwargs_of(client)
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("redis.internal", 6380, 4)
    assert (kwargs["password"], kwargs["client_name"]) == ("s3cret", "crawler")
    assert kwargs["socket_timeout"] == REDIS_SOCKET_TIMEOUT
    assert kwargs["socket_connect_timeout"] == REDIS_CONNECT_TIMEOUT
    assert kwargs["retry_on_timeout"] is False
    assert kwargs["decode_responses"] is False
    assert client.get_retry().get_retries() == 0  # no silent retry
    client.close()


def test_the_json_text_of_redis_params_from_the_command_line_is_read(tmp_path: Path) -> None:
    client = client_of(
        {"REDIS_URL": "redis://h:6379", "REDIS_PARAMS": '{"db": 3}', "REDIS_ENCODING": "latin-1"},
        tmp_path,
    )
    assert (kwargs_of(client)["db"], kwargs_of(client)["encoding"]) == (3, "latin-1")
    client.close()


def test_redis_db_wins_over_redis_params_and_a_database_in_the_url_over_both(
    tmp_path: Path,
) -> None:
    # scrapy-redis's order: REDIS_DB over REDIS_PARAMS['db']; redis-py's: the URL over both.
    settings = {"REDIS_URL": "redis://h:6379", "REDIS_PARAMS": {"db": 3}, "REDIS_DB": 5}
    assert kwargs_of(client_of(settings, tmp_path))["db"] == 5
    settings["REDIS_URL"] = "redis://h:6379/2"
    assert kwargs_of(client_of(settings, tmp_path))["db"] == 2


def test_retryqueue_redis_url_still_wins_and_takes_the_redis_params(tmp_path: Path) -> None:
    settings = {
        "RETRYQUEUE_REDIS_URL": "redis://queue.internal:6379",
        "REDIS_URL": "redis://scheduler.internal:6379",
        "REDIS_PARAMS": {"db": 6},
    }
    config = load_config(Settings(settings))
    assert config.redis_url_setting == "RETRYQUEUE_REDIS_URL"
    kwargs = kwargs_of(client_for(config, embedded_directory=tmp_path)[0])
    assert (kwargs["host"], kwargs["db"]) == ("queue.internal", 6)


@pytest.mark.parametrize(
    ("settings", "url", "setting"),
    [
        ({"REDIS_PARAMS": {"url": "redis://p.internal:7000"}}, "redis://p.internal:7000", "REDIS_PARAMS['url']"),
        ({"REDIS_PARAMS": {"host": "p.internal"}}, "redis://p.internal:6379", "REDIS_HOST/REDIS_PORT"),
        ({"REDIS_PARAMS": {"host": "p.internal", "port": 7001}, "REDIS_HOST": "h.internal"}, "redis://h.internal:7001", "REDIS_HOST/REDIS_PORT"),
        ({"REDIS_PARAMS": {"url": "redis://p.internal:7000"}, "REDIS_URL": "redis://u.internal:1"}, "redis://u.internal:1", "REDIS_URL"),
        ({"REDIS_PARAMS": {"db": 1}}, None, "RETRYQUEUE_EMBEDDED_DIR"),
    ],
)  # fmt: skip
def test_a_server_named_in_redis_params_is_the_one_scrapy_redis_uses(
    settings: dict[str, Any], url: str | None, setting: str
) -> None:
    config = load_config(Settings(settings))
    assert (config.redis_url, config.redis_url_setting) == (url, setting)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"password": "pw"', "REDIS_PARAMS must be a dict of redis-py client arguments (or its JSON text); the text given is not valid JSON"),
        (["pw"], "REDIS_PARAMS must be a dict of redis-py client arguments, got a list"),
    ],
)  # fmt: skip
def test_a_bad_redis_params_is_named_without_showing_its_value(value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Settings({"REDIS_URL": "redis://h:6379", "REDIS_PARAMS": value}))
    assert str(info.value) == message
    assert "pw" not in str(info.value)


def test_the_embedded_server_does_not_take_the_redis_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket = tmp_path / "valkey.sock"
    monkeypatch.setattr(embedded, "ensure_server", lambda directory: f"unix://{socket}")
    config = load_config(Settings({"REDIS_PARAMS": {"password": "for-the-scheduler", "db": 4}}))
    client, url = client_for(config, embedded_directory=tmp_path)
    kwargs = kwargs_of(client)
    assert url == f"unix://{socket}"
    assert kwargs["path"] == str(socket)
    assert "password" not in kwargs or kwargs["password"] is None
    assert kwargs.get("db", 0) == 0
    client.close()


def test_scrapy_redis_makes_the_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client comes from scrapy_redis.connection.get_redis_from_settings, not a copy of it."""
    import scrapy_redis.connection

    seen: list[dict[str, Any]] = []
    real = scrapy_redis.connection.get_redis

    def spy(**kwargs: Any) -> Any:
        seen.append(dict(kwargs))
        return real(**kwargs)

    monkeypatch.setattr(scrapy_redis.connection, "get_redis", spy)
    client_of({"REDIS_URL": "redis://h:6379", "REDIS_PARAMS": {"db": 2}}, tmp_path).close()
    assert len(seen) == 1
    assert (seen[0]["url"], seen[0]["db"], seen[0]["redis_cls"]) == (
        "redis://h:6379",
        2,
        redis.Redis,
    )
    assert seen[0]["encoding"] == "utf-8"  # scrapy-redis's default, under the project's


# -- against the real Redis -----------------------------------------------------------------


@pytest.fixture
def other_db(redis_url: str) -> Iterator[dict[str, Any]]:
    """A key of this test's own in database OTHER_DB of the shared Redis, deleted after."""
    key = f"retryqueue-test:{uuid4().hex}"
    direct = redis.Redis.from_url(without_db(redis_url), db=OTHER_DB)
    yield {"key": key, "client": direct, "url": without_db(redis_url)}
    direct.delete(key)
    direct.close()


def test_writes_land_in_the_database_redis_params_names(
    other_db: dict[str, Any], redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = {"RETRYQUEUE_REDIS_URL": other_db["url"], "REDIS_PARAMS": {"db": OTHER_DB}}
    client = client_of(settings, tmp_path)
    client.set(other_db["key"], b"here")
    client.close()
    assert other_db["client"].get(other_db["key"]) == b"here"
    assert redis_client.get(other_db["key"]) is None  # not in the tests' database


def test_the_start_check_uses_the_redis_params_too(redis_url: str) -> None:
    # A database the server does not have: the check fails as the crawl's client would.
    wrong = load_config(
        Settings({"REDIS_URL": without_db(redis_url), "REDIS_PARAMS": {"db": 100_000}})
    )
    with pytest.raises(redis.RedisError):
        check_reachable(wrong, timeout=2)
    right = load_config(Settings({"REDIS_URL": without_db(redis_url), "REDIS_PARAMS": {"db": 1}}))
    check_reachable(right, timeout=2)


def test_a_cluster_client_takes_the_redis_params_too(
    redis_cluster_url: str, tmp_path: Path
) -> None:
    from redis.cluster import RedisCluster

    settings = {
        "RETRYQUEUE_REDIS_URL": redis_cluster_url,
        "RETRYQUEUE_REDIS_CLUSTER": True,
        "REDIS_PARAMS": {"client_name": "retryqueue-test"},
    }
    client = client_of(settings, tmp_path)
    assert client.ping()
    assert isinstance(client.cluster, RedisCluster)
    assert client.client_getname(target_nodes=RedisCluster.RANDOM) == "retryqueue-test"
    client.close()


def test_a_cluster_client_retries_nothing_behind_the_queue(
    redis_cluster_url: str, tmp_path: Path
) -> None:
    settings = {
        "RETRYQUEUE_REDIS_URL": redis_cluster_url,
        "RETRYQUEUE_REDIS_CLUSTER": True,
        # The project's wish for retries does not reach a script call.
        "REDIS_PARAMS": {"cluster_error_retry_attempts": 7, "require_full_coverage": True},
    }
    client = client_of(settings, tmp_path)
    cluster = client.cluster
    assert cluster.retry.get_retries() == 0
    assert cluster.nodes_manager._require_full_coverage is False
    node = cluster.get_default_node().redis_connection
    assert node.get_retry().get_retries() == 0
    assert node.connection_pool.connection_kwargs["retry_on_timeout"] is False
    # Every node of the cluster is known once it answered: the spool's name.
    identity = queue_identity(client, redis_cluster_url)
    assert identity.startswith("Redis Cluster ") and len(identity.split()) == 2 + 3
    client.close()


def test_a_projects_queue_on_the_crawls_cluster_client_adopts_probes_and_unclaims(
    redis_cluster_url: str, tmp_path: Path
) -> None:
    from scrapy_retryqueue.queue.envelope import Task
    from scrapy_retryqueue.queue.keys import all_keys, keys_for

    settings = {
        "RETRYQUEUE_REDIS_URL": redis_cluster_url,
        "RETRYQUEUE_REDIS_CLUSTER": True,
        "RETRYQUEUE_NAMESPACE": "proj",
    }
    config = load_config(Settings(settings))
    client = client_of(settings, tmp_path)
    spider = f"c{uuid4().hex[:8]}"
    old = RedisDelayedQueue(client, spider, node_id="n")
    queue = RedisDelayedQueue(client, spider, node_id="n", project=config.namespace)
    try:
        task = Task(
            id="a", spider=spider, request={"url": "http://x.test/a"}, kind="timeout", node="n"
        )
        assert old.schedule(task, now=0)  # the layout before namespaces
        # Scripts loaded on the slot's node only (SlotScript): both layouts share it.
        assert queue.adopt_unnamespaced() > 0
        queue.probe()  # reads the project's own key, on the slot's owner
        assert [t for t, _ in queue.claim(now=0, limit=1, lease_until=10, token="n:1").tasks]
        assert queue.unclaim(["n:1"], now=1) == ["a"]
        assert queue.keys.due.startswith("retryqueue:proj:{")
    finally:
        client.delete(*all_keys(keys_for(spider)))
        client.delete(*all_keys(queue.keys))
        client.close()


def test_a_cluster_is_found_through_another_listed_node_when_the_urls_is_down(
    redis_cluster_url: str, tmp_path: Path
) -> None:
    live = urlsplit(redis_cluster_url).netloc
    settings = {
        "RETRYQUEUE_REDIS_URL": "redis://127.0.0.1:1",  # down (nothing listens there)
        "RETRYQUEUE_REDIS_CLUSTER": True,
        "RETRYQUEUE_REDIS_CLUSTER_NODES": [live],
        # The project's own startup nodes are scrapy-redis's too: not taken.
        "REDIS_PARAMS": {"startup_nodes": "not for the queue"},
    }
    client = client_of(settings, tmp_path)
    assert client.ping()
    assert len(client.addresses()) == 3
    client.close()
    check_reachable(load_config(Settings(settings)), timeout=2)


def test_a_cluster_down_at_start_gives_a_client_whose_calls_are_outages(tmp_path: Path) -> None:
    # Port 1: nothing listens there, the connection is refused at once.
    settings = {"RETRYQUEUE_REDIS_URL": "redis://127.0.0.1:1", "RETRYQUEUE_REDIS_CLUSTER": True}
    client = client_of(settings, tmp_path)  # no I/O yet
    assert not client.connected
    queue = RedisDelayedQueue(client, "spider", node_id="n")  # scripts need no connection
    with pytest.raises(RedisClusterException) as caught:
        queue.probe()
    assert is_outage(caught.value), caught.value
    assert queue_identity(client, "redis://127.0.0.1:1") == "Redis Cluster 127.0.0.1:1"
    with pytest.raises(RedisClusterException) as caught:
        check_reachable(load_config(Settings(settings)), timeout=1)
    assert is_outage(caught.value)
    client.close()


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.BusyLoadingError("Redis is loading the dataset in memory"),
        ClusterDownError("The cluster is down"),
        MasterDownError("Link with MASTER is down"),
        TryAgainError("TRYAGAIN"),
        SlotNotCoveredError("Slot 42 is not covered by the cluster."),
        RedisClusterException(
            "Redis Cluster cannot be connected. Please provide at least one reachable node: "
        ),
        RedisClusterException("All slots are not covered after query all startup_nodes."),
        ClusterError("TTL exhausted."),
        ConnectionRefusedError(111, "Connection refused"),
    ],
    ids=type,
)
def test_what_an_outage_is(error: BaseException) -> None:
    assert is_outage(error)


def _raised_while_handling(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except type(inner):
            raise outer  # noqa: B904 - the implicit chain is what redis-py leaves
    except type(outer) as exc:
        return exc


@pytest.mark.parametrize(
    "error",
    [
        redis.ResponseError("ERR Error running script"),
        redis.ResponseError("NOPERM this user has no permissions"),
        RedisClusterException("Invalid args in command: ('GET',)"),
        ClusterError("something else"),
        ValueError("a bug"),
    ],
    ids=str,
)
def test_what_is_not_an_outage(error: BaseException) -> None:
    assert not is_outage(error)


def test_a_cluster_error_raised_while_an_outage_was_handled_is_one() -> None:
    chained = _raised_while_handling(
        RedisClusterException("No targets were found"), redis.ConnectionError("refused")
    )
    assert is_outage(chained)
    assert not is_outage(
        _raised_while_handling(RedisClusterException("No targets"), ValueError("x"))
    )


def test_spool_labels_of_one_cluster_match_through_any_node() -> None:
    one = "Redis Cluster 10.0.0.1:7000 10.0.0.2:7000 10.0.0.3:7000"
    assert same_queue(one, "Redis Cluster 10.0.0.2:7000")  # reached through another node
    assert same_queue(one, one)
    assert not same_queue(one, "Redis Cluster 10.0.0.9:7000")
    assert not same_queue("redis://10.0.0.1:7000/0", "Redis Cluster 10.0.0.1:7000")
    assert not same_queue("redis://a:6379/0", "redis://a:6379/1")


# -- Redis's maintenance notifications ----------------------------------------------------


def _maint_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "maintenance notification" in r.getMessage()]


def _server_lacks_maint_notifications(client: Any) -> bool:
    try:
        client.execute_command("CLIENT", "MAINT_NOTIFICATIONS", "OFF")
    except redis.ResponseError:
        return True
    return False


def test_a_client_never_asks_for_maintenance_notifications(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("redis.maint_notifications")
    caplog.set_level("DEBUG")
    client = client_of({"RETRYQUEUE_REDIS_URL": redis_url}, tmp_path)
    assert client.ping()
    assert not client.connection_pool.maint_notifications_enabled()
    assert _maint_lines(caplog) == []
    client.close()
    # What a client made without the queue's arguments does on this server: one
    # line per connection, which Scrapy's default DEBUG level shows in the crawl log.
    plain = redis.Redis.from_url(redis_url)
    if _server_lacks_maint_notifications(plain):
        plain.connection_pool.disconnect()
        caplog.clear()
        plain.ping()
        assert len(_maint_lines(caplog)) == 1
    plain.close()


def test_a_projects_own_maintenance_notifications_config_is_kept(tmp_path: Path) -> None:
    maint = pytest.importorskip("redis.maint_notifications")
    wanted = maint.MaintNotificationsConfig(enabled="auto")
    client = client_of(
        {"REDIS_URL": "redis://h:6379", "REDIS_PARAMS": {"maint_notifications_config": wanted}},
        tmp_path,
    )
    assert client.connection_pool.maint_notifications_enabled() == "auto"
    client.close()


def test_a_cluster_client_never_asks_for_maintenance_notifications(
    redis_cluster_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("redis.maint_notifications")
    caplog.set_level("DEBUG")
    settings = {"RETRYQUEUE_REDIS_URL": redis_cluster_url, "RETRYQUEUE_REDIS_CLUSTER": True}
    client = client_of(settings, tmp_path)
    assert client.ping()
    node = client.cluster.get_default_node().redis_connection
    assert not node.connection_pool.maint_notifications_enabled()
    assert _maint_lines(caplog) == []
    client.close()


class _FailingOver:
    """A cluster client made the way redis-py makes one while a failover is under way:
    its first *dead* attempts fail on the dead master, then a replica has taken over."""

    def __init__(self, dead: int, error: Exception) -> None:
        self.dead, self.error, self.made = dead, error, 0

    def make(self) -> Any:
        self.made += 1
        if self.made <= self.dead:
            raise self.error
        return self

    def get_primaries(self) -> list[str]:
        return ["a"]

    def ping(self, target_nodes: Any = None) -> bool:
        return True

    def close(self) -> None:
        pass


def test_the_start_waits_for_a_failover_under_way(caplog: pytest.LogCaptureFixture) -> None:
    from scrapy_retryqueue.queue.connection import LazyCluster, _wait_for_some_primary

    cluster = _FailingOver(3, redis.ConnectionError("Error 111 connecting to 127.0.0.1:7001."))
    slept: list[float] = []
    with caplog.at_level("WARNING", logger="scrapy_retryqueue.queue.connection"):
        _wait_for_some_primary(LazyCluster(cluster.make), wait=5, every=0.01, sleep=slept.append)
    assert cluster.made == 4 and slept == [0.01] * 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "failover under way" in lines[0] and "7001" in lines[0]


def test_the_start_waits_for_a_failover_no_longer_than_its_bound() -> None:
    from scrapy_retryqueue.queue.connection import LazyCluster, _wait_for_some_primary

    cluster = _FailingOver(10**6, redis.ConnectionError("refused"))
    with pytest.raises(redis.ConnectionError):
        _wait_for_some_primary(LazyCluster(cluster.make), wait=0.2, every=0.05)
    assert 2 <= cluster.made <= 6


def test_the_start_does_not_wait_for_a_cluster_no_node_answers() -> None:
    from scrapy_retryqueue.queue.connection import LazyCluster, _wait_for_some_primary

    cluster = _FailingOver(1, RedisClusterException("Redis Cluster cannot be connected."))
    with pytest.raises(RedisClusterException):
        _wait_for_some_primary(LazyCluster(cluster.make), wait=5, every=0.01, sleep=pytest.fail)
    assert cluster.made == 1
