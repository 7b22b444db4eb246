"""Encryption at rest of a stored request's headers, body and cookies (RETRYQUEUE_ENCRYPTION_KEYS)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import scrapy
import sqlalchemy
from cryptography.fernet import Fernet
from scrapy.settings import Settings

from scrapy_retryqueue.config import load_config
from scrapy_retryqueue.exceptions import (
    ConfigError,
    EncryptionKeyError,
    EnvelopeError,
    RetryQueueError,
)
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import (
    Task,
    request_from_json,
    request_to_json,
    task_from_json,
)
from scrapy_retryqueue.queue.keys import all_keys
from scrapy_retryqueue.secure.encryption import (
    FIELD,
    LABEL,
    SEALED_FIELDS,
    RequestCipher,
    generate_key,
    open_request,
    parse_keys,
)
from scrapy_retryqueue.secure.redact import (
    MASK,
    mask_envelope,
    mask_raw,
    mask_request,
    secret_names,
)
from scrapy_retryqueue.store.actions import requeue
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.filters import Filters
from scrapy_retryqueue.store.sync import EventSync
from scrapy_retryqueue.values import now_ms

SECRET_VALUE = "Bearer s3cret-t0ken"
OLD, NEW, OTHER = (Fernet.generate_key() for _ in range(3))
SECRET = secret_names(["Authorization", "Cookie", "Proxy-Authorization"])


class Spider(scrapy.Spider):
    name = "enc"

    def parse_page(self, response):  # pragma: no cover - never called
        pass


def stored_request() -> dict:
    request = scrapy.Request(
        "https://example.com/private?q=1",
        method="POST",
        headers={"Authorization": SECRET_VALUE, "Accept": "text/html"},
        body=b"password=hunter2",
        cookies={"sid": "cookie-s3cret"},
        meta={"depth": 2},
        callback=Spider().parse_page,
    )
    return request_to_json(request, Spider())


def test_a_sealed_request_hides_headers_body_and_cookies_and_keeps_the_rest() -> None:
    plain = stored_request()
    sealed = RequestCipher([NEW]).seal(plain)

    text = json.dumps(sealed)
    for secret in ("s3cret-t0ken", "hunter2", "aHVudGVyMg", "cookie-s3cret", "Accept"):
        assert secret not in text
    assert not set(SEALED_FIELDS) & set(sealed)
    # Clear: what the claim (url, first), the store (method, meta) and people need.
    assert next(iter(sealed)) == "url"
    assert (sealed["url"], sealed["method"], sealed["meta"], sealed["callback"]) == (
        "https://example.com/private?q=1",
        "POST",
        {"depth": 2},
        "parse_page",
    )
    marker = sealed[FIELD]
    assert (marker["scheme"], marker["fields"]) == ("fernet", ["headers", "body", "cookies"])
    assert RequestCipher([NEW]).open(sealed) == plain
    assert plain["headers"][0] == ["Authorization", SECRET_VALUE]  # the input is untouched


def test_a_request_without_secret_fields_is_left_as_it_is() -> None:
    assert RequestCipher([NEW]).seal({"url": "https://x/", "meta": {"a": 1}}) == {
        "url": "https://x/",
        "meta": {"a": 1},
    }


def test_a_task_round_trips_through_its_envelope_and_rebuilds_the_request() -> None:
    cipher = RequestCipher([NEW])
    task = Task(id="t", spider="enc", request=cipher.seal(stored_request()), attempts={})
    read = task_from_json(task.to_json())

    request = request_from_json(read.request, Spider(), cipher=cipher)

    assert request.headers.getlist("Authorization") == [SECRET_VALUE.encode()]
    assert request.body == b"password=hunter2"
    assert request.cookies == {"sid": "cookie-s3cret"}
    assert request.meta == {"depth": 2}
    assert request.method == "POST" and request.dont_filter


def test_a_task_written_under_an_old_key_stays_readable_after_rotation() -> None:
    before = RequestCipher([OLD]).seal(stored_request())
    rotated = RequestCipher([NEW, OLD])

    assert rotated.open(before) == stored_request()
    # The first key encrypts: what the rotated node writes needs only the new key.
    after = rotated.seal(stored_request())
    assert RequestCipher([NEW]).open(after) == stored_request()
    with pytest.raises(EncryptionKeyError):
        RequestCipher([OLD]).open(after)


def test_a_missing_key_is_a_clear_error_naming_the_setting_never_a_malformed_envelope() -> None:
    sealed = RequestCipher([OLD]).seal(stored_request())

    with pytest.raises(EncryptionKeyError) as none_set:
        request_from_json(sealed, Spider())
    assert "RETRYQUEUE_ENCRYPTION_KEYS is empty" in str(none_set.value)

    with pytest.raises(EncryptionKeyError) as wrong:
        request_from_json(sealed, Spider(), cipher=RequestCipher([NEW, OTHER]))
    message = str(wrong.value)
    assert "none of the 2 key(s) in RETRYQUEUE_ENCRYPTION_KEYS opens" in message
    assert "list the key that wrote it" in message
    assert OLD.decode() not in message and NEW.decode() not in message
    # Its own error, not an EnvelopeError: a node with the key can run the task.
    assert not isinstance(wrong.value, EnvelopeError)
    assert isinstance(wrong.value, RetryQueueError)


@pytest.mark.parametrize(
    "marker",
    [
        "fernet:abc",
        {"scheme": "rot13", "token": "x"},
        {"scheme": "fernet"},
        {"scheme": "fernet", "token": "not base64 !"},
        {"scheme": "fernet", "token": "Z0FBQUFB"},
        {"scheme": "fernet", "token": "gAAAAA" + "A" * 20},
    ],
)
def test_a_damaged_token_is_malformed_whatever_the_keys(marker: object) -> None:
    request = {"url": "https://x/", FIELD: marker}
    with pytest.raises(EnvelopeError):
        open_request(request, RequestCipher([NEW]))
    with pytest.raises(EnvelopeError):
        open_request(request, None)


def test_sealed_content_that_is_not_the_sealed_fields_is_malformed() -> None:
    token = Fernet(NEW).encrypt(b'{"meta": {}}').decode()
    request = {"url": "https://x/", FIELD: {"scheme": "fernet", "token": token}}
    with pytest.raises(EnvelopeError, match="not a JSON object"):
        RequestCipher([NEW]).open(request)


# -- the setting -------------------------------------------------------------------


def test_the_setting_is_off_by_default_and_takes_a_list_or_command_line_text() -> None:
    assert load_config(Settings()).encryption is None
    assert load_config(Settings({"RETRYQUEUE_ENCRYPTION_KEYS": []})).encryption is None
    config = load_config(Settings({"RETRYQUEUE_ENCRYPTION_KEYS": [NEW.decode(), OLD]}))
    assert config.encryption is not None and config.encryption.key_count == 2
    assert parse_keys(f"{NEW.decode()}, {OLD.decode()}") == (NEW, OLD)
    assert parse_keys(json.dumps([NEW.decode()])) == (NEW,)
    assert len(parse_keys([generate_key()])) == 1


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"a": 1}, "must be a list of Fernet keys, got a dict"),
        ([NEW.decode(), "too-short-s3cret"], "key 2 is not a Fernet key"),
        ([NEW.decode(), 5], "key 2 must be a string, got a int"),
        ([NEW.decode(), NEW.decode()], "lists a key twice"),
        ("[not json s3cret", "is not a JSON list of keys"),
    ],
)
def test_a_bad_key_is_refused_naming_the_setting_without_showing_it(
    value: object, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Settings({"RETRYQUEUE_ENCRYPTION_KEYS": value}))
    message = str(info.value)
    assert "RETRYQUEUE_ENCRYPTION_KEYS" in message and fragment in message
    assert "s3cret" not in message and NEW.decode() not in message


# -- what people see -----------------------------------------------------------------


def test_people_see_each_encrypted_field_as_encrypted_and_no_token() -> None:
    sealed = RequestCipher([NEW]).seal(stored_request())
    shown = mask_request(sealed, SECRET)
    assert FIELD not in shown
    assert (shown["headers"], shown["body"], shown["cookies"]) == (LABEL, LABEL, LABEL)
    assert shown["meta"] == {"depth": 2}
    only_headers = RequestCipher([NEW]).seal({"url": "https://x/", "headers": [["A", "b"]]})
    assert mask_request(only_headers, SECRET) == {"url": "https://x/", "headers": LABEL}
    envelope = {"id": "t", "request": sealed}
    assert mask_envelope(envelope, SECRET)["request"]["headers"] == LABEL


def test_a_malformed_dead_letters_raw_text_is_masked_as_far_as_it_can_be() -> None:
    raw = (
        '{"v":1,"request":{"url":"https://x/","headers":[["authorization", "Bearer a\\"b"],'
        '["Accept","text/html"]],"cookies":{"sid":"s3"}} broken'
    )
    shown = mask_raw(raw, SECRET)
    assert "Bearer" not in shown and '"s3"' not in shown
    assert f'["authorization", "{MASK}"]' in shown
    assert '["Accept","text/html"]' in shown
    wrapper = {"id": "m", "dead_kind": "malformed", "raw": raw}
    assert "Bearer" not in mask_envelope(wrapper, SECRET)["raw"]
    assert mask_envelope(wrapper, frozenset())["raw"] == raw


# -- at rest: Redis and the SQL store ------------------------------------------------


def test_redis_and_the_store_keep_the_fields_encrypted_and_requeue_hands_them_back(
    queue: RedisDelayedQueue, redis_client: Any, spider_name: str, database_url: str
) -> None:
    cipher = RequestCipher([OLD])
    now = now_ms()
    task = Task(
        id="enc-1",
        spider=spider_name,
        request=cipher.seal(stored_request()),
        attempts={"server_error": 2},
        kind="server_error",
        created=now,
        updated=now,
        due=now,
        dead_kind="server_error",
    )
    assert queue.deadletter(task, None, now=now)
    secrets = ("s3cret-t0ken", "hunter2", "aHVudGVyMg", "cookie-s3cret")
    dump = repr([redis_client.dump(key) for key in all_keys(queue.keys)])
    assert not any(secret in dump for secret in secrets)

    store = Store(database_url)
    try:
        store.ensure_schema()
        EventSync(store, redis_client, spider_name, consumer="enc").drain()
        with store.connect() as conn:
            rows = conn.execute(sqlalchemy.select(store.table)).all()
        assert [row.task_id for row in rows] == ["enc-1"]
        assert (rows[0].url, rows[0].method) == ("https://example.com/private?q=1", "POST")
        # The dead-letter table, every column of it, holds no secret.
        assert not any(secret in repr(rows) for secret in secrets)
        assert rows[0].envelope["request"][FIELD]["scheme"] == "fernet"

        # Requeue passes the token on as it is; the node that claims it opens it,
        # here after a rotation (the old key second).
        done = requeue(
            store, redis_client, Filters(spiders=[spider_name]), node_id="t", events_maxlen=100
        )
        assert done.moved == 1
        (claimed,) = queue.claim(
            now=now_ms(), limit=5, lease_until=now_ms() + 60_000, token="t"
        ).tasks
        again = task_from_json(claimed[1])
        request = request_from_json(again.request, Spider(), cipher=RequestCipher([NEW, OLD]))
        assert request.headers.getlist("Authorization") == [SECRET_VALUE.encode()]
        assert request.body == b"password=hunter2"
    finally:
        store.close()
