"""The wait after wrong tokens holds against a client that forges X-Forwarded-For:
the header is believed only from the proxies RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES
lists, so a guesser can neither take a fresh identity per guess nor make
somebody else wait; and it holds in the real server the command runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from scrapy_retryqueue.commands.retryqueue import listen, server_config
from scrapy_retryqueue.dashboard.app import create_app
from scrapy_retryqueue.dashboard.clients import ClientResolver
from scrapy_retryqueue.dashboard.settings import load_dashboard_config
from scrapy_retryqueue.exceptions import ConfigError

TOKEN = "s3cret-token-for-tests"
WRONG = {"Authorization": "Bearer wrong-wrong-wrong"}
BODY = {"ids": ["nothing"], "dry_run": True}
PROXY = "10.1.2.3"


def _resolver(*trusted: str) -> ClientResolver:
    config = load_dashboard_config({"RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES": list(trusted)})
    return ClientResolver(config.trusted_proxies)


def test_forwarded_for_is_ignored_unless_the_peer_is_a_listed_proxy() -> None:
    untrusting = _resolver()
    assert untrusting("127.0.0.1", ["203.0.113.9"]) == "127.0.0.1"
    assert untrusting(PROXY, ["203.0.113.9"]) == PROXY
    trusting = _resolver("10.0.0.0/8")
    assert trusting(PROXY, ["203.0.113.9"]) == "203.0.113.9"
    # Only the part the proxies wrote counts: what the client put first is never reached.
    assert trusting(PROXY, ["198.51.100.1, 203.0.113.9"]) == "203.0.113.9"
    assert trusting(PROXY, ["198.51.100.1", "203.0.113.9, 10.9.9.9"]) == "203.0.113.9"
    assert trusting(PROXY, ["garbage, 203.0.113.9"]) == "203.0.113.9"
    # A client that is not a proxy forges in vain.
    assert trusting("203.0.113.7", ["10.0.0.1"]) == "203.0.113.7"
    # Nothing usable forwarded: the proxy itself is the client.
    assert trusting(PROXY, []) == PROXY
    assert trusting(PROXY, ["not-an-address"]) == PROXY
    assert trusting(PROXY, ["x" * 100_000 + ", 203.0.113.9"]) == "203.0.113.9"


def test_an_ipv6_client_counts_as_its_64_network() -> None:
    resolver = _resolver()
    assert resolver("2001:db8:1:2::1") == resolver("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert resolver("2001:db8:1:3::1") != resolver("2001:db8:1:2::1")
    assert resolver("::ffff:192.0.2.1") == "192.0.2.1"


@pytest.mark.parametrize("bad", [["proxy.example"], ["10.0.0.0/33"], "10.0.0.1, nope", [5]])
def test_trusted_proxies_must_be_addresses(bad: object) -> None:
    with pytest.raises(ConfigError, match="RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES"):
        load_dashboard_config({"RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES": bad})


def _frozen() -> float:
    # The waits must not run out between two guesses on a slow machine.
    return 1000.0


def _app(**settings: object) -> TestClient:
    app = create_app({"RETRYQUEUE_DASHBOARD_TOKEN": TOKEN, **settings})
    app.state.wrong_tokens.clock = _frozen
    return TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 40000))


def _guesses(client: TestClient, forwarded: list[str]) -> list[int]:
    return [
        client.post(
            "/api/actions/cancel", json=BODY, headers={**WRONG, "X-Forwarded-For": ip}
        ).status_code
        for ip in forwarded
    ]


def test_a_fresh_forwarded_address_per_guess_is_still_one_client() -> None:
    with _app() as client:
        codes = _guesses(client, [f"198.51.100.{i}" for i in range(1, 31)])
    assert codes[:4] == [401] * 4 and set(codes[4:]) == {429}, codes


def test_behind_a_listed_proxy_one_guesser_does_not_make_others_wait() -> None:
    with _app(RETRYQUEUE_DASHBOARD_TRUSTED_PROXIES=["127.0.0.1"]) as client:
        codes = _guesses(client, ["198.51.100.7"] * 10)
        assert codes[:4] == [401] * 4 and set(codes[4:]) == {429}, codes
        # The guesser cannot pass for somebody else by writing their address first.
        forged = _guesses(client, ["203.0.113.5, 198.51.100.7"])
        assert forged == [429]
        other = client.post(
            "/api/actions/cancel",
            json=BODY,
            headers={"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": "203.0.113.5"},
        )
        # Its token is checked (no store here: the action itself cannot run).
        assert other.status_code not in (401, 429), other.text


@pytest.fixture
def served() -> Iterator[str]:
    """The dashboard in the uvicorn server the command runs, on a free loopback port."""
    import uvicorn

    config = load_dashboard_config({"RETRYQUEUE_DASHBOARD_TOKEN": TOKEN}, port=0)
    app = create_app({"RETRYQUEUE_DASHBOARD_TOKEN": TOKEN}, config=config)
    app.state.wrong_tokens.clock = _frozen
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(server_config(app, config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        from .waiting import wait_for

        wait_for(lambda: server.started, timeout=30, what="the dashboard to start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def test_the_served_dashboard_does_not_believe_a_loopback_clients_forwarded_for(
    served: str,
) -> None:
    with httpx.Client(base_url=served, timeout=30) as client:
        codes = [
            client.post(
                "/api/actions/cancel",
                json=BODY,
                headers={**WRONG, "X-Forwarded-For": f"198.51.100.{i}"},
            ).status_code
            for i in range(1, 21)
        ]
    assert codes[:4] == [401] * 4 and set(codes[4:]) == {429}, codes
