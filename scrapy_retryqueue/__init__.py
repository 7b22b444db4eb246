"""scrapy-retryqueue: a persistent, distributed retry queue for Scrapy.

The public names below are imported on first use (PEP 562), so that importing
the package for its commands or dashboard does not load the crawl's
components, nor a crawl the store's dependencies before it needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .addon import Addon
    from .exceptions import (
        ConfigError,
        PermanentFailure,
        RequestParked,
        RetryLater,
        RetryQueueError,
    )
    from .extension import RetryQueueExtension
    from .learned import LearnedBackoff
    from .middleware import RetryQueueMiddleware
    from .spidermiddleware import RetryQueueSpiderMiddleware

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "Addon": ".addon",
    "ConfigError": ".exceptions",
    "PermanentFailure": ".exceptions",
    "RequestParked": ".exceptions",
    "RetryLater": ".exceptions",
    "RetryQueueError": ".exceptions",
    "LearnedBackoff": ".learned",
    "RetryQueueExtension": ".extension",
    "RetryQueueMiddleware": ".middleware",
    "RetryQueueSpiderMiddleware": ".spidermiddleware",
}

__all__ = [
    "Addon",
    "ConfigError",
    "LearnedBackoff",
    "PermanentFailure",
    "RequestParked",
    "RetryLater",
    "RetryQueueError",
    "RetryQueueExtension",
    "RetryQueueMiddleware",
    "RetryQueueSpiderMiddleware",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later look-ups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
