"""Which client a request comes from, for the wait after wrong tokens.

The client is the address the connection comes from. ``X-Forwarded-For`` is
believed only when that address is a proxy the user listed
(RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES), and then only the part the proxies
wrote: the list is read from its end, past every listed proxy, and the first
address that is not one is the client. What a client writes itself at the
start of the header is never reached, so it can neither pick a fresh identity
per guess nor pass for somebody else. An IPv6 client counts as its /64 network:
one host holds a whole /64 and could otherwise take a new address per guess.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: Longest X-Forwarded-For read, characters: more is no proxy chain but a flood.
_MAX_FORWARDED = 4096
#: The prefix of an IPv6 client's identity.
_IPV6_PREFIX = 64


def _address(text: str) -> Address | None:
    text = text.strip().strip("[]")
    if "%" in text:  # a zone index (fe80::1%eth0) says nothing of who it is
        text = text.split("%", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def identity(address: Address) -> str:
    """The key a client's wrong tokens count under: its address, or its IPv6 /64."""
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, _IPV6_PREFIX), strict=False))
    return str(address)


class ClientResolver:
    """Tells the client of a request from its peer address and headers."""

    def __init__(self, trusted: Iterable[Network] = ()) -> None:
        self.trusted = tuple(trusted)

    def _is_proxy(self, address: Address) -> bool:
        return any(address in network for network in self.trusted)

    def __call__(self, peer: str | None, forwarded: Iterable[str] = ()) -> str:
        """The client's identity; *forwarded*: the X-Forwarded-For headers, in order
        (a proxy may add a header of its own rather than extend the client's)."""
        address = _address(peer or "")
        if address is None:
            return peer or "?"  # a test client or a unix socket: one client
        if self.trusted and self._is_proxy(address):
            # The end is what the proxies wrote; a flood before it is cut off.
            chain = ",".join(forwarded)[-_MAX_FORWARDED:]
            for part in reversed(chain.split(",")):
                hop = _address(part)
                if hop is None:
                    break  # a proxy writes addresses: what is left is not its own
                address = hop
                if not self._is_proxy(hop):
                    break
        return identity(address)
