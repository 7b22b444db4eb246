"""Redis clients from settings: the configured Redis, opened as scrapy-redis opens it, or the embedded server.

A configured Redis (RETRYQUEUE_REDIS_URL, REDIS_URL, REDIS_HOST / REDIS_PORT)
is opened by scrapy-redis's own helper,
:func:`scrapy_redis.connection.get_redis_from_settings`, over the project's
REDIS_PARAMS, REDIS_DB and REDIS_ENCODING with scrapy-redis's defaults under
them, so that a crawl that also uses scrapy-redis's scheduler talks to the same
server the same way (password, database, TLS and socket options). A few
arguments are the queue's own and win over the project's: see
:data:`QUEUE_ARGUMENTS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from . import embedded
from .defaults import REDIS_CONNECT_TIMEOUT, REDIS_HEALTH_CHECK_INTERVAL, REDIS_SOCKET_TIMEOUT

if TYPE_CHECKING:
    from .config import Config

#: redis-py arguments the queue sets itself, whatever REDIS_PARAMS says:
#: the client class (Redis, or RedisCluster with RETRYQUEUE_REDIS_CLUSTER),
#: no silent retry (a Lua script whose reply was lost must not run twice
#: behind our back: an outage surfaces at once and the crawl spools), its
#: timeouts (an unreachable Redis counts as down within seconds, not
#: scrapy-redis's 30 s), and replies as bytes (envelopes are decoded by the queue).
QUEUE_ARGUMENTS = (
    "redis_cls",
    "retry",
    "retry_on_timeout",
    "socket_timeout",
    "socket_connect_timeout",
    "health_check_interval",
    "decode_responses",
)
#: Where to connect is the URL the settings resolve to (config.redis_url), not these.
_ADDRESS_ARGUMENTS = ("url", "host", "port", "unix_socket_path")


def embedded_dir(configured: str | None) -> Path:
    """RETRYQUEUE_EMBEDDED_DIR, else the project's own (embedded.project_directory)."""
    if configured:
        return Path(configured)
    return embedded.project_directory()


def client_for(
    config: Config, *, embedded_directory: Path
) -> tuple[redis.Redis | RedisCluster, str]:
    """A client of the Redis *config* names and its URL; starts the embedded server when none.

    Blocking: call it off the reactor thread.
    """
    if config.redis_url is None:
        url = embedded.ensure_server(embedded_directory)
        # The embedded server is the project's own: REDIS_PARAMS (a password,
        # say) is for the Redis the settings name, not for it.
        return open_client(url, {}), url
    url = config.redis_url
    return open_client(url, config.redis_client_settings, cluster=config.redis_cluster), url


def open_client(
    url: str,
    client_settings: Mapping[str, Any],
    *,
    cluster: bool = False,
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
        # the one node that owns that slot. The cluster client keeps its own
        # retries: they follow MOVED / ASK redirections.
        ours["redis_cls"] = RedisCluster
    else:
        ours["redis_cls"] = redis.Redis
        ours["health_check_interval"] = REDIS_HEALTH_CHECK_INTERVAL
        ours["retry"] = Retry(ExponentialBackoff(), 0)
    project = {
        name: value
        for name, value in dict(client_settings.get("REDIS_PARAMS") or {}).items()
        if name not in QUEUE_ARGUMENTS and name not in _ADDRESS_ARGUMENTS
    }
    settings = BaseSettings(
        {
            **{k: v for k, v in client_settings.items() if k != "REDIS_PARAMS"},
            "REDIS_URL": url,
            "REDIS_PARAMS": {**project, **ours},
        }
    )
    return get_redis_from_settings(settings)


def check_reachable(config: Config, *, timeout: float) -> None:
    """Raise the client's error when the Redis *config* names does not answer within *timeout* s."""
    assert config.redis_url is not None
    client = open_client(
        config.redis_url,
        config.redis_client_settings,
        cluster=config.redis_cluster,
        socket_timeout=timeout,
        connect_timeout=timeout,
    )
    try:
        client.ping()
    finally:
        client.close()
