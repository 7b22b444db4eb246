"""Per crawler: the facade the Scrapy glue calls (:mod:`.facade`), and the parts behind it.

The glue imports its names from here; each is loaded on first use (PEP 562), so the
add-on, which only registers components, and the helpers the glue shares (the start's
one-line error, the shutdown trigger) do not load the facade and its Redis client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..queue.connection import is_outage
    from ..queue.delayed import Claimed
    from .attemptfacade import Parking
    from .facade import RetryQueueRuntime, runtime_for, runtime_if_any
    from .leases import PollResult
    from .outcome import Outcome
    from .preflight import preflight
    from .shutdown import ShutdownTrigger
    from .startup import mark_logged, stop_at_start
    from .writable import file_problem

#: Public name -> the module that defines it.
_EXPORTS = {
    "Claimed": "..queue.delayed",
    "Outcome": ".outcome",
    "Parking": ".attemptfacade",
    "PollResult": ".leases",
    "RetryQueueRuntime": ".facade",
    "ShutdownTrigger": ".shutdown",
    "file_problem": ".writable",
    "is_outage": "..queue.connection",
    "mark_logged": ".startup",
    "preflight": ".preflight",
    "runtime_for": ".facade",
    "runtime_if_any": ".facade",
    "stop_at_start": ".startup",
}

__all__ = [
    "Claimed",
    "Outcome",
    "Parking",
    "PollResult",
    "RetryQueueRuntime",
    "ShutdownTrigger",
    "file_problem",
    "is_outage",
    "mark_logged",
    "preflight",
    "runtime_for",
    "runtime_if_any",
    "stop_at_start",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
