"""Retry-After headers read as seconds to wait (delta-seconds or an HTTP-date).

Pure, no I/O. :mod:`.classify` reads a failing response's header with it; the policy
then holds a rate-limited retry's delay at least that long (up to
RETRYQUEUE_RETRY_AFTER_MAX).
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime


def parse_retry_after(value: bytes | str | None, *, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date).

    None when the header is absent or unreadable; a date in the past gives 0.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    value = value.strip()
    if not value:
        return None
    # isdigit() alone accepts "²" (latin-1 0xB2), which float() refuses.
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)
