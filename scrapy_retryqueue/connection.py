"""Redis clients from settings: a configured URL, or the embedded server."""

from __future__ import annotations

from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from scrapy.utils.project import data_path

from . import embedded


def embedded_dir(configured: str | None) -> Path:
    """RETRYQUEUE_EMBEDDED_DIR, else ``.scrapy/retryqueue`` of the current project."""
    if configured:
        return Path(configured)
    return Path(data_path("retryqueue", createdir=False))


def client_for(url: str | None, *, embedded_directory: Path) -> tuple[redis.Redis, str]:
    """A client and the URL it talks to; starts the embedded server when *url* is None.

    Blocking: call it off the reactor thread.
    """
    if url is None:
        url = embedded.ensure_server(embedded_directory)
    client = redis.Redis.from_url(
        url,
        socket_timeout=10,
        socket_connect_timeout=5,
        health_check_interval=30,
        # A short blip (failover, restart) is retried here; a longer outage surfaces.
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )
    return client, url
