"""Generic setting readers: a value or its default, numbers, booleans, levels, JSON text.

Every RETRYQUEUE_* reader of the package builds on these, and so do the store's and
the dashboard's settings; :func:`unknown_settings` names what is no setting (a
misspelling). A bad value raises :class:`ConfigError` naming the setting
and showing the value. Defaults come from :mod:`scrapy_retryqueue.settings.defaults`.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
from collections.abc import Iterable
from typing import Any

from ..exceptions import ConfigError
from ..settings import defaults
from ..settings.bounds import check_number
from ..values import shown

#: What every setting of the package starts with.
SETTING_PREFIX = "RETRYQUEUE_"


def raw_setting(settings: Any, name: str) -> Any:
    """The setting's value as given, or its default when unset (None)."""
    value = settings.get(name)
    return defaults.SETTINGS[name] if value is None else value


#: How deep a setting's JSON text may nest: far more than any setting's own shape,
#: far less than what the checks that walk it could recurse through.
_JSON_DEPTH_MAX = 64


def _depth_over(value: Any, limit: int) -> bool:
    """Whether *value* nests lists or dicts deeper than *limit*, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            stack.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return False


def maybe_json(name: str, value: Any) -> Any:
    """*value*, or what its JSON text holds when it is a string; ConfigError names *name*."""
    # Settings given with -s on the command line arrive as strings.
    if isinstance(value, str):
        try:
            loaded = json.loads(value)
        except ValueError:
            raise ConfigError(
                f"{name} must be a dict (or its JSON text), got {shown(value)}"
            ) from None
        except RecursionError:
            loaded = None
            too_deep = True
        else:
            # Python before 3.13 raises RecursionError here; 3.13's parser reads it.
            too_deep = _depth_over(loaded, _JSON_DEPTH_MAX)
        if too_deep:
            raise ConfigError(
                f"{name} is nested too deeply to be read ({len(value)} characters of JSON)"
            )
        return loaded
    return value


def unknown_settings(names: Iterable[Any]) -> list[str]:
    """One notice per RETRYQUEUE_* name of *names* that is no setting, naming the
    closest known one: a misspelt setting would otherwise be ignored without a word.

    The known names are :data:`defaults.SETTINGS`' keys, so a setting added
    there is known here at once.
    """
    # Compared without the prefix every name shares, which would make any two close.
    known = {name.removeprefix(SETTING_PREFIX): name for name in defaults.SETTINGS}
    notices = []
    for name in sorted({n for n in names if isinstance(n, str)}):
        if not name.startswith(SETTING_PREFIX) or name in defaults.SETTINGS:
            continue
        if name in defaults.RETIRED_SETTINGS:  # said by config.thresholds.retired_settings
            continue
        close = difflib.get_close_matches(name.removeprefix(SETTING_PREFIX), known, 1, 0.7)
        hint = f"; did you mean {known[close[0]]}?" if close else "; it is not read"
        notices.append(f"{shown(name, 80)} is not a scrapy-retryqueue setting{hint}")
    return notices


def number_setting(settings: Any, name: str, *, whole: bool = False, **bounds: Any) -> Any:
    """A numeric setting, its text (``-s NAME=3``) read as a number, checked by
    :func:`~.bounds.check_number` with *whole* and *bounds* (minimum, strict, finite,
    maximum), which says the bounds and the error line."""
    value = raw_setting(settings, name)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value) if not whole else int(value)
    return check_number(name, value, whole=whole, **bounds)


def bool_setting(settings: Any, name: str) -> bool:
    value = raw_setting(settings, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, str)) and str(value).strip().lower() in {"0", "1", "true", "false"}:
        return str(value).strip().lower() in {"1", "true"}
    raise ConfigError(f"{name} must be True or False, got {shown(value)}")


def log_level_setting(settings: Any, name: str) -> int:
    """A logging level setting (a name like 'WARNING', or a number) as a number."""
    value = raw_setting(settings, name)
    level = logging.getLevelName(value.upper()) if isinstance(value, str) else value
    if not isinstance(level, int) or isinstance(level, bool):
        raise ConfigError(f"{name} must be a logging level like 'WARNING', got {value!r}")
    return level


def optional_str_setting(settings: Any, name: str) -> str | None:
    """A text or path setting; None when unset or empty."""
    value = raw_setting(settings, name)
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return os.fspath(value)


def setting_names(settings: Any) -> list[Any]:
    """The names *settings* holds: a Scrapy Settings object or a dict."""
    try:
        return list(settings)
    except TypeError:
        return []
