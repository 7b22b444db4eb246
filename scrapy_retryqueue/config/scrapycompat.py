"""Scrapy's RETRY_* settings, as a project sets them, mapped onto the queue's own.

A project that enables the add-on keeps the meaning of what it wrote for
Scrapy's RetryMiddleware. Only values the project set count (any priority
above Scrapy's defaults); a RETRYQUEUE_* setting always wins over its RETRY_*
counterpart. Where a value cannot be honoured exactly, a notice says what
happens instead; the runtime logs each one once, as a WARNING, at start.
The mapping is documented in docs/coming-from-retry.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..decision import kinds
from ..decision.classify import exception_class, exception_kinds_of
from ..exceptions import ConfigError


def project_set(settings: Any, name: str) -> bool:
    """True when the project (settings.py, a spider, the command line) set *name*."""
    getpriority = getattr(settings, "getpriority", None)
    if getpriority is None:  # a plain dict: whatever it holds was set on purpose
        return name in settings
    return (getpriority(name) or 0) > 0


@dataclass(slots=True)
class ScrapyRetry:
    """What a project's RETRY_* settings ask of the queue."""

    #: Kind -> policy fields to merge over the defaults, for kinds that
    #: RETRYQUEUE_POLICIES does not name.
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: HTTP status -> kind (None: not a failure), for statuses that
    #: RETRYQUEUE_STATUS_KINDS does not name.
    status_kinds: dict[int, str | None] = field(default_factory=dict)
    #: Exception class path -> kind, for classes RETRYQUEUE_EXCEPTION_KINDS does not name.
    exception_kinds: dict[str, str] = field(default_factory=dict)
    priority_adjust: int | None = None
    give_up_log_level: int | None = None
    #: RETRY_TIMES: a cap on all retries of a request, over every kind.
    retry_times: int | None = None
    #: What could not be honoured exactly, and what happens instead.
    notices: list[str] = field(default_factory=list)


def own_policy_fields(settings: Any) -> dict[str, frozenset[str]]:
    """Kind -> the policy fields the project set for it (those win over RETRY_*): in
    RETRYQUEUE_POLICIES, and in RETRYQUEUE_KINDS for a kind of its own."""
    own: dict[str, set[str]] = {}
    for name in ("RETRYQUEUE_KINDS", "RETRYQUEUE_POLICIES"):
        value = settings.get(name)
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                continue  # retrying.py reports the bad value
        if not isinstance(value, Mapping):
            continue
        for kind, fields in value.items():
            named = own.setdefault(str(kind), set())
            if isinstance(fields, Mapping):
                named.update(str(f) for f in fields if f not in kinds.TRAITS)
    return {kind: frozenset(fields) for kind, fields in own.items()}


def _ascii_digits(value: Any) -> bool:
    """0-9 only: ``str.isdigit()`` alone accepts "²", which ``int()`` refuses."""
    text = str(value)
    return text.isascii() and text.isdigit()


def _user_keys(settings: Any, name: str) -> set[Any]:
    value = settings.get(name)
    return set(value) if isinstance(value, Mapping) else set()


