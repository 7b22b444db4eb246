"""A real Scrapyd runs the example project's egg, deployed with scrapyd-client,
with only the ADDONS line (docs/deploy.md).

Scrapyd runs a job with no scrapy.cfg in reach: the local state falls back to a
per-user directory named after the project, two jobs share it (and the embedded
server, so their retries), a job cancelled with cancel.json hands its retries
back, and the embedded server stops with the last job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .servers import PortTaken, start_on_free_port
from .waiting import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "example_project"))
from flaky_site import spawn  # noqa: E402

BIN = Path(sys.executable).parent
#: Straight to the local servers, whatever proxy the environment names.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
PAGES = 40


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _processes_under(directory: Path) -> list[tuple[int, str]]:
    """(pid, executable name) of the live processes whose working directory or
    command line is under *directory*: what the test's runs may have left."""
    target = str(directory.resolve())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            exe = Path(os.readlink(proc / "exe")).name
        except OSError:
            continue
        if (cwd.startswith(target) or target in cmdline) and _alive(int(proc.name)):
            found.append((int(proc.name), exe))
    return found


class Scrapyd:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = start_on_free_port(self._start_on, "scrapyd")

    def _start_on(self, port: int) -> int:
        self.port = port
        (self.home / "scrapyd.conf").write_text(
            "[scrapyd]\n"
            "bind_address = 127.0.0.1\n"
            f"http_port = {port}\n"
            "eggs_dir = eggs\nlogs_dir = logs\nitems_dir = items\ndbs_dir = dbs\n"
            "max_proc = 4\npoll_interval = 0.5\n"
        )
        log = open(self.home / f"scrapyd-{port}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(BIN / "scrapyd")], cwd=self.home, env=self.env, stdout=log, stderr=log
        )
        log.close()

        def up() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                return True
            return self.get("daemonstatus.json")["status"] == "ok"

        try:
            wait_for(up, "scrapyd to answer", timeout=60)
        except BaseException:
            self.stop()  # a scrapyd that never answered is not left running
            raise
        if self.process.poll() is not None:
            text = (self.home / f"scrapyd-{port}.log").read_text()
            if "Address already in use" in text:
                raise PortTaken(port)
            pytest.fail(f"scrapyd exited: {text[-2000:]}")
        return port

    def get(self, endpoint: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with OPENER.open(f"{self.url}/{endpoint}{query}", timeout=30) as reply:
            return json.load(reply)

    def post(self, endpoint: str, **data: str) -> Any:
        body = urllib.parse.urlencode(data).encode()
        with OPENER.open(f"{self.url}/{endpoint}", body, timeout=30) as reply:
            answer = json.load(reply)
        assert answer["status"] == "ok", answer
        return answer

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture
def scrapyd(tmp_path: Path) -> Iterator[Scrapyd]:
    home = tmp_path / "scrapyd"
    home.mkdir()
    # The user's data directory (XDG_DATA_HOME) of the jobs: where the local
    # state falls back to without scrapy.cfg.
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    server = Scrapyd(home, env)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        # Whatever the test did, nothing of it runs on.
        for pid, _ in _processes_under(tmp_path):
            os.kill(pid, signal.SIGKILL)


def _deploy(tmp_path: Path, url: str, env: dict[str, str]) -> None:
    """Deploy the example project as a user does: scrapy.cfg's [deploy] and scrapyd-deploy."""
    project = tmp_path / "project"
    shutil.copytree(
        ROOT / "example_project" / "demo",
        project / "demo",
        ignore=shutil.ignore_patterns("__pycache__", ".scrapy"),
    )
    (project / "scrapy.cfg").write_text(
        f"[settings]\ndefault = demo.settings\n\n[deploy]\nurl = {url}/\nproject = demo\n"
    )
    done = subprocess.run(
        [str(BIN / "scrapyd-deploy"), "--version", "1"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _state(scrapyd: Scrapyd, job: str) -> str:
    jobs = scrapyd.get("listjobs.json", project="demo")
    for state in ("pending", "running", "finished"):
        if any(j["id"] == job for j in jobs[state]):
            return state
    return "unknown"


def _log(scrapyd: Scrapyd, job: str) -> str:
    path = scrapyd.home / "logs" / "demo" / "flaky" / f"{job}.log"
    return path.read_text() if path.exists() else ""


def _items(scrapyd: Scrapyd, job: str) -> list[dict[str, Any]]:
    path = scrapyd.home / "items" / "demo" / "flaky" / f"{job}.jl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_scrapyd_runs_the_egg_with_only_the_addons_line(scrapyd: Scrapyd, tmp_path: Path) -> None:
    _deploy(tmp_path, scrapyd.url, scrapyd.env)
    with spawn(pages=PAGES, slow=3) as site:
        table = site.get_json("/__scenarios")
        parseable = {site.url + p for p, info in table.items() if info["expected"] == "parsed"}
        # The first job crawls the site and leaves the retries still pending when it
        # goes idle (no idle wait); the next two run only retries (index=false): they
        # have work only because the jobs share the retry queue.
        first = scrapyd.post(
            "schedule.json",
            project="demo",
            spider="flaky",
            site=site.url,
            setting="RETRYQUEUE_IDLE_TIMEOUT=0",
        )
        wait_for(lambda: _state(scrapyd, first["jobid"]) == "finished", "job 1 ends", 120)
        second = scrapyd.post(
            "schedule.json", project="demo", spider="flaky", site=site.url, index="false"
        )
        # A third job, cancelled as Scrapyd cancels (cancel.json, SIGTERM):
        # what it held goes back to the queue for the others.
        third = scrapyd.post(
            "schedule.json", project="demo", spider="flaky", site=site.url, index="false"
        )
        wait_for(lambda: "Spider opened" in _log(scrapyd, third["jobid"]), "job 3 opens", 60)
        scrapyd.post("cancel.json", project="demo", job=third["jobid"])
        jobs = (first["jobid"], second["jobid"], third["jobid"])
        wait_for(
            lambda: all(_state(scrapyd, job) == "finished" for job in jobs),
            "every job to finish",
            timeout=240,
        )
    logs = {job: _log(scrapyd, job) for job in jobs}
    for log in logs.values():
        assert "NotConfigured" not in log, log[-3000:]
        assert "is not open" not in log, log[-3000:]
    assert "no scrapy.cfg in reach" in logs[first["jobid"]]
    assert "'finish_reason': 'retryqueue_work_left'" in logs[first["jobid"]]
    parsed = {item["url"] for job in jobs for item in _items(scrapyd, job)}
    # Every parseable page parsed, across the jobs.
    assert parsed == parseable, sorted(parseable - parsed)
    # The later jobs had only the first one's retries to run, and ran them.
    recovered = [job for job in jobs[1:] if "'retryqueue/recovered'" in logs[job]]
    assert recovered, {job: log[-2000:] for job, log in logs.items()}
    # The local state is in the per-user directory of the project.
    assert (tmp_path / "data" / "scrapy-retryqueue" / "demo").is_dir()
    # No process of the jobs is left: the embedded server stopped with the last one.
    assert scrapyd.process is not None
    left: list[tuple[int, str]] = []

    def nothing_left() -> bool:
        left[:] = [p for p in _processes_under(tmp_path) if p[0] != scrapyd.process.pid]
        return not left

    try:
        wait_for(nothing_left, "no process left but scrapyd", timeout=30)
    except BaseException:
        pytest.fail(f"left running: {left}; logs: {[log[-1500:] for log in logs.values()]}")
