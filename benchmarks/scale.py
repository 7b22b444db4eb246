"""8. Scale: 1, 2 and 3 nodes sharing one Redis drain a backlog of due retries.

Re-injected retries per second in total, from the first node's start to the
last node's end. The machine's core count bounds what more nodes can add.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import redis

from .common import crawl_process, flaky_site, forget, preload

BACKLOG = 6000


def drain(redis_url: str, workdir: Path, nodes: int) -> float:
    client = redis.Redis.from_url(redis_url)
    spider = f"scale{uuid.uuid4().hex[:6]}"
    with flaky_site(pages=BACKLOG, mix="healthy") as site:
        now = int(time.time() * 1000)
        preload(
            client, spider, [f"{site.url}/page/{i}" for i in range(BACKLOG)], due_ms=[now] * BACKLOG
        )
        settings = {"RETRYQUEUE_REDIS_URL": redis_url, "RETRYQUEUE_POLL_INTERVAL": 0.2}
        started = time.monotonic()
        processes = [
            crawl_process(
                site.url,
                spider,
                {**settings, "RETRYQUEUE_NODE_ID": f"n{n}"},
                workdir,
                "-a",
                "index=false",
            )
            for n in range(nodes)
        ]
        for process, _ in processes:
            assert process.wait(600) == 0
        seconds = time.monotonic() - started
    reinjected = sum(
        json.loads(stats.read_text()).get("retryqueue/reinjected", 0) for _, stats in processes
    )
    forget(client, spider)
    client.close()
    assert reinjected >= BACKLOG, reinjected
    return BACKLOG / seconds


def measure(redis_url: str, workdir: Path) -> dict[str, float]:
    return {
        f"{n} node{'s' if n > 1 else ''} retries/s": drain(redis_url, workdir, n) for n in (1, 2, 3)
    }
