"""A fast static site for the benchmarks: Debian's nginx on loopback, started and stopped here.

The crawl, not the site, must be the bottleneck when a benchmark compares the
crawler's own cost (pages/s, CPU per page). The flaky site (Python's threading
HTTP server) tops out at a few hundred pages/s and hides that cost; nginx serves
pre-generated files tens of times faster. Each benchmark starts its own nginx
with a generated config in a temporary directory, on a free loopback port, and
stops it afterwards; nothing is installed or left running.

Sections of the site, each with an index at ``/<section>/`` linking its pages
(the ``flaky`` spider follows an index, see example_project):

- ``healthy``: every page answers 200 with the markup the spider parses;
- ``notfound``: every page answers 404 (no such file);
- ``forbidden``: every page answers 403 (the config says so);
- ``retry``: every page answers 503 unless the request carries the header
  ``X-Bench-Attempt`` (added by :class:`benchmarks.probes.AttemptHeader` from
  Scrapy's ``retry_times`` meta), so each page fails once and then succeeds,
  for stock Scrapy's RetryMiddleware and the retry queue alike.

With *sizes*, each section also has an index of its first N pages at
``/<section>-<N>/`` (``StaticSite.section(name, N)``): crawls of two sizes from
one site, for the figures that grow with the crawl (the slope of CPU over pages).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .common import free_port

SECTIONS = ("healthy", "notfound", "forbidden", "retry")

#: The page body the flaky spider parses (an h1.title and a p.value), about 1 KB
#: like a small real page.
PAGE = (
    "<!doctype html><html><head><title>page {n}</title></head><body>"
    '<h1 class="title">Page {n}</h1><p class="value">{n}</p>'
    "<p>{filler}</p></body></html>\n"
)
FILLER = "lorem ipsum dolor sit amet " * 30

CONFIG = """\
daemon off;
master_process on;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log error;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    log_not_found off;
    server_tokens off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path {root}/tmp;
    proxy_temp_path {root}/tmp;
    fastcgi_temp_path {root}/tmp;
    uwsgi_temp_path {root}/tmp;
    scgi_temp_path {root}/tmp;
    types {{ text/html html; }}
    default_type text/html;
    server {{
        listen 127.0.0.1:{port};
        root {root}/www;
        location /forbidden/page/ {{ return 403; }}
        location /retry/page/ {{
            if ($http_x_bench_attempt = "") {{ return 503; }}
            try_files $uri =404;
        }}
        location / {{ index index.html; }}
    }}
}}
"""


@dataclass
class StaticSite:
    url: str
    pid: int

    def section(self, name: str, pages: int | None = None) -> str:
        """The site URL of one section (the spider's ``site`` argument); with *pages*,
        of its index of the first *pages* pages (one of the site's *sizes*)."""
        return f"{self.url}/{name}" if pages is None else f"{self.url}/{name}-{pages}"

    def worker_cpu(self) -> float:
        """CPU seconds (user + system) used so far by nginx's master and workers."""
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        for pid in [self.pid, *_children(self.pid)]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
        return total


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def nginx_binary() -> str:
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(
        "nginx is needed for the benchmarks' static site: apt-get install nginx-light "
        "(Debian's package; the benchmark starts and stops its own nginx on loopback)"
    )


def generate(www: Path, pages: int, sizes: tuple[int, ...] = ()) -> None:
    """Write each section's indexes and (for the sections that serve them) its pages."""
    for section in SECTIONS:
        folder = www / section
        (folder / "page").mkdir(parents=True, exist_ok=True)
        for size, index in [(pages, folder), *((n, www / f"{section}-{n}") for n in sizes)]:
            index.mkdir(exist_ok=True)
            links = "".join(f'<a href="/{section}/page/{n}">{n}</a>\n' for n in range(size))
            (index / "index.html").write_text(
                f"<!doctype html><html><body>\n{links}</body></html>\n"
            )
        if section in ("healthy", "retry"):
            for n in range(pages):
                (folder / "page" / str(n)).write_text(PAGE.format(n=n, filler=FILLER))


@contextmanager
def static_site(pages: int, sizes: tuple[int, ...] = ()) -> Iterator[StaticSite]:
    """nginx serving every section with *pages* pages each (and an index of the
    first N pages for each N of *sizes*), on a free loopback port."""
    binary = nginx_binary()
    root = Path(tempfile.mkdtemp(prefix="retryqueue-bench-nginx-"))
    # nginx's workers drop root for an unprivileged user, who must read the files.
    root.chmod(0o755)
    try:
        (root / "tmp").mkdir()
        generate(root / "www", max((pages, *sizes)), sizes)
        for _ in range(10):
            port = free_port()
            (root / "nginx.conf").write_text(CONFIG.format(root=root, port=port))
            process = subprocess.Popen(
                [binary, "-p", str(root), "-c", str(root / "nginx.conf")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            if _wait_listening(port, process):
                break
            process.wait(10)  # the port was taken meanwhile: another one
        else:
            raise SystemExit(f"nginx did not start: {(root / 'error.log').read_text()}")
        try:
            yield StaticSite(f"http://127.0.0.1:{port}", process.pid)
        finally:
            process.send_signal(signal.SIGQUIT)  # graceful: workers finish, then exit
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> bool:
    import socket

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    process.kill()
    return False
