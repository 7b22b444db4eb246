"""What importing the edges loads: the commands and the dashboard never load the crawl stack,
and nothing loads the store's SQLAlchemy and Alembic before the store is used.

Each check runs in a fresh interpreter, so modules other tests imported do not count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The modules a crawl runs on: the commands and the dashboard must not need them.
CRAWL_STACK = (
    "scrapy_retryqueue.runtime",
    "scrapy_retryqueue.crawl.middleware",
    "scrapy_retryqueue.crawl.extension",
    "scrapy_retryqueue.crawl.spidermiddleware",
)
STORE_DEPENDENCIES = ("sqlalchemy", "alembic")


def loaded_after(*imports: str) -> set[str]:
    """The names of the modules loaded by importing *imports* in a fresh interpreter."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(imports)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(name for name in names if name in modules)


@pytest.mark.parametrize(
    "module",
    [
        "scrapy_retryqueue.commands.retryqueue",
        "scrapy_retryqueue.commands.deadletters",
        "scrapy_retryqueue.commands._writer",
        "scrapy_retryqueue.dashboard.app",
        "scrapy_retryqueue.store.service",
    ],
)
def test_the_commands_and_the_dashboard_do_not_import_the_crawl_stack(module: str) -> None:
    assert _loaded(loaded_after(module), (*CRAWL_STACK, "scrapy_retryqueue.crawl.storeext")) == []


def test_the_store_writer_service_imports_neither_scrapy_nor_twisted() -> None:
    """It runs in a crawl, in a command, or anywhere else: Scrapy is its callers' business."""
    import ast

    source = (ROOT / "scrapy_retryqueue" / "store" / "service.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    assert imported.isdisjoint({"scrapy", "twisted", "scrapy_redis"}), imported


def test_the_commands_do_not_import_the_store_until_they_run() -> None:
    # Scrapy imports every command's module whenever `scrapy` runs, a crawl too.
    modules = loaded_after(
        "scrapy_retryqueue.commands.retryqueue", "scrapy_retryqueue.commands.deadletters"
    )
    assert _loaded(modules, STORE_DEPENDENCIES) == []


@pytest.mark.parametrize("module", ["scrapy_retryqueue", "scrapy_retryqueue.crawl.storeext"])
def test_a_crawl_does_not_import_the_store_before_it_is_used(module: str) -> None:
    assert _loaded(loaded_after(module), STORE_DEPENDENCIES) == []
