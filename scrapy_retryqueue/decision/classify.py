"""Failure classification: a response or an exception becomes a failure kind.

Pure functions over plain values; the Scrapy glue extracts status, headers and
exceptions and passes them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError
from ..settings.defaults import ERROR_MESSAGE_MAX
from . import kinds
from .retryafter import parse_retry_after


@dataclass(frozen=True, slots=True)
class FailureInfo:
    """What went wrong with one attempt of a request."""

    kind: str
    error_type: str
    message: str
    status: int | None = None
    #: Seconds the server asked us to wait (Retry-After), before any cap.
    retry_after: float | None = None

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"kind": self.kind, "type": self.error_type, "message": self.message}
        if self.status is not None:
            d["status"] = self.status
        return d


def classify_status(
    status: int,
    retry_after_header: bytes | str | None,
    *,
    status_kinds: Mapping[int, str],
    now: float,
) -> FailureInfo | None:
    """The failure a response status means, or None when it is not a failure."""
    kind = status_kinds.get(status)
    if kind is None:
        return None
    retry_after = parse_retry_after(retry_after_header, now=now)
    # A 503 that says when to come back is the server throttling us, not breaking
    # (unless the project mapped 503 to a kind of its own).
    if status == 503 and retry_after is not None and kind == kinds.SERVER_ERROR:
        kind = kinds.RATE_LIMITED
    return FailureInfo(
        kind=kind,
        error_type="HttpStatus",
        message=f"HTTP {status}",
        status=status,
        retry_after=retry_after if kind == kinds.RATE_LIMITED else None,
    )


def classify_exception(
    exc: BaseException, *, exception_kinds: Mapping[type, str], unknown_kind: str = kinds.UNKNOWN
) -> FailureInfo:
    """The failure an exception means; the most specific class in its MRO wins."""
    kind = unknown_kind
    for cls in type(exc).__mro__:
        if cls in exception_kinds:
            kind = exception_kinds[cls]
            break
    return FailureInfo(
        kind=kind, error_type=_qualname(type(exc)), message=str(exc)[:ERROR_MESSAGE_MAX]
    )


def failure_for_kind(kind: str, exc: BaseException) -> FailureInfo:
    """A failure whose kind the caller already knows (parse, storage, rule, RetryLater's)."""
    return FailureInfo(
        kind=kind, error_type=_qualname(type(exc)), message=str(exc)[:ERROR_MESSAGE_MAX]
    )


def _qualname(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def exception_class(value: Any, *, where: str) -> type[BaseException]:
    """An exception class, or the import path of one; ConfigError names *where* it was."""
    from scrapy.utils.misc import load_object

    try:
        cls = load_object(value) if isinstance(value, str) else value
    except (ImportError, AttributeError, NameError, ValueError) as exc:
        raise ConfigError(f"{where} {value!r} does not import: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise ConfigError(f"{where} {value!r} is not an exception class")
    return cls


def exception_kinds_of(paths: Mapping[str, str]) -> dict[type, str]:
    """Exception class paths -> kind, resolved; a class this Scrapy or Twisted version
    does not have is skipped (the default table names classes of several versions)."""
    from scrapy.utils.misc import load_object

    resolved: dict[type, str] = {}
    for path, kind in paths.items():
        try:
            resolved[load_object(path)] = kind
        except (ImportError, AttributeError, NameError):
            continue
    return resolved
