"""scrapy-retryqueue: a persistent, distributed retry queue for Scrapy."""

from __future__ import annotations

from .addon import Addon
from .exceptions import ConfigError, PermanentFailure, RequestParked
from .extension import RetryQueueExtension
from .middleware import RetryQueueMiddleware
from .spidermiddleware import RetryQueueSpiderMiddleware

__version__ = "0.1.0"

__all__ = [
    "Addon",
    "ConfigError",
    "PermanentFailure",
    "RequestParked",
    "RetryQueueExtension",
    "RetryQueueMiddleware",
    "RetryQueueSpiderMiddleware",
]
