"""How failures are retried: kinds, policies, status and exception kinds, backoff, the hook.

RETRYQUEUE_KINDS, RETRYQUEUE_POLICIES and RETRYQUEUE_DOMAIN_POLICIES, the status and
exception tables, RETRYQUEUE_BACKOFF, RETRYQUEUE_RETRY_HOOK and the dead letters' log
levels, each merged over the built-in table (:mod:`~scrapy_retryqueue.decision.kinds`)
and what the project's RETRY_* settings ask (:mod:`.scrapycompat`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from ..decision import kinds
from ..decision.backoff import BackoffStrategy, ExponentialBackoff
from ..decision.classify import exception_class, exception_kinds_of
from ..decision.kinds import KindTable
from ..decision.policy import POLICY_FIELD_NAMES, Policy, PolicyTable
from ..exceptions import ConfigError
from ..values import shown
from .readers import log_level_setting, maybe_json, number_setting, raw_setting
from .scrapycompat import ScrapyRetry

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


def kinds_setting(settings: Any) -> KindTable:
    """RETRYQUEUE_KINDS: the built-in kinds plus the project's own, validated.

    Cheap and Scrapy-free: the commands and the dashboard read their kinds here too.
    """
    name = "RETRYQUEUE_KINDS"
    table = KindTable.with_declared(
        maybe_json(name, raw_setting(settings, name)), policy_fields=POLICY_FIELD_NAMES, where=name
    )
    for kind in table.declared:
        # The policy's values are checked here, once, with the setting's name.
        Policy.from_dict(table[kind].policy, where=f"{name}[{kind!r}]")
    return table


def _base_policy(table: KindTable, kind: str) -> Policy:
    where = f"defaults[{kind!r}]" if kind in kinds.POLICIES else f"RETRYQUEUE_KINDS[{kind!r}]"
    return Policy.from_dict(kinds.POLICIES.get(kind) or table[kind].policy, where=where)


def policy_table_setting(
    settings: Any,
    scrapy_retry: ScrapyRetry,
    table: KindTable,
    backoff: BackoffStrategy | None,
) -> PolicyTable:
    """RETRYQUEUE_POLICIES and RETRYQUEUE_DOMAIN_POLICIES merged over each kind's default
    policy and the RETRY_* settings' fields: the crawl's policy table."""
    name = "RETRYQUEUE_POLICIES"
    user = maybe_json(name, raw_setting(settings, name))
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
    per_domain_raw = maybe_json(dname, raw_setting(settings, dname))
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


def status_kinds_setting(
    settings: Any, scrapy_retry: ScrapyRetry, table: KindTable
) -> dict[int, str]:
    """RETRYQUEUE_STATUS_KINDS over the built-in table and RETRY_HTTP_CODES: status -> kind."""
    name = "RETRYQUEUE_STATUS_KINDS"
    user = maybe_json(name, raw_setting(settings, name))
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


def exception_kinds_setting(
    settings: Any, scrapy_retry: ScrapyRetry, table: KindTable
) -> dict[type, str]:
    """RETRYQUEUE_EXCEPTION_KINDS over the built-in table and RETRY_EXCEPTIONS: class -> kind."""
    name = "RETRYQUEUE_EXCEPTION_KINDS"
    user = maybe_json(name, raw_setting(settings, name))
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


def dead_log_levels_setting(settings: Any, table: KindTable) -> dict[str, int]:
    """Kind -> level of its dead letters' log line; a "setting:NAME" level is read from NAME."""
    levels: dict[str, int] = {}
    for kind in table:
        level = kind.dead_log_level
        if level.startswith("setting:"):
            levels[kind.name] = log_level_setting(settings, level.removeprefix("setting:"))
        else:
            levels[kind.name] = logging.getLevelName(level)
    return levels


def backoff_setting(settings: Any) -> Any:
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


def retry_hook_setting(settings: Any) -> Any:
    """RETRYQUEUE_RETRY_HOOK loaded: a callable (or a class); None when unset."""
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
