"""Every default and tuning constant of scrapy-retryqueue.

Settings are read through :mod:`scrapy_retryqueue.config`, which validates them
against these defaults. Nothing else in the package hard-codes a default value
or a tuning number shared by two modules: they import them from here, as
Scrapy's components read ``scrapy.settings.default_settings``. The failure
kinds and what each one means are :mod:`scrapy_retryqueue.decision.kinds`' table.
"""

from __future__ import annotations

from typing import Any

#: Version of the task envelope written to Redis; readers refuse newer ones.
ENVELOPE_VERSION = 1
#: Deepest nesting of JSON arrays and objects a stored envelope may hold. A
#: deeper one is malformed when read (reading it must not exhaust the stack of
#: the poll or the store writer), and a request whose meta would make one is
#: refused when parked, so that nothing written is refused when read back.
ENVELOPE_MAX_DEPTH = 64
#: Latest time (ms) an envelope may hold: the end of the year 9999, the last
#: that Python's datetime and the SQL store hold.
ENVELOPE_MAX_MS = 253_402_300_799_999
#: Most attempts of one kind an envelope may count: the store's integer column.
ENVELOPE_MAX_ATTEMPTS = 2**31 - 1

# -- retry policies --------------------------------------------------------------

JITTER_MODES = ("none", "full", "equal")
#: Growth of a policy's delay per retry, where the policy does not say.
BACKOFF_MULTIPLIER = 2.0
#: A policy's jitter where it does not say: a delay d becomes one in [d/2, d].
BACKOFF_JITTER = "equal"
#: A policy's fields where neither the defaults below nor a project set them.
POLICY_FIELDS: dict[str, Any] = {
    "retry": False,
    "base_delay": 0.0,
    "multiplier": BACKOFF_MULTIPLIER,
    "max_delay": 0.0,
    "max_retries": 0,
    "jitter": BACKOFF_JITTER,
}


# -- tuning constants and defaults that function parameters share -------------

#: The learned recovery times (decision/recovery.py): bins of outage duration, each half
#: an octave wide above RECOVERY_FIRST_EDGE seconds (bin 0 is [0, first edge)).
RECOVERY_BINS = 36
RECOVERY_FIRST_EDGE = 0.5
#: Longest record the scripts and the reader accept, characters: a longer one
#: (a hostile writer) is started over by the scripts and ignored by the reader.
RECOVERY_RECORD_MAX = 4096
#: RETRYQUEUE_REPLAY_WINDOW: seconds a finished task's record is kept (with
#: RETRYQUEUE_SIGNING_KEYS): a copy of its envelope put back within it is a replay.
REPLAY_WINDOW = 7 * 24 * 3600.0
#: RETRYQUEUE_REPLAY_RECORDS: the most finished tasks' records kept per spider
#: (about 100 bytes each in Redis); past it the oldest go first.
REPLAY_RECORDS = 200_000
#: Stored entries a node looks at when it starts, to learn which signing keys the
#: spider's queue needs (one HSCAN page of its tasks and one of its frontier's).
SIGNATURE_SAMPLE = 20
#: RETRYQUEUE_LEARNED_HALF_LIFE: seconds after which an observation weighs half.
LEARNED_HALF_LIFE = 7 * 24 * 3600.0
#: RETRYQUEUE_LEARNED_MAX_RECORDS: (kind, domain) records kept per spider.
LEARNED_MAX_RECORDS = 2000
#: RETRYQUEUE_LEARNED_REFRESH: seconds between two reads of the learned records.
LEARNED_REFRESH = 30.0
#: RETRYQUEUE_LEARNED_MIN_OUTAGES: weighted outages a curve needs before it is used.
LEARNED_MIN_OUTAGES = 20.0
#: RETRYQUEUE_LEARNED_TRY_COST: seconds of lag after an outage's end that one failed
#: try is worth to LearnedBackoff's plan (decision/schedule.py): higher, fewer tries
#: and later recoveries. Chosen on the adaptive benchmark's family of outage
#: distributions (benchmarks/outage_family.py, docs/backoff.md), not on one site: 1.5
#: holds the failed tries to 0.6 of the default's on every one (1.0 did not on short
#: lognormal and changing outages), and 1.75 to 2 gave a longer median lag for no fewer.
LEARNED_TRY_COST = 1.5
#: The most RETRYQUEUE_LEARNED_TRY_COST may be, seconds (a day of lag for one try).
LEARNED_TRY_COST_MAX = 86400.0
#: Settings that are no longer read, and what the one WARNING line that a project
#: still setting them gets says replaced them (config/readers.py).
RETIRED_SETTINGS = {
    name: "LearnedBackoff now picks each try as the cheapest plan over the learned curve; "
    "RETRYQUEUE_LEARNED_TRY_COST (seconds of lag one failed try is worth) sets its trade-off"
    for name in ("RETRYQUEUE_LEARNED_SKIP_BELOW", "RETRYQUEUE_LEARNED_EARLY_AT")
}
#: Weighted outages a curve needs still on at a failure's age to say more of it.
LEARNED_MIN_AT_RISK = 3.0
#: LearnedBackoff's jitter: its delay is spread over +-half this share.
LEARNED_JITTER = 0.1

