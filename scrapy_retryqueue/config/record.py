"""The Config record: every validated setting one crawl acts on.

:func:`.load.load_config` builds it from a Scrapy Settings object;
:func:`scrapy_retryqueue.config.config_for` builds one per crawler, which all of
that crawler's components share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..settings import defaults

if TYPE_CHECKING:
    from ..decision.kinds import KindTable
    from ..decision.policy import PolicyTable
    from ..secure.encryption import RequestCipher
    from ..secure.signing import KeyRing


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
    #: The learned recovery records (decision/recovery.py): kept at all, their weights'
    #: half-life (s), how many per spider, how often a learning strategy reads them (s).
    learned_stats: bool = True
    learned_half_life: float = defaults.LEARNED_HALF_LIFE
    learned_max_records: int = defaults.LEARNED_MAX_RECORDS
    learned_refresh: float = defaults.LEARNED_REFRESH
    #: The retry budget per domain (decision/retrybudget.py): the share of a domain's fresh
    #: requests its retries may be (0: off), the floor (retries/s), the window (s).
    retry_budget: float = defaults.RETRY_BUDGET
    retry_budget_floor: float = defaults.RETRY_BUDGET_FLOOR
    retry_budget_window: float = defaults.RETRY_BUDGET_WINDOW
    #: RETRYQUEUE_FRONTIER_RESTART: start a new crawl after a finished one (frontier).
    frontier_restart: bool = False
    #: RETRYQUEUE_FREEZE_HEAP, and Scrapy's MEMDEBUG_ENABLED off (its report counts
    #: what a full collection leaves): freeze the heap while the crawl runs (heap.py).
    #: False when a Config is made by hand: only load_config reads the setting's True.
    freeze_heap: bool = False
    #: RETRYQUEUE_SIGNING_KEYS as a key ring (secure/signing.py); None: nothing is
    #: signed nor checked.
    signing: KeyRing | None = None
    #: How long (s) and how many records of finished tasks are kept, per spider, to
    #: tell a replay by (RETRYQUEUE_REPLAY_WINDOW, RETRYQUEUE_REPLAY_RECORDS).
    replay_window: float = defaults.REPLAY_WINDOW
    replay_records: int = defaults.REPLAY_RECORDS
