"""Encryption at rest of a stored request's secret parts: headers, body and cookies (Fernet).

With ``RETRYQUEUE_ENCRYPTION_KEYS`` set, the request of every envelope a crawl
writes keeps its URL, method, meta, callback and the like in clear text, and
its headers, body and cookies as one Fernet token::

    "encrypted": {"scheme": "fernet", "fields": ["headers", "body"], "token": "gAAAA..."}

so that a Redis dump, a spool file or a copy of the dead-letter table leaks
none of them. The first key encrypts; every key listed decrypts
(``cryptography``'s MultiFernet), so a key is rotated by putting a new one
first and keeping the old one listed while tasks written under it remain.

Only the crawl's re-injection needs the clear text: the store writer, requeue
and people's surfaces pass the token on as it is (people see ``(encrypted)``,
see :mod:`scrapy_retryqueue.secure.redact`). A token that no listed key opens is an
:class:`~scrapy_retryqueue.exceptions.EncryptionKeyError` naming the setting,
never a malformed dead letter; a token that is not a Fernet token at all is an
:class:`~scrapy_retryqueue.exceptions.EnvelopeError` (malformed).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..exceptions import ConfigError, EncryptionKeyError, EnvelopeError
from .keyring import ring_entries

#: The setting that lists the keys, named by every error about them.
SETTING = "RETRYQUEUE_ENCRYPTION_KEYS"
#: The scheme marker of the token (the only one this version writes and reads).
SCHEME = "fernet"
#: The request field that holds the sealed fields.
FIELD = "encrypted"
#: The request fields sealed in the token, in this order.
SEALED_FIELDS = ("headers", "body", "cookies")
#: What people's surfaces show in place of a sealed field.
LABEL = "(encrypted)"

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
#: A Fernet token: version byte 0x80, 8-byte time, 16-byte IV, ciphertext in
#: 16-byte blocks (at least one), 32-byte HMAC.
_FERNET_VERSION = 0x80
_FERNET_OVERHEAD = 1 + 8 + 16 + 32


def is_sealed(request: Any) -> bool:
    """Whether a stored request (envelope ``request`` dict) carries encrypted fields."""
    return isinstance(request, Mapping) and FIELD in request


def sealed_fields(request: Any) -> tuple[str, ...]:
    """The names of the fields a sealed request holds encrypted (as its marker says)."""
    if not is_sealed(request):
        return ()
    marker = request[FIELD]
    fields = marker.get("fields") if isinstance(marker, Mapping) else None
    if not isinstance(fields, list):
        return SEALED_FIELDS
    return tuple(name for name in SEALED_FIELDS if name in fields)


def generate_key() -> str:
    """A new random key for RETRYQUEUE_ENCRYPTION_KEYS (Fernet: 32 bytes, url-safe base64)."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def parse_keys(value: Any) -> tuple[bytes, ...]:
    """RETRYQUEUE_ENCRYPTION_KEYS as key bytes, each checked; ConfigError names the entry.

    A list of keys, or (from ``-s`` on the command line) one string: a JSON list
    or keys separated by commas. An error never shows a key, only its position
    and length: a key is a secret, and the message reaches logs.
    """
    value = ring_entries(SETTING, value, "Fernet keys")
    from cryptography.fernet import Fernet

    keys: list[bytes] = []
    for position, key in enumerate(value, start=1):
        raw = key.encode("ascii", "replace") if isinstance(key, str) else key
        if not isinstance(raw, bytes):
            raise ConfigError(
                f"{SETTING}: key {position} must be a string, got a {type(key).__name__}"
            )
        try:
            Fernet(raw)
        except (ValueError, binascii.Error):
            raise ConfigError(
                f"{SETTING}: key {position} is not a Fernet key (32 url-safe base64-encoded "
                f"bytes, 44 characters; got {len(raw)} characters, not shown). Make one with "
                "python -c 'from scrapy_retryqueue.secure.encryption import generate_key; "
                "print(generate_key())'"
            ) from None
        keys.append(raw)
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{SETTING} lists a key twice")
    return tuple(keys)


