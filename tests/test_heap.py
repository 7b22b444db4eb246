"""The heap freeze (scrapy_retryqueue/heap.py, RETRYQUEUE_FREEZE_HEAP): held while a
crawl's engine runs and while its forked writer lives, released when the last of
them ends, off when the setting or Scrapy's MEMDEBUG_ENABLED says so."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scrapy_retryqueue import heap
from scrapy_retryqueue.store.forked import ForkedWriter

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Starts with nothing frozen and leaves nothing frozen, whatever the test did."""
    assert gc.get_freeze_count() == 0 and heap.holds() == 0
    yield
    leftover = gc.get_freeze_count(), heap.holds()
    heap.reset()
    assert leftover == (0, 0)


def test_the_heap_thaws_when_the_last_hold_is_released(unfrozen: None) -> None:
    first = heap.hold()
    assert gc.get_freeze_count() > 0
    made_between = [{"tracked": []} for _ in range(100)]
    second = heap.hold()
    frozen = gc.get_freeze_count()
    first()
    # The second hold still stands: nothing thawed, and what it froze stays frozen.
    assert gc.get_freeze_count() == frozen and heap.holds() == 1
    first()  # a release counts once
    assert heap.holds() == 1
    second()
    assert gc.get_freeze_count() == 0 and heap.holds() == 0
    del made_between


def test_a_heap_frozen_by_someone_else_is_left_to_them(unfrozen: None) -> None:
    gc.freeze()
    theirs = gc.get_freeze_count()
    extra = [{"made": "after"} for _ in range(50)]
    release = heap.hold()
    # Not a hold: nothing frozen by it, nothing thawed by its release.
    assert heap.holds() == 0 and gc.get_freeze_count() == theirs
    release()
    assert gc.get_freeze_count() == theirs
    gc.unfreeze()
    del extra


def test_a_forked_writer_holds_the_freeze_until_it_is_reaped(unfrozen: None) -> None:
    def never_made(spider: str, forward: object) -> None:
        raise AssertionError("the test never asks the writer to run")

    writer = ForkedWriter.fork(never_made, freeze_heap=True)
    try:
        assert heap.holds() == 1 and gc.get_freeze_count() > 0
    finally:
        writer.end()
    assert writer.exit_status == 0
    assert heap.holds() == 0 and gc.get_freeze_count() == 0
    # Without it, the fork freezes nothing.
    writer = ForkedWriter.fork(never_made)
    try:
        assert heap.holds() == 0 and gc.get_freeze_count() == 0
    finally:
        writer.end()


def test_a_fork_the_system_refuses_leaves_the_heap_as_it_was(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refused)
    with pytest.raises(OSError):
        ForkedWriter.fork(lambda spider, forward: None, freeze_heap=True)
    assert heap.holds() == 0 and gc.get_freeze_count() == 0


#: A crawl of three data: pages in this process; prints what the collector had frozen
#: while it parsed them and once the crawl was over.
CRAWL = textwrap.dedent(
    """
    import gc, json, sys
    import scrapy
    import scrapy.exceptions
    import scrapy.signals
    from scrapy.crawler import CrawlerProcess
    from scrapy_retryqueue import heap

    seen = []

    class CloseAtOpen:
        # A spider closed as it opens (the fleet's crawl already finished, say):
        # Scrapy then sends no engine_started nor engine_stopped.
        @classmethod
        def from_crawler(cls, crawler):
            crawler.signals.connect(cls.opened, signal=scrapy.signals.spider_opened)
            return cls()

        @staticmethod
        def opened(spider):
            raise scrapy.exceptions.CloseSpider("closed at open")

    class Pages(scrapy.Spider):
        name = sys.argv[1]
        start_urls = [f"data:,page{i}" for i in range(3)]

        def parse(self, response):
            seen.append(gc.get_freeze_count())

    process = CrawlerProcess({**json.loads(sys.argv[2]), "ADDONS": {"scrapy_retryqueue.Addon": 0}})
    process.crawl(Pages)
    process.start()
    import os
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        children = []
    print(json.dumps({"during": seen, "after": gc.get_freeze_count(), "holds": heap.holds(),
                      "children": children}))
    """
)


def _crawl(tmp_path: Path, redis_url: str, spider_name: str, **settings: object) -> dict[str, Any]:
    base = {
        "RETRYQUEUE_REDIS_URL": redis_url,
        "RETRYQUEUE_NAMESPACE": "",
        "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
    }
    done = subprocess.run(
        [sys.executable, "-c", CRAWL, spider_name, json.dumps({**base, **settings})],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "settings",
    # The default forks the store writer (a hold of its own); the engine's hold
    # alone, with the writer in a thread; and with no store at all.
    [{}, {"RETRYQUEUE_STORE_PROCESS": False}, {"RETRYQUEUE_STORE_ENABLED": False}],
    ids=["writer forked", "writer thread", "store off"],
)
def test_a_crawl_runs_with_its_heap_frozen_and_ends_with_it_thawed(
    tmp_path: Path, redis_url: str, spider_name: str, settings: dict[str, object]
) -> None:
    seen = _crawl(tmp_path, redis_url, spider_name, **settings)
    assert len(seen["during"]) == 3
    # The modules, the spider and the components: tens of thousands of objects.
    assert min(seen["during"]) > 10_000
    assert seen["after"] == 0 and seen["holds"] == 0


def test_a_spider_closed_as_it_opens_leaves_nothing_frozen_nor_forked(
    tmp_path: Path, redis_url: str, spider_name: str
) -> None:
    # The writer was forked (and the heap frozen for it) as the extensions were made.
    seen = _crawl(tmp_path, redis_url, spider_name, EXTENSIONS={"__main__.CloseAtOpen": 0})
    assert seen["during"] == []
    assert seen["after"] == 0 and seen["holds"] == 0
    assert seen["children"] == []


@pytest.mark.parametrize(
    "settings",
    [{"RETRYQUEUE_FREEZE_HEAP": False}, {"MEMDEBUG_ENABLED": True}],
    ids=["setting off", "memdebug"],
)
def test_a_crawl_told_not_to_freeze_freezes_nothing(
    tmp_path: Path, redis_url: str, spider_name: str, settings: dict[str, object]
) -> None:
    seen = _crawl(tmp_path, redis_url, spider_name, **settings)
    assert seen == {"during": [0, 0, 0], "after": 0, "holds": 0, "children": []}
