"""Run the demo end to end: start the flaky site, crawl it, say what happened.

    python example_project/run_demo.py [--pages 500]

With no Redis configured (the default here) the crawl uses the embedded server
under example_project/.scrapy/retryqueue/; it stops when the crawl and this
summary are done, and its data stays for the next run. The crawl is the
``flaky_resumable`` spider, whose frontier is in that server too: interrupt a
run with Ctrl-C and start it again, and it resumes both the pages it had not
fetched yet and the pending retries.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: The demo's crawl: the flaky site on the leased frontier (demo/spiders/flaky_resumable.py).
SPIDER = "flaky_resumable"


def start_site(pages: int, port: int) -> tuple[subprocess.Popen[str], str]:
    site = subprocess.Popen(
        [sys.executable, str(HERE / "flaky_site.py"), "--port", str(port), "--pages", str(pages)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert site.stdout is not None
    line = site.stdout.readline().strip()
    if not line.startswith("listening on "):
        site.kill()
        raise SystemExit(
            f"the flaky site did not start on port {port} (is it in use? pick another with "
            "--port; retries left pending by an earlier run point at the port they failed on)"
        )
    return site, line.removeprefix("listening on ")


def summarize(spider: str, since_ms: int, items_path: Path) -> str:
    os.chdir(HERE)
    from scrapy.utils.project import get_project_settings

    from scrapy_retryqueue.config import load_config
    from scrapy_retryqueue.queue import embedded
    from scrapy_retryqueue.queue.connection import client_for, embedded_dir

    config = load_config(get_project_settings())
    directory = embedded_dir(config.embedded_dir)
    if config.redis_url is None:
        # Held like a crawl holds it, so that it stops once the summary is read.
        embedded.hold(directory)
    try:
        client, url = client_for(config, embedded_directory=directory)
        return _summarize(client, url, spider, since_ms, items_path, config.namespace)
    finally:
        if config.redis_url is None:
            embedded.let_go(directory)


def _summarize(
    client: Any, url: str, spider: str, since_ms: int, items_path: Path, project: str
) -> str:
    from scrapy_retryqueue.queue import events
    from scrapy_retryqueue.queue.keys import keys_for

    keys = keys_for(spider, project)
    scheduled: collections.Counter[str] = collections.Counter()
    dead: collections.Counter[str] = collections.Counter()
    retried: set[str] = set()
    recovered: set[str] = set()
    for event in events.parse_entries(client.xrange(keys.events, min=f"{since_ms}-0")):
        if isinstance(event, events.MalformedEvent):
            continue
        if event.type == events.SCHEDULED:
            scheduled[event.kind] += 1
            retried.add(event.url)
        elif event.type == events.DEAD:
            dead[event.kind] += 1
        elif event.type == events.SUCCEEDED:
            recovered.add(event.url)
    parsed = [json.loads(line)["url"] for line in items_path.read_text().splitlines() if line]
    pending = client.zcard(keys.due) + client.zcard(keys.leased)
    # Pages an interrupted crawl had not fetched yet wait in the frontier.
    pending += client.zcard(keys.frontier) + client.zcard(keys.frontier_leased)

    def by_kind(counter: collections.Counter[str]) -> str:
        return ", ".join(f"{kind} {n}" for kind, n in counter.most_common()) or "none"

    first_try = len([u for u in parsed if u not in retried])
    return "\n".join(
        [
            f"queue:              {url.split('?')[0]}",
            f"parsed pages:       {len(parsed)} ({first_try} at the first try, "
            f"{len(parsed) - first_try} after a retry)",
            f"retries scheduled:  {sum(scheduled.values())} ({by_kind(scheduled)})",
            f"recovered tasks:    {len(recovered)}",
            f"dead letters:       {sum(dead.values())} ({by_kind(dead)})",
            f"still pending:      {pending}",
            *stored_dead_letters(spider, since_ms),
        ]
    )


def stored_dead_letters(spider: str, since_ms: int) -> list[str]:
    """Where the dead letters ended up (the SQL store), and how to export them."""
    from datetime import UTC, datetime

    from scrapy.utils.project import get_project_settings
    from sqlalchemy import func, select

    from scrapy_retryqueue.config import load_config
    from scrapy_retryqueue.queue.connection import embedded_dir
    from scrapy_retryqueue.store import Store, StoreError, load_store_config

    settings = get_project_settings()
    config = load_config(settings)
    url = load_store_config(settings).url_for(embedded_dir(config.embedded_dir))
    try:
        store = Store(url)
        table = store.table
        since = datetime.fromtimestamp(since_ms / 1000, UTC)
        with store.connect() as conn:
            stored = conn.execute(
                select(func.count())
                .select_from(table)
                .where(table.c.spider == spider, table.c.status == "dead")
                .where(table.c.finished_at >= since)
            ).scalar_one()
        store.close()
    except StoreError as exc:
        return [f"dead letter store: {exc}"]
    scrapy = scrapy_command()
    return [
        f"store:              {stored} dead letters of this run, in {store.safe_url}",
        "export them:        cd example_project && "
        f"{scrapy} deadletters export --spider {spider} -O dead.csv",
        f"queue status:       cd example_project && {scrapy} retryqueue status --spider {spider}",
    ]


def scrapy_command() -> str:
    """How to run ``scrapy`` from example_project/: the one beside this Python (a
    virtualenv's, often not on PATH), else plain ``scrapy``."""
    import shutil

    beside = Path(sys.executable).parent / "scrapy"
    if not beside.exists() or shutil.which("scrapy") == str(beside):
        return "scrapy"
    # ../.venv/bin/scrapy for the repository's own virtualenv, else its full path.
    return os.path.relpath(beside, HERE) if HERE.parent in beside.parents else str(beside)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500)
    # A fixed port: retries left pending by an interrupted run name this site,
    # and the next run must serve them at the same address.
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    site, site_url = start_site(args.pages, args.port)
    items = HERE / ".scrapy" / "demo-items.jsonl"
    items.parent.mkdir(exist_ok=True)
    started_ms = int(time.time() * 1000)
    try:
        print(f"flaky site with {args.pages} pages at {site_url}; crawling...", flush=True)
        crawl = subprocess.run(
            [
                *(sys.executable, "-m", "scrapy.cmdline", "crawl", SPIDER),
                *("-a", f"site={site_url}", "-O", str(items), "-s", "LOG_LEVEL=ERROR"),
            ],
            cwd=HERE,
        )
    finally:
        site.terminate()
        site.wait(10)
    print()
    print(summarize(SPIDER, started_ms, items))
    return crawl.returncode


if __name__ == "__main__":
    raise SystemExit(main())
