"""A number checked against its bounds: the one-line error that names the setting
and shows the value (the config package reads the settings; pure code that is given such a
number, like LearnedBackoff, checks it the same way)."""

from __future__ import annotations

import math
from typing import Any

from ..exceptions import ConfigError
from ..values import shown
from . import defaults


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float = 0.0,
    strict: bool = False,
    whole: bool = False,
    finite: bool = False,
    maximum: float | None = None,
) -> Any:
    """*value*, the number *name* holds; ConfigError names it and shows the value
    when it is not a number (NaN included), not whole when *whole*, infinite when
    *finite*, below *minimum* (or equal to it when *strict*), or above *maximum*.
    A whole float (``3.0``) comes back as an int when *whole*.

    *maximum* defaults to what Redis and the databases take: a whole number at
    most :data:`defaults.SETTING_INT_MAX`, any other (seconds) at most
    :data:`defaults.SETTING_SECONDS_MAX`. An infinite value is above it.
    """
    if maximum is None:
        maximum = defaults.SETTING_INT_MAX if whole else defaults.SETTING_SECONDS_MAX
    bad_type = isinstance(value, bool) or not isinstance(value, (int, float))
    if whole and isinstance(value, float) and value.is_integer():
        value = int(value)
    # NaN (e.g. -s NAME=nan) would pass every comparison below.
    if (
        bad_type
        or (whole and not isinstance(value, int))
        or math.isnan(value)
        or (finite and math.isinf(value))
    ):
        kind = "a whole number" if whole else "a number"
        raise ConfigError(f"{name} must be {kind}, got {shown(value)}")
    if value < minimum or (strict and value == minimum):
        op = ">" if strict else ">="
        raise ConfigError(f"{name} must be {op} {minimum:g}, got {value!r}")
    if value > maximum:
        bound = f"{maximum:.17g}" if isinstance(maximum, float) else str(maximum)
        raise ConfigError(f"{name} must be <= {bound}, got {value!r}")
    return value
