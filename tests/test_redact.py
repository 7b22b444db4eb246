"""Secret request headers are masked wherever people see a stored request."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.secure.redact import MASK, mask_envelope, mask_request, secret_names

SECRET = secret_names(["Authorization", "Cookie", "Proxy-Authorization"])


def test_secret_header_values_are_masked_whatever_their_case() -> None:
    request = {
        "url": "http://x/",
        "headers": [["authorization", "Bearer t0k3n"], ["Accept", "text/html"], ["COOKIE", "a=1"]],
    }
    shown = mask_request(request, SECRET)
    assert shown["headers"] == [["authorization", MASK], ["Accept", "text/html"], ["COOKIE", MASK]]
    assert request["headers"][0][1] == "Bearer t0k3n"  # the stored request is untouched


def test_cookies_are_masked_with_the_cookie_header() -> None:
    assert mask_request({"cookies": {"sid": "s3cret"}}, SECRET)["cookies"] == {"sid": MASK}
    listed = mask_request({"cookies": [{"name": "sid", "value": "s3cret"}]}, SECRET)
    assert listed["cookies"] == [{"name": "sid", "value": MASK}]
    assert mask_request({"cookies": {"sid": "1"}}, frozenset())["cookies"] == {"sid": "1"}


@pytest.mark.parametrize("odd", [None, "text", [["only-one"]], [[1, 2]], {"headers": "x"}])
def test_malformed_envelopes_are_shown_as_they_are(odd: object) -> None:
    assert mask_envelope(odd, SECRET) == odd or isinstance(odd, dict)


def test_the_setting_takes_a_list_or_a_comma_separated_string() -> None:
    assert load_config(Settings()).secret_headers == SECRET | {
        "x-api-key",
        "x-auth-token",
        "api-key",
    }
    config = load_config(Settings({"RETRYQUEUE_SECRET_HEADERS": "X-Api-Key, Authorization"}))
    assert config.secret_headers == {"x-api-key", "authorization"}
    with pytest.raises(ConfigError, match="RETRYQUEUE_SECRET_HEADERS must be a list"):
        load_config(Settings({"RETRYQUEUE_SECRET_HEADERS": {"a": 1}}))


# -- envelopes not shaped as this package writes them (a hostile or older writer) ------

import base64  # noqa: E402

from scrapy_retryqueue.secure.redact import mask_headers, mask_raw, mask_url_passwords  # noqa: E402


@pytest.mark.parametrize(
    ("headers", "shown"),
    [
        ({"Authorization": "Bearer t", "Accept": "x"}, {"Authorization": MASK, "Accept": "x"}),
        ({"cookie": ["a=1", "b=2"]}, {"cookie": MASK}),
        ([["Authorization", "Bearer t", "again"]], [["Authorization", MASK, MASK]]),
        ([("Cookie", "a=1")], [["Cookie", MASK]]),
        ([["Accept", "x", "y"], [1, 2], "odd"], [["Accept", "x", "y"], [1, 2], "odd"]),
    ],
)
def test_headers_of_any_shape_are_masked(headers: object, shown: object) -> None:
    assert mask_headers(headers, SECRET) == shown


@pytest.mark.parametrize(
    "raw",
    [
        '{"request":{"headers":[["Authorization","Bearer SEKRET"]]',  # cut short
        '{"request":{"headers":[["Authorization","Bearer SEK',  # cut inside the value
        '{"request":{"headers":{"Authorization":"Bearer SEKRET"}}}',  # a dict
        '{"request":{"headers":{"authorization":["SEKRET","SEKRET2"]}}}',
        '{"request":{"headers":[["Authorization","x","SEKRET"]]}}',  # three elements
        '{"request":{"headers":[["\\u0041uthorization","SEKRET"]]}}',  # an escaped name
        '{"request":{"headers":[[ "COOKIE" , "SEKRET" ]]}}',
        '{"request":{"cookies":{"sid":"SEKRET"',
        '{"request":{"cookies":[{"name":"sid","value":"SEKRET"}]}}',
    ],
)
def test_unreadable_stored_text_is_masked(raw: str) -> None:
    shown = mask_raw(raw, SECRET)
    assert "SEKRET" not in shown and MASK in shown
    assert mask_envelope({"raw": raw}, SECRET)["raw"] == shown


def test_bytes_that_were_not_utf8_are_masked_inside_their_base64() -> None:
    stored = b'\xff\xfe{"request":{"headers":[["Authorization","Bearer SEKRET"]]}}'
    shown = mask_envelope({"raw_base64": base64.b64encode(stored).decode()}, SECRET)
    decoded = base64.b64decode(shown["raw_base64"])
    assert b"SEKRET" not in decoded and decoded.startswith(b'\xff\xfe{"request"')
    assert "not base64" in mask_envelope({"raw_base64": "!!"}, SECRET)["raw_base64"]


def test_text_that_only_looks_like_a_secret_is_left_alone() -> None:
    raw = '{"request":{"headers":[["Accept","Authorization"]],"meta":{"note":"cookie"}}}'
    assert mask_raw(raw, SECRET) == raw


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "hostile",
    ['"\\' * 200_000, '["Authorization",' * 50_000, '"Authorization":[' * 50_000, '"' * 400_000],
)
def test_masking_hostile_text_is_linear(hostile: str) -> None:
    # A backtracking pattern took minutes on these; the token scan reads each once.
    assert isinstance(mask_raw(hostile, SECRET), str)


def test_a_url_password_is_masked_in_requests_and_error_messages() -> None:
    assert mask_url_passwords("GET https://bob:hunter2@shop.example/a failed") == (
        "GET https://bob:***@shop.example/a failed"
    )
    assert mask_url_passwords("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert mask_url_passwords("mail bob@example.com, http://h/a@b") == (
        "mail bob@example.com, http://h/a@b"
    )
    envelope = {
        "request": {"url": "https://bob:hunter2@shop.example/a"},
        "last_error": {"message": "refused: https://bob:hunter2@shop.example/a"},
        "first_error": {"message": "x"},
    }
    shown = mask_envelope(envelope, SECRET)
    assert "hunter2" not in str(shown)
    assert shown["request"]["url"] == "https://bob:***@shop.example/a"
    assert envelope["request"]["url"].endswith("hunter2@shop.example/a")  # stored as it was
