"""The audit log: its own lines only, in its own file, beside a project's loguru use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loguru import logger

from scrapy_retryqueue.exceptions import ConfigError, RetryQueueError
from scrapy_retryqueue.runtime.audit import AuditLog


def _audit(path: Path) -> AuditLog:
    return AuditLog(str(path), rotation="100 MB", retention="30 days")


def test_the_file_gets_the_audit_lines_and_nothing_else(tmp_path: Path) -> None:
    project_lines: list[str] = []
    # A project's own handler at loguru's lowest named level.
    project = logger.add(project_lines.append, level="TRACE", format="{message}")
    audit = _audit(tmp_path / "audit.jsonl")
    try:
        audit.open()
        audit.write("scheduled", task="t1", kind="timeout")
        logger.info("the project's own line")
        audit.write("dead", task="t2", kind="not_found")
    finally:
        audit.close()
        logger.remove(project)

    lines = (tmp_path / "audit.jsonl").read_text("utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"event": "scheduled", "task": "t1", "kind": "timeout"},
        {"event": "dead", "task": "t2", "kind": "not_found"},
    ]
    assert [line.strip() for line in project_lines] == ["the project's own line"]


def test_two_audit_logs_keep_to_their_own_files(tmp_path: Path) -> None:
    first, second = _audit(tmp_path / "a.jsonl"), _audit(tmp_path / "b.jsonl")
    first.open()
    second.open()
    try:
        first.write("scheduled", task="a")
        second.write("scheduled", task="b")
    finally:
        first.close()
        second.close()
    assert json.loads((tmp_path / "a.jsonl").read_text("utf-8"))["task"] == "a"
    assert json.loads((tmp_path / "b.jsonl").read_text("utf-8"))["task"] == "b"


def test_a_closed_or_unopened_audit_log_writes_nothing(tmp_path: Path) -> None:
    audit = _audit(tmp_path / "audit.jsonl")
    audit.write("scheduled", task="before")
    audit.open()
    audit.close()
    audit.write("scheduled", task="after")
    assert (tmp_path / "audit.jsonl").read_text("utf-8") == ""


def test_a_bad_rotation_names_the_three_settings(tmp_path: Path) -> None:
    audit = AuditLog(str(tmp_path / "audit.jsonl"), rotation="every blue moon", retention="1 day")
    with pytest.raises(ConfigError) as info:
        audit.open()
    assert isinstance(info.value, ValueError) and isinstance(info.value, RetryQueueError)
    message = str(info.value)
    assert (
        "RETRYQUEUE_AUDIT_LOG / RETRYQUEUE_AUDIT_ROTATION / RETRYQUEUE_AUDIT_RETENTION" in message
    )
    assert "rotation='every blue moon'" in message
