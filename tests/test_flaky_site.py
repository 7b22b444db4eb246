"""Tests for example_project/flaky_site.py, the scripted flaky HTTP server.

Most tests run the server as a subprocess exactly as the demo and the
end-to-end tests do; each test gets its own process, so they run in any order.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .waiting import wait_for

FLAKY_SITE = Path(__file__).resolve().parents[1] / "example_project" / "flaky_site.py"
READY_TIMEOUT = 10.0
SLOW = 0.5
RETRY_AFTER = 7
PAGES = 40
READY_RE = re.compile(r"listening on http://127\.0\.0\.1:(\d+)\n")

# The site's tests start the site (a local HTTP server); its pure mapping is marked unit.
pytestmark = pytest.mark.integration


def _load_flaky_site() -> ModuleType:
    # example_project is not a package; load the script by path. It must be in
    # sys.modules while executing, or its dataclasses cannot resolve annotations.
    spec = importlib.util.spec_from_file_location("flaky_site", FLAKY_SITE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


flaky_site = _load_flaky_site()


def first_page(scenario: str) -> int:
    return flaky_site.SCENARIOS.index(scenario)


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    elapsed: float


@dataclass
class Site:
    proc: subprocess.Popen[str]
    port: int
    ready_line: str
    stderr_path: Path

    def request(self, method: str, path: str, timeout: float = 5.0) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        start = time.monotonic()
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        return Reply(resp.status, resp.headers, body, time.monotonic() - start)

    def get(self, path: str, timeout: float = 5.0) -> Reply:
        return self.request("GET", path, timeout)

    def page(self, n: int, timeout: float = 5.0) -> Reply:
        return self.get(f"/page/{n}", timeout)

    def log(self) -> list[dict[str, object]]:
        return json.loads(self.get("/__log").body)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def _read_ready_line(proc: subprocess.Popen[str], stderr_path: Path) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(READY_TIMEOUT):
            pytest.fail(f"server not ready after {READY_TIMEOUT}s")
    line = proc.stdout.readline()
    if not line:
        proc.wait(READY_TIMEOUT)
        pytest.fail(f"server exited early:\n{stderr_path.read_text()}")
    return line


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture
def start_site(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[..., Site]:
    procs: list[subprocess.Popen[str]] = []

    def finalize() -> None:
        for proc in procs:
            _kill(proc)

    request.addfinalizer(finalize)

    def start(*args: str) -> Site:
        stderr_path = tmp_path / f"stderr-{len(procs)}.txt"
        with stderr_path.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, str(FLAKY_SITE), "--port", "0", *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        procs.append(proc)
        line = _read_ready_line(proc, stderr_path)
        match = READY_RE.fullmatch(line)
        assert match, f"unexpected ready line {line!r}"
        return Site(proc, int(match[1]), line, stderr_path)

    return start


@pytest.fixture
def site(start_site: Callable[..., Site]) -> Site:
    return start_site("--pages", str(PAGES), "--slow", str(SLOW), "--retry-after", str(RETRY_AFTER))


def normal_page(n: int) -> bytes:
    return (
        f"<html><head><title>Page {n}</title></head><body>"
        f'<h1 class="title">Page {n}</h1><p class="value">{n}</p></body></html>'
    ).encode()


def assert_framed(reply: Reply) -> None:
    assert reply.headers["Content-Length"] == str(len(reply.body))


# -- the pure mapping --------------------------------------------------------


@pytest.mark.unit
def test_cycle_has_twenty_slots_in_the_agreed_proportion() -> None:
    counts = Counter(flaky_site.SCENARIOS)
    assert len(flaky_site.SCENARIOS) == 20
    assert counts == {
        "ok": 9,
        "server_error_twice": 2,
        "rate_limited": 2,
        "timeout_once": 1,
        "drop_once": 1,
        "server_error_once": 1,
        "not_found": 1,
        "forbidden": 1,
        "parse_once": 1,
        "gone": 1,
    }
    # Every scenario of every mix has an expected outcome.
    mixes = {scenario for cycle in flaky_site.MIXES.values() for scenario in cycle}
    assert set(flaky_site.EXPECTED) == mixes
    assert set(counts) < mixes


@pytest.mark.unit
def test_the_bench_mix_is_20_percent_429s_and_10_percent_503s() -> None:
    cycle = [flaky_site.scenario_for(n, "bench") for n in range(1000)]
    assert Counter(cycle) == {"ok": 700, "rate_limited_thrice": 200, "server_error_twice": 100}
    assert {flaky_site.scenario_for(n, "healthy") for n in range(50)} == {"ok"}
    answers = [
        flaky_site.plan_for("rate_limited_thrice", attempt, slow=SLOW, retry_after=1).status
        for attempt in (1, 2, 3, 4)
    ]
    assert answers == [429, 429, 429, 200]


@pytest.mark.unit
def test_the_defaults_benchmarks_mixes_and_scenarios() -> None:
    transient = Counter(flaky_site.scenario_for(n, "transient") for n in range(40))
    assert transient == {
        "ok": 30,
        "server_error_twice": 2,
        "timeout_once": 2,
        "rate_limited": 2,
        "parse_once": 2,
        "drop_once": 2,
    }
    assert (
        Counter(flaky_site.scenario_for(n, "callback_bug") for n in range(40))["parse_always"] == 4
    )
    assert (
        Counter(flaky_site.scenario_for(n, "outage") for n in range(40))["server_error_outage"] == 4
    )
    never = [
        flaky_site.plan_for("parse_always", attempt, slow=SLOW, retry_after=RETRY_AFTER)
        for attempt in (1, 2, 10)
    ]
    assert [(plan.status, plan.parseable) for plan in never] == [(200, False)] * 3
    # The outage lasts a time, whatever the number of tries.
    outage = [
        flaky_site.plan_for(
            "server_error_outage", attempt, slow=SLOW, retry_after=RETRY_AFTER, age=age, outage=30
        ).status
        for attempt, age in ((1, 0.0), (9, 29.9), (2, 30.0))
    ]
    assert outage == [503, 503, 200]


@pytest.mark.unit
def test_a_chained_site_links_each_page_to_the_next() -> None:
    assert 'href="/page/1"' in flaky_site.index_html(3)
    chained = flaky_site.index_html(3, chain=True)
    assert 'href="/page/0"' in chained and "/page/1" not in chained
    assert '<a class="next" href="/page/4">' in flaky_site.page_html(3, next_page=4)
    assert 'class="next"' not in flaky_site.page_html(3)


def test_the_flaky_spider_follows_the_next_page() -> None:
    from scrapy.http import HtmlResponse, Request

    sys.path.insert(0, str(Path(flaky_site.__file__).parent))
    from demo.spiders.flaky import FlakySpider

    spider = FlakySpider(site="http://site.test")
    body = flaky_site.page_html(3, next_page=4).encode()
    response = HtmlResponse(
        "http://site.test/page/3", body=body, request=Request("http://site.test/page/3")
    )
    item, following = list(spider.parse_page(response))
    assert item["title"] == "Page 3"
    assert following.url == "http://site.test/page/4"
    last = HtmlResponse(
        "http://site.test/page/9",
        body=flaky_site.page_html(9).encode(),
        request=Request("http://site.test/page/9"),
    )
    assert len(list(spider.parse_page(last))) == 1


@pytest.mark.unit
def test_cycle_is_interleaved() -> None:
    first_half = flaky_site.SCENARIOS[:10]
    assert flaky_site.SCENARIOS[0] == "ok"
    assert Counter(first_half)["ok"] < 9
    assert len(set(first_half)) > 5


@pytest.mark.unit
def test_scenario_for_repeats_the_cycle() -> None:
    for n in range(60):
        assert flaky_site.scenario_for(n) == flaky_site.SCENARIOS[n % 20]
    with pytest.raises(ValueError):
        flaky_site.scenario_for(-1)


@pytest.mark.unit
def test_plan_for_knows_every_scenario() -> None:
    for scenario in flaky_site.EXPECTED:
        plan = flaky_site.plan_for(scenario, 1, slow=SLOW, retry_after=RETRY_AFTER)
        assert isinstance(plan, flaky_site.Plan)
    with pytest.raises(ValueError):
        flaky_site.plan_for("nonsense", 1, slow=SLOW, retry_after=RETRY_AFTER)
    with pytest.raises(ValueError):
        flaky_site.plan_for("ok", 0, slow=SLOW, retry_after=RETRY_AFTER)


# -- startup -----------------------------------------------------------------


def test_ready_line_and_port_file(start_site: Callable[..., Site], tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    started = start_site("--pages", "3", "--port-file", str(port_file))
    assert started.port > 0
    assert int(port_file.read_text()) == started.port
    assert started.get("/").status == 200


# -- routes ------------------------------------------------------------------


def test_index_links_every_page(site: Site) -> None:
    reply = site.get("/")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
    assert_framed(reply)
    links = re.findall(r'<a href="/page/(\d+)">', reply.body.decode())
    assert [int(n) for n in links] == list(range(PAGES))


def test_ok_page_body(site: Site) -> None:
    n = first_page("ok")
    for _ in range(2):
        reply = site.page(n)
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
        assert reply.body == normal_page(n)
        assert_framed(reply)


@pytest.mark.parametrize(
    ("scenario", "statuses"),
    [
        ("ok", [200, 200, 200]),
        ("server_error_twice", [503, 503, 200, 200]),
        ("rate_limited", [429, 200, 200]),
        ("server_error_once", [500, 200, 200]),
        ("not_found", [404, 404, 404]),
        ("forbidden", [403, 403, 403]),
        ("gone", [410, 410, 410]),
        ("parse_once", [200, 200, 200]),
    ],
)
def test_status_sequence(site: Site, scenario: str, statuses: list[int]) -> None:
    # The second cycle behaves like the first, with counters of its own.
    for n in (first_page(scenario), first_page(scenario) + 20):
        replies = [site.page(n) for _ in statuses]
        assert [r.status for r in replies] == statuses
        for reply in replies:
            assert_framed(reply)
            if reply.status == 200 and scenario != "parse_once":
                assert reply.body == normal_page(n)
            if reply.status != 200:
                assert b'class="title"' not in reply.body


def test_server_errors_carry_no_retry_after(site: Site) -> None:
    for scenario in ("server_error_twice", "server_error_once"):
        reply = site.page(first_page(scenario))
        assert reply.status >= 500
        assert reply.headers["Retry-After"] is None


def test_rate_limited_sends_retry_after_once(site: Site) -> None:
    n = first_page("rate_limited")
    first = site.page(n)
    assert first.status == 429
    assert first.headers["Retry-After"] == str(RETRY_AFTER)
    second = site.page(n)
    assert second.status == 200
    assert second.headers["Retry-After"] is None
    assert second.body == normal_page(n)


def test_parse_once_first_page_has_no_title(site: Site) -> None:
    n = first_page("parse_once")
    first = site.page(n)
    assert first.status == 200
    assert b'<h1 class="title">' not in first.body
    assert f'<p class="value">{n}</p>'.encode() in first.body
    assert site.page(n).body == normal_page(n)


def test_drop_once_hangs_up_mid_response(site: Site) -> None:
    n = first_page("drop_once")
    with pytest.raises(http.client.IncompleteRead):
        site.page(n)
    second = site.page(n)
    assert second.status == 200
    assert second.body == normal_page(n)
    log = [(e["path"], e["status"], e["attempt"]) for e in site.log()]
    assert log == [(f"/page/{n}", None, 1), (f"/page/{n}", 200, 2)]


def test_timeout_once_stalls_only_the_first_request(site: Site) -> None:
    n = first_page("timeout_once")
    first = site.page(n)
    assert first.status == 200
    assert first.elapsed >= SLOW
    assert first.body == normal_page(n)
    second = site.page(n)
    assert second.status == 200
    assert second.elapsed < SLOW / 2


def test_timeout_once_times_out_a_client_with_a_shorter_timeout(site: Site) -> None:
    n = first_page("timeout_once")
    with pytest.raises(TimeoutError):
        site.page(n, timeout=SLOW / 5)
    assert site.page(n, timeout=SLOW / 2).status == 200
    # The stalled request is logged at arrival with the 200 it would have sent.
    log = [(e["status"], e["attempt"]) for e in site.log()]
    assert log == [(200, 1), (200, 2)]


def test_slow_response_does_not_block_others(start_site: Callable[..., Site]) -> None:
    slow_site = start_site("--pages", "20", "--slow", "3")
    n = first_page("timeout_once")
    outcome: list[object] = []

    def slow_request() -> None:
        # The server is stopped under this request below, so it must not answer.
        try:
            outcome.append(slow_site.page(n, timeout=10).status)
        except (OSError, http.client.HTTPException) as exc:
            outcome.append(exc)

    thread = threading.Thread(target=slow_request, daemon=True)
    thread.start()
    try:
        wait_for(slow_site.log, "the slow request to arrive", timeout=2)
        assert slow_site.log()[0]["status"] == 200

        reply = slow_site.page(first_page("ok"))
        assert reply.status == 200
        assert reply.elapsed < 1.0
        assert thread.is_alive()

        # Stopping must not wait out the stall.
        start = time.monotonic()
        assert slow_site.stop() == 0
        assert time.monotonic() - start < 2.0
    finally:
        thread.join(10)
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], http.client.RemoteDisconnected)


def test_log_records_page_requests_in_order(site: Site) -> None:
    ok = first_page("ok")
    twice = first_page("server_error_twice")
    before = time.time()
    site.page(ok)
    site.get("/")
    site.page(twice)
    site.get("/__scenarios")
    site.page(twice)
    site.page(ok)
    site.get("/page/999")
    after = time.time()

    log = site.log()
    assert all(set(entry) == {"path", "t", "status", "attempt"} for entry in log)
    assert [(e["path"], e["status"], e["attempt"]) for e in log] == [
        (f"/page/{ok}", 200, 1),
        (f"/page/{twice}", 503, 1),
        (f"/page/{twice}", 503, 2),
        (f"/page/{ok}", 200, 2),
        ("/page/999", 404, 1),
    ]
    times = [e["t"] for e in log]
    assert all(isinstance(t, float) for t in times)
    assert times == sorted(times)
    assert before <= times[0] and times[-1] <= after


def test_log_is_json(site: Site) -> None:
    reply = site.get("/__log")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "application/json"
    assert_framed(reply)
    assert json.loads(reply.body) == []


def test_scenarios_for_500_pages(start_site: Callable[..., Site]) -> None:
    big = start_site("--pages", "500")
    reply = big.get("/__scenarios")
    assert reply.status == 200
    assert_framed(reply)
    table = json.loads(reply.body)
    assert list(table) == [f"/page/{n}" for n in range(500)]

    counts = Counter(entry["scenario"] for entry in table.values())
    assert counts == {
        "ok": 225,
        "server_error_twice": 50,
        "rate_limited": 50,
        "timeout_once": 25,
        "drop_once": 25,
        "server_error_once": 25,
        "not_found": 25,
        "forbidden": 25,
        "parse_once": 25,
        "gone": 25,
    }
    dead = {
        "not_found": "dead:not_found",
        "gone": "dead:not_found",
        "forbidden": "dead:forbidden",
    }
    for n in range(500):
        entry = table[f"/page/{n}"]
        assert entry["scenario"] == flaky_site.scenario_for(n)
        assert entry["expected"] == dead.get(entry["scenario"], "parsed")


def test_reset_clears_counters_and_log(site: Site) -> None:
    n = first_page("server_error_twice")
    assert [site.page(n).status for _ in range(3)] == [503, 503, 200]
    assert len(site.log()) == 3

    reply = site.request("POST", "/__reset")
    assert reply.status == 204
    assert reply.body == b""
    assert site.log() == []

    assert site.page(n).status == 503
    assert [(e["status"], e["attempt"]) for e in site.log()] == [(503, 1)]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("GET", f"/page/{PAGES}", 404),
        ("GET", "/page/abc", 404),
        ("GET", "/page/01", 404),
        ("GET", "/__reset", 405),
        ("POST", "/__log", 405),
        ("POST", "/page/0", 404),
        ("POST", "/nope", 404),
    ],
)
def test_other_routes(site: Site, method: str, path: str, status: int) -> None:
    reply = site.request(method, path)
    assert reply.status == status
    assert_framed(reply)


def test_keep_alive_connection_serves_many_responses(site: Site) -> None:
    paths = [f"/page/{first_page(s)}" for s in ("ok", "rate_limited", "not_found")]
    paths += ["/", "/nope", paths[1]]
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    try:
        statuses = []
        for path in paths:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            assert resp.version == 11
            assert resp.headers["Connection"] != "close"
            statuses.append(resp.status)
    finally:
        conn.close()
    assert statuses == [200, 429, 404, 200, 404, 200]


# -- shutdown ----------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_cleanly(site: Site, sig: int) -> None:
    assert site.page(first_page("ok")).status == 200
    assert site.stop(sig) == 0
    assert site.proc.stdout is not None
    # Exactly one line was ever printed, and nothing went to stderr.
    assert site.proc.stdout.read() == ""
    assert site.stderr_path.read_text() == ""


# -- in-process use ----------------------------------------------------------


def test_run_in_process() -> None:
    ready: list[Any] = []
    thread = threading.Thread(
        target=flaky_site.run,
        kwargs={
            "pages": 20,
            "slow": 0.1,
            "retry_after": 1,
            "ready_callback": ready.append,
        },
        daemon=True,
    )
    thread.start()
    wait_for(lambda: ready, "the in-process site to listen", timeout=READY_TIMEOUT)
    server = ready[0]
    try:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("GET", f"/page/{first_page('rate_limited')}")
        resp = conn.getresponse()
        resp.read()
        conn.close()
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "1"
        assert server.url == f"http://127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        thread.join(5)
    assert not thread.is_alive()


@pytest.fixture
def in_process_server() -> Iterator[Any]:
    server = flaky_site.make_server(pages=20, slow=0.1)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_make_server_state_is_inspectable(in_process_server: Any) -> None:
    server = in_process_server
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        for _ in range(2):
            conn.request("GET", "/page/1")
            conn.getresponse().read()
    finally:
        conn.close()
    assert [(e["path"], e["status"]) for e in server.state.log()] == [
        ("/page/1", 503),
        ("/page/1", 503),
    ]


# -- outage windows (--outages): the adaptive benchmark's hosts ------------------------


@pytest.mark.unit
def test_outage_windows_open_at_the_first_request_and_cycle_after_each_reset() -> None:
    windows = flaky_site.OutageWindows([5.0, 20.0])
    assert windows.down(100.0)  # the first request opens the first window
    assert windows.down(104.9) and not windows.down(105.0)
    windows.rearm()
    assert windows.down(200.0) and windows.down(219.0) and not windows.down(220.0)
    windows.rearm()
    assert windows.down(300.0) and not windows.down(305.5)  # back to the first length
    assert windows.windows() == [
        {"start": 100.0, "end": 105.0, "length": 5.0},
        {"start": 200.0, "end": 220.0, "length": 20.0},
        {"start": 300.0, "end": 305.0, "length": 5.0},
    ]
    # A reset before any request arms the same window again; no lengths: never down.
    windows.rearm()
    windows.rearm()
    assert len(windows.windows()) == 3
    assert not flaky_site.OutageWindows([]).down(0.0)
    with pytest.raises(ValueError, match="outage lengths must be seconds >= 0"):
        flaky_site.OutageWindows([-1.0])


def test_outage_mode_answers_503_in_a_window_and_reports_it(
    start_site: Callable[..., Site],
) -> None:
    # 0 s, then an hour: no wait in the test, whatever the machine's load.
    site = start_site("--mix", "healthy", "--outages", "0,3600")
    assert site.page(1).status == 200  # a window of 0 s: never down
    site.request("POST", "/__reset")
    first = site.page(1)
    assert first.status == 503 and "Retry-After" not in first.headers
    assert site.page(2).status == 503  # every page of the host
    (_, window) = json.loads(site.get("/__outages").body)
    assert window["length"] == 3600 and window["end"] - window["start"] == 3600
    assert [e["status"] for e in site.log()] == [503, 503]
    site.request("POST", "/__reset")
    assert site.page(1).status == 200  # the lengths cycle


def test_outage_lengths_must_be_seconds() -> None:
    done = subprocess.run(
        [sys.executable, str(FLAKY_SITE), "--outages", "5,soon"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--outages must be seconds separated by commas, got '5,soon'" in done.stderr
