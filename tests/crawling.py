"""Helpers for tests that run real crawls: the flaky site and scrapy crawl, as subprocesses.

A Twisted reactor cannot be restarted inside the test process, and a crawl
that is killed (-9) must be a process of its own anyway.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "example_project"
sys.path.insert(0, str(PROJECT))
from flaky_site import RunningSite as Site  # noqa: E402
from flaky_site import spawn as flaky_site  # noqa: E402

__all__ = [
    "Crawl",
    "Site",
    "crawl",
    "flaky_site",
    "read_crawl",
    "reap_crawls",
    "start_crawl",
    "stat_of",
    "track",
]

#: The crawls tests started in the background and may not have waited for: any
#: still running when its test ends is killed (tests/conftest.py), so a wait that
#: failed leaves no crawl writing into the next test's keys or ports.
_STARTED: list[subprocess.Popen[Any]] = []


def track(process: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
    """*process*, to be killed at the end of its test if it still runs then."""
    _STARTED.append(process)
    return process


def reap_crawls() -> int:
    """Kill and reap the tracked processes still running; returns how many were."""
    killed = 0
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()  # SIGKILL ends a stopped (SIGSTOP) process too
            process.wait(30)
            killed += 1
    return killed


def crawl_command(
    site_url: str, spider: str, settings: dict[str, Any], out: Path, *args: str
) -> list[str]:
    """``scrapy crawl flaky`` of the example project, its items in *out*, its log beside.

    Its keys have no namespace unless *settings* name one (the project's BOT_NAME
    would give them ``demo``): the tests read them as ``keys_for(spider)``, and
    tests/test_namespaces.py crawls with the default namespace (RETRYQUEUE_NAMESPACE
    None: not set at all).
    """
    settings = {"RETRYQUEUE_NAMESPACE": "", **settings}
    if settings["RETRYQUEUE_NAMESPACE"] is None:
        del settings["RETRYQUEUE_NAMESPACE"]
    command = [sys.executable, "-m", "scrapy.cmdline", "crawl", "flaky"]
    command += ["-a", f"site={site_url}", "-a", f"name={spider}", *args]
    command += ["-O", str(out), "-s", f"LOG_FILE={out.with_suffix('.log')}"]
    for name, value in settings.items():
        text = json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)
        command += ["-s", f"{name}={text}"]
    return command


@dataclass
class Crawl:
    returncode: int
    log: str
    items: list[dict[str, Any]]


def read_crawl(out: Path, returncode: int, stderr: str = "") -> Crawl:
    log = out.with_suffix(".log")
    lines = out.read_text().splitlines() if out.exists() else []
    return Crawl(
        returncode,
        (log.read_text() if log.exists() else "") + stderr,
        [json.loads(line) for line in lines],
    )


def crawl(
    site_url: str, spider: str, tmp_path: Path, settings: dict[str, Any], *args: str
) -> Crawl:
    """Run one crawl to its end."""
    out = tmp_path / f"{spider}-{uuid.uuid4().hex[:6]}.jsonl"
    done = subprocess.run(
        crawl_command(site_url, spider, settings, out, *args),
        cwd=PROJECT,
        timeout=300,
        capture_output=True,
        text=True,
    )
    return read_crawl(out, done.returncode, done.stderr)


def start_crawl(
    site_url: str, spider: str, tmp_path: Path, settings: dict[str, Any], *args: str
) -> tuple[subprocess.Popen[str], Path]:
    """Start a crawl in the background (a fleet node); read it later with read_crawl."""
    out = tmp_path / f"{spider}-{uuid.uuid4().hex[:6]}.jsonl"
    process = subprocess.Popen(
        crawl_command(site_url, spider, settings, out, *args),
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return track(process), out


def stat_of(log: str, name: str) -> int | None:
    """A stat from the crawl's closing dump in *log*, None when it was not counted."""
    marker = f"'{name}': "
    at = log.rfind(marker)
    if at < 0:
        return None
    return int(log[at + len(marker) :].split(",", 1)[0].split("}", 1)[0])
