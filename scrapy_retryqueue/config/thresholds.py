"""Thresholds: the per-domain retry budget, LearnedBackoff's try cost, the monitors' limits.

The retry budget goes into the crawl's Config; LearnedBackoff and the Spidermon
monitors read theirs themselves, at a crawl's end for the monitors. Each is checked
when the crawl's settings are read (:func:`.load.load_config`) all the same: a crawl
must not run for hours to learn that its alert threshold is not a number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..decision import kinds
from ..decision.learned import retired_notice
from ..exceptions import ConfigError
from ..settings import defaults
from ..values import shown
from .readers import maybe_json, number_setting, raw_setting


def retry_budget_settings(settings: Any) -> dict[str, float]:
    """RETRYQUEUE_RETRY_BUDGET (a share, 0: off), its floor and window, checked.

    The floor must be above 0: a domain the crawl sends no fresh request to any
    more would otherwise never get its waiting retries, and the crawl would not end.
    """
    return {
        "retry_budget": float(
            number_setting(settings, "RETRYQUEUE_RETRY_BUDGET", maximum=defaults.RETRY_BUDGET_MAX)
        ),
        "retry_budget_floor": float(
            number_setting(
                settings,
                "RETRYQUEUE_RETRY_BUDGET_FLOOR",
                strict=True,
                maximum=defaults.RETRY_BUDGET_FLOOR_MAX,
            )
        ),
        "retry_budget_window": float(
            number_setting(
                settings,
                "RETRYQUEUE_RETRY_BUDGET_WINDOW",
                minimum=defaults.RETRY_BUDGET_WINDOW_MIN,
                maximum=defaults.RETRY_BUDGET_WINDOW_MAX,
            )
        ),
    }


def learned_backoff_settings(settings: Any) -> tuple[float, float]:
    """(RETRYQUEUE_LEARNED_TRY_COST, RETRYQUEUE_LEARNED_MIN_OUTAGES), checked."""
    try_cost = number_setting(
        settings,
        "RETRYQUEUE_LEARNED_TRY_COST",
        strict=True,
        finite=True,
        maximum=defaults.LEARNED_TRY_COST_MAX,
    )
    outages = number_setting(
        settings,
        "RETRYQUEUE_LEARNED_MIN_OUTAGES",
        minimum=1,
        finite=True,
        maximum=defaults.SETTING_INT_MAX,
    )
    return float(try_cost), float(outages)


def retired_settings(names: Iterable[Any]) -> list[str]:
    """One notice for the retired settings among *names* (defaults.RETIRED_SETTINGS):
    they are ignored, and the line says what replaced them."""
    found = sorted({n for n in names if isinstance(n, str) and n in defaults.RETIRED_SETTINGS})
    return [retired_notice(found)] if found else []


@dataclass(frozen=True, slots=True)
class MonitorThresholds:
    """The Spidermon monitors' thresholds (RETRYQUEUE_MONITOR_*, monitors.py)."""

    max_bans: int
    #: Kind (or "*", every kind not named) -> most dead letters.
    max_dead: Mapping[str, int]
    max_pending: int
    #: Share (0 to 1) of retried failures that must recover.
    min_recovery: float


def monitor_thresholds(settings: Any) -> MonitorThresholds:
    """RETRYQUEUE_MONITOR_*, checked: whole numbers >= 0 (at most what a setting
    holds), and a share from 0 to 1."""
    name = "RETRYQUEUE_MONITOR_MAX_DEAD"
    value = maybe_json(name, raw_setting(settings, name))
    if value is None:
        value = kinds.MONITOR_MAX_DEAD
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a dict of kind -> most dead letters, got {shown(value)}")
    max_dead = {}
    for kind, limit in value.items():
        if (
            not isinstance(limit, int)
            or isinstance(limit, bool)
            or not 0 <= limit <= defaults.SETTING_INT_MAX
        ):
            raise ConfigError(
                f"{name}[{shown(kind, 80)}] must be a whole number from 0 to "
                f"{defaults.SETTING_INT_MAX}, got {shown(limit)}"
            )
        max_dead[str(kind)] = limit
    minimum = number_setting(settings, "RETRYQUEUE_MONITOR_MIN_RECOVERY", maximum=1)
    return MonitorThresholds(
        max_bans=number_setting(settings, "RETRYQUEUE_MONITOR_MAX_BANS", whole=True),
        max_dead=max_dead,
        max_pending=number_setting(settings, "RETRYQUEUE_MONITOR_MAX_PENDING", whole=True),
        min_recovery=float(minimum),
    )
