"""The failure kinds: one table of records, the only place a kind's name is spelled.

A kind says what the rest of the code needs to know about a failure: whether
it is retried and with which default policy, whether it counts against a
domain's breaker, whether it is a download failure, at which level its dead
letters are logged, and whether the queue itself produces it. The built-in
kinds are the entries of :data:`BUILTIN`; a project declares more with
``RETRYQUEUE_KINDS``, checked here (:meth:`KindTable.with_declared`) when
:mod:`scrapy_retryqueue.config` builds a crawler's :class:`KindTable`.

Code that needs one kind by its role names the constant below (``kinds.PARSE``),
never the string: a test holds that no kind literal appears outside this module.
Lua scripts get the kinds they write through ARGV.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import ConfigError
from ..settings.defaults import POLICY_FIELDS

# -- the built-in kinds, by role ---------------------------------------------------

TIMEOUT = "timeout"
CONNECTION = "connection"
DNS = "dns"
RATE_LIMITED = "rate_limited"
SERVER_ERROR = "server_error"
#: A callback raised (RetryQueueSpiderMiddleware).
PARSE = "parse"
#: An item pipeline failed (item_error).
STORAGE = "storage"
NOT_FOUND = "not_found"
FORBIDDEN = "forbidden"
#: The project said so (PermanentFailure).
RULE = "rule"
#: An exception that no RETRYQUEUE_EXCEPTION_KINDS entry matches.
UNKNOWN = "unknown"
#: A request that cannot be stored as JSON (meta, cb_kwargs, callback).
UNSERIALIZABLE = "unserializable"
#: A stored envelope that cannot be read back.
MALFORMED = "malformed"
#: A task reclaimed more than RETRYQUEUE_MAX_RECLAIMS times (reap.lua).
POISON = "poison"
#: A stored entry the crawl did not write where it sits (RETRYQUEUE_SIGNING_KEYS):
#: unsigned, a bad signature, an unknown key, moved, or a replay. Never fetched.
FORGED = "forged"
#: A retry that RETRYQUEUE_RETRY_HOOK refused.
VETOED = "vetoed"
#: A fresh request parked because its domain cools down: not a failure, no
#: budget used (RETRYQUEUE_DOMAIN_COOLDOWN).
DEFERRED = "deferred"

#: Log levels a kind's dead letters may be logged at. "setting:NAME" defers to
#: a setting (forbidden: RETRYQUEUE_FORBIDDEN_LOG_LEVEL).
DEAD_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True, slots=True)
class Kind:
    """One failure kind and what the code needs to know about it."""

    name: str
    #: Its default policy fields (policy.Policy's), merged over POLICY_FIELDS.
    policy: Mapping[str, Any] = field(default_factory=dict)
    #: Counts against a domain's circuit breaker (RETRYQUEUE_DOMAIN_COOLDOWN).
    breaker: bool = False
    #: Counts towards a domain's burst of failures (RETRYQUEUE_BURST_THRESHOLD);
    #: a breaker kind that is not a burst kind (rate_limited) trips the domain at once.
    burst: bool = False
    #: A failure of the download itself (what Scrapy's RETRY_EXCEPTIONS and
    #: RETRY_HTTP_CODES cover), as opposed to a callback's or a pipeline's.
    download: bool = False
    #: Level of its dead letters' log line.
    dead_log_level: str = "ERROR"
    #: Produced by the queue itself: no policy covers it and none can be
    #: configured; never retried (a deferred task waits for its domain instead).
    internal: bool = False
    #: RETRYQUEUE_COOLDOWN_PROBE_PERMANENT gives it one more try when it comes
    #: from a domain cooling down (the site's overload may be its cause).
    cooldown_probe: bool = False

    @property
    def retry(self) -> bool:
        """Retried by its default policy."""
        return bool(self.policy.get("retry", False))


def _retried(base_delay: float, max_delay: float, max_retries: int) -> dict[str, Any]:
    # The multiplier and the jitter come from defaults.POLICY_FIELDS.
    return {
        "retry": True,
        "base_delay": base_delay,
        "max_delay": max_delay,
        "max_retries": max_retries,
    }


_NEVER: dict[str, Any] = {"retry": False}

#: The built-in kinds, in the order people see them. The delays were chosen
#: against measured crawls (benchmarks/defaults.py, docs/settings.md "Why these
#: defaults"): a short first delay, since in a "next page" chain every second a
#: retry waits delays every later page, and enough retries that the whole chain
#: of waits still covers an outage as long as the longer delays did. Every
#: delay is shorter than the default RETRYQUEUE_IDLE_TIMEOUT, so a one-shot
#: `scrapy crawl` runs every retry of its failures before it closes (unless a
#: server's Retry-After asks for longer).
BUILTIN: tuple[Kind, ...] = (
    # 1, 2, 4, 8, 16 s before jitter: each try has already waited DOWNLOAD_TIMEOUT
    # (180 s by default): more tries would mostly hold download slots on a site
    # that does not answer.
    Kind(TIMEOUT, _retried(1.0, 120.0, 5), breaker=True, burst=True, download=True),
    # 1, 2, 4 ... 64, 120 s: 247 s in all.
    Kind(CONNECTION, _retried(1.0, 120.0, 8), breaker=True, burst=True, download=True),
    # Not measured (the flaky site has no DNS failures): a name that does not
    # resolve is more often gone for good than back a second later.
    Kind(DNS, _retried(30.0, 120.0, 3), download=True),
    # Without Retry-After only (the server's word wins): 5, 10 ... 240 s, 1035 s in all.
    Kind(RATE_LIMITED, _retried(5.0, 240.0, 9), breaker=True, download=True),
    # 1, 2, 4 ... 128, 240 s: 495 s in all.
    Kind(SERVER_ERROR, _retried(1.0, 240.0, 9), breaker=True, burst=True, download=True),
    # Stock Scrapy never retries a callback's error: two quick tries catch a page
    # served broken once, and a callback that always fails costs 3 to 6 s.
    Kind(PARSE, _retried(2.0, 30.0, 2)),
    # A database that refused a write usually takes it a moment later.
    Kind(STORAGE, _retried(1.0, 60.0, 5)),
    # The site or the project chose these: logged at INFO, not ERROR.
    Kind(NOT_FOUND, _NEVER, dead_log_level="INFO", cooldown_probe=True),
    Kind(
        FORBIDDEN,
        _NEVER,
        dead_log_level="setting:RETRYQUEUE_FORBIDDEN_LOG_LEVEL",
        cooldown_probe=True,
    ),
    Kind(RULE, _NEVER, dead_log_level="INFO"),
    Kind(UNKNOWN, _retried(60.0, 120.0, 2), download=True),
    Kind(UNSERIALIZABLE, internal=True),
    Kind(MALFORMED, internal=True),
    Kind(POISON, internal=True),
    # WARNING, not ERROR: the crawl did what it should (the entry is refused and
    # kept for the audit); the line names the task and why.
    Kind(FORGED, internal=True, dead_log_level="WARNING"),
    Kind(VETOED, internal=True, dead_log_level="INFO"),
    Kind(DEFERRED, internal=True),
)

#: Built-in kinds by name.
BUILTIN_BY_NAME: dict[str, Kind] = {kind.name: kind for kind in BUILTIN}

#: The traits a project's kind may set in RETRYQUEUE_KINDS, beside its policy
#: fields (internal is the queue's own: no project kind has it).
TRAITS = ("breaker", "burst", "download", "dead_log_level", "cooldown_probe")
#: What a project's kind may be called: it ends up in stat names, log lines,
#: command-line filters and metric labels.
#: Longest kind name: the store's kind columns hold 32 characters.
NAME_MAX = 32
NAME_PATTERN = re.compile(rf"[a-z][a-z0-9_]{{0,{NAME_MAX - 1}}}")
_KINDS_SETTING = "RETRYQUEUE_KINDS"


class KindTable:
    """The kinds one crawl knows: the built-in ones and its project's own.

    Pure and read-only once built; :mod:`scrapy_retryqueue.config` builds one
    per crawler from ``RETRYQUEUE_KINDS`` (:meth:`with_declared`), and the
    commands and the dashboard build theirs from the same setting.
    """

    __slots__ = ("_by_name", "declared")

    def __init__(self, kinds: Collection[Kind] = BUILTIN) -> None:
        self._by_name: dict[str, Kind] = {kind.name: kind for kind in kinds}
        #: The project's own kinds' names, in the order it declared them.
        self.declared: tuple[str, ...] = tuple(
            kind.name for kind in kinds if kind.name not in BUILTIN_BY_NAME
        )

    @classmethod
    def with_declared(
        cls,
        declared: Any,
        *,
        policy_fields: Collection[str],
        where: str = _KINDS_SETTING,
    ) -> KindTable:
        """The built-in kinds plus *declared* (a RETRYQUEUE_KINDS value: name -> fields).

        *policy_fields* are the names a kind's policy may set (policy.Policy's);
        their values are checked where the policy is built. ConfigError names
        *where*, the kind and the bad field, and shows the value.
        """
        if declared is None or declared == "":
            return cls()
        if not isinstance(declared, Mapping):
            raise ConfigError(f"{where} must be a dict of kind name -> fields, got {declared!r}")
        kinds = list(BUILTIN)
        for name, fields in declared.items():
            kinds.append(_declared_kind(name, fields, policy_fields=policy_fields, where=where))
        return cls(kinds)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Kind]:
        return iter(self._by_name.values())

    def __getitem__(self, name: str) -> Kind:
        return self._by_name[name]

    def get(self, name: str) -> Kind | None:
        return self._by_name.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Every kind a task can have: what filters on a kind accept."""
        return tuple(self._by_name)

    @property
    def policy_names(self) -> tuple[str, ...]:
        """The kinds a policy covers: what RETRYQUEUE_POLICIES, RETRYQUEUE_STATUS_KINDS,
        RETRYQUEUE_EXCEPTION_KINDS and the meta keys may name."""
        return tuple(kind.name for kind in self._by_name.values() if not kind.internal)

    def is_internal(self, name: str) -> bool:
        kind = self._by_name.get(name)
        return kind is not None and kind.internal

    def has(self, name: str, trait: str) -> bool:
        """Whether kind *name* has *trait* (a boolean field of Kind); False when unknown."""
        kind = self._by_name.get(name)
        return kind is not None and bool(getattr(kind, trait))

    def named(self, trait: str) -> tuple[str, ...]:
        """The kinds that have *trait*, in table order."""
        return tuple(kind.name for kind in self._by_name.values() if getattr(kind, trait))


