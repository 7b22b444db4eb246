"""Running ``scrapy deadletters`` / ``scrapy retryqueue`` as a person would: a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Result:
    code: int
    out: str
    err: str


def scrapy(
    *args: str,
    cwd: Path,
    settings: dict[str, Any] | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> Result:
    """Run ``scrapy *args`` in *cwd*; *env* adds to (or overrides) this process's environment."""
    command = [sys.executable, "-m", "scrapy.cmdline", *args]
    for name, value in (settings or {}).items():
        command += ["-s", f"{name}={value}"]
    done = subprocess.run(
        command,
        cwd=cwd,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env} if env is not None else None,
    )
    return Result(done.returncode, done.stdout, done.stderr)
