"""``scrapy retryqueue settings``: each RETRYQUEUE_* setting's effective value and where it came from.

The value is the one a crawl reads (its default when nothing sets it), its source
Scrapy's priority name (``settings.getpriority``: default, command, addon, project,
spider, cmdline). Scrapy's RETRY_* and scrapy-redis's REDIS_* settings that the
add-on reads are listed too, when the project sets them. Secrets never show: the
passwords of URLs, the dashboard token and the encryption keys read ``***``.
The settings are then checked as a crawl checks them; a bad one is its one line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES

from ..config import load_config, redact_url
from ..exceptions import ConfigError
from ..secure.redact import MASK, mask_url_passwords
from ..settings.defaults import SETTINGS
from ._args import spider_names
from ._common import CommandFailed

#: Scrapy's RetryMiddleware settings the add-on maps onto its own
#: (config/scrapycompat.py; a test keeps this list and that module's names equal).
SCRAPY_RETRY_SETTINGS = (
    "RETRY_ENABLED",
    "RETRY_TIMES",
    "RETRY_HTTP_CODES",
    "RETRY_EXCEPTIONS",
    "RETRY_PRIORITY_ADJUST",
    "RETRY_GIVE_UP_LOG_LEVEL",
)
#: scrapy-redis's settings that name the Redis when RETRYQUEUE_REDIS_URL is unset.
SCRAPY_REDIS_SETTINGS = ("REDIS_URL", "REDIS_PARAMS", "REDIS_HOST", "REDIS_PORT")
#: Settings whose whole value is a secret.
SECRET_SETTINGS = frozenset(
    {"RETRYQUEUE_DASHBOARD_TOKEN", "RETRYQUEUE_ENCRYPTION_KEYS", "RETRYQUEUE_SIGNING_KEYS"}
)
#: Settings holding a URL, which may carry a password.
URL_SETTINGS = frozenset({"RETRYQUEUE_REDIS_URL", "RETRYQUEUE_DATABASE_URL", "REDIS_URL"})
#: redis-py's arguments in REDIS_PARAMS whose values are secrets (password,
#: ssl_password, credential_provider...).
_SECRET_ARGUMENT = re.compile(r"password|secret|token|credential", re.IGNORECASE)
#: A URL's query arguments whose values are secrets (``?password=``, which redis-py
#: and libpq both read).
_SECRET_QUERY = re.compile(r"([?&][^=&#\s]*(?:pass|secret|token)[^=&#\s]*=)[^&#\s]*", re.I)
#: The dashboard takes its token from the environment before the setting.
TOKEN_ENV = "RETRYQUEUE_DASHBOARD_TOKEN"
#: Said when a source is the environment rather than a Scrapy priority.
ENVIRONMENT = "environment"

_PRIORITY_NAMES = {number: name for name, number in SETTINGS_PRIORITIES.items()}


def source_of(settings: Any, name: str) -> str:
    """Scrapy's name for the priority *name* was set with; ``default`` when unset."""
    priority = settings.getpriority(name)
    if priority is None:
        return "default"  # not in Scrapy's settings at all: the add-on's own default
    return _PRIORITY_NAMES.get(priority, f"priority {priority}")


