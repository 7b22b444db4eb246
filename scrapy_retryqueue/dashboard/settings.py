"""The dashboard's settings: read and validated once, from Scrapy settings."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from .. import defaults
from ..exceptions import ConfigError

#: Most rows one page of the tasks table shows.
MAX_PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    host: str
    port: int
    #: The token that unlocks write actions; None: read-only.
    token: str | None
    #: Seconds between refreshes of the overview.
    refresh: float
    page_size: int

    @property
    def writable(self) -> bool:
        return self.token is not None


def _get(settings: Any, name: str) -> Any:
    value = settings.get(name) if settings is not None else None
    return defaults.SETTINGS[name] if value is None else value


def load_dashboard_config(settings: Any, **overrides: Any) -> DashboardConfig:
    """The RETRYQUEUE_DASHBOARD_* settings; *overrides* (command-line options) win
    when not None. ConfigError names the setting and its value."""
    values = {
        "host": _get(settings, "RETRYQUEUE_DASHBOARD_HOST"),
        "port": _get(settings, "RETRYQUEUE_DASHBOARD_PORT"),
        "token": _get(settings, "RETRYQUEUE_DASHBOARD_TOKEN"),
        "refresh": _get(settings, "RETRYQUEUE_DASHBOARD_REFRESH"),
        "page_size": _get(settings, "RETRYQUEUE_DASHBOARD_PAGE_SIZE"),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        port = int(values["port"])
    except (TypeError, ValueError):
        raise ConfigError(
            f"RETRYQUEUE_DASHBOARD_PORT must be a port number, got {values['port']!r}"
        ) from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"RETRYQUEUE_DASHBOARD_PORT must be 0-65535, got {port}")
    token = values["token"]
    if token is not None:
        token = str(token)
        if len(token) < 8:
            raise ConfigError(
                "RETRYQUEUE_DASHBOARD_TOKEN must be at least 8 characters long, "
                f"got one of {len(token)}"
            )
    try:
        refresh = float(values["refresh"])
    except (TypeError, ValueError):
        refresh = -1.0
    if not 0.5 <= refresh <= 3600:
        raise ConfigError(
            f"RETRYQUEUE_DASHBOARD_REFRESH must be 0.5-3600 seconds, got {values['refresh']!r}"
        )
    try:
        page_size = int(values["page_size"])
    except (TypeError, ValueError):
        page_size = 0
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise ConfigError(
            f"RETRYQUEUE_DASHBOARD_PAGE_SIZE must be 1-{MAX_PAGE_SIZE}, got {values['page_size']!r}"
        )
    return DashboardConfig(str(values["host"]), port, token or None, refresh, page_size)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(config: DashboardConfig) -> None:
    """Refuse to listen on a non-loopback address without a token."""
    if not is_loopback(config.host) and config.token is None:
        raise ConfigError(
            f"the dashboard will not listen on {config.host} (not a loopback address) "
            "without a token: set RETRYQUEUE_DASHBOARD_TOKEN or pass --token"
        )
