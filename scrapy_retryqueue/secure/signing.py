"""The signing key ring: HMAC-SHA256 signatures over stored entries, named by key id.

With ``RETRYQUEUE_SIGNING_KEYS`` set, every entry a crawl acts on (an
envelope, a frontier request, a lifecycle event) carries a signature::

    "<key id>.<MAC, url-safe base64 without padding>"

The first key signs; every key listed verifies. The key id is a short hash of
the key (:func:`key_id`), so a signature says which key made it without saying
anything of the key; rotating is adding a new key first, waiting until no
entry signed with the old one is left (or every node has the new ring), then
removing the old one, as RETRYQUEUE_ENCRYPTION_KEYS rotates.

What is signed is the caller's: :mod:`scrapy_retryqueue.queue.signature` builds
each entry's message (its purpose, the namespace, the bytes stored). A
signature that does not verify is a :class:`SignatureError` that says why, in
words a log line and a dead letter can carry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Iterable, Sequence
from typing import Any

from ..exceptions import ConfigError, SignatureError
from .keyring import ring_entries

#: The setting that lists the keys, named by every error about them.
SETTING = "RETRYQUEUE_SIGNING_KEYS"
#: Bytes of a key (before its base64).
KEY_BYTES = 32
#: Hex digits of a key id.
KEY_ID_DIGITS = 8
#: Characters of a signature: key id, ".", 43 of base64 (32 bytes, no padding).
SIGNATURE_LENGTH = KEY_ID_DIGITS + 1 + 43
_ID_SALT = b"scrapy-retryqueue signing key id\x00"


def generate_key() -> str:
    """A new random key for RETRYQUEUE_SIGNING_KEYS: 32 bytes, url-safe base64 (44 characters)."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def key_id(key: bytes) -> str:
    """The id a signature names *key* by: 8 hex digits of a salted SHA-256 of it."""
    return hashlib.sha256(_ID_SALT + key).hexdigest()[:KEY_ID_DIGITS]


def parse_keys(value: Any) -> tuple[bytes, ...]:
    """RETRYQUEUE_SIGNING_KEYS as key bytes, each checked; ConfigError names the entry.

    A list of keys, or (from ``-s`` on the command line) one string: a JSON list
    or keys separated by commas. An error never shows a key, only its position
    and length: a key is a secret, and the message reaches logs.
    """
    value = ring_entries(SETTING, value, "keys")
    keys: list[bytes] = []
    for position, key in enumerate(value, start=1):
        if not isinstance(key, str):
            raise ConfigError(
                f"{SETTING}: key {position} must be a string, got a {type(key).__name__}"
            )
        try:
            raw = base64.urlsafe_b64decode(key.encode("ascii"))
        except (ValueError, binascii.Error):
            raw = b""
        if len(raw) != KEY_BYTES:
            raise ConfigError(
                f"{SETTING}: key {position} is not a signing key ({KEY_BYTES} random bytes in "
                f"url-safe base64, 44 characters; got {len(key)} characters, not shown). Make "
                "one with: scrapy retryqueue keygen"
            )
        keys.append(raw)
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{SETTING} lists a key twice")
    if len({key_id(key) for key in keys}) != len(keys):
        raise ConfigError(f"{SETTING}: two keys share a key id; make a new one for either")
    return tuple(keys)


def _b64(mac: bytes) -> str:
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


class _Mac:
    """HMAC-SHA256 with one key (RFC 2104), its padded key hashed once: a signature
    costs two copies of a hash state instead of hmac.digest's set-up each time."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        block = key.ljust(hashlib.sha256().block_size, b"\x00")  # keys are 32 bytes
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def __call__(self, message: bytes) -> str:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return _b64(outer.digest())


class KeyRing:
    """Signs with the first of its keys and verifies with any of them."""

    __slots__ = ("_keys", "_signing", "ids")

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ConfigError(f"{SETTING} is empty: there is no key to sign with")
        self._keys = {key_id(key): _Mac(key) for key in keys}
        #: The ids of the keys, the signing key's first.
        self.ids: tuple[str, ...] = tuple(self._keys)
        self._signing = (self.ids[0], self._keys[self.ids[0]])

    @property
    def signing_id(self) -> str:
        """The id of the key that signs."""
        return self._signing[0]

    def sign(self, message: bytes) -> str:
        """The signature of *message* with the first key."""
        kid, mac = self._signing
        return f"{kid}.{mac(message)}"

    def verify(self, message: bytes, signature: Any) -> None:
        """Nothing when *signature* is a signature of *message* by a key of the ring;
        else SignatureError, which says why (unsigned, a key not listed, a bad MAC)."""
        kid = signature_key_id(signature)
        if kid is None:
            if signature is None:
                raise SignatureError("unsigned", "it carries no signature")
            raise SignatureError("unsigned", "its signature is not one this package writes")
        mac = self._keys.get(kid)
        if mac is None:
            raise SignatureError(
                "unknown key",
                f"it is signed with key {kid}, which {SETTING} does not list "
                f"(listed: {', '.join(self.ids)})",
            )
        if not hmac.compare_digest(mac(message), signature[KEY_ID_DIGITS + 1 :]):
            raise SignatureError("bad signature", f"its signature (key {kid}) does not match it")

    def knows(self, signature: Any) -> bool:
        """Whether a key of the ring could have made *signature* (its key id is listed)."""
        return signature_key_id(signature) in self._keys


def signature_key_id(signature: Any) -> str | None:
    """The key id a signature names; None when *signature* is no signature's shape."""
    if (
        not isinstance(signature, str)
        or len(signature) != SIGNATURE_LENGTH
        or signature[KEY_ID_DIGITS] != "."
        or not signature.isascii()
    ):
        return None
    kid = signature[:KEY_ID_DIGITS]
    return kid if all(c in "0123456789abcdef" for c in kid) else None


def ring_for(keys: Iterable[bytes]) -> KeyRing | None:
    """The key ring of a parsed RETRYQUEUE_SIGNING_KEYS; None when no key is set."""
    keys = tuple(keys)
    return KeyRing(keys) if keys else None