def with_spider(settings: Any, values: list[str]) -> Any:
    """*settings* as a crawl of the spider *values* names starts with them: its
    ``custom_settings`` at the spider priority. The settings themselves when none."""
    if not values:
        return settings
    names = spider_names(values)
    if len(names) != 1:
        raise CommandFailed(f"--spider {', '.join(names)}: settings shows one spider at a time")
    name = names[0]
    if not settings.getlist("SPIDER_MODULES"):
        raise CommandFailed(
            f"--spider {name!r}: no spider is known outside a project (run it next to scrapy.cfg)"
        )
    from scrapy.spiderloader import get_spider_loader

    try:
        loader = get_spider_loader(settings)
        known = sorted(loader.list())
        spidercls = loader.load(name) if name in known else None
    except Exception as exc:  # the project's own code: any error, said in one line
        raise CommandFailed(
            f"the project's spiders cannot be loaded to find --spider {name!r} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if spidercls is None:
        raise CommandFailed(
            f"--spider {name!r}: no spider of that name in this project (its spiders: "
            f"{', '.join(known) or 'none'})"
        )
    copy = settings.copy()
    spidercls.update_settings(copy)
    return copy


def report(settings: Any, *, changed: bool = False) -> dict[str, Any]:
    """Every setting's value, default and source (JSON-ready, secrets masked), the
    notes on Scrapy's RETRY_* settings, and the first error a crawl would stop at."""
    error, config = None, None
    try:
        config = check(settings)
    except ConfigError as exc:
        error = str(exc)
    out: dict[str, Any] = {"settings": {}, "scrapy": {}, "notes": [], "error": error}
    for name, default in SETTINGS.items():
        source = source_of(settings, name)
        value = settings.get(name)
        entry = {
            "value": masked(name, default if value is None else value),
            "default": masked(name, default),
            "source": source,
        }
        if name == "RETRYQUEUE_DASHBOARD_TOKEN" and os.environ.get(TOKEN_ENV):
            entry.update(value=MASK, source=ENVIRONMENT)
        if config is not None and name in _RESOLVED:
            entry["resolved"] = masked(name, _RESOLVED[name](config, settings))
        if not changed or entry["source"] != "default":
            out["settings"][name] = entry
    for name in (*SCRAPY_RETRY_SETTINGS, *SCRAPY_REDIS_SETTINGS):
        if (settings.getpriority(name) or 0) > 0:  # what the project set, not Scrapy's default
            out["scrapy"][name] = {
                "value": masked(name, settings.get(name)),
                "source": source_of(settings, name),
            }
    if config is not None:
        from ..config.scrapycompat import read_scrapy_retry

        out["notes"] = read_scrapy_retry(settings, config.kinds).notices
    return out


def check(settings: Any) -> Any:
    """The settings validated as a crawl validates them (and the dashboard's):
    the Config, or the ConfigError of the first bad one."""
    from ..dashboard.settings import load_dashboard_config
    from ..store.config import load_store_config

    config = load_config(settings)
    load_store_config(settings)
    load_dashboard_config(settings)
    return config


def _directory(config: Any) -> Any:
    """The embedded server's directory, where the default SQLite store lives too."""
    from ..queue.connection import embedded_dir

    return embedded_dir(config.embedded_dir)


def _redis_in_use(config: Any, settings: Any) -> str:
    from ..queue import embedded

    if config.redis_url:
        return f"{config.redis_url} ({config.redis_url_setting})"
    return f"{embedded.server_url(_directory(config))} (the embedded server)"


def _database_in_use(config: Any, settings: Any) -> str:
    from ..store.config import load_store_config

    return load_store_config(settings).url_for(_directory(config))


#: What a setting left unset means in the crawl, read from the validated settings.
_RESOLVED = {
    "RETRYQUEUE_REDIS_URL": _redis_in_use,
    "RETRYQUEUE_DATABASE_URL": _database_in_use,
    "RETRYQUEUE_MAX_IN_FLIGHT": lambda config, _: config.max_in_flight,
    "RETRYQUEUE_NAMESPACE": lambda config, _: config.namespace,
    "RETRYQUEUE_EMBEDDED_DIR": lambda config, _: str(_directory(config)),
    "RETRYQUEUE_NODE_ID": lambda config, settings: (
        settings.get("RETRYQUEUE_NODE_ID") or "<host name>:<pid> of each crawl"
    ),
}


def masked(name: str, value: Any) -> Any:
    """*value* as it may be shown (JSON-ready): secrets as ``***``."""
    if name in SECRET_SETTINGS and value not in (None, "", [], ()):
        if isinstance(value, (list, tuple)):
            return [MASK] * len(value)
        return MASK
    if name == "REDIS_PARAMS" and value not in (None, ""):
        if isinstance(value, str):  # -s REDIS_PARAMS='{"password": ...}'
            try:
                value = json.loads(value)
            except ValueError:
                return MASK  # not JSON, so not read: it may hold a password all the same
        if isinstance(value, Mapping):
            return {
                str(key): MASK if item and _SECRET_ARGUMENT.search(str(key)) else _plain(item)
                for key, item in value.items()
            }
    return _plain(value)


def _plain(value: Any) -> Any:
    """*value* for JSON and for people: classes and functions as their import path,
    the passwords of URLs masked, wherever they are nested."""
    if isinstance(value, str):
        return _mask_url(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(item) for item in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", None)
        if module and qualname:
            return f"{module}.{qualname}"
    return _mask_url(repr(value))


def _mask_url(text: str) -> str:
    """*text* with a URL's password masked, in its user part and in its query."""
    text = mask_url_passwords(redact_url(text) if "://" in text else text)
    return _SECRET_QUERY.sub(lambda found: found.group(1) + MASK, text)


# -- output -------------------------------------------------------------------


def _shown(entry: dict[str, Any]) -> str:
    text = _text(entry["value"])
    if entry["value"] in (None, "") and "resolved" in entry:
        # What the crawl derives from a setting left unset: said beside it.
        resolved = entry["resolved"]
        used = resolved if isinstance(resolved, str) and resolved else repr(resolved)
        text += f"  (in use: {used})"
    return text


def _text(value: Any) -> str:
    return value if isinstance(value, str) and value == MASK else repr(value)


def render_table(report: dict[str, Any]) -> str:
    rows = [(name, e["source"], _shown(e)) for name, e in report["settings"].items()]
    others = [(name, e["source"], _text(e["value"])) for name, e in report["scrapy"].items()]
    header = ("setting", "from", "value")
    width = [max(len(r[i]) for r in (header, *rows, *others)) for i in range(2)]

    def line(row: tuple[str, str, str]) -> str:
        return f"{row[0].ljust(width[0])}  {row[1].ljust(width[1])}  {row[2]}".rstrip()

    lines = [line(header), *(line(row) for row in rows)]
    if not rows:
        lines.append("(every RETRYQUEUE_* setting is at its default)")
    if others:
        lines += ["", "Scrapy's and scrapy-redis's settings the add-on reads, as set:"]
        lines += [line(row) for row in others]
    lines += [f"note: {note}" for note in report["notes"]]
    return "\n".join(lines)


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)
