"""Task envelopes and request JSON: round trips, small output, precise errors."""

from __future__ import annotations

import base64
import json

import pytest
import scrapy
from scrapy import Request
from scrapy.http import FormRequest, JsonRequest

from scrapy_retryqueue.exceptions import EnvelopeError
from scrapy_retryqueue.queue.envelope import (
    Task,
    check_json,
    malformed_envelope,
    request_from_json,
    request_to_json,
    task_from_json,
)
from scrapy_retryqueue.settings.defaults import ENVELOPE_VERSION

ALL_BYTES = bytes(range(256))


class QuotesSpider(scrapy.Spider):
    name = "quotes"

    def parse(self, response, **kwargs):
        return None

    def parse_detail(self, response, page, tags):
        return None

    def on_error(self, failure):
        return None


def module_function(response):
    return None


class Item:
    pass


@pytest.fixture
def spider():
    return QuotesSpider()


def _round_trip(request, spider):
    """To JSON data, through JSON text (as Redis holds it), and back."""
    data = request_to_json(request, spider)
    text = json.dumps(data, ensure_ascii=False)
    return request_from_json(json.loads(text), spider)


# -- Task -------------------------------------------------------------------------


def _task(**changes):
    values = {
        "id": "a" * 40,
        "spider": "quotes",
        "request": {"url": "https://example.com/p/1", "method": "POST", "body": "eA=="},
        "attempts": {"timeout": 2, "server_error": 1},
        "kind": "timeout",
        "first_error": {"kind": "server_error", "type": "HttpStatus", "message": "HTTP 503"},
        "last_error": {"kind": "timeout", "type": "X", "message": "slow \u00e9\u20ac"},
        "node": "host:123",
        "created": 1_700_000_000_000,
        "updated": 1_700_000_005_000,
        "due": 1_700_000_010_000,
    }
    values.update(changes)
    return Task(**values)


def test_task_round_trip():
    task = _task()
    again = task_from_json(task.to_json())
    assert again == task
    assert again.url == "https://example.com/p/1"


def test_task_round_trip_from_bytes_and_dead_kind():
    task = _task(dead_kind="poison")
    raw = task.to_json().encode("utf-8")
    assert task_from_json(raw) == task


def test_the_resolved_budget_travels_in_the_envelope_and_older_ones_have_none():
    task = _task(max_retries=4)
    doc = json.loads(task.to_json())
    assert doc["max_retries"] == 4
    assert task_from_json(task.to_json()) == task
    del doc["max_retries"]  # an envelope written before the field existed
    assert task_from_json(json.dumps(doc)).max_retries is None
    assert "max_retries" not in json.loads(_task().to_json())
    for wrong in ("4", -1, True, 2.5, None, [4]):
        # Only the store shows it: a wrong one is not worth a malformed task.
        assert task_from_json(json.dumps({**doc, "max_retries": wrong})).max_retries is None


def test_task_json_layout():
    doc = json.loads(_task().to_json())
    assert doc["v"] == ENVELOPE_VERSION
    assert "dead_kind" not in doc
    assert json.loads(_task(dead_kind="rule").to_json())["dead_kind"] == "rule"


def test_task_json_is_compact_and_keeps_unicode():
    text = _task().to_json()
    assert ", " not in text
    assert ": " not in text
    assert "\u20ac" in text


def test_task_to_json_refuses_nan():
    with pytest.raises(ValueError):
        _task(first_error={"delay": float("nan")}).to_json()


def test_task_defaults_when_optional_fields_missing():
    task = task_from_json(
        '{"v": 1, "id": "x", "spider": "s", "request": {"url": "u"}, "attempts": {}}'
    )
    assert task == Task(id="x", spider="s", request={"url": "u"})


def test_older_envelope_version_is_read():
    doc = json.loads(_task().to_json())
    doc["v"] = 0
    assert task_from_json(json.dumps(doc)).id == "a" * 40


