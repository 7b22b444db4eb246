"""Redis clients from settings: a configured URL, or the embedded server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from scrapy.utils.project import data_path

from . import embedded
from .defaults import REDIS_CONNECT_TIMEOUT, REDIS_HEALTH_CHECK_INTERVAL, REDIS_SOCKET_TIMEOUT


def embedded_dir(configured: str | None) -> Path:
    """RETRYQUEUE_EMBEDDED_DIR, else ``.scrapy/retryqueue`` of the current project."""
    if configured:
        return Path(configured)
    return Path(data_path("retryqueue", createdir=False))


def client_for(
    url: str | None, *, embedded_directory: Path, cluster: bool = False
) -> tuple[redis.Redis | RedisCluster, str]:
    """A client and the URL it talks to; starts the embedded server when *url* is None.

    Blocking: call it off the reactor thread.
    """
    if url is None:
        url = embedded.ensure_server(embedded_directory)
    elif cluster:
        # Every key of a spider shares one hash tag, so each script runs on
        # the one node that owns that slot.
        return RedisCluster.from_url(
            url, socket_timeout=REDIS_SOCKET_TIMEOUT, socket_connect_timeout=REDIS_CONNECT_TIMEOUT
        ), url
    client = redis.Redis.from_url(
        url,
        socket_timeout=REDIS_SOCKET_TIMEOUT,
        socket_connect_timeout=REDIS_CONNECT_TIMEOUT,
        health_check_interval=REDIS_HEALTH_CHECK_INTERVAL,
        # No silent retries: a script whose reply was lost must not run twice
        # behind our back. An outage surfaces at once and the runtime spools.
        retry=Retry(ExponentialBackoff(), 0),
    )
    return client, url


def check_reachable(url: str, *, cluster: bool, timeout: float) -> None:
    """Raise the client's error when the Redis at *url* does not answer within *timeout* s."""
    if cluster:
        client: Any = RedisCluster.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
    else:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()