def read_scrapy_retry(
    settings: Any, kind_table: kinds.KindTable = kinds.BUILTIN_TABLE
) -> ScrapyRetry:
    """What the project's RETRY_* settings ask of the queue; *kind_table* says which
    kinds are download failures (what RETRY_ENABLED and RETRY_TIMES cover)."""
    result = ScrapyRetry()
    own = own_policy_fields(settings)
    download_kinds = kind_table.named("download")

    if project_set(settings, "RETRY_ENABLED") and not settings.getbool("RETRY_ENABLED"):
        off = [k for k in download_kinds if "retry" not in own.get(k, ())]
        for kind in off:
            result.policies[kind] = {"retry": False}
        result.notices.append(
            "RETRY_ENABLED = False: failed downloads are not retried; they are still kept "
            "as dead letters (kinds " + ", ".join(off) + f"), and callback ({kinds.PARSE}) "
            f"and item ({kinds.STORAGE}) failures are still retried"
        )

    if project_set(settings, "RETRY_TIMES"):
        times = settings.get("RETRY_TIMES")
        if isinstance(times, bool) or not isinstance(times, (int, str)) or not _ascii_digits(times):
            raise ConfigError(f"RETRY_TIMES must be a whole number >= 0, got {times!r}")
        result.retry_times = int(times)
        for kind in download_kinds:
            if "max_retries" not in own.get(kind, ()):
                result.policies.setdefault(kind, {})["max_retries"] = int(times)

    if project_set(settings, "RETRY_HTTP_CODES"):
        _map_http_codes(settings, result)

    if project_set(settings, "RETRY_EXCEPTIONS"):
        _map_exceptions(settings, result)

    if project_set(settings, "RETRY_PRIORITY_ADJUST") and not project_set(
        settings, "RETRYQUEUE_PRIORITY_ADJUST"
    ):
        try:
            result.priority_adjust = int(settings.get("RETRY_PRIORITY_ADJUST"))
        except (TypeError, ValueError):
            raise ConfigError(
                "RETRY_PRIORITY_ADJUST must be a whole number, "
                f"got {settings.get('RETRY_PRIORITY_ADJUST')!r}"
            ) from None
        result.notices.append(
            f"RETRY_PRIORITY_ADJUST = {result.priority_adjust}: applied once when a request "
            "first fails, not again on each retry"
        )

    if project_set(settings, "RETRY_GIVE_UP_LOG_LEVEL"):
        value = settings.get("RETRY_GIVE_UP_LOG_LEVEL")
        level = logging.getLevelName(value.upper()) if isinstance(value, str) else value
        if not isinstance(level, int) or isinstance(level, bool):
            raise ConfigError(
                f"RETRY_GIVE_UP_LOG_LEVEL must be a logging level like 'ERROR', got {value!r}"
            )
        result.give_up_log_level = level
    return result


def _map_http_codes(settings: Any, result: ScrapyRetry) -> None:
    try:
        codes = {int(code) for code in settings.getlist("RETRY_HTTP_CODES")}
    except (TypeError, ValueError):
        raise ConfigError(
            f"RETRY_HTTP_CODES must be a list of HTTP statuses, got {settings.get('RETRY_HTTP_CODES')!r}"
        ) from None
    own = {int(s) for s in _user_keys(settings, "RETRYQUEUE_STATUS_KINDS") if _ascii_digits(s)}
    retried = {status for status, kind in kinds.STATUS_KINDS.items() if _retried(kind)}
    for status in sorted(codes - retried - own):
        if not 100 <= status <= 599:
            raise ConfigError(f"RETRY_HTTP_CODES holds {status!r}, not an HTTP status (100-599)")
        if status in kinds.STATUS_KINDS:
            # A 404 or 403 the project retries: as the status table's kind
            # would dead-letter it, retry it as a server error.
            result.notices.append(
                f"RETRY_HTTP_CODES includes {status}: retried as {kinds.SERVER_ERROR} instead of "
                f"being dead-lettered as {kinds.STATUS_KINDS[status]}"
            )
        result.status_kinds[status] = kinds.SERVER_ERROR
    for status in sorted(retried - codes - own):
        result.status_kinds[status] = None


def _map_exceptions(settings: Any, result: ScrapyRetry) -> None:
    listed = [
        exception_class(entry, where="RETRY_EXCEPTIONS entry")
        for entry in settings.getlist("RETRY_EXCEPTIONS")
    ]
    own = {str(k) for k in _user_keys(settings, "RETRYQUEUE_EXCEPTION_KINDS")}
    table = exception_kinds_of(kinds.EXCEPTION_KINDS)
    for cls in listed:
        path = f"{cls.__module__}.{cls.__qualname__}"
        if path in own or any(issubclass(cls, known) for known in table):
            continue
        # Retried, as Scrapy would: a failure of the connection is the closest kind.
        result.exception_kinds[path] = kinds.CONNECTION
    dropped = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for cls, kind in table.items()
        if _retried(kind)
        and not any(issubclass(cls, wanted) or issubclass(wanted, cls) for wanted in listed)
        and f"{cls.__module__}.{cls.__qualname__}" not in own
    )
    if dropped:
        result.notices.append(
            "RETRY_EXCEPTIONS leaves out exceptions the queue retries by default ("
            + ", ".join(dropped)
            + "); they are still retried by their kind's policy: to stop that, map them in "
            "RETRYQUEUE_EXCEPTION_KINDS or turn their kinds off in RETRYQUEUE_POLICIES"
        )


def _retried(kind: str) -> bool:
    """A built-in kind that its default policy retries (what Scrapy's RETRY_* lists cover)."""
    return kinds.BUILTIN_BY_NAME[kind].retry
