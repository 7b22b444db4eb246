"""What the crawls of tests/kinds_crawl.py share: a small site served in the test
process that records when each path was fetched, a spider whose keys are cleared
after the test, and the crawl itself, run in a subprocess (:func:`serving` serves
the sites of other crawl tests too).

Each test module says how its site answers (an :data:`Answer`); the site keeps the
fetch times, so a test can check the gaps the retries left between them.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, urlsplit

import redis

from scrapy_retryqueue.queue.keys import all_keys, keys_for

ROOT = Path(__file__).resolve().parents[1]

#: (path, query, fetch times of the path so far, this one last) -> (status, HTML body).
#: Called outside the site's lock: an answer may take its time (a slow first answer).
Answer = Callable[[str, dict[str, list[str]], list[float]], tuple[int, bytes]]


class Site:
    """A site on 127.0.0.1 answering by *answer*; ``hits[path]`` holds the time
    (monotonic) of each fetch of a path."""

    def __init__(self, answer: Answer) -> None:
        self.hits: dict[str, list[float]] = {}
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                with site.lock:
                    seen = site.hits.setdefault(parts.path, [])
                    seen.append(time.monotonic())
                    times = list(seen)
                status, body = answer(parts.path, parse_qs(parts.query), times)
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def gaps(self, path: str) -> list[float]:
        """Seconds between one fetch of *path* and the next."""
        return [b - a for a, b in itertools.pairwise(self.hits.get(path, []))]


class Served(Protocol):
    server: ThreadingHTTPServer


S = TypeVar("S", bound=Served)


@contextmanager
def serving(site: S) -> Iterator[S]:
    """*site* (anything with a ``server``) served from a thread of the test process
    until the block ends."""
    thread = threading.Thread(target=site.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.server.shutdown()
        site.server.server_close()
        thread.join(10)


@contextmanager
def spider_named(prefix: str, redis_url: str) -> Iterator[str]:
    """A fresh spider name; its keys are deleted from the Redis at *redis_url* after."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        client = redis.Redis.from_url(redis_url)
        client.delete(*all_keys(keys_for(name)))
        client.close()


def run_crawl(spider: str, urls: list[str], settings: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """tests/kinds_crawl.py over *urls*: what it parsed, its errbacks, stats and log."""
    out = tmp / f"{spider}.json"
    done = subprocess.run(
        [
            *(sys.executable, str(ROOT / "tests" / "kinds_crawl.py")),
            *(spider, json.dumps(urls), json.dumps(settings), str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    result["log"] = done.stderr
    return result
