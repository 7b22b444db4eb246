"""scrapy-retryqueue: a persistent, distributed retry queue for Scrapy.

The public names below are imported on first use (PEP 562), so that importing
the package for its commands or dashboard does not load the crawl's
components, nor a crawl the store's dependencies before it needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved

if TYPE_CHECKING:
    from .crawl.addon import Addon
    from .crawl.extension import RetryQueueExtension
    from .crawl.middleware import RetryQueueMiddleware
    from .crawl.spidermiddleware import RetryQueueSpiderMiddleware
    from .decision.learned import LearnedBackoff
    from .exceptions import (
        ConfigError,
        PermanentFailure,
        RequestParked,
        RetryLater,
        RetryQueueError,
    )

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "Addon": ".crawl.addon",
    "ConfigError": ".exceptions",
    "PermanentFailure": ".exceptions",
    "RequestParked": ".exceptions",
    "RetryLater": ".exceptions",
    "RetryQueueError": ".exceptions",
    "LearnedBackoff": ".decision.learned",
    "RetryQueueExtension": ".crawl.extension",
    "RetryQueueMiddleware": ".crawl.middleware",
    "RetryQueueSpiderMiddleware": ".crawl.spidermiddleware",
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


# The modules' paths before they moved into the layer packages (_moved.py).
_moved.install()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later look-ups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
