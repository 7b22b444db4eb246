"""The old import paths of modules that moved into the layer packages: still importable.

Until 0.2 the package kept every module flat (``scrapy_retryqueue.kinds``,
``scrapy_retryqueue.middleware``, ...). Projects name those paths in settings
(``RETRYQUEUE_BACKOFF``, ``SCHEDULER``, ``DOWNLOADER_MIDDLEWARES``) and import them in
code, so each old path stays an alias of its module in the new rooms: importing it
gives the very same module object (one class, one ``isinstance``), with no warning and
no copy of the code. The finder answers only the names listed here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

#: Old path -> the module's path now.
MOVED = {
    "scrapy_retryqueue.addon": "scrapy_retryqueue.crawl.addon",
    "scrapy_retryqueue.audit": "scrapy_retryqueue.runtime.audit",
    "scrapy_retryqueue.backoff": "scrapy_retryqueue.decision.backoff",
    "scrapy_retryqueue.bounds": "scrapy_retryqueue.settings.bounds",
    "scrapy_retryqueue.classify": "scrapy_retryqueue.decision.classify",
    "scrapy_retryqueue.connection": "scrapy_retryqueue.queue.connection",
    "scrapy_retryqueue.defaults": "scrapy_retryqueue.settings.defaults",
    "scrapy_retryqueue.domains": "scrapy_retryqueue.queue.domains",
    "scrapy_retryqueue.embedded": "scrapy_retryqueue.queue.embedded",
    "scrapy_retryqueue.encryption": "scrapy_retryqueue.secure.encryption",
    "scrapy_retryqueue.engineview": "scrapy_retryqueue.runtime.engineview",
    "scrapy_retryqueue.envelope": "scrapy_retryqueue.queue.envelope",
    "scrapy_retryqueue.events": "scrapy_retryqueue.queue.events",
    "scrapy_retryqueue.extension": "scrapy_retryqueue.crawl.extension",
    "scrapy_retryqueue.files": "scrapy_retryqueue.queue.files",
    "scrapy_retryqueue.frontier": "scrapy_retryqueue.crawl.frontier",
    "scrapy_retryqueue.keys": "scrapy_retryqueue.queue.keys",
    "scrapy_retryqueue.kinds": "scrapy_retryqueue.decision.kinds",
    "scrapy_retryqueue.learned": "scrapy_retryqueue.decision.learned",
    "scrapy_retryqueue.middleware": "scrapy_retryqueue.crawl.middleware",
    "scrapy_retryqueue.monitors": "scrapy_retryqueue.crawl.monitors",
    "scrapy_retryqueue.policy": "scrapy_retryqueue.decision.policy",
    "scrapy_retryqueue.recovery": "scrapy_retryqueue.decision.recovery",
    "scrapy_retryqueue.recoverysummary": "scrapy_retryqueue.decision.recoverysummary",
    "scrapy_retryqueue.redact": "scrapy_retryqueue.secure.redact",
    "scrapy_retryqueue.redisfrontier": "scrapy_retryqueue.queue.frontier",
    "scrapy_retryqueue.retrybudget": "scrapy_retryqueue.decision.retrybudget",
    "scrapy_retryqueue.scrapycompat": "scrapy_retryqueue.config.scrapycompat",
    "scrapy_retryqueue.shutdown": "scrapy_retryqueue.runtime.shutdown",
    "scrapy_retryqueue.sources": "scrapy_retryqueue.view.sources",
    "scrapy_retryqueue.spidermiddleware": "scrapy_retryqueue.crawl.spidermiddleware",
    "scrapy_retryqueue.spool": "scrapy_retryqueue.queue.spool",
    "scrapy_retryqueue.startup": "scrapy_retryqueue.runtime.startup",
    "scrapy_retryqueue.status": "scrapy_retryqueue.view.status",
    "scrapy_retryqueue.storeext": "scrapy_retryqueue.crawl.storeext",
    "scrapy_retryqueue.taskinfo": "scrapy_retryqueue.queue.taskinfo",
    "scrapy_retryqueue.writable": "scrapy_retryqueue.runtime.writable",
}
# ``scrapy_retryqueue.queue`` and ``scrapy_retryqueue.view`` were modules and are the
# packages of their rooms now: each package answers its old module's names
# (queue/__init__.py, view/__init__.py), so they are no aliases here.


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran under its own name. The import system has
        put the alias's spec on it; its own goes back (relative imports, reload)."""
        module.__spec__ = self.spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds an old path of :data:`MOVED` as its module under the new path."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        # First: a stale file left at an old path (an upgrade over an unpacked copy)
        # must not load a second copy of a module.
        sys.meta_path.insert(0, MovedFinder())
