"""The add-on: ``ADDONS = {"scrapy_retryqueue.Addon": 0}`` enables everything."""

from __future__ import annotations

from typing import Any

from scrapy.downloadermiddlewares.retry import RetryMiddleware

from .defaults import (
    DOWNLOADER_MIDDLEWARE_ORDER,
    EXTENSION_ORDER,
    SPIDER_MIDDLEWARE_ORDER,
    STORE_EXTENSION_ORDER,
)
from .extension import RetryQueueExtension
from .middleware import RetryQueueMiddleware
from .spidermiddleware import RetryQueueSpiderMiddleware
from .storeext import RetryQueueStoreExtension

STOCK_RETRY_MIDDLEWARE = "scrapy.downloadermiddlewares.retry.RetryMiddleware"


class Addon:
    """Swaps Scrapy's RetryMiddleware for ours; adds the spider middleware, the
    extension, and the store writer (failure history and dead letters in SQL)."""

    def update_settings(self, settings: Any) -> None:
        if not settings.getbool("RETRYQUEUE_ENABLED", True):
            return  # Scrapy's own RetryMiddleware stays in charge
        # Disabled by its import path, the key Scrapy's base setting uses: Scrapy
        # 2.13 does not match a class key against a path key when merging.
        middlewares = settings.getdict("DOWNLOADER_MIDDLEWARES")
        for key in [k for k in middlewares if k is RetryMiddleware]:
            del middlewares[key]
        middlewares[STOCK_RETRY_MIDDLEWARE] = None
        settings.set(
            "DOWNLOADER_MIDDLEWARES",
            middlewares,
            settings.getpriority("DOWNLOADER_MIDDLEWARES") or 0,
        )
        settings.set_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", RetryQueueMiddleware, DOWNLOADER_MIDDLEWARE_ORDER
        )
        settings.set_in_component_priority_dict(
            "SPIDER_MIDDLEWARES", RetryQueueSpiderMiddleware, SPIDER_MIDDLEWARE_ORDER
        )
        settings.set_in_component_priority_dict("EXTENSIONS", RetryQueueExtension, EXTENSION_ORDER)
        settings.set_in_component_priority_dict(
            "EXTENSIONS", RetryQueueStoreExtension, STORE_EXTENSION_ORDER
        )