#: RETRYQUEUE_RETRY_BUDGET: share of a domain's fresh requests its retries may be
#: (0: no retry budget). Off by default: with it, a queue's retries to a domain
#: the crawl no longer sends fresh requests to drain at the floor's pace.
RETRY_BUDGET = 0.0
#: RETRYQUEUE_RETRY_BUDGET_FLOOR: retries per second a domain may always get.
RETRY_BUDGET_FLOOR = 1.0
#: RETRYQUEUE_RETRY_BUDGET_WINDOW: seconds over which retries and requests are counted.
RETRY_BUDGET_WINDOW = 10.0
#: Slices the budget's window is cut into (decision/retrybudget.py): its resolution.
BUDGET_SLICES = 10
#: Longest budget record the claim script and the reader accept, characters.
BUDGET_RECORD_MAX = 512
#: The budget's share, at most (Finagle's percentCanRetry stops at 1000 %).
RETRY_BUDGET_MAX = 10.0
#: Bounds of the floor (retries/s) and the window (s).
RETRY_BUDGET_FLOOR_MAX = 1_000_000.0
RETRY_BUDGET_WINDOW_MIN = 1.0
RETRY_BUDGET_WINDOW_MAX = 86_400.0

#: RETRYQUEUE_EVENTS_MAXLEN: approximate cap on a spider's events stream, entries.
EVENTS_MAXLEN = 1_000_000
#: Most writes (or task ids) one script call carries: bounds how long one call
#: blocks Redis. Batches of the queue, the spool replay and the reaper.
QUEUE_BATCH = 500
#: While a half-open domain's probe is in flight, its other tasks (and fresh
#: requests to it) look again after this many ms.
PROBE_RECHECK_MS = 1000
#: Dead letters one read of the queue's dead set returns when the caller sets no limit.
DEAD_LETTERS_LIMIT = 1000
#: Longest exception message a task keeps, characters.
ERROR_MESSAGE_MAX = 1000
#: Longest reason a domain's state keeps, characters.
DOMAIN_REASON_MAX = 200
#: Polls come at most this often (seconds), even when tasks fall due faster.
MIN_POLL_INTERVAL = 0.05
#: First and longest wait (seconds) between two reconnection tries while Redis
#: does not answer; the wait doubles after each failed try.
RECONNECT_MIN_DELAY = 0.5
RECONNECT_MAX_DELAY = 30.0
#: Redis client of a crawl: seconds a command (socket_timeout) and a connection
#: may take before Redis counts as down, and seconds between health checks of
#: an idle connection.
REDIS_SOCKET_TIMEOUT = 10
REDIS_CONNECT_TIMEOUT = 5
REDIS_HEALTH_CHECK_INTERVAL = 30
#: A node counts as alive while its heartbeat is at most 3 polls (and at least
#: this many ms) old, and as working while it had work within 2 polls (and at
#: least this many ms): the fleet's idle nodes wait for working ones.
FLEET_HEARTBEAT_MIN_MS = 3000
FLEET_BUSY_MIN_MS = 2000
#: A node that registered (its first heartbeat) within this many polls, and at
#: least FLEET_HEARTBEAT_MIN_MS, keeps the fleet's idle nodes in the crawl: it
#: may be about to push its start requests.
FLEET_REGISTERED_POLLS = 5
#: How long the start of a crawl waits for its Redis to answer, seconds.
REDIS_START_TIMEOUT = 3
#: How long the start of a crawl waits, seconds, for a Redis Cluster that answers but
#: one of whose masters does not (a failover under way: a replica takes over within
#: the cluster's cluster-node-timeout, 15 s by default), and how often it asks again.
CLUSTER_START_FAILOVER_WAIT = 20
CLUSTER_START_RETRY_EVERY = 0.5
#: scrapy-redis's own defaults for REDIS_HOST / REDIS_PORT, used when a project
#: sets only one of them.
SCRAPY_REDIS_HOST = "localhost"
SCRAPY_REDIS_PORT = 6379

