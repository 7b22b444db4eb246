"""Redis clients from settings: a configured URL, or the embedded server."""

from __future__ import annotations

from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from scrapy.utils.project import data_path

from . import embedded


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
        return RedisCluster.from_url(url, socket_timeout=10, socket_connect_timeout=5), url
    client = redis.Redis.from_url(
        url,
        socket_timeout=10,
        socket_connect_timeout=5,
        health_check_interval=30,
        # No silent retries: a script whose reply was lost must not run twice
        # behind our back. An outage surfaces at once and the runtime spools.
        retry=Retry(ExponentialBackoff(), 0),
    )
    return client, url