def _doc(**changes):
    doc = json.loads(_task().to_json())
    for key, value in changes.items():
        if value is KeyError:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("raw", "fragments"),
    [
        ("{not json", ["not JSON"]),
        (b"\xff\xfe\x00garbage", ["not JSON"]),
        ("", ["not JSON"]),
        ("[1, 2]", ["JSON object", "list"]),
        ('"text"', ["JSON object", "str"]),
        ("null", ["JSON object", "NoneType"]),
        (_doc(v=KeyError), ["'v'", "None"]),
        (_doc(v="1"), ["'v'", "'1'"]),
        (_doc(v=True), ["'v'", "True"]),
        (_doc(v=1.0), ["'v'", "1.0"]),
        (_doc(id=KeyError), ["'id'", "str"]),
        (_doc(id=5), ["'id'", "5"]),
        (_doc(spider=None), ["'spider'", "None"]),
        (_doc(request=KeyError), ["'request'", "dict"]),
        # Only its type: a bad request's value may hold secret headers.
        (_doc(request=["https://example.com"]), ["'request'", "got a list"]),
        (_doc(request={"method": "GET"}), ["request.url"]),
        (_doc(request={"url": 5}), ["request.url"]),
        (_doc(attempts=KeyError), ["'attempts'"]),
        (_doc(attempts=[1]), ["'attempts'", "got a list"]),
        (_doc(attempts={"timeout": "1"}), ["'attempts'", "'1'"]),
        (_doc(attempts={"timeout": 1.5}), ["'attempts'", "1.5"]),
        (_doc(attempts={"timeout": True}), ["'attempts'", "True"]),
        (_doc(attempts={"timeout": None}), ["'attempts'", "None"]),
        (_doc(created="yesterday"), ["wrong type", "yesterday"]),
        (_doc(due=None), ["wrong type"]),
    ],
)
def test_task_from_json_errors(raw, fragments):
    with pytest.raises(EnvelopeError) as info:
        task_from_json(raw)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_a_bad_request_field_is_reported_without_its_value():
    raw = _doc(request=[["Authorization", "Bearer s3cret-value"]])
    with pytest.raises(EnvelopeError) as info:
        task_from_json(raw)
    assert "s3cret-value" not in str(info.value)
    assert "'request' must be dict, got a list" in str(info.value)


def test_a_malformed_envelope_keeps_text_as_is_and_other_bytes_as_base64():
    text = json.loads(malformed_envelope("m", "{broken \u00e9", "not JSON", "node-a"))
    assert text["raw"] == "{broken \u00e9" and "raw_base64" not in text
    raw = b"{\xff\xfe broken"
    kept = json.loads(malformed_envelope("m", raw, "not UTF-8", "node-a"))
    assert "raw" not in kept
    assert base64.b64decode(kept["raw_base64"]) == raw
    assert (kept["dead_kind"], kept["last_error"]["message"]) == ("malformed", "not UTF-8")
    # UTF-8 bytes are text: kept as such.
    assert json.loads(malformed_envelope("m", "é".encode(), "x", "n"))["raw"] == "é"


def test_future_envelope_version_is_refused_with_upgrade_hint():
    with pytest.raises(EnvelopeError) as info:
        task_from_json(_doc(v=ENVELOPE_VERSION + 1))
    message = str(info.value)
    assert f"version {ENVELOPE_VERSION + 1}" in message
    assert "newer" in message
    assert "upgrade" in message


# -- requests: round trips --------------------------------------------------------


def test_full_request_round_trip(spider):
    meta = {
        "page": 3,
        "ratio": 0.25,
        "tags": ["a", "b"],
        "nested": {"x": [1, 2.5, None, True, {"y": "z"}], "empty": {}},
        "\u00fcn\u00efc\u00f8d\u00e9": "\u00e7\u00f8d\u00e9 \u20ac \U0001f600",
        "dont_retry": False,
    }
    request = Request(
        "https://example.com/api?q=1",
        method="POST",
        callback=spider.parse_detail,
        errback=spider.on_error,
        cb_kwargs={"page": 2, "tags": ["x"]},
        meta=meta,
        headers={
            "X-Name": b"caf\xe9 \xff",
            "Accept": [b"text/html", b"application/json"],
            "Content-Type": "application/octet-stream",
        },
        body=ALL_BYTES,
        cookies={"session": "abc", "lang": "fr"},
        priority=-7,
        encoding="latin-1",
        flags=["retried"],
    )
    again = _round_trip(request, spider)

    assert type(again) is Request
    assert again.url == request.url
    assert again.method == "POST"
    assert again.callback == spider.parse_detail
    assert again.errback == spider.on_error
    assert again.cb_kwargs == {"page": 2, "tags": ["x"]}
    assert again.meta == meta
    assert again.headers.getlist("X-Name") == [b"caf\xe9 \xff"]
    assert again.headers.getlist("Accept") == [b"text/html", b"application/json"]
    assert again.headers[b"Content-Type"] == b"application/octet-stream"
    assert again.body == ALL_BYTES
    assert again.cookies == {"session": "abc", "lang": "fr"}
    assert again.priority == -7
    assert again.encoding == "latin-1"
    assert again.flags == ["retried"]
    assert again.dont_filter is True
    # Re-serializing gives the same document, but for the dont_filter every rebuilt
    # request carries (the runtime's envelope keeps the project's own: test_signing_crawl.py).
    assert request_to_json(again, spider) == {
        **request_to_json(request, spider),
        "dont_filter": True,
    }


