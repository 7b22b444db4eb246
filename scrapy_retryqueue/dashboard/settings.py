"""The dashboard's settings: read and validated once, from Scrapy settings."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from ..config import secret_headers_setting
from ..exceptions import ConfigError
from ..settings import defaults

#: Most rows one page of the tasks table shows.
MAX_PAGE_SIZE = 500
#: An entry of RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS: a name (".name" for its
#: subdomains too), an IPv4 address, or an IPv6 one (with or without brackets).
_HOST_ENTRY = re.compile(r"\.?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?|\[?[0-9a-f:.]+\]?")


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    host: str
    port: int
    #: The token that unlocks write actions; None: read-only.
    token: str | None
    #: Seconds between refreshes of the overview.
    refresh: float
    page_size: int
    #: RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS, lower-case, without a trailing dot.
    allowed_hosts: tuple[str, ...] = ()
    #: Seconds a sign-in lasts.
    session_ttl: float = defaults.SETTINGS["RETRYQUEUE_DASHBOARD_SESSION_TTL"]
    #: RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES: whose X-Forwarded-For is believed.
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    #: RETRYQUEUE_SECRET_HEADERS: header values no page or API answer shows.
    secret_headers: frozenset[str] = frozenset(
        name.lower() for name in defaults.SETTINGS["RETRYQUEUE_SECRET_HEADERS"]
    )

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
    return DashboardConfig(
        _host(values["host"]),
        port,
        token or None,
        refresh,
        page_size,
        allowed_hosts=_allowed_hosts(_get(settings, "RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS")),
        session_ttl=_session_ttl(_get(settings, "RETRYQUEUE_DASHBOARD_SESSION_TTL")),
        trusted_proxies=_trusted_proxies(_get(settings, "RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES")),
        secret_headers=secret_headers_setting(settings if settings is not None else {}),
    )


#: One label of a host name (RFC 1123).
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)", re.IGNORECASE)


def _host(value: Any) -> str:
    """RETRYQUEUE_DASHBOARD_HOST (or --host): an IP address or a host name."""
    host = str(value).strip()
    try:
        ipaddress.ip_address(host.strip("[]") if host.startswith("[") else host)
        return host.strip("[]")
    except ValueError:
        pass
    name = host.removesuffix(".")
    if name and len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split(".")):
        return host
    shown = repr(host) if len(host) <= 80 else f"{host[:80]!r}… ({len(host)} characters)"
    raise ConfigError(
        f"RETRYQUEUE_DASHBOARD_HOST (--host) must be an IP address or a host name, got {shown}"
    )


def _allowed_hosts(value: Any) -> tuple[str, ...]:
    name = "RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS"
    if isinstance(value, str):  # -s on the command line: comma-separated
        value = value.split(",")
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(
        isinstance(v, str) for v in value
    ):
        raise ConfigError(f"{name} must be a list of host names, got {value!r}")
    hosts = []
    for entry in value:
        host = entry.strip().lower().rstrip(".")
        if not host:
            continue
        if host != "*" and not _HOST_ENTRY.fullmatch(host):
            raise ConfigError(
                f"{name} entries must be host names or addresses (no scheme, port or path), "
                f"got {entry!r}"
            )
        hosts.append(host)
    return tuple(hosts)


def _trusted_proxies(value: Any) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    name = "RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES"
    if isinstance(value, str):  # -s on the command line: comma-separated
        value = value.split(",")
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(
        isinstance(v, str) for v in value
    ):
        raise ConfigError(f"{name} must be a list of IP addresses or networks, got {value!r}")
    networks = []
    for entry in value:
        if not entry.strip():
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip().strip("[]"), strict=False))
        except ValueError:
            shown = repr(entry) if len(entry) <= 80 else f"{entry[:80]!r}…"
            raise ConfigError(
                f"{name} entries must be IP addresses or networks like 10.0.0.0/8 (a proxy's "
                f"address, not its name), got {shown}"
            ) from None
    return tuple(networks)


def _session_ttl(value: Any) -> float:
    try:
        ttl = float(value)
    except (TypeError, ValueError):
        ttl = -1.0
    if not 60 <= ttl <= 366 * 86400:
        raise ConfigError(
            f"RETRYQUEUE_DASHBOARD_SESSION_TTL must be 60 seconds to 366 days, got {value!r}"
        )
    return ttl


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
