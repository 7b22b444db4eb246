"""Secret request headers are masked wherever people see a stored request."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.exceptions import ConfigError
from scrapy_retryqueue.redact import MASK, mask_envelope, mask_request, secret_names

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
