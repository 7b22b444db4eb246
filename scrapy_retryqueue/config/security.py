"""Security settings: secret header names, encryption and signing keys; URLs without password.

What people may see of a stored request (RETRYQUEUE_SECRET_HEADERS), how it is sealed
(RETRYQUEUE_ENCRYPTION_KEYS), how stored entries are signed (RETRYQUEUE_SIGNING_KEYS),
and :func:`redact_url`, which every log line and error message that shows a Redis or
database address goes through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..exceptions import ConfigError
from .readers import raw_setting

if TYPE_CHECKING:
    from ..secure.encryption import RequestCipher
    from ..secure.signing import KeyRing


def secret_headers_setting(settings: Any) -> frozenset[str]:
    """RETRYQUEUE_SECRET_HEADERS: a list (or comma-separated string) of header names."""
    from ..secure.redact import secret_names

    name = "RETRYQUEUE_SECRET_HEADERS"
    value = raw_setting(settings, name)
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(
        isinstance(v, str) for v in value
    ):
        raise ConfigError(f"{name} must be a list of header names, got {value!r}")
    return secret_names(value)


def encryption_setting(settings: Any) -> RequestCipher | None:
    """RETRYQUEUE_ENCRYPTION_KEYS as a cipher; None when no key is set (no encryption)."""
    from ..secure.encryption import cipher_for, parse_keys

    return cipher_for(parse_keys(raw_setting(settings, "RETRYQUEUE_ENCRYPTION_KEYS")))


def signing_setting(settings: Any) -> KeyRing | None:
    """RETRYQUEUE_SIGNING_KEYS as a key ring; None when no key is set (nothing signed)."""
    from ..secure.signing import parse_keys, ring_for

    return ring_for(parse_keys(raw_setting(settings, "RETRYQUEUE_SIGNING_KEYS")))


def redact_url(url: str) -> str:
    """*url* with any password replaced, for logs and error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
