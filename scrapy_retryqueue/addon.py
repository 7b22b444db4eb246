"""The add-on: ``ADDONS = {"scrapy_retryqueue.Addon": 0}`` enables everything."""

from __future__ import annotations

from typing import Any

from scrapy.downloadermiddlewares.retry import RetryMiddleware

from .defaults import DOWNLOADER_MIDDLEWARE_ORDER, EXTENSION_ORDER, SPIDER_MIDDLEWARE_ORDER
from .extension import RetryQueueExtension
from .middleware import RetryQueueMiddleware
from .spidermiddleware import RetryQueueSpiderMiddleware


class Addon:
    """Swaps Scrapy's RetryMiddleware for ours; adds the spider middleware and extension."""

    def update_settings(self, settings: Any) -> None:
        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", RetryMiddleware, None)
        settings.set_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", RetryQueueMiddleware, DOWNLOADER_MIDDLEWARE_ORDER
        )
        settings.set_in_component_priority_dict(
            "SPIDER_MIDDLEWARES", RetryQueueSpiderMiddleware, SPIDER_MIDDLEWARE_ORDER
        )
        settings.set_in_component_priority_dict("EXTENSIONS", RetryQueueExtension, EXTENSION_ORDER)
