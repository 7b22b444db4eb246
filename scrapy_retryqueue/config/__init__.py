"""RETRYQUEUE_* settings, read and validated once per crawler into a Config.

A bad value raises :class:`ConfigError` naming the setting and showing the value,
so the crawl stops before it fetches anything. Every component of one crawl
shares one validated Config through :func:`config_for`; the readers here
(:func:`number_setting`, :func:`bool_setting`, ...) also serve the store's and
the dashboard's settings. Defaults come from :mod:`scrapy_retryqueue.settings.defaults`.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from weakref import WeakKeyDictionary

from scrapy.settings import default_settings
from scrapy.utils.misc import load_object

from ..decision import kinds
from ..decision.backoff import BackoffStrategy, ExponentialBackoff
from ..decision.classify import exception_class, exception_kinds_of
from ..decision.kinds import KindTable
from ..decision.policy import POLICY_FIELD_NAMES, Policy, PolicyTable
from ..exceptions import ConfigError
from ..settings import defaults
from ..settings.bounds import check_number
from ..values import shown
from .scrapycompat import ScrapyRetry, own_policy_fields, read_scrapy_retry

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from ..secure.encryption import RequestCipher

_REDIS_SCHEMES = ("redis", "rediss", "unix")
#: What every setting of the package starts with.
SETTING_PREFIX = "RETRYQUEUE_"


@dataclass(frozen=True, slots=True)
class Config:
    enabled: bool
    #: None means: use the embedded server.
    redis_url: str | None
    #: The setting *redis_url* came from, for error lines.
    redis_url_setting: str
    #: scrapy-redis's REDIS_PARAMS, REDIS_DB and REDIS_ENCODING, the ones set: how
    #: a configured Redis is talked to (connection.client_for).
    redis_client_settings: Mapping[str, Any]
    start_without_redis: bool
    fleet_wait: float
    wait_log_interval: float
    #: RETRYQUEUE_SECRET_HEADERS, lower-cased (redact.py).
    secret_headers: frozenset[str]
    #: RETRYQUEUE_ENCRYPTION_KEYS as a cipher (encryption.py); None: not encrypted.
    encryption: RequestCipher | None
    redis_cluster: bool
    #: RETRYQUEUE_REDIS_CLUSTER_NODES: more startup nodes of the cluster (host, port).
    redis_cluster_nodes: tuple[tuple[str, int], ...]
    spool_memory: int
    spool_max: int
    #: The built-in kinds and the project's own (RETRYQUEUE_KINDS).
    kinds: KindTable
    #: RETRYQUEUE_BACKOFF as loaded: a class (built per crawler by config_for,
    #: which hands the instance to policy_table) or a ready strategy object.
    backoff: Any
    policy_table: PolicyTable
    status_kinds: Mapping[int, str]
    exception_kinds: Mapping[type, str]
    poll_interval: float
    lease_time: float
    max_in_flight: int
    idle_timeout: float
    max_reclaims: int
    priority_adjust: int
    node_id: str
    #: The project's namespace in the Redis keys (RETRYQUEUE_NAMESPACE, else
    #: BOT_NAME when the project sets it); "" for keys without one.
    namespace: str
    events_maxlen: int
    audit_log: str | None
    audit_rotation: str
    audit_retention: str
    embedded_dir: str | None
    #: Keep the embedded server when the crawl ends (RETRYQUEUE_EMBEDDED_KEEP).
    embedded_keep: bool
    forbidden_log_level: int
    #: Kind -> level of its dead letters' log line (its record's dead_log_level,
    #: a "setting:NAME" one read from that setting).
    dead_log_levels: Mapping[str, int]
    #: Dead-letter lines logged per kind at their level (RETRYQUEUE_DEAD_LOG_LIMIT).
    dead_log_limit: int
    #: The RETRYQUEUE_RETRY_HOOK object as loaded (a callable, or a class the
    #: runtime instantiates); None when unset.
    retry_hook: Any
    #: Per-domain cooldowns (RETRYQUEUE_DOMAIN_COOLDOWN and its numbers).
    domain_cooldown: bool
    cooldown_base: float
    cooldown_max: float
    burst_threshold: int
    burst_window: float
    cooldown_probe_permanent: bool
    #: Seconds; None: no limit.
    deferral_max_wait: float | None
    item_replay: bool
    #: Scrapy's RETRY_TIMES when the project set it: a cap on all retries of a
    #: request, over every kind; None: only the per-kind budgets apply.
    retry_times: int | None
    #: Scrapy's RETRY_GIVE_UP_LOG_LEVEL when the project set it: the level of a
    #: retryable failure's dead letter; None: the queue's own levels.
    give_up_log_level: int | None
    #: RETRY_TIMES whoever set it (Scrapy's default 2): the cap once a callback
    #: counted retries itself with get_retry_request().
    scrapy_retry_times: int
    #: Kinds whose max_retries RETRYQUEUE_POLICIES sets: RETRY_TIMES does not cap them.
    own_budget_kinds: frozenset[str]
    #: Said once at start as WARNING lines: RETRY_* values honoured differently
    #: (scrapycompat.py), RETRYQUEUE_* names that are no setting (a misspelling).
    notices: tuple[str, ...]
    #: The learned recovery records (recovery.py): kept at all, their weights'
    #: half-life (s), how many per spider, how often a learning strategy reads them (s).
    learned_stats: bool = True
    learned_half_life: float = defaults.LEARNED_HALF_LIFE
    learned_max_records: int = defaults.LEARNED_MAX_RECORDS
    learned_refresh: float = defaults.LEARNED_REFRESH
    #: The retry budget per domain (retrybudget.py): the share of a domain's fresh
    #: requests its retries may be (0: off), the floor (retries/s), the window (s).
    retry_budget: float = defaults.RETRY_BUDGET
    retry_budget_floor: float = defaults.RETRY_BUDGET_FLOOR
    retry_budget_window: float = defaults.RETRY_BUDGET_WINDOW


def raw_setting(settings: Any, name: str) -> Any:
    """The setting's value as given, or its default when unset (None)."""
    value = settings.get(name)
    return defaults.SETTINGS[name] if value is None else value