#: Largest whole number a setting may hold: a Redis script reads its numbers as
#: Lua doubles, exact only up to 2**53 (a larger count would fail every call).
SETTING_INT_MAX = 2**53 - 1
#: Longest duration a setting may hold, seconds (about 31 years): now plus it, in
#: ms, stays an exact Redis score and a date Python and the databases can hold.
SETTING_SECONDS_MAX = 1e9
#: Longest retention a store setting may hold, days (about 270 years): now minus
#: it stays a date after the year 1.
SETTING_DAYS_MAX = 100_000
#: Longest RETRYQUEUE_NODE_ID, characters: it names the node's spool file, and a
#: file name has at most 255 bytes on the usual filesystems.
NODE_ID_MAX = 200

SETTINGS: dict[str, Any] = {
    #: False: the add-on leaves Scrapy's RetryMiddleware in charge; components stay off.
    "RETRYQUEUE_ENABLED": True,
    #: None: use scrapy-redis's REDIS_URL / REDIS_HOST + REDIS_PORT, else embedded.
    "RETRYQUEUE_REDIS_URL": None,
    #: Talk to the URL as a Redis Cluster (any node's address will do).
    "RETRYQUEUE_REDIS_CLUSTER": False,
    #: More nodes of that cluster ("host:port"), tried when the URL's does not answer.
    "RETRYQUEUE_REDIS_CLUSTER_NODES": [],
    #: Writes held in memory while Redis is unreachable, before a file takes them.
    "RETRYQUEUE_SPOOL_MEMORY": 10_000,
    #: Writes the local spool holds at most; past it a failure goes to its errback.
    "RETRYQUEUE_SPOOL_MAX": 1_000_000,
    #: The project's own failure kinds: name -> policy fields and traits (decision/kinds.py).
    "RETRYQUEUE_KINDS": {},
    #: Kind -> policy fields, merged over POLICIES field by field.
    "RETRYQUEUE_POLICIES": {},
    #: Host name -> kind -> policy fields, for a domain and its subdomains.
    "RETRYQUEUE_DOMAIN_POLICIES": {},
    #: HTTP status -> kind (None: not a failure), merged over STATUS_KINDS.
    "RETRYQUEUE_STATUS_KINDS": {},
    #: Exception class (or its path) -> kind (None: drop it), merged over EXCEPTION_KINDS.
    "RETRYQUEUE_EXCEPTION_KINDS": {},
    #: The backoff strategy: a class (or its import path) built with Scrapy's
    #: build_from_crawler, whose delay(ctx) gives the seconds before a retry.
    "RETRYQUEUE_BACKOFF": "scrapy_retryqueue.decision.backoff.ExponentialBackoff",
    #: Cap on a server's Retry-After, seconds.
    "RETRYQUEUE_RETRY_AFTER_MAX": 3600.0,
    #: Seconds between two polls of the queue for due tasks.
    "RETRYQUEUE_POLL_INTERVAL": 1.0,
    #: How long a node owns a claimed task without renewing it, seconds.
    "RETRYQUEUE_LEASE_TIME": 60.0,
    #: Tasks one node holds at once; None: CONCURRENT_REQUESTS.
    "RETRYQUEUE_MAX_IN_FLIGHT": None,
    #: An idle spider with pending retries waits at most this long, seconds.
    "RETRYQUEUE_IDLE_TIMEOUT": 300.0,
    #: Expired leases a task survives; one more and it is a poison dead letter.
    "RETRYQUEUE_MAX_RECLAIMS": 3,
    #: Added to a task's request priority once, when the task is created.
    "RETRYQUEUE_PRIORITY_ADJUST": 0,
    #: None: host name and pid.
    "RETRYQUEUE_NODE_ID": None,
    #: Approximate cap on the events stream, entries.
    "RETRYQUEUE_EVENTS_MAXLEN": EVENTS_MAXLEN,
    #: Record how long each domain's outages last, per kind (docs/backoff.md).
    "RETRYQUEUE_LEARNED_STATS": True,
    #: Seconds after which a recorded outage weighs half as much as a new one.
    "RETRYQUEUE_LEARNED_HALF_LIFE": LEARNED_HALF_LIFE,
    #: (kind, domain) records kept per spider; new domains past it are not recorded.
    "RETRYQUEUE_LEARNED_MAX_RECORDS": LEARNED_MAX_RECORDS,
    #: Seconds between two reads of the records by a crawl whose strategy learns.
    "RETRYQUEUE_LEARNED_REFRESH": LEARNED_REFRESH,
    #: LearnedBackoff: weighted outages a curve needs before it is trusted.
    "RETRYQUEUE_LEARNED_MIN_OUTAGES": LEARNED_MIN_OUTAGES,
    #: LearnedBackoff: seconds of lag one failed try is worth to its plan.
    "RETRYQUEUE_LEARNED_TRY_COST": LEARNED_TRY_COST,
    #: The fleet's retry budget per domain (docs/backoff.md): a domain's retries are
    #: held to this share of its fresh requests, plus the floor; 0: off.
    "RETRYQUEUE_RETRY_BUDGET": RETRY_BUDGET,
    #: Retries per second a domain may get whatever its requests.
    "RETRYQUEUE_RETRY_BUDGET_FLOOR": RETRY_BUDGET_FLOOR,
    #: Seconds over which the budget counts requests and retries.
    "RETRYQUEUE_RETRY_BUDGET_WINDOW": RETRY_BUDGET_WINDOW,
    #: A file that gets one JSON line per retry decision; None: no audit log.
    "RETRYQUEUE_AUDIT_LOG": None,
    #: The audit file's loguru rotation and retention.
    "RETRYQUEUE_AUDIT_ROTATION": "100 MB",
    "RETRYQUEUE_AUDIT_RETENTION": "30 days",
    #: Where the embedded server keeps its socket and data; None: .scrapy/retryqueue,
    #: or a per-user directory named after the project without scrapy.cfg (Scrapyd).
    "RETRYQUEUE_EMBEDDED_DIR": None,
    #: Keep the embedded server running when its last crawl ends (False: stop it,
    #: so that a runner such as Scrapyd is left with no process of ours).
    "RETRYQUEUE_EMBEDDED_KEEP": False,
    #: The project's namespace in the Redis keys, so that two projects on one Redis
    #: never meet; None: BOT_NAME (when the project sets it), "": no namespace.
    "RETRYQUEUE_NAMESPACE": None,
    #: The Spidermon monitors' thresholds (monitors.py): forbidden dead letters
    #: (a ban), dead letters per kind ("*": any kind not named; by default the
    #: kinds only a bug or a hostile writer produces), retries left pending, and
    #: the share of retried failures that must recover.
    "RETRYQUEUE_MONITOR_MAX_BANS": 0,
    #: None: kinds.MONITOR_MAX_DEAD, no dead letter of the kinds only a bug, a hostile
    #: writer or a request that crashes every node produce.
    "RETRYQUEUE_MONITOR_MAX_DEAD": None,
    "RETRYQUEUE_MONITOR_MAX_PENDING": 0,
    "RETRYQUEUE_MONITOR_MIN_RECOVERY": 0.5,
    #: Log level of the dead-letter line of a forbidden (401, 403) failure.
    "RETRYQUEUE_FORBIDDEN_LOG_LEVEL": "WARNING",
    #: Dead-letter lines a crawl logs per kind at their level; past it, one line
    #: says so and the rest go to DEBUG (counted in the end-of-crawl table).
    #: A crawl that meets thousands of 404s or 403s then logs a summary, not
    #: thousands of lines. 0: every dead letter at DEBUG.
    "RETRYQUEUE_DEAD_LOG_LIMIT": 20,
    #: A callable (or its import path) called as hook(request, decision) before a
    #: retry is scheduled: None keeps it, a Request replaces it, False vetoes it,
    #: a number sets its delay in seconds.
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
    #: Start the crawl even when Redis does not answer at start: failures wait in
    #: the local spool until it does. False: the crawl stops at once (exit 1).
    "RETRYQUEUE_START_WITHOUT_REDIS": False,
    #: While an idle spider waits for pending retries, say so every this many
    #: seconds (as Scrapy's LOGSTATS_INTERVAL does for pages).
    "RETRYQUEUE_WAIT_LOG_INTERVAL": 60.0,
    #: A storage failure (item_error) re-runs the item pipelines for that item
    #: when due, without downloading the page again, when the item is JSON.
    "RETRYQUEUE_ITEM_REPLAY": False,
    #: An idle node stays in the crawl while another node of the same spider is
    #: still working (it may push new requests to a shared frontier), at most
    #: this many seconds; 0: leave as soon as this node has nothing to do.
    "RETRYQUEUE_FLEET_WAIT": 60.0,
    #: On the leased frontier, a node that finds the fleet's last crawl finished
    #: (before the node started) starts a new crawl; False: it crawls nothing.
    "RETRYQUEUE_FRONTIER_RESTART": False,
    #: Freeze the process's heap while the crawl's engine runs, and before it forks
    #: its store writer (heap.py): full collections skip the modules and start-up
    #: objects. Off anyway with Scrapy's MEMDEBUG_ENABLED.
    "RETRYQUEUE_FREEZE_HEAP": True,
    #: Request headers whose values no surface shows (dashboard, API, exports,
    #: logs, the audit log); the stored request keeps them, to be replayed.
    "RETRYQUEUE_SECRET_HEADERS": [
        "Authorization",
        "Cookie",
        "Proxy-Authorization",
        "X-Api-Key",
        "X-Auth-Token",
        "Api-Key",
    ],
    #: Fernet keys that encrypt a stored request's headers, body and cookies at
    #: rest (encryption.py): the first encrypts, every one decrypts. Empty: off.
    "RETRYQUEUE_ENCRYPTION_KEYS": [],
    #: Keys that sign every entry a crawl acts on (signing.py): the first signs,
    #: every one verifies. Empty: nothing is signed nor checked.
    "RETRYQUEUE_SIGNING_KEYS": [],
    #: Seconds and count of the records of finished tasks replays are told by.
    "RETRYQUEUE_REPLAY_WINDOW": REPLAY_WINDOW,
    "RETRYQUEUE_REPLAY_RECORDS": REPLAY_RECORDS,
}

