"""The README's main job: the demo crawl against the bundled flaky site, on embedded
defaults (no Redis, no database configured), run as a newcomer runs it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scrapy_retryqueue.queue import embedded

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_runs_end_to_end_on_embedded_defaults(tmp_path: Path) -> None:
    # A copy of the example project: the demo keeps its state under its own folder.
    project = tmp_path / "example_project"
    shutil.copytree(
        ROOT / "example_project", project, ignore=shutil.ignore_patterns(".scrapy", "__pycache__")
    )
    try:
        done = subprocess.run(
            [sys.executable, str(project / "run_demo.py"), "--pages", "100", "--port", "0"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        embedded.stop_server(project / ".scrapy" / "retryqueue")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "queue:              unix://" in out  # the embedded server, no Redis configured
    parsed = int(re.search(r"parsed pages:\s+(\d+)", out)[1])
    dead = int(re.search(r"dead letters:\s+(\d+)", out)[1])
    assert re.search(r"still pending:\s+0\b", out), out
    # Every page ends parsed or dead-lettered: the site's mix is 85% parseable.
    assert parsed + dead == 100, out
    assert parsed == 85, out
    assert "sqlite:///" in out  # the dead letters went to the default SQLite store
    # The embedded server stopped with the crawl and the summary: nothing left running.
    assert not embedded.is_running(project / ".scrapy" / "retryqueue")
    # The hints name a scrapy that runs from example_project/ (a virtualenv's is not on PATH).
    hint = re.search(r"queue status:\s+cd example_project && (\S+) retryqueue status", out)[1]
    assert hint == "scrapy" or Path(hint).is_absolute() or hint.startswith(".."), out
