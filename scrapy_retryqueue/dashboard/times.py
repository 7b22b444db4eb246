"""Times as the dashboard's answers write them: ISO 8601 text, from a datetime or from ms."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def ms_iso(ms: int | None) -> str | None:
    """An ISO time from ms since the epoch; None for None or a time no date can hold."""
    if ms is None:
        return None
    try:
        return iso(datetime.fromtimestamp(ms / 1000, UTC))
    except (OverflowError, OSError, ValueError):
        return None