#: How deep a setting's JSON text may nest: far more than any setting's own shape,
#: far less than what the checks that walk it could recurse through.
_JSON_DEPTH_MAX = 64


def _depth_over(value: Any, limit: int) -> bool:
    """Whether *value* nests lists or dicts deeper than *limit*, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            stack.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return False


def _maybe_json(name: str, value: Any) -> Any:
    # Settings given with -s on the command line arrive as strings.
    if isinstance(value, str):
        try:
            loaded = json.loads(value)
        except ValueError:
            raise ConfigError(
                f"{name} must be a dict (or its JSON text), got {shown(value)}"
            ) from None
        except RecursionError:
            loaded = None
            too_deep = True
        else:
            # Python before 3.13 raises RecursionError here; 3.13's parser reads it.
            too_deep = _depth_over(loaded, _JSON_DEPTH_MAX)
        if too_deep:
            raise ConfigError(
                f"{name} is nested too deeply to be read ({len(value)} characters of JSON)"
            )
        return loaded
    return value


def unknown_settings(names: Iterable[Any]) -> list[str]:
    """One notice per RETRYQUEUE_* name of *names* that is no setting, naming the
    closest known one: a misspelt setting would otherwise be ignored without a word.

    The known names are :data:`defaults.SETTINGS`' keys, so a setting added
    there is known here at once.
    """
    # Compared without the prefix every name shares, which would make any two close.
    known = {name.removeprefix(SETTING_PREFIX): name for name in defaults.SETTINGS}
    notices = []
    for name in sorted({n for n in names if isinstance(n, str)}):
        if not name.startswith(SETTING_PREFIX) or name in defaults.SETTINGS:
            continue
        close = difflib.get_close_matches(name.removeprefix(SETTING_PREFIX), known, 1, 0.7)
        hint = f"; did you mean {known[close[0]]}?" if close else "; it is not read"
        notices.append(f"{shown(name, 80)} is not a scrapy-retryqueue setting{hint}")
    return notices


def number_setting(settings: Any, name: str, *, whole: bool = False, **bounds: Any) -> Any:
    """A numeric setting, its text (``-s NAME=3``) read as a number, checked by
    :func:`~.bounds.check_number` with *whole* and *bounds* (minimum, strict, finite,
    maximum), which says the bounds and the error line."""
    value = raw_setting(settings, name)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value) if not whole else int(value)
    return check_number(name, value, whole=whole, **bounds)


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


def bool_setting(settings: Any, name: str) -> bool:
    value = raw_setting(settings, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, str)) and str(value).strip().lower() in {"0", "1", "true", "false"}:
        return str(value).strip().lower() in {"1", "true"}
    raise ConfigError(f"{name} must be True or False, got {shown(value)}")


def kinds_setting(settings: Any) -> KindTable:
    """RETRYQUEUE_KINDS: the built-in kinds plus the project's own, validated.

    Cheap and Scrapy-free: the commands and the dashboard read their kinds here too.
    """
    name = "RETRYQUEUE_KINDS"
    table = KindTable.with_declared(
        _maybe_json(name, raw_setting(settings, name)), policy_fields=POLICY_FIELD_NAMES, where=name
    )
    for kind in table.declared:
        # The policy's values are checked here, once, with the setting's name.
        Policy.from_dict(table[kind].policy, where=f"{name}[{kind!r}]")
    return table


def _base_policy(table: KindTable, kind: str) -> Policy:
    where = f"defaults[{kind!r}]" if kind in kinds.POLICIES else f"RETRYQUEUE_KINDS[{kind!r}]"
    return Policy.from_dict(kinds.POLICIES.get(kind) or table[kind].policy, where=where)


def _policies(
    settings: Any,
    scrapy_retry: ScrapyRetry,
    table: KindTable,
    backoff: BackoffStrategy | None,
) -> PolicyTable:
    name = "RETRYQUEUE_POLICIES"
    user = _maybe_json(name, raw_setting(settings, name))
    if not isinstance(user, Mapping):
        raise ConfigError(f"{name} must be a dict of kind -> policy fields, got {user!r}")
    known = table.policy_names
    unknown = set(user) - set(known)
    if unknown:
        raise ConfigError(
            f"{name} names unknown kind(s) {sorted(map(str, unknown))}; known: {', '.join(known)}"
        )
    policies: dict[str, Policy] = {}
    for kind in known:
        base = _base_policy(table, kind)
        base = base.merged(scrapy_retry.policies.get(kind, {}), where="RETRY_* settings")
        policies[kind] = base.merged(user.get(kind, {}), where=f"{name}[{kind!r}]")

    dname = "RETRYQUEUE_DOMAIN_POLICIES"
    per_domain_raw = _maybe_json(dname, raw_setting(settings, dname))
    if not isinstance(per_domain_raw, Mapping):
        raise ConfigError(
            f"{dname} must be a dict of domain -> kind -> policy, got {per_domain_raw!r}"
        )
    per_domain: dict[str, dict[str, Policy]] = {}
    for domain, per_kind in per_domain_raw.items():
        if (
            not isinstance(domain, str)
            or not domain.strip(".")
            or any(c in domain for c in "/@ ")
            or len(domain) > 253
        ):
            raise ConfigError(
                f"{dname} keys must be host names like 'example.com', got {shown(domain, 80)}"
            )
        if not isinstance(per_kind, Mapping):
            raise ConfigError(
                f"{dname}[{domain!r}] must be a dict of kind -> policy, got {per_kind!r}"
            )
        resolved: dict[str, Policy] = {}
        for kind, overrides in per_kind.items():
            if kind not in policies:
                raise ConfigError(
                    f"{dname}[{domain!r}] names unknown kind {kind!r}; known: {', '.join(known)}"
                )
            resolved[kind] = policies[kind].merged(
                overrides, where=f"{dname}[{domain!r}][{kind!r}]"
            )
        per_domain[domain.lower().lstrip(".")] = resolved

    retry_after_max = number_setting(settings, "RETRYQUEUE_RETRY_AFTER_MAX")
    return PolicyTable(
        policies,
        per_domain,
        retry_after_max=float(retry_after_max),
        backoff=backoff,
        kind_table=table,
    )


def _status_kinds(settings: Any, scrapy_retry: ScrapyRetry, table: KindTable) -> dict[int, str]:
    name = "RETRYQUEUE_STATUS_KINDS"
    user = _maybe_json(name, raw_setting(settings, name))
    if not isinstance(user, Mapping):
        raise ConfigError(f"{name} must be a dict of HTTP status -> kind, got {user!r}")
    merged = dict(kinds.STATUS_KINDS)
    for code, scrapy_kind in scrapy_retry.status_kinds.items():
        if scrapy_kind is None:
            merged.pop(code, None)
        else:
            merged[code] = scrapy_kind
    for status, kind in user.items():
        try:
            code = int(status)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} key must be an HTTP status, got {status!r}") from None
        if not 100 <= code <= 599:
            raise ConfigError(f"{name} key must be an HTTP status (100-599), got {status!r}")
        if kind is None:  # a project can stop treating a status as a failure
            merged.pop(code, None)
        elif kind in table.policy_names:
            merged[code] = kind
        else:
            raise ConfigError(
                f"{name}[{status!r}] is {kind!r}, not a kind; known: {', '.join(table.policy_names)}"
            )
    return merged


def _exception_kinds(settings: Any, scrapy_retry: ScrapyRetry, table: KindTable) -> dict[type, str]:
    name = "RETRYQUEUE_EXCEPTION_KINDS"
    user = _maybe_json(name, raw_setting(settings, name))
    if not isinstance(user, Mapping):
        raise ConfigError(f"{name} must be a dict of exception class path -> kind, got {user!r}")
    resolved = exception_kinds_of({**kinds.EXCEPTION_KINDS, **scrapy_retry.exception_kinds})
    for path, kind in user.items():
        cls = exception_class(path, where=f"{name} key")
        if kind is None:
            resolved.pop(cls, None)
        elif kind in table.policy_names:
            resolved[cls] = kind
        else:
            raise ConfigError(
                f"{name}[{path!r}] is {kind!r}, not a kind; known: {', '.join(table.policy_names)}"
            )
    return resolved


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


def secret_headers_setting(settings: Any) -> frozenset[str]:
    """RETRYQUEUE_SECRET_HEADERS: a list (or comma-separated string) of header names."""
    from ..secure.redact import secret_names

    name = "RETRYQUEUE_SECRET_HEADERS"
    value = raw_setting(settings, name)
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(
        isinstance(v, str) for v in value
    ):
        raise ConfigError(f"{name} must be a list of header names, got {value!r}")
    return secret_names(value)


def encryption_setting(settings: Any) -> RequestCipher | None:
    """RETRYQUEUE_ENCRYPTION_KEYS as a cipher; None when no key is set (no encryption)."""
    from ..secure.encryption import cipher_for, parse_keys

    return cipher_for(parse_keys(raw_setting(settings, "RETRYQUEUE_ENCRYPTION_KEYS")))


def redis_url_setting_name(settings: Any) -> str:
    """Which setting names the Redis the crawl uses (see :func:`redis_url_from_settings`)."""
    return _redis_address(settings)[1]


def redact_url(url: str) -> str:
    """*url* with any password replaced, for logs and error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _log_level(settings: Any, name: str) -> int:
    value = raw_setting(settings, name)
    level = logging.getLevelName(value.upper()) if isinstance(value, str) else value
    if not isinstance(level, int) or isinstance(level, bool):
        raise ConfigError(f"{name} must be a logging level like 'WARNING', got {value!r}")
    return level