def test_body_is_base64_and_headers_latin1_text(spider):
    data = request_to_json(
        Request("https://example.com", body=b"\x00\xff", headers={"X": b"\xe9"}), spider
    )
    assert data["body"] == "AP8="
    assert data["headers"] == [["X", "\u00e9"]]


def test_cookie_list_round_trip(spider):
    cookies = [{"name": "a", "value": "1", "domain": "example.com", "path": "/"}]
    again = _round_trip(Request("https://example.com", cookies=cookies), spider)
    assert again.cookies == cookies


def test_no_callback_round_trip(spider):
    again = _round_trip(Request("https://example.com/x"), spider)
    assert again.callback is None
    assert again.errback is None
    assert again.method == "GET"
    assert again.body == b""
    assert again.meta == {}
    assert again.dont_filter is True


def test_dont_filter_is_set_even_if_stored_false(spider):
    again = request_from_json({"url": "https://example.com", "dont_filter": False}, spider)
    assert again.dont_filter is True


def test_form_request_keeps_its_class(spider):
    request = FormRequest(
        "https://example.com/login",
        formdata={"user": "\u00e9l\u00e8ve", "pw": "x y"},
        callback=spider.parse,
    )
    data = request_to_json(request, spider)
    assert data["_class"] == "scrapy.http.request.form.FormRequest"
    again = _round_trip(request, spider)
    assert type(again) is FormRequest
    assert again.method == "POST"
    assert again.body == request.body
    assert again.headers[b"Content-Type"] == b"application/x-www-form-urlencoded"
    assert again.callback == spider.parse


def test_json_request_keeps_its_class_and_body(spider):
    request = JsonRequest("https://example.com/api", data={"q": "\u00e9", "n": [1, 2]})
    again = _round_trip(request, spider)
    assert type(again) is JsonRequest
    assert again.body == request.body
    assert again.method == "POST"


def test_plain_get_envelope_is_small(spider):
    request = Request("https://example.com/page/1", callback=spider.parse)
    data = request_to_json(request, spider)
    assert data == {"url": "https://example.com/page/1", "callback": "parse"}
    assert len(json.dumps(data, separators=(",", ":"))) < 200
    assert request_to_json(Request("https://example.com/"), spider) == {
        "url": "https://example.com/"
    }


def test_non_default_values_are_written(spider):
    data = request_to_json(
        Request("https://example.com", method="PUT", priority=3, flags=["f"]), spider
    )
    assert data["method"] == "PUT"
    assert data["priority"] == 3
    assert data["flags"] == ["f"]
    assert "dont_filter" not in data


def test_transient_and_private_meta_keys_are_dropped(spider):
    request = Request(
        "https://example.com",
        meta={
            "download_slot": "example.com",
            "download_latency": 0.31,
            "download_timeout_reached": True,
            "retryqueue_task": "abc",
            "_private": object(),  # dropped before the JSON check
            "__dunder": {1, 2},
            "keep": {"a": 1},
            "depth": 2,
        },
    )
    data = request_to_json(request, spider)
    assert data["meta"] == {"keep": {"a": 1}, "depth": 2}
    assert _round_trip(request, spider).meta == {"keep": {"a": 1}, "depth": 2}


def test_meta_with_only_transient_keys_is_omitted(spider):
    data = request_to_json(Request("https://example.com", meta={"download_slot": "x"}), spider)
    assert "meta" not in data


def test_tuples_become_lists(spider):
    data = request_to_json(Request("https://example.com", meta={"t": (1, (2, 3))}), spider)
    assert data["meta"] == {"t": [1, [2, 3]]}


# -- requests: what cannot be stored ------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"meta": {"item": Item()}}, ["meta['item']", "Item", "not JSON data"]),
        ({"meta": {"a": {"b": {1, 2}}}}, ["meta['a']['b']", "builtins.set"]),
        ({"meta": {"a": [0, {"b": b"raw"}]}}, ["meta['a'][1]['b']", "builtins.bytes"]),
        ({"meta": {"x": float("nan")}}, ["meta['x']", "nan"]),
        ({"meta": {"x": [float("inf")]}}, ["meta['x'][0]", "inf"]),
        ({"meta": {"a": {1: "one"}}}, ["meta['a']", "key 1"]),
        ({"meta": {("k",): 1}}, ["meta has a key ('k',)"]),
        ({"cb_kwargs": {"item": Item()}}, ["cb_kwargs['item']", "Item"]),
        ({"cookies": {"c": object()}}, ["cookies['c']", "builtins.object"]),
    ],
)
def test_unserializable_values_name_their_path(spider, kwargs, fragments):
    with pytest.raises(EnvelopeError) as info:
        request_to_json(Request("https://example.com", **kwargs), spider)
    for fragment in fragments:
        assert fragment in str(info.value)


