"""The add-on: ``ADDONS = {"scrapy_retryqueue.Addon": 0}`` enables everything.

It names the components by import path, so enabling it imports none of them:
Scrapy imports each one when it builds the crawl.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy.utils.misc import load_object

from ..config import bool_setting
from ..decision.kinds import BUILTIN_BY_NAME, STATUS_KINDS
from ..exceptions import ConfigError
from ..runtime import mark_logged
from ..settings.defaults import (
    DOWNLOADER_MIDDLEWARE_ORDER,
    EXTENSION_ORDER,
    SPIDER_MIDDLEWARE_ORDER,
    STORE_EXTENSION_ORDER,
)

logger = logging.getLogger(__name__)

STOCK_RETRY_MIDDLEWARE = "scrapy.downloadermiddlewares.retry.RetryMiddleware"
_PACKAGE = "scrapy_retryqueue"

#: What the add-on enables: (component setting, import path, order).
COMPONENTS = (
    (
        "DOWNLOADER_MIDDLEWARES",
        "scrapy_retryqueue.crawl.middleware.RetryQueueMiddleware",
        DOWNLOADER_MIDDLEWARE_ORDER,
    ),
    (
        "SPIDER_MIDDLEWARES",
        "scrapy_retryqueue.crawl.spidermiddleware.RetryQueueSpiderMiddleware",
        SPIDER_MIDDLEWARE_ORDER,
    ),
    ("EXTENSIONS", "scrapy_retryqueue.crawl.extension.RetryQueueExtension", EXTENSION_ORDER),
    (
        "EXTENSIONS",
        "scrapy_retryqueue.crawl.storeext.RetryQueueStoreExtension",
        STORE_EXTENSION_ORDER,
    ),
)


def _path_of(key: Any) -> str | None:
    """The import path a component key stands for, without importing a path."""
    if isinstance(key, str):
        return key
    module, name = getattr(key, "__module__", None), getattr(key, "__qualname__", None)
    return f"{module}.{name}" if module and name else None


def _names(key: Any, path: str) -> bool:
    """Whether a component key names the class at *path* (as the class or a path)."""
    if _path_of(key) == path:
        return True
    # Another path to the same class, such as the package's own export
    # "scrapy_retryqueue.RetryQueueMiddleware": imported to tell only when it is
    # one of ours with the class's name, which only a project lists.
    name = path.rpartition(".")[2]
    if isinstance(key, str) and key.startswith(f"{_PACKAGE}.") and key.endswith(f".{name}"):
        try:
            return _path_of(load_object(key)) == path
        except (ImportError, AttributeError, NameError, ValueError):
            return False
    return False


def _set_component(settings: Any, name: str, path: str, order: int | None) -> None:
    """Put *path* in the *name* component dict at *order*, dropping any other key
    that names the same class, as ``set_in_component_priority_dict`` does; the
    setting keeps its priority."""
    components = settings.getdict(name)
    for key in [k for k in components if k != path and _names(k, path)]:
        del components[key]
    components[path] = order
    settings.set(name, components, settings.getpriority(name) or 0)


class Addon:
    """Swaps Scrapy's RetryMiddleware for ours; adds the spider middleware, the
    extension, and the store writer (failure history and dead letters in SQL)."""

    def update_settings(self, settings: Any) -> None:
        try:
            enabled = bool_setting(settings, "RETRYQUEUE_ENABLED")
        except ConfigError as exc:
            # One line, no traceback after it (see startup.py): the crawl stops.
            logger.error("scrapy-retryqueue: %s", exc)
            raise mark_logged(exc) from None
        if not enabled:
            return  # Scrapy's own RetryMiddleware stays in charge
        # Disabled by its import path, the key Scrapy's base setting uses: Scrapy
        # 2.13 does not match a class key against a path key when merging.
        _set_component(settings, "DOWNLOADER_MIDDLEWARES", STOCK_RETRY_MIDDLEWARE, None)
        for name, path, order in COMPONENTS:
            _set_component(settings, name, path, order)
        keep_failures_out_of_cache(settings)
        if "scrapy_redis" in str(settings.get("SCHEDULER") or ""):
            quiet_scrapy_redis()


def retried_statuses(settings: Any) -> set[int]:
    """The statuses a retry may follow: the retried kinds' in STATUS_KINDS, and
    the project's RETRY_HTTP_CODES (which the queue honours too)."""
    codes = {
        code
        for code, kind in STATUS_KINDS.items()
        if kind in BUILTIN_BY_NAME and BUILTIN_BY_NAME[kind].retry
    }
    return codes | {int(code) for code in settings.getlist("RETRY_HTTP_CODES")}


def keep_failures_out_of_cache(settings: Any) -> None:
    """Add the retried statuses to HTTPCACHE_IGNORE_HTTP_CODES, at its own priority.

    Scrapy's default cache policy stores every response: a 503 cached once would
    answer every later crawl of that page with the same 503, and the site would
    never be asked again. The statuses the project lists stay listed.
    """
    name = "HTTPCACHE_IGNORE_HTTP_CODES"
    listed = [int(code) for code in settings.getlist(name)]
    missing = sorted(retried_statuses(settings) - set(listed))
    if missing:
        settings.set(name, listed + missing, settings.getpriority(name) or 0)


def quiet_scrapy_redis() -> None:
    """Keep out of the crawl's log a warning of scrapy-redis's that only its authors
    can act on: its scheduler passes ``spider=`` to StatsCollector.inc_value, which
    Scrapy 2.19 deprecates (docs/fleet.md)."""
    import warnings

    warnings.filterwarnings(
        "ignore",
        message=r"Passing a 'spider' argument to StatsCollector\.",
        module=r"scrapy_redis(\.|$)",
    )
