"""The signatures of stored entries: what each covers, how it is carried, how it is checked.

With RETRYQUEUE_SIGNING_KEYS (:mod:`scrapy_retryqueue.secure.signing`) three
kinds of entry are signed where they are written and checked before the crawl
acts on them:

- a task envelope (the retry queue's ``tasks``, ``deadtasks``): its whole JSON
  text, in the project's namespace. Its task id and spider are fields of that
  text, checked against where it sits; its ``updated`` time is the version a
  replay is told by (:func:`check_claimed`).
- a frontier request: its JSON text, with the spider, the namespace and the
  request id it is stored under.
- a lifecycle event a node composes (``scheduled``, ``succeeded``, ``dead``,
  ``cancelled``, ``released``): its fields, with the spider and the namespace.

A signed JSON text carries its signature as its last field, ``"sig"``: the
bytes signed are the text without it, exactly as stored, so nothing is
serialized again to check it (no canonical form to agree on, a few µs per
entry). An event carries it as its ``sig`` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..exceptions import SignatureError
from ..secure.signing import SIGNATURE_LENGTH, KeyRing, signature_key_id

#: The field that carries a signature, in a JSON text and in an event.
FIELD = "sig"
#: What a signed JSON text ends with: ``,"sig":"<signature>"}``.
_TAIL_HEAD = f',"{FIELD}":"'
_TAIL = len(_TAIL_HEAD) + SIGNATURE_LENGTH + 2
_VERSION = b"rq1"


def _message(purpose: bytes, *context: str, body: str) -> bytes:
    parts = [_VERSION, purpose, *(c.encode("utf-8", "surrogatepass") for c in context)]
    parts.append(body.encode("utf-8", "surrogatepass"))
    return b"\x00".join(parts)


def _signed(text: str, signature: str) -> str:
    if not text.endswith("}") or text == "{}":
        raise ValueError("only a non-empty JSON object's text can carry a signature")
    return f'{text[:-1]}{_TAIL_HEAD}{signature}"}}'


def split_signed(text: str) -> tuple[str, str | None]:
    """(the text that was signed, the signature) of a stored JSON text; (text, None)
    when it carries no signature as its last field."""
    if (
        len(text) > _TAIL
        and text.endswith('"}')
        and text[-_TAIL : -_TAIL + len(_TAIL_HEAD)] == _TAIL_HEAD
    ):
        return text[:-_TAIL] + "}", text[-SIGNATURE_LENGTH - 2 : -2]
    return text, None


def is_signed(text: Any) -> bool:
    """Whether a stored JSON text carries a signature of this package's shape."""
    return isinstance(text, str) and split_signed(text)[1] is not None


def signed_key_id(text: Any) -> str | None:
    """The key id a stored JSON text's signature names, None when it carries none."""
    return signature_key_id(split_signed(text)[1]) if isinstance(text, str) else None


# -- envelopes -------------------------------------------------------------------------


def sign_envelope(text: str, ring: KeyRing, namespace: str) -> str:
    """*text* (Task.to_json) with its signature as its last field."""
    return _signed(text, ring.sign(_message(b"envelope", namespace, body=text)))


def verify_envelope(text: str, ring: KeyRing, namespace: str) -> None:
    """SignatureError unless *text* is an envelope signed by a key of *ring* in *namespace*."""
    signed, signature = split_signed(text)
    ring.verify(_message(b"envelope", namespace, body=signed), signature)


def check_claimed(
    doc: Mapping[str, Any],
    *,
    task_id: str,
    spider: str,
    version: int | None,
    finished: int | None,
) -> None:
    """SignatureError when a claimed envelope (its signature verified, or signing off)
    is not the live task it sits as.

    *doc* is the envelope; *task_id* and *spider* where it was claimed; *version*
    the ``updated`` time recorded beside the live task (``versions``) and
    *finished* the one recorded when a task of this id last finished
    (``finished``), None when there is none (or signing is off, when nothing is
    recorded and only the first two checks apply).
    """
    if doc.get("id") != task_id:
        raise SignatureError(
            "moved", f"it was written for task {_short(doc.get('id'))}, not this one"
        )
    if doc.get("spider") != spider:
        raise SignatureError(
            "moved", f"it was written for spider {_short(doc.get('spider'))}, not this one"
        )
    updated = doc.get("updated")
    if finished is not None and isinstance(updated, int) and updated <= finished:
        raise SignatureError(
            "replay",
            f"its task finished with the envelope written at {finished} "
            f"(this one was written at {updated})",
        )
    if version is not None and updated != version:
        raise SignatureError(
            "replay",
            f"the live task's envelope was written at {version}, this one at {_short(updated)}",
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- frontier requests ---------------------------------------------------------------


def sign_frontier_request(
    text: str, ring: KeyRing, namespace: str, spider: str, request_id: str
) -> str:
    """A frontier request's JSON text with its signature, bound to where it is stored."""
    message = _message(b"frontier", namespace, spider, request_id, body=text)
    return _signed(text, ring.sign(message))


def verify_frontier_request(
    text: str, ring: KeyRing, namespace: str, spider: str, request_id: str
) -> None:
    """SignatureError unless *text* was signed for this request id of this spider."""
    signed, signature = split_signed(text)
    ring.verify(_message(b"frontier", namespace, spider, request_id, body=signed), signature)


# -- events ------------------------------------------------------------------------------


def _event_body(fields: Mapping[str, Any]) -> str:
    return "\x00".join(
        f"{name}={'' if value is None else value}"
        for name, value in sorted(fields.items())
        if name != FIELD
    )


def sign_event(fields: Mapping[str, Any], ring: KeyRing, namespace: str, spider: str) -> str:
    """The signature of an event a script will write with exactly these *fields*
    (values as Redis stores them: ints as their decimal text)."""
    return ring.sign(_message(b"event", namespace, spider, body=_event_body(fields)))


def verify_event(fields: Mapping[str, str], ring: KeyRing, namespace: str, spider: str) -> None:
    """SignatureError unless the event's ``sig`` field signs its other fields."""
    message = _message(b"event", namespace, spider, body=_event_body(fields))
    ring.verify(message, fields.get(FIELD))
