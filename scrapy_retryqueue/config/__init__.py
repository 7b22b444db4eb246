"""RETRYQUEUE_* settings, read and validated once per crawler into a Config: :func:`config_for`.

A bad value raises :class:`ConfigError` naming the setting and showing the value,
so the crawl stops before it fetches anything. Every component of one crawl shares
one validated Config through :func:`config_for`. The readers live in one module per
group of settings, and this package answers all of their public names:

- :mod:`.record`: the :class:`Config` record;
- :mod:`.load`: :func:`load_config`, which reads every setting into one;
- :mod:`.readers`: the generic readers (:func:`number_setting`, :func:`bool_setting`,
  ...), which also serve the store's and the dashboard's settings;
- :mod:`.redisaddress`: where the Redis is and how it is talked to;
- :mod:`.security`: secret headers, encryption and signing keys, :func:`redact_url`;
- :mod:`.retrying`: kinds, policies, status and exception kinds, backoff, retry hook;
- :mod:`.thresholds`: the retry budget, LearnedBackoff's and the monitors' thresholds;
- :mod:`.scrapycompat`: Scrapy's RETRY_* settings mapped onto the queue's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from ..exceptions import ConfigError

# Error lines show values through it; it was importable from here before the split.
from ..values import shown
from .load import load_config, namespace_setting
from .readers import (
    SETTING_PREFIX,
    bool_setting,
    number_setting,
    raw_setting,
    unknown_settings,
)
from .record import Config
from .redisaddress import (
    cluster_nodes_setting,
    redis_url_from_settings,
    redis_url_setting_name,
    scrapy_redis_client_settings,
    scrapy_redis_params,
)
from .retrying import build_backoff, kinds_setting
from .security import encryption_setting, redact_url, secret_headers_setting, signing_setting
from .thresholds import (
    MonitorThresholds,
    learned_backoff_settings,
    monitor_thresholds,
    retired_settings,
    retry_budget_settings,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = [
    "SETTING_PREFIX",
    "Config",
    "MonitorThresholds",
    "bool_setting",
    "build_backoff",
    "cluster_nodes_setting",
    "config_for",
    "encryption_setting",
    "kinds_setting",
    "learned_backoff_settings",
    "load_config",
    "monitor_thresholds",
    "namespace_setting",
    "number_setting",
    "raw_setting",
    "redact_url",
    "redis_url_from_settings",
    "redis_url_setting_name",
    "retired_settings",
    "retry_budget_settings",
    "scrapy_redis_client_settings",
    "scrapy_redis_params",
    "secret_headers_setting",
    "shown",
    "signing_setting",
    "unknown_settings",
]


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
