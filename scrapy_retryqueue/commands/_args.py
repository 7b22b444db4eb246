"""A command's arguments checked before it opens anything: spider names, empty values, numbers.

A refused command leaves the disk and the servers as it found them. The checks
here read only the parsed options, so each subcommand runs them before it opens
the store or Redis, starts the embedded server, or creates a file (docs/commands.md,
"Output and errors"). Each error is one line naming the option and its value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..values import shown
from ._common import CommandFailed


def split_values(
    option: str, values: Sequence[str], *, every: str = "match every one"
) -> list[str]:
    """The values of a repeatable option, each occurrence split at commas and stripped.

    An empty value is an error, not a value dropped: ``--spider "$UNSET"`` would
    otherwise widen the command to everything (*every* says to what).
    """
    parts = []
    for value in values:
        split = [part.strip() for part in value.split(",")]
        if not all(split):
            raise CommandFailed(
                f"{option} {shown(value, 80)} holds an empty value; give a value, or leave "
                f"{option} out to {every}"
            )
        parts.extend(split)
    return parts


def spider_names(
    values: Sequence[str], *, option: str = "--spider", every: str = "match every one"
) -> list[str]:
    """The spider names of *option*; one no queue can have (``{}``) is an error now,
    rather than after the store or Redis was opened for it."""
    from ..exceptions import SpiderNameError
    from ..queue.keys import keys_for

    names = split_values(option, values, every=every)
    for name in names:
        try:
            keys_for(name)
        except SpiderNameError as exc:
            raise CommandFailed(f"{option}: {exc}") from None
    return names


def refuse_empty(ns: Any, *options: str) -> None:
    """An option given as an empty text (``--token ""``) is an error, not its default."""
    for option in options:
        value = getattr(ns, option.lstrip("-").replace("-", "_"), None)
        if isinstance(value, str) and not value.strip():
            raise CommandFailed(f"{option} is empty; give a value, or leave {option} out")


def check_limit(ns: Any) -> None:
    """``--limit N``: at least 1 (0 would be "nothing", which no one asks for)."""
    limit = getattr(ns, "limit", None)
    if limit is not None and limit < 1:
        raise CommandFailed(f"--limit must be >= 1, got {limit}")


def check_seconds(option: str, value: float) -> None:
    """A positive, finite number of seconds (``nan`` and ``inf`` parse as floats)."""
    if not (value > 0 and math.isfinite(value)):
        raise CommandFailed(f"{option} must be > 0 seconds, got {value:g}")