#: Request meta keys the queue reads.
META_MAX_RETRIES = "retryqueue_max_retries"
META_POLICY = "retryqueue_policy"
#: Set on a re-injected request: the task it belongs to (not serialized).
META_TASK = "retryqueue_task"
#: Set on a request the leased frontier handed to this node: its lease (not serialized).
META_FRONTIER = "retryqueue_frontier"
#: Set on the stored request of an item replay (RETRYQUEUE_ITEM_REPLAY): the
#: item to send through the pipelines again, {"item": <JSON>, "class": <path>}.
META_ITEM = "retryqueue_item"
#: Scrapy's own RetryMiddleware meta keys, which the queue honours too
#: (docs/coming-from-retry.md).
SCRAPY_META_MAX_RETRY_TIMES = "max_retry_times"
SCRAPY_META_RETRY_TIMES = "retry_times"
SCRAPY_META_GIVE_UP_LOG_LEVEL = "give_up_log_level"
#: Scrapy's HttpCacheMiddleware neither answers nor stores a request with it:
#: set on every re-injected retry, or it would get the cached failure back.
SCRAPY_META_DONT_CACHE = "dont_cache"

#: Meta keys Scrapy fills in per download; stale on a later attempt.
TRANSIENT_META_KEYS = frozenset(
    {"download_latency", "download_slot", "download_timeout_reached", META_TASK, META_FRONTIER}
)
#: Set by Scrapy's DownloadTimeoutMiddleware from DOWNLOAD_TIMEOUT when the request
#: has none: not stored when it holds that value, so a later run's setting applies.
SCRAPY_META_DOWNLOAD_TIMEOUT = "download_timeout"
#: Set by Scrapy's HttpProxyMiddleware from the environment (http_proxy ...),
#: which marks it with SCRAPY_META_SCHEME_PROXY: not stored then, so the run that
#: retries the request takes its own environment's proxy.
SCRAPY_META_PROXY = "proxy"
SCRAPY_META_SCHEME_PROXY = "_scheme_proxy"

