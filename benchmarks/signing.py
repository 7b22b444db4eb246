"""14. Signing (RETRYQUEUE_SIGNING_KEYS): what it adds per envelope, both ways, in µs.

Pure code, in this process, no Redis: the µs of this thread's CPU one envelope
costs to sign as a write leaves for Redis (its signature, and the one of the
event the script appends) and to check as a claim hands it back (its signature,
then where it sits: task id, spider, the replay records), for a typical
envelope (a GET with a few headers and some meta, about 800 bytes) and one of
a POST with a 4 KB body. Beside them, for scale, what encoding and decoding the
same envelope costs without signing, and the leased frontier's per request. A
request that never fails has no envelope: signing costs it nothing (a
frontier request is signed once, when pushed).
"""

from __future__ import annotations

import base64
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scrapy_retryqueue.queue import events as ev
from scrapy_retryqueue.queue.envelope import Task, task_from_json
from scrapy_retryqueue.queue.signature import (
    check_claimed,
    sign_envelope,
    sign_event,
    sign_frontier_request,
    verify_envelope,
    verify_frontier_request,
)
from scrapy_retryqueue.secure.signing import KeyRing, generate_key, parse_keys

T0 = 1_700_000_000_000
NAMESPACE, SPIDER = "demo", "shop"
#: Calls timed per figure, and the best of so many rounds of them.
CALLS, ROUNDS = 5_000, 5


def _task(body: bytes = b"") -> Task:
    error = {"kind": "server_error", "type": "HttpStatus", "message": "HTTP 503", "status": 503}
    request: dict[str, Any] = {
        "url": "https://shop17.example.com/category/977/item/123456?ref=list&page=3",
        "headers": [
            ["Accept", "text/html,application/xhtml+xml"],
            ["Accept-Language", "en"],
            ["User-Agent", "Scrapy/2.19 (+https://scrapy.org)"],
        ],
        "meta": {"depth": 3, "category": "c977", "retryqueue_policy": {"max_retries": 5}},
        "callback": "parse_item",
    }
    if body:
        request.update(method="POST", body=base64.b64encode(body).decode("ascii"))
    return Task(
        id="5f3c" * 10,
        spider=SPIDER,
        request=request,
        attempts={"server_error": 2},
        kind="server_error",
        first_error=error,
        last_error=error,
        node="bench-node:1234",
        created=T0,
        updated=T0 + 5_000,
        due=T0 + 9_000,
        max_retries=9,
    )


def _us(call: Callable[[], Any]) -> float:
    """This thread's CPU per call of *call*, µs: the best of ROUNDS rounds of CALLS calls."""
    best = []
    for _ in range(ROUNDS):
        started = time.thread_time()
        for _ in range(CALLS):
            call()
        best.append((time.thread_time() - started) / CALLS * 1e6)
    return min(best) if min(best) > 0 else statistics.median(best)


def _envelope(label: str, task: Task, ring: KeyRing) -> dict[str, float]:
    """The figures of one envelope."""
    text = task.to_json()
    signed = sign_envelope(text, ring, NAMESPACE)
    doc = {"id": task.id, "spider": task.spider, "updated": task.updated}
    fields = {
        ev.TYPE: ev.SCHEDULED,
        ev.ID: task.id,
        ev.KIND: task.kind,
        ev.ATTEMPT: 2,
        ev.DUE: task.due,
        ev.NODE: task.node,
        ev.TS: task.updated,
        ev.URL: task.url,
    }

    def sign() -> None:
        sign_envelope(text, ring, NAMESPACE)
        sign_event(fields, ring, NAMESPACE, SPIDER)

    def verify() -> None:
        verify_envelope(signed, ring, NAMESPACE)
        check_claimed(doc, task_id=task.id, spider=SPIDER, version=task.updated, finished=T0)

    signing, checking = _us(sign), _us(verify)
    return {
        f"{label}: envelope bytes": len(signed),
        f"{label}: sign µs": signing,
        f"{label}: verify µs": checking,
        f"{label}: sign + verify µs": signing + checking,
        f"{label}: encode µs (unsigned)": _us(task.to_json),
        f"{label}: decode µs (unsigned)": _us(lambda: task_from_json(signed)),
    }


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    ring = KeyRing(parse_keys([generate_key(), generate_key()]))
    out = _envelope("typical", _task(), ring)
    out.update(_envelope("4 KB body", _task(b"x" * 4096), ring))
    text = json.dumps(_task().request, separators=(",", ":"))
    request_id = "5f3c" * 10
    signed = sign_frontier_request(text, ring, NAMESPACE, SPIDER, request_id)
    out["frontier: sign µs/request"] = _us(
        lambda: sign_frontier_request(text, ring, NAMESPACE, SPIDER, request_id)
    )
    out["frontier: verify µs/request"] = _us(
        lambda: verify_frontier_request(signed, ring, NAMESPACE, SPIDER, request_id)
    )
    return out