def namespace_setting(settings: Any) -> str:
    """RETRYQUEUE_NAMESPACE; when None, the project's BOT_NAME (as a namespace can
    hold it), unless BOT_NAME is Scrapy's default: then "" (no namespace)."""
    from ..settings.names import project_name, usable_project

    name = "RETRYQUEUE_NAMESPACE"
    value = raw_setting(settings, name)
    if value is None:
        get_priority = getattr(settings, "getpriority", None)
        bot = settings.get("BOT_NAME")
        if get_priority is None or not bot or (get_priority("BOT_NAME") or 0) <= 0:
            return ""
        return project_name(str(bot))
    if not isinstance(value, str) or not usable_project(value):
        raise ConfigError(
            f"{name} must be 1-64 letters, digits, '_', '.' or '-' (or '' for keys without "
            f"a namespace), got {value!r}"
        )
    return value


def _optional_str(settings: Any, name: str) -> str | None:
    value = raw_setting(settings, name)
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return os.fspath(value)


def _node_id(settings: Any) -> str | None:
    name = "RETRYQUEUE_NODE_ID"
    value = _optional_str(settings, name)
    if value is None:
        return None
    if len(value) > defaults.NODE_ID_MAX or not value.isprintable():
        raise ConfigError(
            f"{name} must be at most {defaults.NODE_ID_MAX} printable characters (it names the "
            f"node's spool file), got {shown(value, 60)}"
        )
    return value


