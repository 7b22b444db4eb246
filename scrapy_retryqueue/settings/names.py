"""What a project namespace may hold: it becomes part of every Redis key (no I/O).

RETRYQUEUE_NAMESPACE is checked against it when settings are read, and the key
names are built with it (:mod:`scrapy_retryqueue.queue.keys`).
"""

from __future__ import annotations

import re

#: What a project namespace may hold: no ':', no braces, nothing a SCAN pattern reads.
PROJECT_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def usable_project(project: str) -> bool:
    """Whether *project* can be a namespace ("" is the layout without one)."""
    return project == "" or PROJECT_PATTERN.fullmatch(project) is not None


def project_name(name: str) -> str:
    """A namespace made of a name that may hold anything (a BOT_NAME): the characters
    a namespace cannot hold become ``_``; "" stays "" (no namespace)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
