"""Redis clients from settings: the configured Redis, opened as scrapy-redis opens it, or the embedded server.

A configured Redis (RETRYQUEUE_REDIS_URL, REDIS_URL, REDIS_HOST / REDIS_PORT)
is opened by scrapy-redis's own helper,
:func:`scrapy_redis.connection.get_redis_from_settings`, over the project's
REDIS_PARAMS, REDIS_DB and REDIS_ENCODING with scrapy-redis's defaults under
them, so that a crawl that also uses scrapy-redis's scheduler talks to the same
server the same way (password, database, TLS and socket options). A few
arguments are the queue's own and win over the project's: see
:data:`QUEUE_ARGUMENTS`.

One server or a Redis Cluster, an outage means the same (:func:`is_outage`):
the spider's slot cannot be served now, and the queue spools and probes
rather than any client retrying a script behind its back. A cluster client
is made on first use (:class:`LazyCluster`), so that a cluster unreachable at
start is such an outage too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from redis._parsers import Encoder
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    NoScriptError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from ..settings.defaults import (
    CLUSTER_START_FAILOVER_WAIT,
    CLUSTER_START_RETRY_EVERY,
    REDIS_CONNECT_TIMEOUT,
    REDIS_HEALTH_CHECK_INTERVAL,
    REDIS_SOCKET_TIMEOUT,
)
from . import embedded

if TYPE_CHECKING:
    from ..config import Config

#: redis-py arguments the queue sets itself, whatever REDIS_PARAMS says:
#: the client class (Redis, or RedisCluster with RETRYQUEUE_REDIS_CLUSTER),
#: no silent retry (a Lua script whose reply was lost must not run twice
#: behind our back: an outage surfaces at once and the crawl spools; a
#: cluster client still follows MOVED / ASK, which a node answers without
#: running anything), its timeouts (an unreachable Redis counts as down
#: within seconds, not scrapy-redis's 30 s), replies as bytes (envelopes are
#: decoded by the queue), a cluster client that starts with slots
#: uncovered (a dead shard costs only the spiders whose slot it served),
#: and its startup nodes (RETRYQUEUE_REDIS_CLUSTER_NODES; REDIS_PARAMS is
#: scrapy-redis's too, whose client takes no such argument).
QUEUE_ARGUMENTS = (
    "redis_cls",
    "startup_nodes",
    "retry",
    "retry_on_timeout",
    "cluster_error_retry_attempts",
    "require_full_coverage",
    "socket_timeout",
    "socket_connect_timeout",
    "health_check_interval",
    "decode_responses",
)

logger = logging.getLogger(__name__)

#: Errors that mean the server (or the cluster node owning the slot) cannot
#: serve the queue now: connection refused or lost, a timeout, a server still
#: loading its append-only file (BusyLoadingError is a ConnectionError), the
#: cluster down or failing over (CLUSTERDOWN, MASTERDOWN, TRYAGAIN, a slot no
#: node serves), and the OS's own connection errors. :func:`is_outage` adds
#: the cluster client's "cannot be connected" / "slots not covered" errors,
#: whose type redis-py shares with its usage errors.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
    ConnectionError,
    # redis-py 8.2 and later raise "cannot be connected" as a type of its own.
    *(
        t
        for t in (getattr(redis.exceptions, "RedisClusterUnreachableError", None),)
        if t is not None
    ),
)
#: What the cluster client says when no node tells it the slots, or some slot
#: has no node (raised from its topology refresh, typed RedisClusterException).
_CLUSTER_UNREACHABLE = ("Redis Cluster cannot be connected", "All slots are not covered")
#: A redirect storm (MOVED after MOVED) while slots move in a failover.
_TTL_EXHAUSTED = "TTL exhausted"


def is_outage(error: BaseException) -> bool:
    """Whether *error* means "Redis is unreachable" for the queue's slot, one server or a cluster.

    Such a failure is spooled, logged once, and tried again once a probe of
    the slot answers; any other error is a refusal, reported as such.
    """
    if isinstance(error, OUTAGE_ERRORS):
        return True
    if type(error) is RedisClusterException:
        if str(error).startswith(_CLUSTER_UNREACHABLE):
            return True
        # Raised while refreshing the topology after an outage error: that one counts.
        cause = error.__cause__ or error.__context__
        return cause is not None and is_outage(cause)
    return type(error) is ClusterError and str(error).startswith(_TTL_EXHAUSTED)


#: Where to connect is the URL the settings resolve to (config.redis_url), not these.
_ADDRESS_ARGUMENTS = ("url", "host", "port", "unix_socket_path")


def embedded_dir(configured: str | None) -> Path:
    """RETRYQUEUE_EMBEDDED_DIR, else the project's own (embedded.project_directory)."""
    if configured:
        return Path(configured)
    return embedded.project_directory()


