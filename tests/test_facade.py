"""The runtime facade the glue calls: re-injection of a claimed task, the counts the
extension reads, an item as its replay keeps it. In-process, without a server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import scrapy
from cryptography.fernet import Fernet
from scrapy.statscollectors import MemoryStatsCollector
from twisted.internet.defer import Deferred

from scrapy_retryqueue.exceptions import EncryptionKeyError
from scrapy_retryqueue.queue.envelope import Task, request_to_json
from scrapy_retryqueue.secure.encryption import RequestCipher
from scrapy_retryqueue.signals import retryqueue_recovered

from .runtimes import unopened_runtime


class FacadeSpider(scrapy.Spider):
    name = "facade"

    def parse_page(self, response):  # pragma: no cover - never called
        pass


def _task(request: dict, **fields) -> str:
    return Task(id="t1", spider="facade", request=request, **fields).to_json()


def test_a_claimed_task_comes_back_as_its_request_marked_with_its_lease(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    spider = runtime.spider
    stored = request_to_json(
        scrapy.Request("http://example.com/a", callback=spider.parse_page), spider
    )
    raw = _task(stored, attempts={"server_error": 2}, kind="server_error")

    request = runtime.claimed("t1", raw, "tok-1")

    assert request is not None
    assert request.url == "http://example.com/a"
    assert request.callback == spider.parse_page
    assert request.meta["retryqueue_task"]["id"] == "t1"
    assert request.meta["retryqueue_task"]["token"] == "tok-1"
    # What the ack writes for learning: the host of the request's own URL.
    assert request.meta["retryqueue_task"]["host"] == "example.com"
    assert request.meta["retry_times"] == 2
    assert runtime.crawler.stats.get_value("retryqueue/reinjected") == 1


def test_a_claimed_task_no_key_opens_raises_and_is_not_a_malformed_dead_letter(
    tmp_path: Path,
) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    stored = request_to_json(
        scrapy.Request("http://example.com/private", headers={"Authorization": "secret"}),
        runtime.spider,
    )
    sealed = RequestCipher([Fernet.generate_key()]).seal(stored)

    # No key configured here. A dead letter would need the queue, which this
    # unopened runtime does not have: the error must come before any write.
    with pytest.raises(EncryptionKeyError, match="RETRYQUEUE_ENCRYPTION_KEYS"):
        runtime.claimed("t1", _task(sealed), "tok-1")
    assert runtime.crawler.stats.get_value("retryqueue/reinjected") is None


def test_the_counts_the_extension_reads_follow_the_leases_and_the_writes(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path, RETRYQUEUE_MAX_IN_FLIGHT=3)
    assert (runtime.held, runtime.room, runtime.spooled, runtime.writes_submitted) == (0, 3, 0, 0)

    runtime.leases.hold("a", "tok")
    runtime.leases.hold("b", "tok")
    assert (runtime.held, runtime.room) == (2, 1)
    # Its last write on its way: room again at once, renewed until the write lands.
    landed: Deferred[None] = Deferred()
    runtime.leases.written_by("a", landed)
    assert (runtime.held, runtime.room) == (1, 2)
    assert runtime.leases.writing == {"a": "tok"}
    landed.callback(None)
    assert runtime.leases.writing == {}
    # Each write moves the marker, done or not (unopened: this one fails at once).
    runtime.writes.call(lambda: None).addErrback(lambda _: None)
    assert runtime.writes_submitted == 1


def test_count_adds_to_the_crawl_stats(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    runtime.count("retryqueue/x")
    runtime.count("retryqueue/x", 4)
    assert runtime.crawler.stats.get_value("retryqueue/x") == 5


def test_count_follows_the_stats_dict_scrapy_keeps(tmp_path: Path) -> None:
    """Past the collector's wrapper, a count still lands in its current dict (set_stats
    replaces it, clear_stats empties it) and nothing else counts it twice."""
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    stats = runtime.crawler.stats
    runtime.count("retryqueue/x", 2)
    stats.set_stats({"retryqueue/x": 10})
    runtime.count("retryqueue/x")
    assert stats.get_stats() == {"retryqueue/x": 11}
    stats.clear_stats()
    runtime.count("retryqueue/y")
    assert stats.get_stats() == {"retryqueue/y": 1}


class CountingStats(MemoryStatsCollector):
    """A project's collector with an inc_value of its own (a statsd client's, say)."""

    def __init__(self, crawler):
        super().__init__(crawler)
        self.calls: list[tuple[str, int]] = []

    def inc_value(self, key, count=1, start=0, spider=None):
        self.calls.append((key, count))
        super().inc_value(key, count, start)


def test_count_goes_through_a_collectors_own_inc_value(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path, STATS_CLASS=CountingStats)
    runtime.count("retryqueue/x", 2)
    stats = runtime.crawler.stats
    assert isinstance(stats, CountingStats)
    assert stats.calls == [("retryqueue/x", 2)]
    assert stats.get_value("retryqueue/x") == 2


def test_a_signal_handler_connected_late_is_sent_the_signal(tmp_path: Path) -> None:
    """The reporter sends no signal nobody hears, and asks anew each time."""
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    heard: list[str] = []
    runtime.reporter.send(retryqueue_recovered, task_id="t0")
    runtime.crawler.signals.connect(
        lambda task_id, **_: heard.append(task_id), signal=retryqueue_recovered, weak=False
    )
    runtime.reporter.send(retryqueue_recovered, task_id="t1")
    assert heard == ["t1"]


class Product(scrapy.Item):
    name = scrapy.Field()


def test_an_item_is_kept_for_its_replay_as_json_with_its_class(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    assert runtime.replay_meta({"name": "a"}) == {"item": {"name": "a"}, "class": None}
    assert runtime.replay_meta(Product(name="b")) == {
        "item": {"name": "b"},
        "class": f"{__name__}.Product",
    }
    # Not JSON: no replay (the page's task is retried instead).
    assert runtime.replay_meta({"when": object()}) is None


def test_a_replayed_item_comes_back_as_its_class(tmp_path: Path) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    stored = runtime.replay_meta(Product(name="b"))
    assert stored is not None
    item = runtime.replayed_item(stored)
    assert isinstance(item, Product) and item["name"] == "b"
    assert runtime.replayed_item({"item": {"name": "a"}, "class": None}) == {"name": "a"}


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        # Classes and functions of loaded modules, callable with an item's fields.
        ("subprocess.Popen", {"args": ["touch", "{marker}"]}),
        ("os.system", {"command": "touch {marker}"}),
        ("retryqueue_never_imported_module.Item", {"name": "x"}),
        (f"{__name__}.FacadeSpider", {"name": "x"}),
        ("x" * 2000, {"name": "x"}),
    ],
    ids=["Popen", "os.system", "not imported", "not an item class", "too long"],
)
def test_a_replayed_items_class_read_from_redis_runs_nothing(
    path: str, fields: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Redis is shared with a hostile writer: the class an item replay names may only
    # be an item class this crawl has loaded, never imported nor any other callable.
    import sys

    runtime = unopened_runtime(FacadeSpider, tmp_path)
    marker = tmp_path / "ran"
    fields = {
        k: [p.replace("{marker}", str(marker)) for p in v]
        if isinstance(v, list)
        else v.replace("{marker}", str(marker))
        for k, v in fields.items()
    }
    with caplog.at_level("WARNING", logger="scrapy_retryqueue"):
        item = runtime.replayed_item({"item": fields, "class": path})
        runtime.replayed_item({"item": fields, "class": path})
    time.sleep(0.2)  # a Popen would have touched the marker by now
    assert item == fields and type(item) is dict
    assert not marker.exists()
    assert "retryqueue_never_imported_module" not in sys.modules
    assert runtime.crawler.stats.get_value("retryqueue/item_replay/class_unknown") == 2
    assert len([r for r in caplog.records if "no item class" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    "replay",
    [
        "not a dict",
        {"class": None},
        {"item": "text", "class": None},
        {"item": {"name": "a"}, "class": 42},
    ],
)
def test_a_claimed_task_with_a_broken_item_replay_is_a_malformed_dead_letter(
    replay: object, tmp_path: Path
) -> None:
    runtime = unopened_runtime(FacadeSpider, tmp_path)
    stored = request_to_json(scrapy.Request("http://example.com/i"), runtime.spider)
    stored["meta"] = {"retryqueue_item": replay}
    isolated: list[str] = []
    # The dead letter's write needs Redis; what is checked here is that the task is
    # isolated before anything replays it.
    runtime._dead_letter_malformed = lambda task_id, raw, token, exc: isolated.append(str(exc))
    assert runtime.claimed("t1", _task(stored), "tok-1") is None
    assert len(isolated) == 1 and "retryqueue_item" in isolated[0]
    # A sound replay passes.
    stored["meta"] = {"retryqueue_item": {"item": {"name": "a"}, "class": None}}
    assert runtime.claimed("t1", _task(stored), "tok-2") is not None


def test_a_poll_lost_to_an_outage_is_doubted_and_a_refused_one_is_not(tmp_path: Path) -> None:
    import redis
    from twisted.python.failure import Failure

    runtime = unopened_runtime(FacadeSpider, tmp_path)
    runtime._poll_failed(Failure(redis.ResponseError("ERR Error running script")), "n:1")
    assert runtime.leases.doubtful == set() and not runtime.down
    # A timeout: the claim may have run; the next poll hands back what it leased.
    runtime._poll_failed(Failure(redis.TimeoutError("Timeout reading from socket")), "n:2")
    assert runtime.leases.doubtful == {"n:2"}
    assert runtime.down


# -- the glue reads no part behind the facade ----------------------------------------

GLUE = (
    "crawl/middleware.py",
    "crawl/spidermiddleware.py",
    "crawl/extension.py",
    "crawl/storeext.py",
    "crawl/addon.py",
    "crawl/frontier.py",
    "crawl/monitors.py",
)


def _parts_of_the_runtime() -> set[str]:
    """The attributes RetryQueueRuntime.__init__ sets to one of its parts (an object
    built from a class of a runtime submodule): what the glue must not read.

    The source is that of ``__init__`` wherever it is defined (the facade's methods
    live in base classes of their own), and a part is any class the runtime package
    defines, so a new part is found without this test naming it."""
    import ast
    import inspect
    import sys
    import textwrap

    from scrapy_retryqueue.runtime import RetryQueueRuntime

    init = RetryQueueRuntime.__init__
    namespace = vars(sys.modules[init.__module__])
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    behind = {
        name
        for name, value in namespace.items()
        if isinstance(value, type) and value.__module__.startswith("scrapy_retryqueue.runtime.")
    }
    assert {"Reporter", "WritePath", "Planner"} <= behind  # the lookup itself works
    parts = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id in behind
        ):
            parts.update(t.attr for t in node.targets if isinstance(t, ast.Attribute))
    return parts


def _reads_of_parts(source: str, parts: set[str]) -> list[str]:
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        # runtime.writes, self.runtime.leases, ...: a part read through the runtime.
        if isinstance(node, ast.Attribute) and node.attr in parts:
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("runtime", "_runtime"):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_glue_reads_no_part_behind_the_facade() -> None:
    parts = _parts_of_the_runtime()
    assert parts == {
        "reporter",
        "writes",
        "breaker",
        "leases",
        "planner",
        "frontier",
        "requests",
        "_offsite",
    }
    package = Path(__file__).parent.parent / "scrapy_retryqueue"
    reads = {name: _reads_of_parts((package / name).read_text(), parts) for name in GLUE}
    assert not any(reads.values()), reads


def test_the_glue_check_finds_a_part_read_through_the_runtime() -> None:
    parts = _parts_of_the_runtime()
    source = "def f(self):\n    self.runtime.reporter.callback_error(1)\n"
    assert _reads_of_parts(source, parts) == ["line 2: self.runtime.reporter"]