class Helper:
    def parse(self, response):
        return None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"callback": lambda response: None},
        {"callback": module_function},
        {"errback": lambda failure: None},
        {"callback": Helper().parse},
    ],
    ids=["lambda-callback", "function-callback", "lambda-errback", "method-of-non-spider"],
)
def test_callback_that_is_not_a_spider_method(spider, kwargs):
    with pytest.raises(EnvelopeError, match="callback/errback cannot be stored"):
        request_to_json(Request("https://example.com", **kwargs), spider)


def test_method_of_another_instance_of_the_spider_class_is_stored_by_name(spider):
    data = request_to_json(Request("https://example.com", callback=QuotesSpider().parse), spider)
    assert data["callback"] == "parse"
    assert request_from_json(data, spider).callback == spider.parse


class AliasSpider(QuotesSpider):
    name = "alias"
    # The same function under a second name: either name calls it.
    also_parse = QuotesSpider.parse


@pytest.mark.parametrize(
    "request_",
    [
        Request("https://example.com/a"),
        Request("https://example.com/b", callback=AliasSpider().parse_detail),
        Request("https://example.com/c", callback=AliasSpider().also_parse),
        FormRequest("https://example.com/d", formdata={"q": "1"}, errback=AliasSpider().on_error),
        Request("https://example.com/e", cb_kwargs={"page": 2}, priority=3, dont_filter=True),
    ],
    ids=["no-callback", "method", "alias", "form-errback", "attributes"],
)
def test_a_request_is_stored_as_request_to_dict_says(request_):
    # The callback's name is found at once rather than by Request.to_dict's search
    # of every spider attribute: what is stored must not change.
    spider = AliasSpider()
    data = request_to_json(request_, spider)
    rebuilt = request_from_json(data, spider)
    assert rebuilt.to_dict(spider=spider) == request_.to_dict(spider=spider) | {"dont_filter": True}


def test_check_json_path_in_message():
    with pytest.raises(EnvelopeError, match=r"^root\['a'\]\[2\] is a builtins.complex"):
        check_json({"a": [1, 2, 3j]}, "root")
    assert check_json({"a": (1, None, "s", 1.5, True)}, "root") == {"a": [1, None, "s", 1.5, True]}


# -- requests: malformed data from Redis --------------------------------------------


@pytest.mark.parametrize(
    "cls", ["os.path.join", "builtins.dict", "no.such.module.Request", "NoDots", 5, None]
)
def test_request_class_must_be_a_request_subclass(spider, cls):
    with pytest.raises(EnvelopeError) as info:
        request_from_json({"url": "https://example.com", "_class": cls}, spider)
    assert "not a scrapy Request class" in str(info.value)
    assert repr(cls) in str(info.value)


def test_request_class_path_that_is_a_request_subclass_is_accepted(spider):
    again = request_from_json(
        {"url": "https://example.com", "_class": "scrapy.http.JsonRequest"}, spider
    )
    assert type(again) is JsonRequest


@pytest.mark.parametrize(
    "data",
    [
        {"url": "https://example.com", "body": "not base64!"},
        {"url": "https://example.com", "body": 5},
        {"url": "https://example.com", "headers": [["X-Only-Name"]]},
        {"url": "https://example.com", "headers": [["X", "\u20ac"]]},
        {"url": "https://example.com", "headers": [["X", 5]]},
        {"url": "https://example.com", "headers": 7},
    ],
)
def test_malformed_body_or_headers(spider, data):
    with pytest.raises(EnvelopeError, match="headers/body are malformed"):
        request_from_json(data, spider)


@pytest.mark.parametrize(
    "data",
    [
        {"url": "https://example.com", "callback": "no_such_method"},
        {"url": "https://example.com", "errback": "no_such_method"},
        {"url": "not a url"},
    ],
)
def test_request_that_cannot_be_rebuilt(spider, data):
    with pytest.raises(EnvelopeError, match="cannot be rebuilt"):
        request_from_json(data, spider)
