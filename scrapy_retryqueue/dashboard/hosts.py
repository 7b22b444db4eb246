"""Which Host headers the dashboard answers: the names it is served under, no other.

A page of another site can point its own name at 127.0.0.1 (DNS rebinding);
the browser then treats the dashboard as that site and lets the page read it.
Such a request still names the other site in its ``Host`` header, so refusing
every name the dashboard is not served under closes that door. Accepted: the
loopback names and addresses, the address it listens on (any IP address when
it listens on all of them: a page cannot rebind an address), and
RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from .settings import DashboardConfig

#: Status of a refused Host (400, as Django and Starlette's TrustedHostMiddleware answer).
REFUSED = 400


def split_host(header: str) -> str:
    """The name or address of a Host header, without its port, lower-case."""
    host = header.strip().lower()
    if host.startswith("["):  # [::1]:8787
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


class AllowedHosts:
    """Decides whether a Host header names this dashboard."""

    def __init__(self, bind_host: str, extra: Iterable[str] = ()) -> None:
        bound = bind_host.strip().lower().rstrip(".")
        self.any_host = "*" in extra
        self.names = {"localhost"}
        self.suffixes: list[str] = []
        self.addresses = set()
        self.any_address = False
        bound_address = _address(bound)
        if bound_address is None:
            self.names.add(bound)
        elif bound_address.is_unspecified:
            self.any_address = True
        else:
            self.addresses.add(bound_address)
        for entry in extra:
            address = _address(entry)
            if address is not None:
                self.addresses.add(address)
            elif entry.startswith("."):
                self.suffixes.append(entry)
                self.names.add(entry[1:])
            else:
                self.names.add(entry)

    def __call__(self, header: str | None) -> bool:
        if self.any_host:
            return True
        if not header:
            return False
        host = split_host(header)
        address = _address(host)
        if address is not None:
            return address.is_loopback or self.any_address or address in self.addresses
        return host in self.names or any(host.endswith(s) for s in self.suffixes)

    @classmethod
    def for_config(cls, config: DashboardConfig) -> AllowedHosts:
        return cls(config.host, config.allowed_hosts)


class HostCheck:
    """ASGI middleware: a request whose Host is not allowed gets a 400 and nothing else."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers") or ():
            if name == b"host":
                header = value.decode("latin-1")
                break
        if self.allowed(header):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        shown = repr(header[:100]) if header is not None else "missing"
        body = json.dumps(
            {
                "detail": f"Host header {shown} is not a name this dashboard is served under; "
                "add it to RETRYQUEUE_DASHBOARD_ALLOWED_HOSTS"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": REFUSED,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