#: The finish_reason of a crawl that closed with retries pending or writes
#: spooled (as Scrapy's closespider_* reasons name why a crawl ended).
FINISH_REASON_WORK_LEFT = "retryqueue_work_left"
#: The finish_reason of a crawl that claimed a task no key of
#: RETRYQUEUE_ENCRYPTION_KEYS decrypts (the task is handed back, not lost).
FINISH_REASON_KEY_MISSING = "retryqueue_encryption_key_missing"
#: Finish reason of a node on the leased frontier that starts after the fleet's
#: crawl finished: it crawls nothing (RETRYQUEUE_FRONTIER_RESTART starts anew).
FINISH_REASON_FLEET_FINISHED = "retryqueue_fleet_finished"
#: Scrapy's own finish reason of a spider that ran out of work (its start
#: requests all handled): the only one that marks a leased frontier's crawl finished.
SCRAPY_FINISHED = "finished"

#: Middleware orders: where Scrapy's RetryMiddleware sits, and close to the spider.
DOWNLOADER_MIDDLEWARE_ORDER = 550
SPIDER_MIDDLEWARE_ORDER = 950
EXTENSION_ORDER = 500

#: RETRYQUEUE_STORE_BATCH_SIZE: events written per database transaction, at most.
STORE_BATCH_SIZE = 500
#: RETRYQUEUE_STORE_CLAIM_IDLE: seconds before another node's unacknowledged
#: events are taken over.
STORE_CLAIM_IDLE = 60.0
#: The SQL store (failure history and dead letters); validated by store/config.py.
STORE_SETTINGS: dict[str, Any] = {
    #: Run the store writer during crawls (needs RETRYQUEUE_ENABLED too).
    "RETRYQUEUE_STORE_ENABLED": True,
    #: Where the crawl's store writer runs: "auto", in a process forked from the
    #: crawl where it can fork one, else in a thread of the crawl; True: the process
    #: (the thread, with a warning, where it cannot); False: the thread. The process
    #: costs the crawl less CPU per event and ~75 MB more memory: store.md.
    "RETRYQUEUE_STORE_PROCESS": "auto",
    #: SQLAlchemy URL (postgresql://user@host/db); None: SQLite under the embedded dir.
    "RETRYQUEUE_DATABASE_URL": None,
    #: Events written per database transaction, at most.
    "RETRYQUEUE_STORE_BATCH_SIZE": STORE_BATCH_SIZE,
    #: How long the writer waits for new events before it looks again, seconds.
    "RETRYQUEUE_STORE_INTERVAL": 1.0,
    #: Longest wait between two tries while the database is down, seconds.
    "RETRYQUEUE_STORE_RETRY_MAX": 30.0,
    #: Events read but not acknowledged by another node for this long are taken
    #: over (that node died between reading and writing them), seconds.
    "RETRYQUEUE_STORE_CLAIM_IDLE": STORE_CLAIM_IDLE,
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
#: Task statuses in the store after which nothing more happens to a task.
FINAL_TASK_STATUSES = ("succeeded", "dead", "cancelled")
#: Right after the retry queue's own extension (EXTENSION_ORDER).
STORE_EXTENSION_ORDER = 510
#: The store writer's first wait (seconds) after a failed write; it doubles up
#: to RETRYQUEUE_STORE_RETRY_MAX while the database is down.
STORE_RETRY_MIN_DELAY = 0.5
#: Seconds between two sweeps for dead letters whose events were trimmed away.
STORE_SWEEP_INTERVAL = 300.0
#: Seconds between two runs of RETRYQUEUE_DEAD_RETENTION / RETRYQUEUE_HISTORY_RETENTION.
STORE_RETENTION_INTERVAL = 3600.0
#: Longest the store writer's final flush (after the spider closed) may take, seconds.
STORE_FINAL_FLUSH_MAX = 5.0
#: ``scrapy retryqueue writer --rescan``: seconds between two scans of Redis for
#: the events streams of spiders it does not serve yet (a crawl that started later).
STORE_WRITER_RESCAN = 10.0
#: Seconds a ``scrapy retryqueue writer``'s announcement in Redis (queue/keys.writer_key)
#: lives unless renewed; it renews it every third of that. A crawl that sees one
#: starts no store writer of its own.
STORE_WRITER_ANNOUNCE_TTL = 30.0

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
    #: Host names (Host header) the dashboard answers under besides the loopback
    #: names and the address it listens on: a page of another site that points
    #: its own name at this machine (DNS rebinding) is refused. ".example.com"
    #: matches every subdomain; "*" turns the check off.
    "RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS": [],
    #: Seconds a sign-in lasts (12 hours); after it the token is asked again.
    "RETRYQUEUE_DASHBOARD_SESSION_TTL": 43200.0,
    #: Addresses (or networks, "10.0.0.0/8") of the reverse proxies whose
    #: X-Forwarded-For the dashboard believes; a request from any other address
    #: is its own client, whatever it says. Empty: no proxy is trusted.
    "RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES": [],
}
SETTINGS.update(DASHBOARD_SETTINGS)
#: Wrong dashboard tokens a client may send before it is made to wait.
DASHBOARD_FREE_WRONG_TOKENS = 3
#: Its first wait (seconds); each further wrong token doubles it, up to the maximum.
DASHBOARD_WRONG_TOKEN_WAIT = 1.0
DASHBOARD_WRONG_TOKEN_MAX_WAIT = 60.0
#: Seconds without a wrong token after which a client's count starts again.
DASHBOARD_WRONG_TOKEN_FORGET = 900.0
#: Clients whose wrong tokens are remembered, and sign-ins kept, at most (oldest go first).
DASHBOARD_MAX_CLIENTS = 10_000
DASHBOARD_MAX_SESSIONS = 10_000
