"""A deterministic "flaky" HTTP site for demo crawls, end-to-end tests and benchmarks.

Every ``/page/N`` follows a scripted scenario chosen by ``scenario_for(N)``: some
pages answer at once, others fail a fixed number of times (503, 429 with
Retry-After, 500, a stalled response, a dropped connection, a page the spider
cannot parse) before recovering, and a few fail forever (404, 403, 410). The
n-th request to the same path decides what happens, so a crawl against a fresh
server always sees the same sequence and its outcome can be checked exactly.

Stdlib only, so it runs anywhere the tests do::

    python example_project/flaky_site.py --port 0 --pages 500 --slow 5.0

It prints one line, ``listening on http://HOST:PORT``, once it accepts
connections, and exits with status 0 on SIGTERM or SIGINT.

Besides the pages it serves ``/`` (an index linking every page), ``/__log``
(every request to ``/page/*`` so far, as JSON), ``/__scenarios`` (each page's
scenario and expected final outcome, as JSON), ``/__outages`` (the outage
windows so far, as JSON) and ``POST /__reset`` (forget all counters and the log,
and arm the next outage).

Outage windows (``--outages 4,12.5``): a host whose outages a benchmark times.
From its first page request the whole site answers 503 (no Retry-After: a site
that broke, not one that throttles) for the first length, seconds; after
``POST /__reset`` the next first request starts the next length (the list
cycles). One site per host (``--host 127.0.0.x``) gives each host its own.

Importable too: ``make_server()`` or ``run()`` serve in-process, and the
scenario mapping (``SCENARIOS``, ``scenario_for``, ``plan_for``, ...) is pure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, TypedDict
from urllib.parse import urlsplit

# --------------------------------------------------------------------------
# Scenarios: a pure mapping from page number and attempt to a planned answer.
# --------------------------------------------------------------------------

OK: Final = "ok"
SERVER_ERROR_TWICE: Final = "server_error_twice"
RATE_LIMITED: Final = "rate_limited"
TIMEOUT_ONCE: Final = "timeout_once"
DROP_ONCE: Final = "drop_once"
SERVER_ERROR_ONCE: Final = "server_error_once"
NOT_FOUND: Final = "not_found"
FORBIDDEN: Final = "forbidden"
PARSE_ONCE: Final = "parse_once"
GONE: Final = "gone"
RATE_LIMITED_THRICE: Final = "rate_limited_thrice"
#: 200 without the markup the spider needs, every time: a callback that always fails.
PARSE_ALWAYS: Final = "parse_always"
#: 503 until ``--outage`` seconds after the page's first request, then 200: an
#: outage that lasts a while, whatever the number of tries.
SERVER_ERROR_OUTAGE: Final = "server_error_outage"

#: The fixed cycle of scenarios; page N gets ``SCENARIOS[N % 20]``. Failures are
#: spread through the cycle so that any prefix of the pages (a short demo crawl)
#: still meets most kinds of failure.
SCENARIOS: Final[tuple[str, ...]] = (
    OK,
    SERVER_ERROR_TWICE,
    OK,
    RATE_LIMITED,
    NOT_FOUND,
    OK,
    TIMEOUT_ONCE,
    OK,
    DROP_ONCE,
    SERVER_ERROR_ONCE,
    OK,
    FORBIDDEN,
    SERVER_ERROR_TWICE,
    OK,
    PARSE_ONCE,
    RATE_LIMITED,
    OK,
    GONE,
    OK,
    OK,
)

#: How a crawl with retries should end up for each scenario: ``parsed``, or
#: ``dead:<failure kind>`` for pages that never recover.
EXPECTED: Final[dict[str, str]] = {
    OK: "parsed",
    SERVER_ERROR_TWICE: "parsed",
    RATE_LIMITED: "parsed",
    TIMEOUT_ONCE: "parsed",
    DROP_ONCE: "parsed",
    SERVER_ERROR_ONCE: "parsed",
    NOT_FOUND: "dead:not_found",
    FORBIDDEN: "dead:forbidden",
    PARSE_ONCE: "parsed",
    GONE: "dead:not_found",
    RATE_LIMITED_THRICE: "parsed",
    PARSE_ALWAYS: "dead:parse",
    SERVER_ERROR_OUTAGE: "parsed",
}

#: Other cycles than the demo's, chosen with ``--mix``: ``healthy`` (every page
#: answers at once, to measure overhead), ``bench`` (20% of pages answer 429
#: three times, 10% 503 twice, the rest at once: the benchmark's fault mix), and
#: the defaults benchmark's (benchmarks/defaults.py): ``transient`` (one page in
#: four fails once or twice: 503, a timeout, 429 with Retry-After, a callback
#: error, a dropped connection), ``callback_bug`` (one page in ten never parses)
#: and ``outage`` (one page in ten answers 503 for ``--outage`` seconds).
MIXES: Final[dict[str, tuple[str, ...]]] = {
    "demo": SCENARIOS,
    "healthy": (OK,),
    "bench": (
        RATE_LIMITED_THRICE,
        OK,
        OK,
        SERVER_ERROR_TWICE,
        OK,
        OK,
        RATE_LIMITED_THRICE,
        OK,
        OK,
        OK,
        RATE_LIMITED_THRICE,
        OK,
        OK,
        SERVER_ERROR_TWICE,
        OK,
        OK,
        OK,
        RATE_LIMITED_THRICE,
        OK,
        OK,
    ),
    "transient": (
        OK,
        SERVER_ERROR_TWICE,
        OK,
        OK,
        OK,
        TIMEOUT_ONCE,
        OK,
        OK,
        OK,
        RATE_LIMITED,
        OK,
        OK,
        OK,
        PARSE_ONCE,
        OK,
        OK,
        OK,
        DROP_ONCE,
        OK,
        OK,
    ),
    "callback_bug": (OK, OK, OK, OK, OK, PARSE_ALWAYS, OK, OK, OK, OK),
    "outage": (OK, OK, OK, OK, OK, SERVER_ERROR_OUTAGE, OK, OK, OK, OK),
}


def scenario_for(n: int, mix: str = "demo") -> str:
    """The scenario of ``/page/n`` in a site of the given mix."""
    if n < 0:
        raise ValueError(f"page number must be >= 0, got {n}")
    cycle = MIXES[mix]
    return cycle[n % len(cycle)]


def expected_for(scenario: str) -> str:
    """The final outcome a retrying crawl should reach for ``scenario``."""
    return EXPECTED[scenario]


def scenarios_table(pages: int, mix: str = "demo") -> dict[str, dict[str, str]]:
    """Path -> ``{"scenario", "expected"}`` for every page of a site."""
    table: dict[str, dict[str, str]] = {}
    for n in range(pages):
        scenario = scenario_for(n, mix)
        table[page_path(n)] = {"scenario": scenario, "expected": expected_for(scenario)}
    return table


@dataclass(frozen=True)
class Plan:
    """What the server does for one request to a page."""

    #: Status to answer with; None means hang up halfway through a 200 page.
    status: int | None
    #: Seconds to stall before answering.
    delay: float = 0.0
    #: Value of the Retry-After header, when one is sent.
    retry_after: int | None = None
    #: Whether a 200 page carries the ``<h1 class="title">`` the spider needs.
    parseable: bool = True


def plan_for(
    scenario: str,
    attempt: int,
    *,
    slow: float,
    retry_after: int,
    age: float = 0.0,
    outage: float = 0.0,
) -> Plan:
    """The answer to the ``attempt``-th (1-based) request of a page in ``scenario``,
    *age* seconds after the page's first request (*outage*: how long
    ``server_error_outage`` lasts)."""
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    first = attempt == 1
    match scenario:
        case "ok":
            return Plan(200)
        case "server_error_twice":
            # No Retry-After: this is breakage, not throttling, and the
            # classifier treats a 503 with Retry-After as rate limiting.
            return Plan(503) if attempt <= 2 else Plan(200)
        case "rate_limited":
            return Plan(429, retry_after=retry_after) if first else Plan(200)
        case "rate_limited_thrice":
            return Plan(429, retry_after=retry_after) if attempt <= 3 else Plan(200)
        case "timeout_once":
            return Plan(200, delay=slow) if first else Plan(200)
        case "drop_once":
            return Plan(None) if first else Plan(200)
        case "server_error_once":
            return Plan(500) if first else Plan(200)
        case "not_found":
            return Plan(404)
        case "forbidden":
            return Plan(403)
        case "parse_once":
            return Plan(200, parseable=not first)
        case "gone":
            return Plan(410)
        case "parse_always":
            return Plan(200, parseable=False)
        case "server_error_outage":
            return Plan(503) if age < outage else Plan(200)
    raise ValueError(f"unknown scenario {scenario!r}")


def page_path(n: int) -> str:
    return f"/page/{n}"


def page_html(n: int, *, parseable: bool = True, next_page: int | None = None) -> str:
    """The body of a 200 page; without the title when it must not parse, with a
    link to *next_page* (``a.next``) in a chained site."""
    title = f'<h1 class="title">Page {n}</h1>' if parseable else ""
    link = "" if next_page is None else f'<a class="next" href="{page_path(next_page)}">next</a>'
    return (
        f"<html><head><title>Page {n}</title></head><body>"
        f'{title}<p class="value">{n}</p>{link}</body></html>'
    )


def index_html(pages: int, *, chain: bool = False) -> str:
    # A chained site's index links its first page only: each page links the next.
    shown = min(pages, 1) if chain else pages
    links = "\n".join(f'<li><a href="{page_path(n)}">Page {n}</a></li>' for n in range(shown))
    return f"<html><head><title>Flaky site</title></head><body><ul>\n{links}\n</ul></body></html>"


def error_html(status: int) -> str:
    # Deliberately no <h1 class="title">: an error page must never look parsed.
    return f"<html><body><p>HTTP {status}</p></body></html>"


# --------------------------------------------------------------------------
# Per-path counters and the request log, shared by the handler threads.
# --------------------------------------------------------------------------


class LogEntry(TypedDict):
    path: str
    t: float
    status: int | None
    attempt: int


class SiteState:
    """Request counters and log; every access holds one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[str, int] = {}
        self._first: dict[str, float] = {}
        self._log: list[LogEntry] = []

    def arrive(self, path: str, decide: Callable[[int, float], Plan]) -> tuple[Plan, LogEntry]:
        """Count a request to ``path``, plan its answer (from the attempt and the
        seconds since the path's first request) and log it."""
        # Counting, deciding and logging under one lock keeps the log order,
        # the attempt numbers and the timestamps consistent with each other.
        with self._lock:
            now = time.time()
            attempt = self._attempts.get(path, 0) + 1
            self._attempts[path] = attempt
            first = self._first.setdefault(path, now)
            plan = decide(attempt, now - first)
            entry: LogEntry = {
                "path": path,
                "t": now,
                "status": plan.status,
                "attempt": attempt,
            }
            self._log.append(entry)
        return plan, entry

    def mark_incomplete(self, entry: LogEntry) -> None:
        with self._lock:
            entry["status"] = None

    def log(self) -> list[LogEntry]:
        with self._lock:
            return [entry.copy() for entry in self._log]

    def reset(self) -> None:
        with self._lock:
            self._attempts.clear()
            self._first.clear()
            self._log.clear()


