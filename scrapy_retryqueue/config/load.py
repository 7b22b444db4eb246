"""Every RETRYQUEUE_* setting read and validated into a Config: :func:`load_config`.

It calls the reader of each group of settings (:mod:`.redisaddress`, :mod:`.security`,
:mod:`.retrying`, :mod:`.thresholds`, :mod:`.scrapycompat`) and reads the rest itself:
the plain numbers and switches (through :mod:`.readers`), the node's id, the namespace,
and the checks that relate two settings. A bad value raises :class:`ConfigError`, so a
crawl stops before it fetches anything.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from scrapy.settings import default_settings

from ..exceptions import ConfigError
from ..settings import defaults
from ..values import shown
from .readers import (
    bool_setting,
    log_level_setting,
    number_setting,
    optional_str_setting,
    raw_setting,
    setting_names,
    unknown_settings,
)
from .record import Config
from .redisaddress import (
    cluster_nodes_setting,
    redis_url_from_settings,
    redis_url_setting_name,
    scrapy_redis_client_settings,
)
from .retrying import (
    backoff_setting,
    dead_log_levels_setting,
    exception_kinds_setting,
    kinds_setting,
    policy_table_setting,
    retry_hook_setting,
    status_kinds_setting,
)
from .scrapycompat import own_policy_fields, read_scrapy_retry
from .security import encryption_setting, secret_headers_setting, signing_setting
from .thresholds import (
    learned_backoff_settings,
    monitor_thresholds,
    retired_settings,
    retry_budget_settings,
)


def load_config(settings: Any) -> Config:
    """Read and validate every RETRYQUEUE_* setting of a Scrapy Settings object."""
    max_in_flight = raw_setting(settings, "RETRYQUEUE_MAX_IN_FLIGHT")
    if max_in_flight is None or max_in_flight == "":
        # Scrapy's own default when a bare Settings lacks it (or sets 0).
        concurrency = default_settings.CONCURRENT_REQUESTS
        max_in_flight = int(settings.getint("CONCURRENT_REQUESTS", concurrency) or concurrency)
    else:
        max_in_flight = number_setting(settings, "RETRYQUEUE_MAX_IN_FLIGHT", minimum=1, whole=True)
    node_id = node_id_setting(settings) or f"{socket.gethostname()}:{os.getpid()}"
    poll = number_setting(settings, "RETRYQUEUE_POLL_INTERVAL", strict=True)
    lease = number_setting(settings, "RETRYQUEUE_LEASE_TIME", strict=True)
    if lease < 3 * poll:
        raise ConfigError(
            f"RETRYQUEUE_LEASE_TIME ({lease}) must be at least 3 x RETRYQUEUE_POLL_INTERVAL "
            f"({poll}), so leases are renewed before they expire"
        )
    kind_table = kinds_setting(settings)
    backoff = backoff_setting(settings)
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
        frontier_restart=bool_setting(settings, "RETRYQUEUE_FRONTIER_RESTART"),
        # A plain dict of settings (the commands' checks) has no Scrapy default to read.
        freeze_heap=bool_setting(settings, "RETRYQUEUE_FREEZE_HEAP")
        and not (hasattr(settings, "getbool") and settings.getbool("MEMDEBUG_ENABLED")),
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
        policy_table=policy_table_setting(
            settings, scrapy_retry, kind_table, None if isinstance(backoff, type) else backoff
        ),
        status_kinds=status_kinds_setting(settings, scrapy_retry, kind_table),
        exception_kinds=exception_kinds_setting(settings, scrapy_retry, kind_table),
        poll_interval=float(poll),
        lease_time=float(lease),
        max_in_flight=int(max_in_flight),
        idle_timeout=float(number_setting(settings, "RETRYQUEUE_IDLE_TIMEOUT")),
        max_reclaims=number_setting(settings, "RETRYQUEUE_MAX_RECLAIMS", whole=True),
        priority_adjust=int(priority_adjust),
        node_id=node_id,
        namespace=namespace_setting(settings),
        events_maxlen=number_setting(settings, "RETRYQUEUE_EVENTS_MAXLEN", minimum=1, whole=True),
        audit_log=optional_str_setting(settings, "RETRYQUEUE_AUDIT_LOG"),
        audit_rotation=str(raw_setting(settings, "RETRYQUEUE_AUDIT_ROTATION")),
        audit_retention=str(raw_setting(settings, "RETRYQUEUE_AUDIT_RETENTION")),
        embedded_dir=optional_str_setting(settings, "RETRYQUEUE_EMBEDDED_DIR"),
        embedded_keep=bool_setting(settings, "RETRYQUEUE_EMBEDDED_KEEP"),
        forbidden_log_level=log_level_setting(settings, "RETRYQUEUE_FORBIDDEN_LOG_LEVEL"),
        dead_log_levels=dead_log_levels_setting(settings, kind_table),
        dead_log_limit=number_setting(settings, "RETRYQUEUE_DEAD_LOG_LIMIT", whole=True),
        retry_hook=retry_hook_setting(settings),
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
        notices=(
            *scrapy_retry.notices,
            *unknown_settings(setting_names(settings)),
            *retired_settings(setting_names(settings)),
        ),
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
        signing=signing_setting(settings),
        replay_window=float(
            number_setting(settings, "RETRYQUEUE_REPLAY_WINDOW", strict=True, finite=True)
        ),
        replay_records=number_setting(settings, "RETRYQUEUE_REPLAY_RECORDS", minimum=1, whole=True),
    )
    # Read only by LearnedBackoff and the Spidermon monitors (at the crawl's
    # end), but said at start like the others: a crawl must not run for hours
    # to learn that its alert threshold is not a number.
    learned_backoff_settings(settings)
    monitor_thresholds(settings)
    return config


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


def node_id_setting(settings: Any) -> str | None:
    """RETRYQUEUE_NODE_ID; None when unset (the caller names the node by host and pid)."""
    name = "RETRYQUEUE_NODE_ID"
    value = optional_str_setting(settings, name)
    if value is None:
        return None
    if len(value) > defaults.NODE_ID_MAX or not value.isprintable():
        raise ConfigError(
            f"{name} must be at most {defaults.NODE_ID_MAX} printable characters (it names the "
            f"node's spool file), got {shown(value, 60)}"
        )
    return value
