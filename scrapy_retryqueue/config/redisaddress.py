"""Where the Redis is and how it is talked to: its URL, scrapy-redis's REDIS_*, cluster nodes.

RETRYQUEUE_REDIS_URL first, then the settings scrapy-redis reads, in scrapy-redis's
order; none set means the embedded server. A URL or client argument redis-py would
refuse is said at start, with the setting's name and without the URL's password.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..exceptions import ConfigError
from ..settings import defaults
from ..values import shown
from .readers import bool_setting
from .security import redact_url

_REDIS_SCHEMES = ("redis", "rediss", "unix")


def redis_url_from_settings(settings: Any) -> str | None:
    """RETRYQUEUE_REDIS_URL, else the server scrapy-redis's settings name.

    None when none is set: the caller then uses the embedded server.
    """
    url, name = _redis_address(settings)
    if not url:
        return None
    try:
        scheme = urlsplit(url).scheme if isinstance(url, str) else None
    except ValueError:
        scheme = None
    if scheme not in _REDIS_SCHEMES:
        raise ConfigError(
            f"{name} must be a redis://, rediss:// or unix:// URL, got {redact_url(str(url))!r}"
        )
    problem = _redis_url_problem(url)
    if problem:
        raise ConfigError(f"{name} {redact_url(url)!r}: {problem}")
    return url


def _redis_url_problem(url: str) -> str | None:
    """What redis-py would refuse in a redis:// URL (a port or database that is no
    number), said at start rather than as a traceback when the client is made."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return None if parts.path else "a unix:// URL needs the socket's path"
    try:
        port = parts.port
    except ValueError:
        return "its port is not a number 0-65535"
    if port is not None and not 0 < port <= 65535:
        return "its port is not a number 1-65535"
    database = parts.path.strip("/")
    if database and not (database.isascii() and database.isdigit()):
        return f"its database ({shown(database, 40)}) is not a number"
    return None


def _redis_address(settings: Any) -> tuple[Any, str]:
    """The Redis URL the settings name and the setting it came from (url None: none).

    After RETRYQUEUE_REDIS_URL, the order is scrapy-redis's
    (scrapy_redis.connection.get_redis_from_settings): REDIS_URL, then a
    ``url`` in REDIS_PARAMS, then REDIS_HOST / REDIS_PORT, each over the
    ``host`` / ``port`` of REDIS_PARAMS. Nothing set means the embedded server
    here, where scrapy-redis would use localhost:6379.
    """
    if settings.get("RETRYQUEUE_REDIS_URL"):
        return settings.get("RETRYQUEUE_REDIS_URL"), "RETRYQUEUE_REDIS_URL"
    if settings.get("REDIS_URL"):
        return settings.get("REDIS_URL"), "REDIS_URL"
    params = scrapy_redis_params(settings)
    if params.get("url"):
        return params["url"], "REDIS_PARAMS['url']"
    host = settings.get("REDIS_HOST") or params.get("host")
    port = settings.get("REDIS_PORT") or params.get("port")
    if host or port:
        host = host or defaults.SCRAPY_REDIS_HOST
        port = port or defaults.SCRAPY_REDIS_PORT
        return f"redis://{host}:{port}", "REDIS_HOST/REDIS_PORT"
    return None, "RETRYQUEUE_EMBEDDED_DIR"


def scrapy_redis_params(settings: Any) -> dict[str, Any]:
    """REDIS_PARAMS (scrapy-redis: keyword arguments of the redis-py client) as a dict.

    The message of a bad value shows its type only: it may hold a password.
    """
    name = "REDIS_PARAMS"
    value = settings.get(name)
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise ConfigError(
                f"{name} must be a dict of redis-py client arguments (or its JSON text); "
                "the text given is not valid JSON"
            ) from None
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{name} must be a dict of redis-py client arguments, got a {type(value).__name__}"
        )
    unknown = sorted(str(key)[:80] for key in value if key not in _redis_client_arguments())
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(_redis_client_arguments()), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{name} names {', '.join(map(repr, unknown[:5]))}, not an argument of redis-py's "
            f"client or connection{hint}"
        )
    return dict(value)


@functools.cache
def _redis_client_arguments() -> frozenset[str]:
    """The keyword arguments redis-py's clients and connections take (REDIS_PARAMS
    reaches the client, its connection pool and its connections), and
    scrapy-redis's own ``url`` and ``redis_cls``."""
    import inspect

    import redis
    from redis import connection

    names = {"url", "redis_cls"}
    for function in (
        redis.Redis.__init__,
        redis.RedisCluster.__init__,
        connection.ConnectionPool.__init__,
        connection.AbstractConnection.__init__,
        connection.Connection.__init__,
        connection.SSLConnection.__init__,
        connection.UnixDomainSocketConnection.__init__,
    ):
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                names.add(parameter.name)
    names.discard("self")
    return frozenset(names)


def scrapy_redis_client_settings(settings: Any) -> dict[str, Any]:
    """How scrapy-redis connects, beside where: REDIS_PARAMS, REDIS_DB, REDIS_ENCODING.

    Only the ones set; :func:`scrapy_retryqueue.queue.connection.client_for` hands
    them to scrapy-redis's own connection helper.
    """
    found: dict[str, Any] = {}
    params = scrapy_redis_params(settings)
    if params:
        found["REDIS_PARAMS"] = params
    for name in ("REDIS_DB", "REDIS_ENCODING"):
        value = settings.get(name)
        if value not in (None, ""):
            found[name] = value
    return found


def redis_url_setting_name(settings: Any) -> str:
    """Which setting names the Redis the crawl uses (see :func:`redis_url_from_settings`)."""
    return _redis_address(settings)[1]


def cluster_nodes_setting(settings: Any) -> tuple[tuple[str, int], ...]:
    """RETRYQUEUE_REDIS_CLUSTER_NODES as (host, port) pairs: a list, or comma-separated text."""
    name = "RETRYQUEUE_REDIS_CLUSTER_NODES"
    raw = settings.get(name)
    if not raw:
        return ()
    if not bool_setting(settings, "RETRYQUEUE_REDIS_CLUSTER"):
        raise ConfigError(f"{name} is set but RETRYQUEUE_REDIS_CLUSTER is False")
    items: Any = raw
    if isinstance(raw, str):
        try:  # a list given with -s as JSON text
            items = json.loads(raw) if raw.lstrip().startswith("[") else raw.split(",")
        except ValueError:
            raise ConfigError(f"{name} is not a JSON list: {raw!r}") from None
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"{name} must be a list of 'host:port' addresses; got {raw!r}")
    nodes: list[tuple[str, int]] = []
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        host, _, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{name}: {item!r} is not a 'host:port' address")
        nodes.append((host, int(port)))
    return tuple(nodes)