def _retry_hook(settings: Any) -> Any:
    name = "RETRYQUEUE_RETRY_HOOK"
    value = raw_setting(settings, name)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = load_object(value)
        except (ImportError, AttributeError, NameError, ValueError) as exc:
            raise ConfigError(f"{name} {value!r} does not import: {exc}") from None
    if not callable(value):
        raise ConfigError(f"{name} must be a callable or its import path, got {value!r}")
    return value


def _backoff(settings: Any) -> Any:
    """RETRYQUEUE_BACKOFF: a class (or its import path), or an object with a ``delay`` method."""
    name = "RETRYQUEUE_BACKOFF"
    value = raw_setting(settings, name)
    if value is None or value == "":
        return ExponentialBackoff
    if isinstance(value, str):
        try:
            value = load_object(value)
        except (ImportError, AttributeError, NameError, ValueError) as exc:
            raise ConfigError(f"{name} {value!r} does not import: {exc}") from None
    if not callable(getattr(value, "delay", None)):
        raise ConfigError(
            f"{name} must be a class (or its import path) or an object with a delay(ctx) "
            f"method, got {value!r}"
        )
    return value


def build_backoff(value: Any, crawler: Crawler | None = None) -> BackoffStrategy:
    """The strategy of a loaded RETRYQUEUE_BACKOFF: a class is built with Scrapy's
    ``build_from_crawler`` (its ``from_crawler`` when it has one), or plainly
    without a crawler; an object is used as it is."""
    if not isinstance(value, type):
        return value
    try:
        if crawler is None:
            return value()
        from scrapy.utils.misc import build_from_crawler

        return build_from_crawler(value, crawler)
    except Exception as exc:
        raise ConfigError(
            f"RETRYQUEUE_BACKOFF {value.__module__}.{value.__qualname__} could not be built: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def _dead_log_levels(settings: Any, table: KindTable) -> dict[str, int]:
    levels: dict[str, int] = {}
    for kind in table:
        level = kind.dead_log_level
        if level.startswith("setting:"):
            levels[kind.name] = _log_level(settings, level.removeprefix("setting:"))
        else:
            levels[kind.name] = logging.getLevelName(level)
    return levels


def load_config(settings: Any) -> Config:
    """Read and validate every RETRYQUEUE_* setting of a Scrapy Settings object."""
    max_in_flight = raw_setting(settings, "RETRYQUEUE_MAX_IN_FLIGHT")
    if max_in_flight is None or max_in_flight == "":
        # Scrapy's own default when a bare Settings lacks it (or sets 0).
        concurrency = default_settings.CONCURRENT_REQUESTS
        max_in_flight = int(settings.getint("CONCURRENT_REQUESTS", concurrency) or concurrency)
    else:
        max_in_flight = number_setting(settings, "RETRYQUEUE_MAX_IN_FLIGHT", minimum=1, whole=True)
    node_id = _node_id(settings) or f"{socket.gethostname()}:{os.getpid()}"
    poll = number_setting(settings, "RETRYQUEUE_POLL_INTERVAL", strict=True)
    lease = number_setting(settings, "RETRYQUEUE_LEASE_TIME", strict=True)
    if lease < 3 * poll:
        raise ConfigError(
            f"RETRYQUEUE_LEASE_TIME ({lease}) must be at least 3 x RETRYQUEUE_POLL_INTERVAL "
            f"({poll}), so leases are renewed before they expire"
        )
    kind_table = kinds_setting(settings)
    backoff = _backoff(settings)
    scrapy_retry = read_scrapy_retry(settings, kind_table)
    priority_adjust = number_setting(
        settings, "RETRYQUEUE_PRIORITY_ADJUST", minimum=-(10**9), whole=True
    )
    if scrapy_retry.priority_adjust is not None:
        priority_adjust = scrapy_retry.priority_adjust
    cooldown_base = number_setting(settings, "RETRYQUEUE_COOLDOWN_BASE", strict=True)
    cooldown_max = number_setting(settings, "RETRYQUEUE_COOLDOWN_MAX", strict=True)
    if cooldown_max < cooldown_base:
        raise ConfigError(
            f"RETRYQUEUE_COOLDOWN_MAX ({cooldown_max}) is below "
            f"RETRYQUEUE_COOLDOWN_BASE ({cooldown_base})"
        )
    config = Config(
        enabled=bool_setting(settings, "RETRYQUEUE_ENABLED"),
        redis_url=redis_url_from_settings(settings),
        redis_url_setting=redis_url_setting_name(settings),
        redis_client_settings=scrapy_redis_client_settings(settings),
        start_without_redis=bool_setting(settings, "RETRYQUEUE_START_WITHOUT_REDIS"),
        fleet_wait=float(number_setting(settings, "RETRYQUEUE_FLEET_WAIT")),
        secret_headers=secret_headers_setting(settings),
        encryption=encryption_setting(settings),
        wait_log_interval=float(
            number_setting(settings, "RETRYQUEUE_WAIT_LOG_INTERVAL", strict=True)
        ),
        redis_cluster=bool_setting(settings, "RETRYQUEUE_REDIS_CLUSTER"),
        redis_cluster_nodes=cluster_nodes_setting(settings),
        spool_memory=number_setting(settings, "RETRYQUEUE_SPOOL_MEMORY", whole=True),
        spool_max=number_setting(settings, "RETRYQUEUE_SPOOL_MAX", minimum=1, whole=True),
        kinds=kind_table,
        backoff=backoff,
        # A class is built per crawler (config_for); until then the default strategy.
        policy_table=_policies(
            settings, scrapy_retry, kind_table, None if isinstance(backoff, type) else backoff
        ),
        status_kinds=_status_kinds(settings, scrapy_retry, kind_table),
        exception_kinds=_exception_kinds(settings, scrapy_retry, kind_table),
        poll_interval=float(poll),
        lease_time=float(lease),
        max_in_flight=int(max_in_flight),
        idle_timeout=float(number_setting(settings, "RETRYQUEUE_IDLE_TIMEOUT")),
        max_reclaims=number_setting(settings, "RETRYQUEUE_MAX_RECLAIMS", whole=True),
        priority_adjust=int(priority_adjust),
        node_id=node_id,
        namespace=namespace_setting(settings),
        events_maxlen=number_setting(settings, "RETRYQUEUE_EVENTS_MAXLEN", minimum=1, whole=True),
        audit_log=_optional_str(settings, "RETRYQUEUE_AUDIT_LOG"),
        audit_rotation=str(raw_setting(settings, "RETRYQUEUE_AUDIT_ROTATION")),
        audit_retention=str(raw_setting(settings, "RETRYQUEUE_AUDIT_RETENTION")),
        embedded_dir=_optional_str(settings, "RETRYQUEUE_EMBEDDED_DIR"),
        embedded_keep=bool_setting(settings, "RETRYQUEUE_EMBEDDED_KEEP"),
        forbidden_log_level=_log_level(settings, "RETRYQUEUE_FORBIDDEN_LOG_LEVEL"),
        dead_log_levels=_dead_log_levels(settings, kind_table),
        dead_log_limit=number_setting(settings, "RETRYQUEUE_DEAD_LOG_LIMIT", whole=True),
        retry_hook=_retry_hook(settings),
        domain_cooldown=bool_setting(settings, "RETRYQUEUE_DOMAIN_COOLDOWN"),
        cooldown_base=float(cooldown_base),
        cooldown_max=float(cooldown_max),
        burst_threshold=number_setting(
            settings, "RETRYQUEUE_BURST_THRESHOLD", minimum=1, whole=True
        ),
        burst_window=float(number_setting(settings, "RETRYQUEUE_BURST_WINDOW", strict=True)),
        cooldown_probe_permanent=bool_setting(settings, "RETRYQUEUE_COOLDOWN_PROBE_PERMANENT"),
        item_replay=bool_setting(settings, "RETRYQUEUE_ITEM_REPLAY"),
        deferral_max_wait=(
            None
            if raw_setting(settings, "RETRYQUEUE_DEFERRAL_MAX_WAIT") in (None, "")
            else float(number_setting(settings, "RETRYQUEUE_DEFERRAL_MAX_WAIT", strict=True))
        ),
        retry_times=scrapy_retry.retry_times,
        scrapy_retry_times=settings.getint("RETRY_TIMES", 2) if hasattr(settings, "getint") else 2,
        give_up_log_level=scrapy_retry.give_up_log_level,
        own_budget_kinds=frozenset(
            kind for kind, fields in own_policy_fields(settings).items() if "max_retries" in fields
        ),
        notices=(*scrapy_retry.notices, *unknown_settings(_setting_names(settings))),
        learned_stats=bool_setting(settings, "RETRYQUEUE_LEARNED_STATS"),
        learned_half_life=float(
            number_setting(settings, "RETRYQUEUE_LEARNED_HALF_LIFE", strict=True, finite=True)
        ),
        learned_max_records=number_setting(
            settings, "RETRYQUEUE_LEARNED_MAX_RECORDS", minimum=1, whole=True
        ),
        learned_refresh=float(
            number_setting(settings, "RETRYQUEUE_LEARNED_REFRESH", strict=True, finite=True)
        ),
        **retry_budget_settings(settings),
    )
    # Read only by LearnedBackoff and the Spidermon monitors (at the crawl's
    # end), but said at start like the others: a crawl must not run for hours
    # to learn that its alert threshold is not a number.
    learned_backoff_settings(settings)
    monitor_thresholds(settings)
    return config


def retry_budget_settings(settings: Any) -> dict[str, float]:
    """RETRYQUEUE_RETRY_BUDGET (a share, 0: off), its floor and window, checked.

    The floor must be above 0: a domain the crawl sends no fresh request to any
    more would otherwise never get its waiting retries, and the crawl would not end.
    """
    return {
        "retry_budget": float(
            number_setting(settings, "RETRYQUEUE_RETRY_BUDGET", maximum=defaults.RETRY_BUDGET_MAX)
        ),
        "retry_budget_floor": float(
            number_setting(
                settings,
                "RETRYQUEUE_RETRY_BUDGET_FLOOR",
                strict=True,
                maximum=defaults.RETRY_BUDGET_FLOOR_MAX,
            )
        ),
        "retry_budget_window": float(
            number_setting(
                settings,
                "RETRYQUEUE_RETRY_BUDGET_WINDOW",
                minimum=defaults.RETRY_BUDGET_WINDOW_MIN,
                maximum=defaults.RETRY_BUDGET_WINDOW_MAX,
            )
        ),
    }


def learned_backoff_settings(settings: Any) -> tuple[float, float, float]:
    """(RETRYQUEUE_LEARNED_SKIP_BELOW, RETRYQUEUE_LEARNED_EARLY_AT,
    RETRYQUEUE_LEARNED_MIN_OUTAGES), checked."""
    skip = number_setting(settings, "RETRYQUEUE_LEARNED_SKIP_BELOW", strict=True, maximum=1)
    early = number_setting(settings, "RETRYQUEUE_LEARNED_EARLY_AT", strict=True, maximum=1)
    if skip >= early:
        raise ConfigError(
            f"RETRYQUEUE_LEARNED_SKIP_BELOW ({skip!r}) must be below "
            f"RETRYQUEUE_LEARNED_EARLY_AT ({early!r})"
        )
    outages = number_setting(
        settings,
        "RETRYQUEUE_LEARNED_MIN_OUTAGES",
        minimum=1,
        finite=True,
        maximum=defaults.SETTING_INT_MAX,
    )
    return float(skip), float(early), float(outages)


@dataclass(frozen=True, slots=True)
class MonitorThresholds:
    """The Spidermon monitors' thresholds (RETRYQUEUE_MONITOR_*, monitors.py)."""

    max_bans: int
    #: Kind (or "*", every kind not named) -> most dead letters.
    max_dead: Mapping[str, int]
    max_pending: int
    #: Share (0 to 1) of retried failures that must recover.
    min_recovery: float


def monitor_thresholds(settings: Any) -> MonitorThresholds:
    """RETRYQUEUE_MONITOR_*, checked: whole numbers >= 0 (at most what a setting
    holds), and a share from 0 to 1."""
    name = "RETRYQUEUE_MONITOR_MAX_DEAD"
    value = _maybe_json(name, raw_setting(settings, name))
    if value is None:
        value = kinds.MONITOR_MAX_DEAD
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a dict of kind -> most dead letters, got {shown(value)}")
    max_dead = {}
    for kind, limit in value.items():
        if (
            not isinstance(limit, int)
            or isinstance(limit, bool)
            or not 0 <= limit <= defaults.SETTING_INT_MAX
        ):
            raise ConfigError(
                f"{name}[{shown(kind, 80)}] must be a whole number from 0 to "
                f"{defaults.SETTING_INT_MAX}, got {shown(limit)}"
            )
        max_dead[str(kind)] = limit
    minimum = number_setting(settings, "RETRYQUEUE_MONITOR_MIN_RECOVERY", maximum=1)
    return MonitorThresholds(
        max_bans=number_setting(settings, "RETRYQUEUE_MONITOR_MAX_BANS", whole=True),
        max_dead=max_dead,
        max_pending=number_setting(settings, "RETRYQUEUE_MONITOR_MAX_PENDING", whole=True),
        min_recovery=float(minimum),
    )


def _setting_names(settings: Any) -> list[Any]:
    """The names *settings* holds: a Scrapy Settings object or a dict."""
    try:
        return list(settings)
    except TypeError:
        return []


#: Each crawler's validated settings (or the ConfigError they raised).
_CONFIGS: WeakKeyDictionary[Crawler, Config | ConfigError] = WeakKeyDictionary()


def config_for(crawler: Crawler) -> Config:
    """The crawler's settings, validated once and shared by its components.

    Call it once the crawler's settings are final (from ``from_crawler`` on).
    A bad setting raises the same :class:`ConfigError` on every call, without
    reading the settings again.
    """
    cached = _CONFIGS.get(crawler)
    if cached is None:
        try:
            cached = load_config(crawler.settings)
            cached.policy_table.backoff = build_backoff(cached.backoff, crawler)
        except ConfigError as exc:
            cached = exc
        _CONFIGS[crawler] = cached
    if isinstance(cached, ConfigError):
        # A fresh traceback each time, not one that grows with every raise.
        raise cached.with_traceback(None)
    return cached
