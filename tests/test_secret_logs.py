"""The crawl's log lines and audit log never show a secret header's value.

In-process, without a server: the planner and the reporter of a runtime, fed a
request that carries credentials, through every outcome they log or audit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import scrapy
from cryptography.fernet import Fernet
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_retryqueue.decision.classify import FailureInfo
from scrapy_retryqueue.runtime import Outcome, RetryQueueRuntime
from scrapy_retryqueue.secure.encryption import FIELD
from scrapy_retryqueue.secure.redact import MASK

SECRETS = ("Bearer AUTH-S3CRET", "sid=COOKIE-S3CRET", "APIKEY-S3CRET", "REFERER-S3CRET")
SERVER_ERROR = FailureInfo("server_error", "HttpStatus", "HTTP 503", status=503)
NOT_FOUND = FailureInfo("not_found", "HttpStatus", "HTTP 404", status=404)


class SecretSpider(scrapy.Spider):
    name = "secrets"


def _runtime(tmp_path: Path, **settings: Any) -> RetryQueueRuntime:
    crawler = get_crawler(
        SecretSpider,
        {
            "RETRYQUEUE_EMBEDDED_DIR": str(tmp_path),
            "RETRYQUEUE_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
            "RETRYQUEUE_SECRET_HEADERS": ["Authorization", "Cookie", "X-Api-Key", "Referer"],
            **settings,
        },
    )
    crawler.spider = crawler._create_spider()
    runtime = RetryQueueRuntime(crawler)
    runtime.spider = runtime.planner.spider = runtime.reporter.spider = crawler.spider
    runtime.reporter.open(crawler.spider)
    return runtime


def _request(path: str) -> scrapy.Request:
    return scrapy.Request(
        f"http://example.com/{path}",
        headers={
            "Authorization": SECRETS[0],
            "Cookie": SECRETS[1],
            "X-Api-Key": SECRETS[2],
            "Referer": SECRETS[3],
        },
        cookies={"session": "COOKIE-S3CRET"},
    )


@pytest.mark.parametrize("encrypted", [False, True])
def test_no_outcome_logs_or_audits_a_secret_header_value(
    tmp_path: Path, caplog: Any, encrypted: bool
) -> None:
    keys = [Fernet.generate_key().decode()] if encrypted else []
    runtime = _runtime(tmp_path, RETRYQUEUE_ENCRYPTION_KEYS=keys)
    reporter = runtime.reporter
    try:
        with caplog.at_level(logging.DEBUG):
            for n, outcome in enumerate(Outcome):
                plan = runtime.planner.plan(_request(f"retry-{n}"), SERVER_ERROR)
                reporter.notes(plan.notes)
                reporter.planned(plan, outcome, RuntimeError("refused"))
            dead = runtime.planner.plan(_request("dead"), NOT_FOUND)
            reporter.planned(dead, Outcome.DEAD)
            ref = {"id": "t", "token": "x", "kind": "server_error", "url": dead.task.url}
            reporter.acked(_request("ok"), ref, "recovered", Outcome.ACKED, 1)  # type: ignore[arg-type]
            response = HtmlResponse(
                "http://example.com/p", body=b"<html></html>", request=_request("p")
            )
            reporter.callback_error(ValueError("no title"), response, first=True, due_in=30)
    finally:
        reporter.close()
    audit = (tmp_path / "audit.jsonl").read_text("utf-8")
    assert audit.count('"event":') == len(Outcome) + 2
    for secret in SECRETS:
        assert secret not in caplog.text
        assert secret not in audit
    # The referer Scrapy's own wording shows is masked, since it is named secret.
    assert f"(referer: {MASK})" in caplog.text
    # Encrypted: the envelope written to Redis holds none of them either.
    stored = dead.task.to_json()
    assert (FIELD in stored) is encrypted
    assert any(secret in stored for secret in SECRETS) is not encrypted
