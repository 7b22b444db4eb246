"""classify_status, classify_exception and failure_for_kind with the default mappings."""

from __future__ import annotations

from email.utils import formatdate

import pytest
import scrapy.exceptions
from scrapy.settings import Settings
from twisted.internet import error as terror
from twisted.web._newclient import ResponseNeverReceived

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.decision import kinds
from scrapy_retryqueue.decision.classify import (
    FailureInfo,
    classify_exception,
    classify_status,
    failure_for_kind,
)
from scrapy_retryqueue.exceptions import PermanentFailure

NOW = 1_700_000_000.0

_CONFIG = load_config(Settings())
STATUS_KINDS = _CONFIG.status_kinds
EXCEPTION_KINDS = _CONFIG.exception_kinds


def _status(status, header=None, now=NOW):
    return classify_status(status, header, status_kinds=STATUS_KINDS, now=now)


def _exc(exc):
    return classify_exception(exc, exception_kinds=EXCEPTION_KINDS)


# -- statuses -------------------------------------------------------------------


def test_default_status_kinds_are_loaded():
    assert dict(STATUS_KINDS) == kinds.STATUS_KINDS


@pytest.mark.parametrize(("status", "kind"), sorted(kinds.STATUS_KINDS.items()))
def test_each_default_status(status, kind):
    info = _status(status)
    assert info == FailureInfo(
        kind=kind, error_type="HttpStatus", message=f"HTTP {status}", status=status
    )
    assert info.retry_after is None


@pytest.mark.parametrize("status", [200, 201, 204, 301, 302, 304, 400, 405, 501])
def test_statuses_that_are_not_failures(status):
    assert _status(status) is None
    assert _status(status, b"30") is None


def test_503_with_retry_after_is_rate_limited():
    info = _status(503, b"45")
    assert info.kind == "rate_limited"
    assert info.status == 503
    assert info.retry_after == 45.0


def test_503_without_retry_after_is_server_error():
    info = _status(503)
    assert info.kind == "server_error"
    assert info.retry_after is None


def test_503_with_unreadable_retry_after_is_server_error():
    info = _status(503, b"whenever")
    assert info.kind == "server_error"
    assert info.retry_after is None


def test_429_without_retry_after():
    info = _status(429)
    assert info.kind == "rate_limited"
    assert info.retry_after is None


def test_429_with_delta_seconds():
    assert _status(429, "120").retry_after == 120.0


def test_429_with_http_date():
    header = formatdate(NOW + 600, usegmt=True).encode("ascii")
    info = _status(429, header)
    assert info.kind == "rate_limited"
    assert info.retry_after == 600.0


def test_429_with_http_date_in_past():
    header = formatdate(NOW - 600, usegmt=True)
    assert _status(429, header).retry_after == 0.0


def test_retry_after_is_kept_only_for_rate_limited():
    # A 500 that sends Retry-After is still a server error; the hint is dropped.
    info = _status(500, b"30")
    assert info.kind == "server_error"
    assert info.retry_after is None


def test_custom_status_kinds():
    kinds = {418: "rule"}
    info = classify_status(418, None, status_kinds=kinds, now=NOW)
    assert info.kind == "rule"
    assert classify_status(404, None, status_kinds=kinds, now=NOW) is None


def test_status_failure_as_dict():
    assert _status(404).as_dict() == {
        "kind": "not_found",
        "type": "HttpStatus",
        "message": "HTTP 404",
        "status": 404,
    }


# -- exceptions -----------------------------------------------------------------


# Scrapy's own download errors (2.14 and newer); Scrapy 2.13 raises Twisted's,
# which are covered below either way.
SCRAPY_ERRORS = [
    (getattr(scrapy.exceptions, name)(message), kind, f"scrapy.exceptions.{name}")
    for name, kind, message in (
        ("DownloadTimeoutError", "timeout", "took too long"),
        ("CannotResolveHostError", "dns", "x"),
        ("DownloadFailedError", "connection", "reset"),
        ("DownloadConnectionRefusedError", "connection", "refused"),
        ("ResponseDataLossError", "connection", "short"),
    )
    if hasattr(scrapy.exceptions, name)
]