def _declared_kind(name: Any, fields: Any, *, policy_fields: Collection[str], where: str) -> Kind:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"{where} key {name!r} is not a kind name: 1 to 40 of a-z, 0-9 and _, "
            "starting with a letter"
        )
    here = f"{where}[{name!r}]"
    builtin = BUILTIN_BY_NAME.get(name)
    if builtin is not None:
        if builtin.internal:
            raise ConfigError(
                f"{here}: {name!r} is one of the queue's own kinds; pick another name"
            )
        raise ConfigError(
            f"{here}: {name!r} is a built-in kind; change its policy in RETRYQUEUE_POLICIES"
        )
    if not isinstance(fields, Mapping):
        raise ConfigError(f"{here} must be a dict of policy fields and traits, got {fields!r}")
    unknown = set(fields) - set(TRAITS) - set(policy_fields)
    if unknown:
        raise ConfigError(
            f"{here} has unknown field(s) {sorted(map(str, unknown))}; known: policy fields "
            f"{sorted(policy_fields)}, traits {sorted(TRAITS)}"
        )
    traits: dict[str, Any] = {}
    for trait in ("breaker", "burst", "download", "cooldown_probe"):
        if trait in fields:
            value = fields[trait]
            if not isinstance(value, bool):
                raise ConfigError(f"{here}[{trait!r}] must be True or False, got {value!r}")
            traits[trait] = value
    if traits.get("burst") and not traits.get("breaker"):
        # A burst is counted by the domain's breaker: without it nothing counts.
        raise ConfigError(f"{here}: burst=True needs breaker=True")
    if "dead_log_level" in fields:
        level = fields["dead_log_level"]
        if not isinstance(level, str) or level.upper() not in DEAD_LOG_LEVELS:
            raise ConfigError(
                f"{here}['dead_log_level'] must be one of {', '.join(DEAD_LOG_LEVELS)}, "
                f"got {level!r}"
            )
        traits["dead_log_level"] = level.upper()
    policy = {key: value for key, value in fields.items() if key not in TRAITS}
    return Kind(name, policy, **traits)