# --------------------------------------------------------------------------
# HTTP plumbing.
# --------------------------------------------------------------------------

_PAGE_RE: Final = re.compile(r"/page/(0|[1-9][0-9]*)")
_HTML: Final = "text/html; charset=utf-8"
_JSON: Final = "application/json"
#: Method each fixed route answers; a wrong method gets 405 rather than 404.
_ROUTES: Final[dict[str, str]] = {
    "/": "GET",
    "/__log": "GET",
    "/__scenarios": "GET",
    "/__outages": "GET",
    "/__reset": "POST",
}


def _page_plan(scenario: str, server: FlakyServer, attempt: int, age: float) -> Plan:
    return plan_for(
        scenario,
        attempt,
        slow=server.slow,
        retry_after=server.retry_after,
        age=age,
        outage=server.outage,
    )


def _not_found_plan(attempt: int, age: float) -> Plan:
    return Plan(404)


def _throttled_plan(retry_after: int, attempt: int, age: float) -> Plan:
    return Plan(429, retry_after=max(1, retry_after))


def _outage_plan(attempt: int, age: float = 0.0) -> Plan:
    return Plan(503)


class OutageWindows:
    """The outage mode: down for ``lengths[i]`` seconds from the first page request
    after the i-th arming (the start, then each reset), the lengths cycling."""

    def __init__(self, lengths: Sequence[float]) -> None:
        if any(not (math.isfinite(x) and x >= 0) for x in lengths):
            raise ValueError(f"outage lengths must be seconds >= 0, got {list(lengths)!r}")
        self.lengths = tuple(float(x) for x in lengths)
        self._lock = threading.Lock()
        self._armed = 0
        self._windows: list[dict[str, float]] = []
        self._current: dict[str, float] | None = None

    def down(self, now: float) -> bool:
        """Whether a page request at *now* finds the site down (the first after an
        arming opens the window)."""
        if not self.lengths:
            return False
        with self._lock:
            if self._current is None:
                length = self.lengths[self._armed % len(self.lengths)]
                self._current = {"start": now, "end": now + length, "length": length}
                self._windows.append(self._current)
            return now < self._current["end"]

    def rearm(self) -> None:
        with self._lock:
            if self._current is not None:
                self._armed += 1
            self._current = None

    def windows(self) -> list[dict[str, float]]:
        with self._lock:
            return [dict(w) for w in self._windows]


class FlakyHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive like a real site; every response that
    # may carry a body states its Content-Length so the framing stays correct.
    protocol_version = "HTTP/1.1"
    server_version = "FlakySite/1.0"
    # Headers and body go out in separate writes; with Nagle on, the client's
    # delayed ACK would add ~40 ms to every kept-alive response.
    disable_nagle_algorithm = True
    # `timeout` stays None: reaping idle kept-alive connections could close one
    # just as the client reuses it, a failure that no scenario planned.
    timeout = None
    server: FlakyServer

    def log_message(self, format: str, *args: Any) -> None:
        # One stderr line per request would drown the demo's own output.
        pass

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path.startswith("/page/"):
            self._serve_page(path)
        elif _ROUTES.get(path) != "GET":
            self._reject(path)
        elif path == "/":
            self._send(200, index_html(self.server.pages, chain=self.server.chain).encode(), _HTML)
        elif path == "/__log":
            self._send_json(self.server.state.log())
        elif path == "/__outages":
            self._send_json(self.server.outages.windows())
        else:
            self._send_json(scenarios_table(self.server.pages, self.server.mix))

    def do_POST(self) -> None:
        self._discard_body()
        path = urlsplit(self.path).path
        if path != "/__reset":
            self._reject(path)
            return
        self.server.state.reset()
        self.server.outages.rearm()
        # 204 carries no Content-Length: RFC 9110 forbids it there, and the
        # status alone tells the client there is no body.
        self.send_response(204)
        self.end_headers()

    def _serve_page(self, path: str) -> None:
        server = self.server
        match = _PAGE_RE.fullmatch(path)
        n = int(match[1]) if match else -1
        decide: Callable[[int, float], Plan]
        if 0 <= n < server.pages:
            scenario = scenario_for(n, server.mix)
            decide = partial(_page_plan, scenario, server)
        else:
            scenario = None
            decide = _not_found_plan
        throttled = server.throttled()
        if throttled is not None:
            # A site under load: every page answers 429 until the throttle ends.
            decide = partial(_throttled_plan, math.ceil(throttled))
        if server.outages.down(time.time()):
            decide = _outage_plan
        plan, entry = server.state.arrive(path, decide)

        # Waiting on the stop event rather than sleeping lets shutdown cut
        # stalled responses short instead of answering them late.
        delay = plan.delay + server.latency
        if delay and server.stopping.wait(delay):
            self._drop()
            return
        if plan.status is None:
            self._drop_mid_response(page_html(n).encode())
            return

        if plan.status == 200:
            following = n + 1 if server.chain and n + 1 < server.pages else None
            body = page_html(n, parseable=plan.parseable, next_page=following)
        else:
            body = error_html(plan.status)
        headers = []
        if plan.retry_after is not None:
            headers.append(("Retry-After", str(plan.retry_after)))
        sent = self._send(plan.status, body.encode(), _HTML, headers)
        # A stalled response usually finds its client gone (that is the point of
        # it); its log entry keeps the planned 200 so the log shows the stall.
        if not sent and scenario != TIMEOUT_ONCE:
            server.state.mark_incomplete(entry)

    def _reject(self, path: str) -> None:
        allowed = _ROUTES.get(path)
        if allowed is None:
            self._send(404, error_html(404).encode(), _HTML)
        else:
            self._send(405, error_html(405).encode(), _HTML, [("Allow", allowed)])

    def _send_json(self, payload: object) -> None:
        self._send(200, json.dumps(payload).encode(), _JSON)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: Iterable[tuple[str, str]] = (),
    ) -> bool:
        """Write a complete response; False when the client had already gone."""
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True
            return False
        return True

    def _drop_mid_response(self, body: bytes) -> None:
        """Promise a whole page, send half of it, hang up: a crashed upstream.

        Hanging up before the first byte would not do: HTTP clients (Twisted's
        among them) resend an idempotent request on their own when a reused
        connection closes before any response, so the crawler never sees it.
        """
        try:
            self.send_response(200)
            self.send_header("Content-Type", _HTML)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
        except OSError:
            pass
        self._drop()

    def _drop(self) -> None:
        """Hang up without a byte of response, like a crashed upstream."""
        self.close_connection = True
        # Shutting down (not just closing) sends the FIN now, even though the
        # server still holds the socket until this handler returns.
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _discard_body(self) -> None:
        # An unread request body would be parsed as the next request on a
        # kept-alive connection.
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length > 0:
            self.rfile.read(length)
        elif length < 0 or self.headers.get("Transfer-Encoding"):
            self.close_connection = True