class SlotScript(Script):
    """A Lua script that a cluster loads on the node owning its keys' slot only.

    redis-py's Script answers NOSCRIPT (a node restarted, a replica promoted)
    with SCRIPT LOAD on every primary, which fails while any shard is down:
    EVAL of the source goes where the keys are, and caches it there. A node
    answers NOSCRIPT without running anything, so nothing runs twice.
    """

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        keys, args = list(keys or []), list(args or [])
        client = client if client is not None else self.registered_client
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.script, len(keys), *keys, *args)


class LazyCluster:
    """A Redis Cluster client made on first use, for a cluster that may be down at start.

    redis-py's RedisCluster asks a node for the slots when it is made, and
    raises when none answers; the queue must start in the "down" state then
    (RETRYQUEUE_START_WITHOUT_REDIS) and spool. Until the client exists, any
    call tries to make it (the caller sees the outage error); scripts are
    registered without a client, so the queue can be built at once.
    """

    def __init__(self, make: Callable[[], RedisCluster], *, encoding: str = "utf-8") -> None:
        self._make = make
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()
        self._encoder = Encoder(encoding, "strict", False)

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def cluster(self) -> RedisCluster:
        """The RedisCluster, made now if it is not yet (raises while the cluster is down)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make()
                client = self._client
        return client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)

    def get_encoder(self) -> Encoder:
        return self._encoder

    def register_script(self, script: str) -> SlotScript:
        return SlotScript(self, script)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def addresses(self) -> list[str]:
        """Every node the client knows (``host:port``), sorted; [] before it connected."""
        if self._client is None:
            return []
        return sorted(node.name for node in self._client.get_nodes())


def is_cluster_client(client: object) -> bool:
    """Whether *client* talks to a Redis Cluster, asked without connecting (a
    LazyCluster's attributes would make its client)."""
    return isinstance(client, (RedisCluster, LazyCluster))


#: redis-py's argument for Redis's maintenance notifications (redis-py 7 and later).
MAINT_NOTIFICATIONS = "maint_notifications_config"


def _maint_notifications_off() -> Any:
    # redis-py 7+ speaks RESP3 by default and then sends CLIENT MAINT_NOTIFICATIONS
    # on every new TCP connection; a server without it (Redis before 8, Valkey)
    # refuses it, one "Failed to enable maintenance notifications" line each,
    # which Scrapy's default DEBUG level shows. The queue has no use for them:
    # it has its own notion of an outage (is_outage) and its own timeouts, which
    # the notifications would relax behind its back. A project that wants them
    # passes its own config in REDIS_PARAMS.
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # redis-py before 7: no such handshake
        return None
    return MaintNotificationsConfig(enabled=False)


_MAINT_OFF = _maint_notifications_off()


def client_for(
    config: Config, *, embedded_directory: Path
) -> tuple[redis.Redis | LazyCluster, str]:
    """A client of the Redis *config* names and its URL; starts the embedded server when none.

    Blocking: call it off the reactor thread.
    """
    if config.redis_url is None:
        url = embedded.ensure_server(embedded_directory)
        # The embedded server is the project's own: REDIS_PARAMS (a password,
        # say) is for the Redis the settings name, not for it.
        return open_client(url, {}), url
    url = config.redis_url
    client = open_client(
        url,
        config.redis_client_settings,
        cluster=config.redis_cluster,
        cluster_nodes=config.redis_cluster_nodes,
    )
    return client, url


def open_client(
    url: str,
    client_settings: Mapping[str, Any],
    *,
    cluster: bool = False,
    cluster_nodes: Sequence[tuple[str, int]] = (),
    socket_timeout: float = REDIS_SOCKET_TIMEOUT,
    connect_timeout: float = REDIS_CONNECT_TIMEOUT,
) -> Any:
    """A client of *url* made by scrapy-redis's get_redis_from_settings.

    *client_settings* are the project's REDIS_PARAMS, REDIS_DB and
    REDIS_ENCODING (Config.redis_client_settings); the queue's own arguments
    (QUEUE_ARGUMENTS) win over them, the URL's own options (a password or a
    database in it) win over all.
    """
    from scrapy.settings import BaseSettings
    from scrapy_redis.connection import get_redis_from_settings

    ours: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry_on_timeout": False,
        "decode_responses": False,
    }
    if cluster:
        # Every key of a spider shares one hash tag, so each script runs on
        # the one node that owns that slot. Retries 0: redis-py would retry a
        # timed-out script up to 10 times (it may have run); redirections
        # (MOVED / ASK) are followed whatever this says.
        ours["redis_cls"] = RedisCluster
        ours["retry"] = Retry(NoBackoff(), 0)
        ours["require_full_coverage"] = False
        if cluster_nodes:
            # Tried with the URL's own node: one that is down at start (a failover
            # under way) does not keep the client from finding the cluster.
            ours["startup_nodes"] = [ClusterNode(host, port) for host, port in cluster_nodes]
    else:
        ours["redis_cls"] = redis.Redis
        ours["health_check_interval"] = REDIS_HEALTH_CHECK_INTERVAL
        ours["retry"] = Retry(ExponentialBackoff(), 0)
    project = {
        name: value
        for name, value in dict(client_settings.get("REDIS_PARAMS") or {}).items()
        if name not in QUEUE_ARGUMENTS and name not in _ADDRESS_ARGUMENTS
    }
    if _MAINT_OFF is not None and MAINT_NOTIFICATIONS not in project:
        ours[MAINT_NOTIFICATIONS] = _MAINT_OFF
    settings = BaseSettings(
        {
            **{k: v for k, v in client_settings.items() if k != "REDIS_PARAMS"},
            "REDIS_URL": url,
            "REDIS_PARAMS": {**project, **ours},
        }
    )
    if cluster:
        encoding = client_settings.get("REDIS_ENCODING") or "utf-8"
        return LazyCluster(lambda: get_redis_from_settings(settings), encoding=encoding)
    return get_redis_from_settings(settings)