#: The table of the built-in kinds alone (a project that declares none).
BUILTIN_TABLE = KindTable()


# -- the built-in tables a project's settings are merged over ---------------------

#: The built-in kinds' default policies (their records in BUILTIN own
#: them), delays in seconds. RETRYQUEUE_POLICIES is merged over these key by
#: key, so it only names what it changes.
POLICIES: dict[str, dict[str, Any]] = {
    k.name: {**POLICY_FIELDS, **k.policy} for k in BUILTIN if not k.internal
}

#: RETRYQUEUE_STATUS_KINDS: which HTTP statuses are failures, and of which kind.
#: Statuses not listed pass through to the spider untouched.
STATUS_KINDS: dict[int, str] = {
    408: SERVER_ERROR,
    429: RATE_LIMITED,
    500: SERVER_ERROR,
    502: SERVER_ERROR,
    503: SERVER_ERROR,
    504: SERVER_ERROR,
    522: SERVER_ERROR,
    524: SERVER_ERROR,
    401: FORBIDDEN,
    403: FORBIDDEN,
    404: NOT_FOUND,
    410: NOT_FOUND,
}

#: RETRYQUEUE_EXCEPTION_KINDS: exception classes (import paths) → kind. The most
#: specific class in an exception's MRO wins; paths that do not import (a class
#: that an older Scrapy lacks) are skipped.
EXCEPTION_KINDS: dict[str, str] = {
    "scrapy.exceptions.DownloadTimeoutError": TIMEOUT,
    "twisted.internet.error.TimeoutError": TIMEOUT,
    "twisted.internet.error.TCPTimedOutError": TIMEOUT,
    "scrapy.exceptions.CannotResolveHostError": DNS,
    "twisted.internet.error.DNSLookupError": DNS,
    "scrapy.exceptions.DownloadConnectionRefusedError": CONNECTION,
    "scrapy.exceptions.DownloadFailedError": CONNECTION,
    "scrapy.exceptions.ResponseDataLossError": CONNECTION,
    "twisted.internet.error.ConnectionRefusedError": CONNECTION,
    "twisted.internet.error.ConnectError": CONNECTION,
    "twisted.internet.error.ConnectionLost": CONNECTION,
    "twisted.internet.error.ConnectionDone": CONNECTION,
    "twisted.web._newclient.ResponseNeverReceived": CONNECTION,
    "twisted.web._newclient.ResponseFailed": CONNECTION,
    "scrapy.core.downloader.handlers.http11.TunnelError": CONNECTION,
    "builtins.TimeoutError": TIMEOUT,
    # HttpCompressionMiddleware raises OSError on a truncated body.
    "builtins.OSError": CONNECTION,
    "scrapy_retryqueue.exceptions.PermanentFailure": RULE,
}

#: RETRYQUEUE_MONITOR_MAX_DEAD when it is not set: no dead letter of the kinds only
#: a bug, a hostile writer or a request that crashes every node produce.
MONITOR_MAX_DEAD: dict[str, int] = {MALFORMED: 0, POISON: 0, UNSERIALIZABLE: 0, FORGED: 0}
