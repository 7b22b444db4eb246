"""Every default of scrapy-retryqueue, in one place.

Settings are read through :mod:`scrapy_retryqueue.config`, which validates them
against these defaults; nothing else in the package hard-codes a default value.
"""

from __future__ import annotations

from typing import Any

#: Version of the task envelope written to Redis; readers refuse newer ones.
ENVELOPE_VERSION = 1

#: Failure kinds that the classifier can produce and the policy table covers.
RETRYABLE_KINDS = (
    "timeout",
    "connection",
    "dns",
    "rate_limited",
    "server_error",
    "parse",
    "storage",
)
PERMANENT_KINDS = ("not_found", "forbidden", "rule")
#: Kinds produced by the queue itself, never retried and not configurable.
INTERNAL_KINDS = ("unserializable", "malformed", "poison", "vetoed")
UNKNOWN_KIND = "unknown"
POLICY_KINDS = (*RETRYABLE_KINDS, *PERMANENT_KINDS, UNKNOWN_KIND)
ALL_KINDS = (*POLICY_KINDS, *INTERNAL_KINDS)

JITTER_MODES = ("none", "full", "equal")


def _policy(
    retry: bool,
    base_delay: float = 0.0,
    multiplier: float = 2.0,
    max_delay: float = 0.0,
    max_retries: int = 0,
    jitter: str = "equal",
) -> dict[str, Any]:
    return {
        "retry": retry,
        "base_delay": base_delay,
        "multiplier": multiplier,
        "max_delay": max_delay,
        "max_retries": max_retries,
        "jitter": jitter,
    }


#: RETRYQUEUE_POLICIES: per failure kind; delays in seconds. A project's value is
#: merged over this one key by key, so it only names what it changes.
POLICIES: dict[str, dict[str, Any]] = {
    # 3, 6, 12, 24, 48 s before jitter.
    "timeout": _policy(True, 3.0, 2.0, 120.0, 5),
    "connection": _policy(True, 5.0, 2.0, 300.0, 5),
    "dns": _policy(True, 30.0, 2.0, 600.0, 3),
    # Longer: hammering a site that asks us to slow down makes things worse.
    "rate_limited": _policy(True, 30.0, 2.0, 1800.0, 8),
    "server_error": _policy(True, 10.0, 2.0, 600.0, 5),
    # A layout that changed for an hour: few tries, far apart.
    "parse": _policy(True, 600.0, 2.0, 3600.0, 3),
    # A database that refused a write usually takes it a moment later.
    "storage": _policy(True, 1.0, 2.0, 60.0, 5),
    "not_found": _policy(False),
    "forbidden": _policy(False),
    "rule": _policy(False),
    "unknown": _policy(True, 60.0, 2.0, 600.0, 2),
}

#: RETRYQUEUE_STATUS_KINDS: which HTTP statuses are failures, and of which kind.
#: Statuses not listed pass through to the spider untouched.
STATUS_KINDS: dict[int, str] = {
    408: "server_error",
    429: "rate_limited",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
    522: "server_error",
    524: "server_error",
    401: "forbidden",
    403: "forbidden",
    404: "not_found",
    410: "not_found",
}

#: RETRYQUEUE_EXCEPTION_KINDS: exception classes (import paths) → kind. The most
#: specific class in an exception's MRO wins; paths that do not import (a class
#: that an older Scrapy lacks) are skipped.
EXCEPTION_KINDS: dict[str, str] = {
    "scrapy.exceptions.DownloadTimeoutError": "timeout",
    "twisted.internet.error.TimeoutError": "timeout",
    "twisted.internet.error.TCPTimedOutError": "timeout",
    "scrapy.exceptions.CannotResolveHostError": "dns",
    "twisted.internet.error.DNSLookupError": "dns",
    "scrapy.exceptions.DownloadConnectionRefusedError": "connection",
    "scrapy.exceptions.DownloadFailedError": "connection",
    "scrapy.exceptions.ResponseDataLossError": "connection",
    "twisted.internet.error.ConnectionRefusedError": "connection",
    "twisted.internet.error.ConnectError": "connection",
    "twisted.internet.error.ConnectionLost": "connection",
    "twisted.internet.error.ConnectionDone": "connection",
    "twisted.web._newclient.ResponseNeverReceived": "connection",
    "twisted.web._newclient.ResponseFailed": "connection",
    "scrapy.core.downloader.handlers.http11.TunnelError": "connection",
    "builtins.TimeoutError": "timeout",
    # HttpCompressionMiddleware raises OSError on a truncated body.
    "builtins.OSError": "connection",
    "scrapy_retryqueue.exceptions.PermanentFailure": "rule",
}