class FlakyServer(ThreadingHTTPServer):
    """A threading HTTP server carrying the site's settings and state."""

    # One thread per connection, so a stalled response never blocks the others.
    daemon_threads = True
    # Threads stalled in a slow response or idling on a kept-alive connection
    # must not hold up server_close().
    block_on_close = False
    # The default backlog of 5 refuses connections when a crawler opens dozens
    # at once: failures that are the server's, not the scenario's.
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        *,
        pages: int = 500,
        slow: float = 5.0,
        retry_after: int = 2,
        latency: float = 0.0,
        mix: str = "demo",
        throttle_after: int = 0,
        throttle_for: float = 10.0,
        chain: bool = False,
        outage: float = 30.0,
        outages: Sequence[float] = (),
    ) -> None:
        if mix not in MIXES:
            raise ValueError(f"mix must be one of {', '.join(MIXES)}, got {mix!r}")
        self.mix = mix
        if pages < 0 or slow < 0 or retry_after < 0 or latency < 0 or outage < 0:
            raise ValueError("pages, slow, retry_after, latency and outage must be >= 0")
        self.pages = pages
        #: Each page links the next one (a "next page" chain); the index links page 0.
        self.chain = chain
        #: How long a server_error_outage page answers 503, seconds from its first request.
        self.outage = outage
        #: Added to every page's answer: keeps requests in flight for fleet tests.
        self.latency = latency
        self.slow = slow
        self.retry_after = retry_after
        self.state = SiteState()
        self.stopping = threading.Event()
        #: After this many page requests (0: never), every page answers 429 with
        #: Retry-After for throttle_for seconds, then the site is normal again.
        self.throttle_after = throttle_after
        self.throttle_for = throttle_for
        self._throttle_lock = threading.Lock()
        self._page_requests = 0
        self._throttle_until: float | None = None
        #: The outage mode (OutageWindows); no lengths: never down.
        self.outages = OutageWindows(outages)
        super().__init__(address, FlakyHandler)

    def throttled(self) -> float | None:
        """Count a page request; the seconds of throttling left, None when not throttled."""
        if not self.throttle_after:
            return None
        with self._throttle_lock:
            self._page_requests += 1
            now = time.time()
            if self._throttle_until is None and self._page_requests > self.throttle_after:
                self._throttle_until = now + self.throttle_for
            if self._throttle_until is not None and now < self._throttle_until:
                return self._throttle_until - now
        return None

    @property
    def host(self) -> str:
        return str(self.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up mid-response are expected here (timeouts, drops);
        # anything else is a bug worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def server_close(self) -> None:
        self.stopping.set()
        super().server_close()


def make_server(
    host: str = "127.0.0.1",
    port: int = 0,
    pages: int = 500,
    slow: float = 5.0,
    retry_after: int = 2,
    latency: float = 0.0,
    mix: str = "demo",
    throttle_after: int = 0,
    throttle_for: float = 10.0,
    chain: bool = False,
    outage: float = 30.0,
    outages: Sequence[float] = (),
) -> FlakyServer:
    """A bound, listening server; drive it with ``serve_forever()``.

    Stop it with ``shutdown()`` from another thread, then ``server_close()``.
    """
    return FlakyServer(
        (host, port),
        pages=pages,
        slow=slow,
        retry_after=retry_after,
        latency=latency,
        mix=mix,
        throttle_after=throttle_after,
        throttle_for=throttle_for,
        chain=chain,
        outage=outage,
        outages=outages,
    )


def run(
    host: str = "127.0.0.1",
    port: int = 0,
    pages: int = 500,
    slow: float = 5.0,
    retry_after: int = 2,
    ready_callback: Callable[[FlakyServer], object] | None = None,
    latency: float = 0.0,
    mix: str = "demo",
    throttle_after: int = 0,
    throttle_for: float = 10.0,
    chain: bool = False,
    outage: float = 30.0,
    outages: Sequence[float] = (),
) -> None:
    """Serve until ``shutdown()`` is called on the server.

    ``ready_callback(server)`` runs once the socket is listening, before serving
    starts; it is where callers learn the port and get a handle to stop it.
    """
    server = make_server(
        host,
        port,
        pages,
        slow,
        retry_after,
        latency,
        mix,
        throttle_after,
        throttle_for,
        chain,
        outage,
        outages,
    )
    try:
        if ready_callback is not None:
            ready_callback(server)
        # A short poll keeps shutdown (and so SIGTERM) prompt.
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()


# --------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------


def _write_port_file(path: Path, port: int) -> None:
    # Write-then-rename so a poller never reads a half-written file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Serve a deterministic flaky site for scrapy-retryqueue demos."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 lets the OS pick")
    parser.add_argument("--pages", type=int, default=500)
    parser.add_argument("--slow", type=float, default=5.0, help="stall of timeout_once pages, s")
    parser.add_argument("--retry-after", type=int, default=2, help="Retry-After sent with 429s, s")
    parser.add_argument("--latency", type=float, default=0.0, help="added to every page, s")
    parser.add_argument("--mix", choices=sorted(MIXES), default="demo", help="cycle of scenarios")
    parser.add_argument("--port-file", type=Path, help="write the bound port here")
    parser.add_argument(
        "--throttle-after",
        type=int,
        default=0,
        help="after this many page requests, answer 429 to every page (0: never)",
    )
    parser.add_argument(
        "--throttle-for", type=float, default=10.0, help="how long the throttling lasts, s"
    )
    parser.add_argument(
        "--chain", action="store_true", help="each page links the next; the index links page 0"
    )
    parser.add_argument(
        "--outage", type=float, default=30.0, help="how long server_error_outage pages fail, s"
    )
    parser.add_argument(
        "--outages",
        type=_lengths,
        default=(),
        metavar="S[,S...]",
        help="outage windows: every page answers 503 for S seconds from the first page "
        "request, the next S after each POST /__reset (default: none)",
    )
    args = parser.parse_args(argv)
    for name in (
        "pages",
        "slow",
        "retry_after",
        "latency",
        "throttle_after",
        "throttle_for",
        "outage",
    ):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    return args


def _lengths(text: str) -> tuple[float, ...]:
    try:
        lengths = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--outages must be seconds separated by commas, got {text!r}"
        ) from None
    if any(not (math.isfinite(x) and x >= 0) for x in lengths):
        raise argparse.ArgumentTypeError(f"--outages lengths must be seconds >= 0, got {text!r}")
    return lengths


