"""Export of dead letters: rows per second and peak memory, 100,000 vs 1,000,000 rows.

    python benchmarks/export.py [--sizes 100000,1000000] [--formats csv,jsonl]

Fills a fresh PostgreSQL database with realistic dead letters (an envelope of
about 1 KB each), then runs the real command, ``scrapy deadletters export``, in
a subprocess per size and format, and reports its wall time, rows/s and peak
resident memory (the child's own ru_maxrss). Streaming means the peak stays
flat while the row count grows tenfold.
Needs PostgreSQL on 127.0.0.1:5432 (RETRYQUEUE_BENCH_DATABASE_URL).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy
from sqlalchemy import text

from scrapy_retryqueue.store.db import Store

PG_URL = os.environ.get(
    "RETRYQUEUE_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

FILL = """
INSERT INTO retryqueue_tasks (
    spider, task_id, url, domain, method, status, kind, attempts, attempts_total, max_retries,
    reclaims, first_error_kind, first_error_type, first_error_message, first_error_status,
    last_error_kind, last_error_type, last_error_message, last_error_status, node, envelope,
    created_at, updated_at, finished_at, event_ms, event_seq)
SELECT
    'bench', md5(i::text) || substr(md5((i + 1)::text), 1, 8),
    'https://shop' || (i % 50) || '.example.com/category/' || (i % 977) || '/item/' || i || '?ref=list',
    'shop' || (i % 50) || '.example.com', 'GET', 'dead',
    (ARRAY['server_error', 'timeout', 'not_found', 'forbidden'])[1 + i % 4],
    '{"server_error": 5, "timeout": 1}'::jsonb, 6, 5, 0,
    'timeout', 'TimeoutError', 'Getting https://shop.example.com/ took longer than 180.0 seconds.', NULL,
    'server_error', 'HttpError', 'Ignoring non-200 response: HTTP 503 Service Unavailable', 503,
    'node-' || (i % 8),
    jsonb_build_object(
        'v', 1, 'id', md5(i::text), 'spider', 'bench', 'kind', 'server_error',
        'attempts', jsonb_build_object('server_error', 5, 'timeout', 1),
        'first_error', jsonb_build_object('kind', 'timeout', 'type', 'TimeoutError',
            'message', 'Getting https://shop.example.com/ took longer than 180.0 seconds.'),
        'last_error', jsonb_build_object('kind', 'server_error', 'type', 'HttpError',
            'message', 'Ignoring non-200 response: HTTP 503 Service Unavailable', 'status', 503),
        'node', 'node-' || (i % 8), 'created', 1700000000000 + i, 'updated', 1700000000000 + i,
        'due', 0, 'dead_kind', 'server_error',
        'request', jsonb_build_object(
            'url', 'https://shop' || (i % 50) || '.example.com/category/' || (i % 977) || '/item/' || i,
            'headers', '[["Accept", "text/html,application/xhtml+xml"], ["Referer", "https://shop.example.com/"]]'::jsonb,
            'meta', jsonb_build_object('depth', 3, 'category', 'c' || (i % 977),
                'listing', jsonb_build_object('page', i % 9, 'pos', i % 24)),
            'callback', 'parse_item', 'errback', 'failed')),
    now() - interval '1 day', now() - (i || ' seconds')::interval, now() - (i || ' seconds')::interval,
    0, 0
FROM generate_series(:start, :stop - 1) AS i
"""


def fill(store: Store, start: int, stop: int) -> None:
    step = 100_000
    for low in range(start, stop, step):
        with store.begin() as conn:
            conn.execute(text(FILL), {"start": low, "stop": min(stop, low + step)})
    with store.begin() as conn:
        conn.execute(text("ANALYZE retryqueue_tasks"))


def export(url: str, fmt: str, out: Path) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (KiB) of the command, and the file size."""
    command = [sys.executable, "-m", "scrapy.cmdline", "deadletters", "export",
               "--format", fmt, "-O", str(out), "-s", f"RETRYQUEUE_DATABASE_URL={url}"]  # fmt: skip
    started = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=out.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"export failed: {child.stderr.read().decode() if child.stderr else ''}")
    return seconds, usage.ru_maxrss, out.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--formats", default="csv,jsonl")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    formats = args.formats.split(",")

    admin = sqlalchemy.create_engine(sqlalchemy.make_url(PG_URL).set(drivername="postgresql+psycopg2"),
                                     isolation_level="AUTOCOMMIT")  # fmt: skip
    name = f"rq_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = sqlalchemy.make_url(PG_URL).set(database=name).render_as_string(False)
    store = Store(url)
    store.upgrade()
    baseline = [
        sys.executable,
        "-c",
        "import scrapy.cmdline, scrapy_retryqueue.commands.deadletters",
    ]
    child = subprocess.Popen(baseline)
    _, _, usage = os.wait4(child.pid, 0)
    print(f"PostgreSQL {store.engine.dialect.server_version_info}; "
          f"a Python with Scrapy and the command imported peaks at {usage.ru_maxrss / 1024:.0f} MiB")  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            filled = 0
            for size in sizes:
                started = time.perf_counter()
                fill(store, filled, size)
                print(
                    f"filled {size:,} dead letters in {time.perf_counter() - started:.0f}s",
                    flush=True,
                )
                filled = size
                for fmt in formats:
                    out = Path(tmp) / f"dead.{fmt}"
                    seconds, rss_kib, file_size = export(url, fmt, out)
                    print(
                        f"{size:>9,} rows  {fmt:5}  {seconds:6.1f}s  {size / seconds:8,.0f} rows/s  "
                        f"peak RSS {rss_kib / 1024:6.1f} MiB  file {file_size / 2**20:7.1f} MiB",
                        flush=True,
                    )
                    out.unlink()
    finally:
        store.close()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