SETTINGS: dict[str, Any] = {
    "RETRYQUEUE_ENABLED": True,
    #: None: use scrapy-redis's REDIS_URL / REDIS_HOST + REDIS_PORT, else embedded.
    "RETRYQUEUE_REDIS_URL": None,
    #: Talk to the URL as a Redis Cluster (any node's address will do).
    "RETRYQUEUE_REDIS_CLUSTER": False,
    #: Writes held in memory while Redis is unreachable, before a file takes them.
    "RETRYQUEUE_SPOOL_MEMORY": 10_000,
    #: Writes the local spool holds at most; past it a failure goes to its errback.
    "RETRYQUEUE_SPOOL_MAX": 1_000_000,
    "RETRYQUEUE_POLICIES": {},
    "RETRYQUEUE_DOMAIN_POLICIES": {},
    "RETRYQUEUE_STATUS_KINDS": {},
    "RETRYQUEUE_EXCEPTION_KINDS": {},
    #: Cap on a server's Retry-After, seconds.
    "RETRYQUEUE_RETRY_AFTER_MAX": 3600.0,
    "RETRYQUEUE_POLL_INTERVAL": 1.0,
    #: How long a node owns a claimed task without renewing it, seconds.
    "RETRYQUEUE_LEASE_TIME": 60.0,
    #: Tasks one node holds at once; None: CONCURRENT_REQUESTS.
    "RETRYQUEUE_MAX_IN_FLIGHT": None,
    #: An idle spider with pending retries waits at most this long, seconds.
    "RETRYQUEUE_IDLE_TIMEOUT": 300.0,
    "RETRYQUEUE_MAX_RECLAIMS": 3,
    "RETRYQUEUE_PRIORITY_ADJUST": 0,
    #: None: host name and pid.
    "RETRYQUEUE_NODE_ID": None,
    #: Approximate cap on the events stream, entries.
    "RETRYQUEUE_EVENTS_MAXLEN": 1_000_000,
    "RETRYQUEUE_AUDIT_LOG": None,
    "RETRYQUEUE_AUDIT_ROTATION": "100 MB",
    "RETRYQUEUE_AUDIT_RETENTION": "30 days",
    #: Where the embedded server keeps its socket and data; None: .scrapy/retryqueue.
    "RETRYQUEUE_EMBEDDED_DIR": None,
    "RETRYQUEUE_FORBIDDEN_LOG_LEVEL": "WARNING",
    #: A callable (or its import path) called as hook(request, decision) before a
    #: retry is scheduled: None keeps it, a Request replaces it, False vetoes it.
    "RETRYQUEUE_RETRY_HOOK": None,
    #: Per-domain cooldowns shared by the fleet (a circuit breaker per host).
    "RETRYQUEUE_DOMAIN_COOLDOWN": False,
    #: First cooldown of a domain, seconds; doubled after each failed probe.
    "RETRYQUEUE_COOLDOWN_BASE": 10.0,
    #: Cap on a domain's own cooldown backoff, seconds (Retry-After may be longer).
    "RETRYQUEUE_COOLDOWN_MAX": 600.0,
    #: Timeouts, connection errors and 5xx of one domain within the window that
    #: put it in cooldown.
    "RETRYQUEUE_BURST_THRESHOLD": 10,
    #: The burst window, seconds.
    "RETRYQUEUE_BURST_WINDOW": 10.0,
    #: A 403 / 404 from a domain cooling down gets one more try after the cooldown.
    "RETRYQUEUE_COOLDOWN_PROBE_PERMANENT": True,
    #: Longest a task may wait on its domain's cooldowns, seconds from its first
    #: failure; past it, a rate_limited dead letter. None: no limit.
    "RETRYQUEUE_DEFERRAL_MAX_WAIT": None,
    #: A storage failure (item_error) re-runs the item pipelines for that item
    #: when due, without downloading the page again, when the item is JSON.
    "RETRYQUEUE_ITEM_REPLAY": False,
}

