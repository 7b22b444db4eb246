"""13. The heap every full garbage collection walks: a crawler's modules, and what the store adds.

A fresh interpreter imports what a stock crawl imports (Scrapy's crawler,
Twisted's asyncio reactor, and the installed entry-point commands, the
add-on's among them, which Scrapy loads for any run), then what the add-on
adds to a crawl (redis-py, the add-on's extension, middlewares and store
extension: "crawl modules"), then the modules a crawl's store writer loads
with its first dead letter (``scrapy_retryqueue.store.service``: SQLAlchemy's core and
the store's own modules; SQLAlchemy's PostgreSQL dialect only comes with a
PostgreSQL store's engine, or with Alembic when a crawl creates the schema).
After each step it counts the objects the collector tracks and times a full collection (``gc.collect()``,
the best of 7, this thread's CPU). A crawl makes a full collection about every
tenth second-generation one (29 to 31 in each 3,000-page 404 crawl at the lean
baseline, with the store on or off, counted with ``gc.callbacks``), so "store
ms per full collection" is paid again and again while the crawl runs: a cost
per page, not a fixed one. The ratio is after ÷ before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .common import ROOT

PROBE = """
import gc, json, time
def full():
    gc.collect()
    best = None
    for _ in range(7):
        started = time.thread_time()
        gc.collect()
        took = time.thread_time() - started
        best = took if best is None else min(best, took)
    return len(gc.get_objects()), best * 1000
import scrapy.crawler, twisted.internet.asyncioreactor
from importlib.metadata import entry_points
for command in entry_points(group="scrapy.commands"):  # as Scrapy does for any run
    command.load()
stock = full()
import redis
client = full()
import scrapy_retryqueue.crawl.extension, scrapy_retryqueue.crawl.middleware, scrapy_retryqueue.crawl.storeext
crawl = full()
import sqlalchemy
core = full()
import scrapy_retryqueue.store.service
store = full()
print(json.dumps({"stock": stock, "client": client, "crawl": crawl, "core": core, "store": store}))
"""


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    steps = json.loads(out.strip().splitlines()[-1])
    (stock_objects, stock_ms), (client_objects, _) = steps["stock"], steps["client"]
    (crawl_objects, crawl_ms), (core_objects, _), (store_objects, store_ms) = (
        steps["crawl"],
        steps["core"],
        steps["store"],
    )
    return {
        "stock modules: tracked objects": stock_objects,
        "stock modules: full collection ms": stock_ms,
        "+ add-on: tracked objects": crawl_objects - stock_objects,
        "+ add-on: of them redis-py's": client_objects - stock_objects,
        "add-on ms per full collection": crawl_ms - stock_ms,
        "crawl modules: tracked objects": crawl_objects,
        "crawl modules: full collection ms": crawl_ms,
        "+ store: tracked objects": store_objects - crawl_objects,
        "+ store: of them SQLAlchemy's core": core_objects - crawl_objects,
        "+ store: full collection ms": store_ms,
        "store ms per full collection": store_ms - crawl_ms,
        "store ratio": store_ms / crawl_ms,
        "µs per tracked object": store_ms * 1000 / store_objects,
    }
