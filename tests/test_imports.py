"""What importing the package loads: nothing of the crawl stack, the store or
loguru until it is used, and loguru only through its public API.

Each check imports in a fresh interpreter, since this test process has long
imported everything.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from scrapy.settings import Settings

import scrapy_retryqueue
from scrapy_retryqueue.crawl.addon import COMPONENTS, STOCK_RETRY_MIDDLEWARE, Addon

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scrapy_retryqueue"

#: Modules (and packages, with their submodules) that must wait until used.
HEAVY = (
    "sqlalchemy",
    "alembic",
    "loguru",
    "scrapy_retryqueue.store",
    "scrapy_retryqueue.crawl.storeext",
    "scrapy_retryqueue.writer",
    "scrapy_retryqueue.dashboard",
    "scrapy_retryqueue.commands",
    "scrapy_retryqueue.runtime.facade",
    "scrapy_retryqueue.runtime.writes",
    "scrapy_retryqueue.crawl.middleware",
    "scrapy_retryqueue.crawl.spidermiddleware",
    "scrapy_retryqueue.crawl.extension",
)


def loaded_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The *heavy* modules in sys.modules after running *code* in a new interpreter."""
    probe = (
        "import json, sys\n"
        f"{code}\n"
        f"heavy = {heavy!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if any(m == h or m.startswith(h + '.') for h in heavy))))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_package_loads_nothing_heavy() -> None:
    assert loaded_after("import scrapy_retryqueue") == []


def test_loading_the_commands_loads_no_client() -> None:
    # Scrapy loads every entry-point command for any ``scrapy`` run, a stock
    # crawl included: what they import, every run of the project pays.
    code = "\n".join(
        f"from importlib import import_module; import_module({ep.module!r}).{ep.attr}()"
        for ep in entry_points(group="scrapy.commands")
        if ep.value.startswith("scrapy_retryqueue.")
    )
    assert code
    heavy = tuple(h for h in HEAVY if h != "scrapy_retryqueue.commands") + ("redis", "uvicorn")
    assert loaded_after(code, heavy) == []


@pytest.mark.parametrize(
    "module",
    [
        "defaults",
        "values",
        "exceptions",
        "config",
        "policy",
        "classify",
        "backoff",
        "envelope",
        "keys",
        "queue",
        "domains",
        "connection",
        "embedded",
        "spool",
        "audit",
        "addon",
    ],
)
def test_the_core_modules_load_nothing_heavy(module: str) -> None:
    assert loaded_after(f"import scrapy_retryqueue.{module}") == []


def test_the_add_on_registers_components_without_importing_them() -> None:
    code = (
        "from scrapy.settings import Settings\n"
        "from scrapy_retryqueue import Addon\n"
        "Addon().update_settings(Settings())"
    )
    assert loaded_after(code) == []


def test_public_names_still_import_from_the_package() -> None:
    code = (
        "from scrapy_retryqueue import Addon, RetryQueueMiddleware\n"
        "import scrapy_retryqueue.crawl.addon, scrapy_retryqueue.crawl.middleware\n"
        "assert Addon is scrapy_retryqueue.crawl.addon.Addon\n"
        "assert RetryQueueMiddleware is scrapy_retryqueue.crawl.middleware.RetryQueueMiddleware"
    )
    assert "scrapy_retryqueue.crawl.middleware" in loaded_after(code)


def test_every_public_name_resolves_and_is_listed() -> None:
    for name in scrapy_retryqueue.__all__:
        assert getattr(scrapy_retryqueue, name).__name__ == name
    assert set(scrapy_retryqueue.__all__) <= set(dir(scrapy_retryqueue))
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        scrapy_retryqueue.Nothing  # noqa: B018


def test_no_module_uses_a_private_loguru_module() -> None:
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith("loguru._"), f"{path.name} imports {name}"


# -- the add-on's settings ------------------------------------------------------------


def test_every_component_path_names_its_class() -> None:
    from scrapy.utils.misc import load_object

    for _setting, path, _order in COMPONENTS:
        cls = load_object(path)
        assert f"{cls.__module__}.{cls.__qualname__}" == path


def test_the_add_on_swaps_the_retry_middleware_and_adds_ours() -> None:
    from scrapy.downloadermiddlewares.retry import RetryMiddleware

    from scrapy_retryqueue import RetryQueueMiddleware

    settings = Settings(
        {
            "DOWNLOADER_MIDDLEWARES": {RetryMiddleware: 550, RetryQueueMiddleware: 1},
            # Another path to our own class: replaced, not listed twice.
            "SPIDER_MIDDLEWARES": {"scrapy_retryqueue.RetryQueueSpiderMiddleware": 1},
            "EXTENSIONS": {"myproject.extensions.Other": 10},
        }
    )
    Addon().update_settings(settings)

    assert settings.getdict("DOWNLOADER_MIDDLEWARES") == {
        STOCK_RETRY_MIDDLEWARE: None,
        "scrapy_retryqueue.crawl.middleware.RetryQueueMiddleware": 550,
    }
    assert settings.getdict("SPIDER_MIDDLEWARES") == {
        "scrapy_retryqueue.crawl.spidermiddleware.RetryQueueSpiderMiddleware": 950,
    }
    assert settings.getdict("EXTENSIONS") == {
        "myproject.extensions.Other": 10,
        "scrapy_retryqueue.crawl.extension.RetryQueueExtension": 500,
        "scrapy_retryqueue.crawl.storeext.RetryQueueStoreExtension": 510,
    }


def test_the_add_on_keeps_the_setting_priority() -> None:
    from scrapy.settings import SETTINGS_PRIORITIES

    settings = Settings()
    settings.set("EXTENSIONS", {}, priority="project")
    Addon().update_settings(settings)
    assert settings.getpriority("EXTENSIONS") == SETTINGS_PRIORITIES["project"]


@pytest.mark.parametrize("enabled", [False, "False", "0", 0])
def test_a_disabled_add_on_leaves_scrapys_retry_middleware(enabled: object) -> None:
    settings = Settings({"RETRYQUEUE_ENABLED": enabled})
    Addon().update_settings(settings)
    assert settings.getdict("DOWNLOADER_MIDDLEWARES") == {}
    assert settings.getdict("EXTENSIONS") == {}
