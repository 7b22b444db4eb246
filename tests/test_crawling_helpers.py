"""The test helpers' own guarantee: a crawl a test left running does not outlive it."""

from __future__ import annotations

import signal
import subprocess
import sys

from .crawling import reap_crawls, track


def test_reap_crawls_kills_what_a_test_left_running_and_leaves_the_rest() -> None:
    running = track(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    stopped = track(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    stopped.send_signal(signal.SIGSTOP)  # a frozen crawl, as a test may leave one
    finished = track(subprocess.Popen([sys.executable, "-c", "pass"]))
    assert finished.wait(30) == 0
    assert reap_crawls() == 2
    assert running.returncode == stopped.returncode == -signal.SIGKILL
    assert finished.returncode == 0
    assert reap_crawls() == 0  # nothing is tracked twice
