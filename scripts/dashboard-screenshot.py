"""Regenerate docs/dashboard-overview.png from the demo's data (README and docs/dashboard.md show it).

    .venv/bin/python scripts/dashboard-screenshot.py [--pages 500] [--out docs/dashboard-overview.png]

Runs the demo's crawl (the ``flaky_resumable`` spider of example_project on the
bundled flaky site, with the demo's settings) against an embedded server and a
SQLite store of its own, in a temporary directory, so that neither a test's
leftovers nor an earlier demo run shows; then serves the dashboard on that data
and photographs its overview with headless Chromium. Everything it starts is
stopped, and the temporary directory removed, when it ends.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "example_project"
sys.path.insert(0, str(PROJECT))

from flaky_site import spawn  # noqa: E402

from scrapy_retryqueue.queue import embedded  # noqa: E402

SPIDER = "flaky_resumable"
#: The size of the picture: the whole overview of the demo's data, no scrolling.
WINDOW = "1280,1223"


def chromium() -> str:
    for candidate in ("chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium"):
        found = shutil.which(candidate)
        if found:
            return found
    raise SystemExit("headless Chromium is needed: apt-get install chromium")


def scrapy(*args: str, state: Path) -> list[str]:
    """A ``scrapy`` command of the example project on the private state."""
    return [
        *(sys.executable, "-m", "scrapy.cmdline", *args),
        *("-s", f"RETRYQUEUE_EMBEDDED_DIR={state}"),
    ]


def wait_for(url: str, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the dashboard exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the dashboard did not answer at {url}")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard-overview.png")
    args = parser.parse_args()
    browser = chromium()
    tmp = Path(tempfile.mkdtemp(prefix="retryqueue-screenshot-"))
    state = tmp / "retryqueue"
    dashboard: subprocess.Popen[bytes] | None = None
    try:
        with spawn(pages=args.pages) as site:
            print(f"crawling the demo site ({args.pages} pages) at {site.url}...", flush=True)
            crawl = subprocess.run(
                [
                    *scrapy("crawl", SPIDER, state=state),
                    *("-a", f"site={site.url}", "-O", str(tmp / "items.jsonl")),
                    *("-s", "LOG_LEVEL=ERROR"),
                ],
                cwd=PROJECT,
            )
        if crawl.returncode != 0:
            raise SystemExit(f"the demo crawl failed (exit {crawl.returncode})")
        # The crawl stopped the embedded server as it ended (RETRYQUEUE_EMBEDDED_KEEP is
        # off); the dashboard reads the live counts and the chart's events from it.
        embedded.ensure_server(state, keep=True)
        port = free_port()
        dashboard = subprocess.Popen(
            [*scrapy("retryqueue", "dashboard", "--port", str(port), state=state)],
            cwd=PROJECT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}/"
        wait_for(url, dashboard)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={tmp / 'chromium'}",
                f"--window-size={WINDOW}",
                # Time for the page's script to fetch and draw the figures.
                "--virtual-time-budget=5000",
                f"--screenshot={args.out}",
                url,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(f"written: {os.path.relpath(args.out, ROOT)}")
    finally:
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(10)
        embedded.stop_server(state)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