#: Request meta keys the queue reads.
META_MAX_RETRIES = "retryqueue_max_retries"
META_POLICY = "retryqueue_policy"
#: Set on a re-injected request: the task it belongs to (not serialized).
META_TASK = "retryqueue_task"
#: Set on the stored request of an item replay (RETRYQUEUE_ITEM_REPLAY): the
#: item to send through the pipelines again, {"item": <JSON>, "class": <path>}.
META_ITEM = "retryqueue_item"

#: Meta keys Scrapy fills in per download; stale on a later attempt.
TRANSIENT_META_KEYS = frozenset(
    {"download_latency", "download_slot", "download_timeout_reached", META_TASK}
)

#: Middleware orders: where Scrapy's RetryMiddleware sits, and close to the spider.
DOWNLOADER_MIDDLEWARE_ORDER = 550
SPIDER_MIDDLEWARE_ORDER = 950
EXTENSION_ORDER = 500

#: The SQL store (failure history and dead letters); validated by store/config.py.
STORE_SETTINGS: dict[str, Any] = {
    #: Run the store writer during crawls (needs RETRYQUEUE_ENABLED too).
    "RETRYQUEUE_STORE_ENABLED": True,
    #: SQLAlchemy URL (postgresql://user@host/db); None: SQLite under the embedded dir.
    "RETRYQUEUE_DATABASE_URL": None,
    #: Events written per database transaction, at most.
    "RETRYQUEUE_STORE_BATCH_SIZE": 500,
    #: How long the writer waits for new events before it looks again, seconds.
    "RETRYQUEUE_STORE_INTERVAL": 1.0,
    #: Longest wait between two tries while the database is down, seconds.
    "RETRYQUEUE_STORE_RETRY_MAX": 30.0,
    #: Events read but not acknowledged by another node for this long are taken
    #: over (that node died between reading and writing them), seconds.
    "RETRYQUEUE_STORE_CLAIM_IDLE": 60.0,
    #: How long a closing spider keeps trying to write what is left, seconds;
    #: whatever is still unwritten waits in Redis for the next crawl.
    "RETRYQUEUE_STORE_CLOSE_TIMEOUT": 30.0,
    #: Create the schema in an empty database on first use (an older schema is
    #: never upgraded implicitly: run ``scrapy deadletters migrate``).
    "RETRYQUEUE_STORE_CREATE_SCHEMA": True,
    #: Delete dead letters older than this many days; None: keep them forever.
    "RETRYQUEUE_DEAD_RETENTION": None,
    #: Delete succeeded / cancelled tasks older than this many days; None: keep them.
    "RETRYQUEUE_HISTORY_RETENTION": None,
}
SETTINGS.update(STORE_SETTINGS)

#: Consumer group of the store writers on each spider's events stream.
STORE_CONSUMER_GROUP = "store"
#: File name of the default SQLite store, in the embedded dir.
STORE_SQLITE_NAME = "retryqueue.sqlite3"
#: Task statuses in the store.
TASK_STATUSES = ("waiting", "retrying", "succeeded", "dead", "cancelled")
#: Right after the retry queue's own extension (EXTENSION_ORDER).
STORE_EXTENSION_ORDER = 510

#: The web dashboard (scrapy retryqueue dashboard); validated by dashboard/settings.py.
DASHBOARD_SETTINGS: dict[str, Any] = {
    #: Address the dashboard listens on; a non-loopback one needs a token.
    "RETRYQUEUE_DASHBOARD_HOST": "127.0.0.1",
    #: Port the dashboard listens on.
    "RETRYQUEUE_DASHBOARD_PORT": 8787,
    #: Token that unlocks the write actions (retry now, cancel, requeue, purge);
    #: None: the dashboard is read-only.
    "RETRYQUEUE_DASHBOARD_TOKEN": None,
    #: Seconds between two refreshes of the overview in the browser.
    "RETRYQUEUE_DASHBOARD_REFRESH": 5.0,
    #: Rows per page of the tasks table (at most 500).
    "RETRYQUEUE_DASHBOARD_PAGE_SIZE": 50,
}
SETTINGS.update(DASHBOARD_SETTINGS)

# --- added by the edges redesign ---
#: "deferred": a fresh request parked because its domain cools down
#: (RETRYQUEUE_DOMAIN_COOLDOWN); produced by the runtime, not configurable.
INTERNAL_KINDS = (*INTERNAL_KINDS, "deferred")
ALL_KINDS = (*POLICY_KINDS, *INTERNAL_KINDS)
#: Task statuses in the store after which nothing more happens to a task.
FINAL_TASK_STATUSES = ("succeeded", "dead", "cancelled")
