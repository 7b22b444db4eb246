"""The signing key ring and the signatures of stored entries (pure, no server)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from scrapy_retryqueue.exceptions import ConfigError, SignatureError
from scrapy_retryqueue.queue.envelope import Task, task_from_json
from scrapy_retryqueue.queue.signature import (
    is_signed,
    sign_envelope,
    sign_frontier_request,
    signed_key_id,
    split_signed,
    verify_envelope,
    verify_frontier_request,
)
from scrapy_retryqueue.secure.signing import (
    KeyRing,
    generate_key,
    key_id,
    parse_keys,
    ring_for,
)

OLD, NEW = generate_key(), generate_key()


def ring(*keys: str) -> KeyRing:
    return KeyRing(parse_keys(list(keys)))


def envelope(**fields: object) -> str:
    task = Task(id="a" * 40, spider="s", request={"url": "https://example.com/é"}, updated=5)
    for name, value in fields.items():
        setattr(task, name, value)
    return task.to_json()


def test_a_signature_is_rfc_2104_hmac_sha256_named_by_its_key_id() -> None:
    keys = parse_keys([NEW])
    signature = KeyRing(keys).sign(b"message")
    kid, _, mac = signature.partition(".")
    assert kid == key_id(keys[0]) and len(kid) == 8
    expected = hmac.digest(keys[0], b"message", "sha256")
    assert base64.urlsafe_b64decode(mac + "=") == expected
    assert hashlib.sha256(keys[0]).hexdigest()[:8] != kid  # the id is salted


def test_rotation_the_first_key_signs_every_key_verifies() -> None:
    text = envelope()
    by_old = sign_envelope(text, ring(OLD), "demo")
    # Step 1: the new key is added first; what the old one signed still verifies.
    both = ring(NEW, OLD)
    verify_envelope(by_old, both, "demo")
    by_new = sign_envelope(text, both, "demo")
    assert signed_key_id(by_new) == both.signing_id != signed_key_id(by_old)
    # Step 3: the old key is removed; its entries are refused, naming the key.
    with pytest.raises(SignatureError, match="unknown key: it is signed with key"):
        verify_envelope(by_old, ring(NEW), "demo")
    verify_envelope(by_new, ring(NEW), "demo")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda t: t.replace("example.com", "evil.test"), "bad signature"),
        (lambda t: t.replace('"updated":5', '"updated":6'), "bad signature"),
        (lambda t: split_signed(t)[0], "unsigned"),
        (lambda t: t[:-3] + 'x"}', "bad signature"),
        (lambda t: t.replace('"sig":"', '"sig":"z'), "unsigned"),
    ],
)
def test_any_change_to_a_signed_envelope_is_refused(change, reason: str) -> None:
    signed = sign_envelope(envelope(), ring(NEW), "demo")
    with pytest.raises(SignatureError) as caught:
        verify_envelope(change(signed), ring(NEW), "demo")
    assert caught.value.reason == reason


def test_a_signed_envelope_is_json_with_its_signature_last_and_reads_as_before() -> None:
    text = envelope()
    signed = sign_envelope(text, ring(NEW), "demo")
    doc = json.loads(signed)
    assert list(doc)[-1] == "sig" and is_signed(signed) and not is_signed(text)
    assert task_from_json(signed) == task_from_json(text)


def test_an_envelope_of_another_namespace_is_refused() -> None:
    signed = sign_envelope(envelope(), ring(NEW), "quotesbot")
    with pytest.raises(SignatureError, match="bad signature"):
        verify_envelope(signed, ring(NEW), "booksbot")


def test_a_frontier_request_is_bound_to_its_id_and_spider() -> None:
    text = '{"url":"https://example.com/"}'
    signed = sign_frontier_request(text, ring(NEW), "demo", "spider", "fp1")
    verify_frontier_request(signed, ring(NEW), "demo", "spider", "fp1")
    for spider, request_id in (("spider", "fp2"), ("other", "fp1")):
        with pytest.raises(SignatureError, match="bad signature"):
            verify_frontier_request(signed, ring(NEW), "demo", spider, request_id)


def test_keys_from_the_command_line_and_their_errors_never_show_a_key() -> None:
    assert parse_keys(f"{NEW},{OLD}") == parse_keys([NEW, OLD])
    assert parse_keys(json.dumps([NEW])) == parse_keys([NEW])
    assert parse_keys("") == () and ring_for(()) is None
    secret = "s3cret-password-that-is-no-key"
    with pytest.raises(ConfigError) as caught:
        parse_keys([NEW, secret])
    message = str(caught.value)
    assert message.startswith("RETRYQUEUE_SIGNING_KEYS: key 2 is not a signing key")
    assert secret not in message and "scrapy retryqueue keygen" in message
    with pytest.raises(ConfigError, match="lists a key twice"):
        parse_keys([NEW, NEW])
    with pytest.raises(ConfigError, match="must be a list"):
        parse_keys(42)
    with pytest.raises(ConfigError, match="key 1 must be a string"):
        parse_keys([b"bytes"])
    with pytest.raises(ConfigError, match="not a JSON list"):
        parse_keys("[not json")


def test_a_generated_key_is_32_random_bytes() -> None:
    keys = {generate_key() for _ in range(20)}
    assert len(keys) == 20
    assert all(len(base64.urlsafe_b64decode(k)) == 32 and len(k) == 44 for k in keys)


def _load(**settings: object):
    from scrapy.settings import Settings

    from scrapy_retryqueue.config import load_config

    return load_config(Settings(settings))


def test_the_settings_are_read_and_a_bad_one_is_one_line_naming_it() -> None:
    config = _load(
        RETRYQUEUE_SIGNING_KEYS=f"{NEW},{OLD}",
        RETRYQUEUE_REPLAY_WINDOW="3600",
        RETRYQUEUE_REPLAY_RECORDS=10,
    )
    assert config.signing is not None and config.signing.ids == ring(NEW, OLD).ids
    assert (config.replay_window, config.replay_records) == (3600.0, 10)
    assert _load().signing is None  # no key: nothing signed, nothing checked
    for name, value in (
        ("RETRYQUEUE_SIGNING_KEYS", ["not-a-key"]),
        ("RETRYQUEUE_REPLAY_WINDOW", 0),
        ("RETRYQUEUE_REPLAY_WINDOW", "forever"),
        ("RETRYQUEUE_REPLAY_RECORDS", 0),
    ):
        with pytest.raises(ConfigError) as caught:
            _load(**{name: value})
        message = str(caught.value)
        assert message.startswith(name) and "\n" not in message, message
