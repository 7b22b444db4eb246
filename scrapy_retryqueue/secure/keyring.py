"""A key ring setting read as its list of entries: a list, or one string holding a JSON list or keys separated by commas.

RETRYQUEUE_ENCRYPTION_KEYS and RETRYQUEUE_SIGNING_KEYS are written the same way
(a list in settings.py, one string from ``-s`` on the command line); each module
then checks its own entries. An error never shows the setting's text: it holds keys.
"""

from __future__ import annotations

import json
from typing import Any

from ..exceptions import ConfigError


def ring_entries(setting: str, value: Any, what: str) -> list[Any]:
    """*value* of *setting* as the list of its entries, unchecked; [] when unset."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                raise ConfigError(
                    f"{setting} is not a JSON list of keys (its text is not shown: it holds "
                    f"secrets; {len(text)} characters)"
                ) from None
        else:
            value = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{setting} must be a list of {what}, got a {type(value).__name__}")
    return list(value)