def queue_identity(client: Any, url: str) -> str:
    """What names the queue's Redis for its spool, as people may read it (no password).

    One server: its URL. A cluster: ``Redis Cluster`` and every node it
    has (sorted), so the same cluster reached through another node is the
    same queue; while it never answered, only the node of *url* is known.
    """
    from ..config import redact_url

    if not isinstance(client, LazyCluster):
        return redact_url(url)
    nodes = client.addresses() or [seed_address(url)]
    return f"{CLUSTER_LABEL} {' '.join(nodes)}"


#: How a cluster's spool label begins (see :func:`queue_identity`).
CLUSTER_LABEL = "Redis Cluster"


def seed_address(url: str) -> str:
    """``host:port`` of the node a cluster URL names."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def same_queue(label: str, other: str) -> bool:
    """Whether two spool labels name the same queue: equal, or clusters sharing a node."""
    if label == other:
        return True
    prefix = CLUSTER_LABEL + " "
    if not (label.startswith(prefix) and other.startswith(prefix)):
        return False
    return bool(set(label[len(prefix) :].split()) & set(other[len(prefix) :].split()))


def check_reachable(config: Config, *, timeout: float) -> None:
    """Raise the client's error when the Redis *config* names does not answer within *timeout* s."""
    assert config.redis_url is not None
    client = open_client(
        config.redis_url,
        config.redis_client_settings,
        cluster=config.redis_cluster,
        cluster_nodes=config.redis_cluster_nodes,
        socket_timeout=timeout,
        connect_timeout=timeout,
    )
    try:
        if isinstance(client, LazyCluster):
            _wait_for_some_primary(client)
        else:
            client.ping()
    finally:
        client.close()


def _wait_for_some_primary(
    client: LazyCluster,
    *,
    wait: float = CLUSTER_START_FAILOVER_WAIT,
    every: float = CLUSTER_START_RETRY_EVERY,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """:func:`_ping_some_primary`, asked again for up to *wait* seconds while the
    cluster answers and a master it lists does not.

    redis-py makes a cluster client by reading the topology from a node, then asking
    its first master for the command table: in a failover under way that master is
    dead, and the client cannot be made until a replica takes over. A cluster no
    node answers (RedisClusterUnreachableError, a RedisClusterException) is not
    waited for.
    """
    deadline = time.monotonic() + wait
    said = False
    while True:
        try:
            _ping_some_primary(client)
            return
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() + every > deadline:
                raise
            if not said:
                said = True
                logger.warning(
                    "scrapy-retryqueue: the Redis Cluster answers but a master it lists does "
                    "not (%s): a failover under way? Waiting up to %ss for a replica to take "
                    "over",
                    exc,
                    wait,
                )
        sleep(every)


def _ping_some_primary(client: LazyCluster) -> None:
    """The cluster answers: its topology came from some node, and a master answers.

    A plain PING goes to every node in recent redis-py, so one master dead in a
    failover under way would stop a crawl the queue can run (it spools what
    that master's slots refuse until a replica takes over).
    """
    first: BaseException | None = None
    for node in client.get_primaries():
        try:
            client.ping(target_nodes=node)
            return
        except Exception as exc:  # the next master may answer
            first = first or exc
    if first is not None:
        raise first