class RequestCipher:
    """Seals and opens the secret fields of stored requests with a list of Fernet keys."""

    def __init__(self, keys: Sequence[bytes | str]) -> None:
        from cryptography.fernet import Fernet, MultiFernet

        if not keys:
            raise ConfigError(f"{SETTING} is empty: there is no key to encrypt with")
        self.key_count = len(keys)
        self._fernet = MultiFernet([Fernet(key) for key in keys])

    def seal(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """*request* with its headers, body and cookies replaced by one token.

        A request without any of them is returned as it is (nothing to hide).
        """
        secret = {name: request[name] for name in SEALED_FIELDS if name in request}
        out = {k: v for k, v in request.items() if k not in SEALED_FIELDS}
        if not secret:
            return out
        token = self._fernet.encrypt(_dumps(secret).encode("utf-8")).decode("ascii")
        out[FIELD] = {"scheme": SCHEME, "fields": list(secret), "token": token}
        return out

    def open(self, request: Mapping[str, Any], *, task_id: str = "") -> dict[str, Any]:
        """*request* with its sealed fields decrypted back in place."""
        if not is_sealed(request):
            return dict(request)
        from cryptography.fernet import InvalidToken

        token = _token(request[FIELD], task_id)
        try:
            plain = self._fernet.decrypt(token.encode("ascii"))
        except InvalidToken:
            raise EncryptionKeyError(
                f"{_task(task_id)}request is encrypted with a key that none of the "
                f"{self.key_count} key(s) in {SETTING} opens; list the key that wrote it in "
                f"{SETTING} (the first key encrypts, every key listed decrypts)"
            ) from None
        try:
            secret = json.loads(plain)
        except ValueError:
            secret = None
        if not isinstance(secret, dict) or not set(secret) <= set(SEALED_FIELDS):
            raise EnvelopeError(f"{_task(task_id)}encrypted request fields are not a JSON object")
        out = {k: v for k, v in request.items() if k != FIELD}
        out.update(secret)
        return out


def open_request(
    request: Mapping[str, Any], cipher: RequestCipher | None, *, task_id: str = ""
) -> dict[str, Any]:
    """A stored request in clear text: opened with *cipher* when it is sealed.

    EncryptionKeyError when it is sealed and there is no key (*cipher* None)
    or no listed key opens it; EnvelopeError when its token is malformed.
    """
    if not is_sealed(request):
        return dict(request)
    if cipher is None:
        _token(request[FIELD], task_id)  # a malformed token is malformed, key or not
        raise EncryptionKeyError(
            f"{_task(task_id)}request is encrypted ({SCHEME}) and {SETTING} is empty; "
            f"set {SETTING} to a list that includes the key that wrote it"
        )
    return cipher.open(request, task_id=task_id)


def cipher_for(keys: Iterable[bytes]) -> RequestCipher | None:
    """The cipher of a parsed RETRYQUEUE_ENCRYPTION_KEYS; None when no key is set."""
    keys = tuple(keys)
    return RequestCipher(keys) if keys else None


def _task(task_id: str) -> str:
    return f"task {task_id!a}: " if task_id else ""


def _token(marker: Any, task_id: str) -> str:
    """The Fernet token of a request's marker; EnvelopeError when it cannot be one.

    Checked before any key is tried, so that a damaged envelope is malformed
    and only a well-formed token that no key opens blames the keys.
    """
    if not isinstance(marker, Mapping) or marker.get("scheme") != SCHEME:
        scheme = marker.get("scheme") if isinstance(marker, Mapping) else None
        raise EnvelopeError(
            f"{_task(task_id)}request field {FIELD!r} must be "
            f'{{"scheme": "{SCHEME}", "token": ...}}, got scheme {scheme!r}'
        )
    token = marker.get("token")
    if not isinstance(token, str) or not token.isascii():
        raise EnvelopeError(f"{_task(task_id)}encrypted request has no token")
    try:
        data = base64.b64decode(token, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        data = b""
    blocks = len(data) - _FERNET_OVERHEAD
    if not data or data[0] != _FERNET_VERSION or blocks < 16 or blocks % 16:
        raise EnvelopeError(f"{_task(task_id)}encrypted request's token is not a Fernet token")
    return token