@dataclass
class RunningSite:
    """A flaky site serving in a subprocess (see :func:`spawn`)."""

    url: str
    process: subprocess.Popen[str]

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as reply:
            return json.load(reply)

    def reset(self) -> None:
        request = urllib.request.Request(self.url + "/__reset", method="POST")
        urllib.request.urlopen(request, timeout=10).close()

    def pages(self, scenario: str) -> list[str]:
        """URLs of the pages that follow *scenario*."""
        table = self.get_json("/__scenarios")
        return [self.url + path for path, info in table.items() if info["scenario"] == scenario]


@contextlib.contextmanager
def spawn(**options: Any) -> Iterator[RunningSite]:
    """Run this site in a subprocess on a free port (tests, benchmarks, the demo).

    *options* are its command-line flags (``pages=500``, ``host="127.0.0.2"``);
    the process is stopped on exit.
    """
    command = [sys.executable, str(Path(__file__).resolve()), "--port", "0"]
    for name, value in options.items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            # A switch (chain=True): the flag alone, or nothing.
            command += [flag] if value else []
        else:
            command += [flag, str(value)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"the flaky site did not start: {line!r}")
    try:
        yield RunningSite(line.removeprefix("listening on "), process)
    finally:
        process.terminate()
        process.wait(10)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)

    def ready(server: FlakyServer) -> None:
        def request_stop(signum: int, frame: object) -> None:
            # shutdown() waits for serve_forever() to return, and that runs on
            # this very thread: calling it here directly would deadlock.
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        if args.port_file is not None:
            _write_port_file(args.port_file, server.port)
        print(f"listening on {server.url}", flush=True)

    run(
        args.host,
        args.port,
        args.pages,
        args.slow,
        args.retry_after,
        ready,
        args.latency,
        args.mix,
        args.throttle_after,
        args.throttle_for,
        args.chain,
        args.outage,
        args.outages,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