class SlowTimeout(getattr(scrapy.exceptions, "DownloadTimeoutError", terror.TimeoutError)):  # type: ignore[misc]
    pass


class ResolverHiccup(terror.DNSLookupError):
    pass


class CustomOSError(OSError):
    pass


@pytest.mark.parametrize(
    ("exc", "kind", "error_type"),
    [
        *SCRAPY_ERRORS,
        # MRO: TimeoutError -> UserError -> ConnectError ("connection"); timeout wins.
        (terror.TimeoutError(), "timeout", "twisted.internet.error.TimeoutError"),
        (terror.TCPTimedOutError(), "timeout", "twisted.internet.error.TCPTimedOutError"),
        # MRO: DNSLookupError -> OSError ("connection"); dns wins.
        (terror.DNSLookupError("no such host"), "dns", "twisted.internet.error.DNSLookupError"),
        (
            terror.ConnectionRefusedError(),
            "connection",
            "twisted.internet.error.ConnectionRefusedError",
        ),
        (terror.ConnectionLost(), "connection", "twisted.internet.error.ConnectionLost"),
        (terror.ConnectionDone(), "connection", "twisted.internet.error.ConnectionDone"),
        (
            ResponseNeverReceived([]),
            "connection",
            "twisted.web._newclient.ResponseNeverReceived",
        ),
        (OSError("truncated gzip"), "connection", "OSError"),
        (PermanentFailure("gone"), "rule", "scrapy_retryqueue.exceptions.PermanentFailure"),
        (ValueError("bad"), "unknown", "ValueError"),
        (KeyError("price"), "unknown", "KeyError"),
    ],
)
def test_exception_kinds(exc, kind, error_type):
    info = _exc(exc)
    assert info.kind == kind
    assert info.error_type == error_type
    assert info.message == str(exc)
    assert info.status is None
    assert info.retry_after is None


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (SlowTimeout("x"), "timeout"),
        (ResolverHiccup("x"), "dns"),
        (CustomOSError("x"), "connection"),
    ],
)
def test_subclass_of_mapped_class_gets_the_most_specific_kind(exc, kind):
    info = _exc(exc)
    assert info.kind == kind
    assert info.error_type == f"{__name__}.{type(exc).__qualname__}"


def test_most_specific_class_in_mro_wins_over_base():
    kinds = {Exception: "unknown", LookupError: "parse", KeyError: "storage"}
    assert classify_exception(KeyError("k"), exception_kinds=kinds).kind == "storage"
    assert classify_exception(IndexError("i"), exception_kinds=kinds).kind == "parse"
    assert classify_exception(RuntimeError("r"), exception_kinds=kinds).kind == "unknown"


def test_unmapped_exception_uses_unknown_kind_argument():
    info = classify_exception(ValueError("x"), exception_kinds={}, unknown_kind="rule")
    assert info.kind == "rule"


def test_message_is_truncated():
    info = _exc(ValueError("x" * 5000))
    assert info.message == "x" * 1000


def test_exception_failure_as_dict_has_no_status():
    assert _exc(OSError("boom")).as_dict() == {
        "kind": "connection",
        "type": "OSError",
        "message": "boom",
    }


def test_failure_for_kind():
    info = failure_for_kind("parse", KeyError("price"))
    assert info == FailureInfo(kind="parse", error_type="KeyError", message="'price'")
    info = failure_for_kind("storage", ConnectionError("db down " + "y" * 2000))
    assert info.kind == "storage"
    assert info.error_type == "ConnectionError"
    assert len(info.message) == 1000
    assert info.message.startswith("db down y")


def test_builtin_timeout_error_is_a_timeout_not_a_connection_error() -> None:
    # TimeoutError subclasses OSError, which maps to connection: the more
    # specific class must win.
    kinds = load_config(Settings()).exception_kinds
    assert (
        classify_exception(TimeoutError("read timed out"), exception_kinds=kinds).kind == "timeout"
    )
    assert classify_exception(OSError("truncated"), exception_kinds=kinds).kind == "connection"
