"""``scrapy deadletters export|requeue|purge|sync`` and ``scrapy retryqueue status``,
run as a person runs them (a subprocess, outside a project), against the real
PostgreSQL (SQLite for the zero-setup default) and Redis."""

from __future__ import annotations

import csv
import io
import json
import os
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis
from sqlalchemy import select

from scrapy_retryqueue.commands._common import Progress
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue
from scrapy_retryqueue.queue.envelope import Task, task_from_json
from scrapy_retryqueue.queue.keys import all_keys, keys_for
from scrapy_retryqueue.store.db import Store
from scrapy_retryqueue.store.export import csv_cell, escape_cell
from scrapy_retryqueue.store.upsert import apply_batch
from scrapy_retryqueue.store.writer import Event, build_batch

from .storecli import Result, scrapy


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp() * 1000)


#: (key, spider, status, kind, url, http status, node, time, message)
ROWS = [
    ("r1", "alpha", "dead", "not_found", "https://shop.example/a", 404, "n1", "2024-01-01T10:00", "Not Found"),
    ("r2", "alpha", "dead", "server_error", "https://www.shop.example/b", 503, "n2", "2024-01-02T10:00", "503"),
    ("r3", "alpha", "dead", "timeout", "https://other.example/c?q=-1", None, "n1", "2024-01-03T10:00", "=HYPERLINK(\"http://evil\")"),
    ("r4", "alpha", "succeeded", "timeout", "https://other.example/ok", None, "n1", "2024-01-03T11:00", "late"),
    ("r5", "alpha", "waiting", "parse", "https://other.example/wait", None, "n1", "2024-01-03T12:00", "no title"),
    ("r6", "beta", "dead", "forbidden", "https://shop.example/d", 403, "n2", "2024-01-04T10:00", "Forbidden"),
]  # fmt: skip
EVENT_TYPE = {"dead": "dead", "succeeded": "succeeded", "waiting": "scheduled"}


@pytest.fixture
def spiders(redis_client: redis.Redis) -> Iterator[dict[str, str]]:
    """Spider names of this test (their Redis namespaces are deleted afterwards)."""
    names = {"alpha": f"a{uuid4().hex[:8]}", "beta": f"b{uuid4().hex[:8]}"}
    yield names
    for name in names.values():
        redis_client.delete(*all_keys(keys_for(name)))


def fill(store: Store, spiders: dict[str, str]) -> dict[str, str]:
    """Write ROWS (and one malformed dead letter) through the writer; returns key → task id."""
    events, envelopes, ids = [], {}, {}
    for n, (key, spider, status, kind, url, http, node, when, message) in enumerate(ROWS, 1):
        spider_name = spiders[spider]
        task_id = f"{key}{uuid4().hex[:6]}"
        ids[key] = task_id
        error = {"kind": kind, "type": "HttpError" if http else "TimeoutError", "message": message}
        if http:
            error["status"] = http
        envelope = Task(
            id=task_id,
            spider=spider_name,
            request={"url": url, "meta": {"page": n}},
            attempts={kind: 2},
            kind=kind,
            first_error=error,
            last_error=error,
            node=node,
            created=ms(when) - 1000,
            updated=ms(when),
            dead_kind=kind if status == "dead" else None,
        ).to_json()
        type_ = EVENT_TYPE[status]
        fields = {"type": type_, "id": task_id, "kind": kind, "node": node, "ts": str(ms(when))}
        events.append(Event(f"{n}-0", spider_name, fields))
        source = "dead" if type_ == "dead" else "tasks"
        envelopes[(spider_name, source, task_id)] = json.loads(envelope)
    ids["malformed"] = "m" + uuid4().hex[:8]
    fields = {
        "type": "dead",
        "id": ids["malformed"],
        "kind": "malformed",
        "ts": str(ms("2024-01-05T10:00")),
    }
    events.append(Event("99-0", spiders["beta"], fields))
    envelopes[(spiders["beta"], "dead", ids["malformed"])] = {
        "id": ids["malformed"],
        "raw": "{oops",
    }
    with store.begin() as conn:
        apply_batch(conn, build_batch(events, envelopes))
    return ids


@pytest.fixture
def pg(new_pg_database: Callable[[], str], spiders: dict[str, str]) -> Iterator[dict[str, Any]]:
    url = new_pg_database()
    store = Store(url)
    store.upgrade()
    ids = fill(store, spiders)
    yield {"url": url, "store": store, "ids": ids, "spiders": spiders}
    store.close()


@pytest.fixture
def settings(pg: dict[str, Any], redis_url: str) -> dict[str, str]:
    return {"RETRYQUEUE_DATABASE_URL": pg["url"], "RETRYQUEUE_REDIS_URL": redis_url}


def run(tmp_path: Path, settings: dict[str, str], *args: str, stdin: str | None = None) -> Result:
    return scrapy(*args, cwd=tmp_path, settings=settings, stdin=stdin)


def exported_keys(pg: dict[str, Any], rows: list[dict[str, Any]]) -> set[str]:
    by_id = {v: k for k, v in pg["ids"].items()}
    return {by_id[r["task_id"]] for r in rows}


def status_of(pg: dict[str, Any], key: str) -> dict[str, Any]:
    store, table = pg["store"], pg["store"].table
    with store.connect() as conn:
        row = conn.execute(select(table).where(table.c.task_id == pg["ids"][key])).mappings().one()
    return dict(row)


# -- export ------------------------------------------------------------------------


def test_export_csv_to_a_file_streams_every_dead_letter_with_formulas_made_inert(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "dead.csv"
    done = run(tmp_path, settings, "deadletters", "export", "-O", str(target))
    assert done.code == 0, done.err
    assert done.err.strip() == f"exported 5 task(s) to {target} (csv)"
    assert not list(tmp_path.glob("*.part"))
    rows = list(csv.DictReader(io.StringIO(target.read_text(encoding="utf-8"), newline="")))
    assert exported_keys(pg, rows) == {"r1", "r2", "r3", "r6", "malformed"}
    r3 = next(r for r in rows if r["task_id"] == pg["ids"]["r3"])
    assert r3["last_error_message"] == '\'=HYPERLINK("http://evil")'
    assert r3["url"] == "https://other.example/c?q=-1"
    assert json.loads(r3["envelope"])["request"]["meta"] == {"page": 3}
    assert r3["finished_at"] == "2024-01-03T10:00:00+00:00"
    r2 = next(r for r in rows if r["task_id"] == pg["ids"]["r2"])
    assert (r2["last_error_status"], r2["attempts_total"], r2["domain"]) == (
        "503",
        "2",
        "www.shop.example",
    )


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (["--spider", "alpha", "--kind", "server_error,not_found"], {"r1", "r2"}),
        (["--domain", "shop.example"], {"r1", "r2", "r6"}),
        (["--http-status", "503", "--http-status", "403"], {"r2", "r6"}),
        (["--node", "n1"], {"r1", "r3"}),
        (["--since", "2024-01-02T00:00Z", "--until", "2024-01-04"], {"r2", "r3"}),
        (["--status", "all", "--spider", "alpha"], {"r1", "r2", "r3", "r4", "r5"}),
        (["--kind", "malformed"], {"malformed"}),
    ],
)
def test_export_jsonl_to_stdout_honours_each_filter(
    pg: dict[str, Any],
    settings: dict[str, str],
    tmp_path: Path,
    filters: list[str],
    expected: set[str],
) -> None:
    spider_args = []
    for i, value in enumerate(filters):
        if i and filters[i - 1] == "--spider":
            value = pg["spiders"][value]
        spider_args.append(value)
    if "--spider" not in filters:
        spider_args += ["--spider", ",".join(pg["spiders"].values())]
    done = run(tmp_path, settings, "deadletters", "export", "--format", "jsonl", *spider_args)
    assert done.code == 0, done.err
    rows = [json.loads(line) for line in done.out.splitlines()]
    assert exported_keys(pg, rows) == expected
    assert done.err == ""  # no progress bar when stderr is not a terminal


def test_export_into_a_pipe_its_reader_closed_ends_quietly(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    # `scrapy deadletters export | head -1`: the reader goes before the export ends.
    import subprocess
    import sys

    command = [sys.executable, "-m", "scrapy.cmdline", "deadletters", "export", "--format"]
    command += ["jsonl", "--spider", ",".join(pg["spiders"].values())]
    for name, value in settings.items():
        command += ["-s", f"{name}={value}"]
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    process.stdout.close()  # before the first row is written: every write fails
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "error" not in err.lower() and "Traceback" not in err


def test_export_takes_the_deferred_kind(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    # A fresh request parked while its domain cools down: a waiting task of kind deferred.
    spider = pg["spiders"]["alpha"]
    task_id = "deferred" + uuid4().hex[:6]
    when = str(ms("2024-01-06T10:00"))
    fields = {"type": "scheduled", "id": task_id, "kind": "deferred", "ts": when, "due": when}
    envelope = Task(
        id=task_id, spider=spider, request={"url": "https://cool.example/"}, kind="deferred"
    ).to_json()
    with pg["store"].begin() as conn:
        batch = build_batch(
            [Event("100-0", spider, fields)], {(spider, "tasks", task_id): json.loads(envelope)}
        )
        apply_batch(conn, batch)
    args = ["--kind", "deferred", "--status", "waiting", "--spider", spider]
    done = run(tmp_path, settings, "deadletters", "export", "--format", "jsonl", *args)
    assert done.code == 0, done.err
    assert [json.loads(line)["task_id"] for line in done.out.splitlines()] == [task_id]


def test_export_json_is_one_array_and_limit_caps_it(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "dead.json"
    spider = pg["spiders"]["alpha"]
    done = run(
        tmp_path,
        settings,
        "deadletters",
        "export",
        "-O",
        str(target),
        "--spider",
        spider,
        "--limit",
        "2",
    )
    assert done.code == 0, done.err
    rows = json.loads(target.read_text())
    assert [r["task_id"] for r in rows] == [pg["ids"]["r1"], pg["ids"]["r2"]]
    assert rows[0]["attempts"] == {"not_found": 2}


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["export", "--kind", "timout"], 2, "--kind 'timout' is not a kind; known: timeout"),
        (["export", "--since", "last tuesday"], 2, "--since 'last tuesday' is not a date or time"),
        (["export", "--since", "2024-02-01", "--until", "2024-01-01"], 2, "is not before --until"),
        (["export", "--http-status", "99"], 2, "--http-status '99' is not an HTTP status"),
        (["export", "--status", "gone"], 2, "--status 'gone' is not a status"),
        (["export", "--format", "xml"], 2, "invalid choice: 'xml'"),
        (["export", "--limit", "0"], 2, "--limit must be >= 1"),
        (["export", "--spider", "nobody"], 1, "no tasks match (status=dead spider=nobody)"),
        (["requeue", "--kind", "rule"], 1, "no dead letters match"),
        (["purge", "--domain", "nowhere.example", "--yes"], 1, "no tasks match"),
        # An empty value is no filter that matches everything.
        (["purge", "--spider", "", "--yes"], 2, "--spider '' holds an empty value"),
        (["export", "--kind", "timeout,"], 2, "--kind 'timeout,' holds an empty value"),
        (["export", "--node", " "], 2, "--node ' ' holds an empty value"),
        (["export", "--since", ""], 2, "--since is empty"),
        # As the dashboard: a task still due in Redis is not purged.
        (["purge", "--status", "waiting", "--yes"], 2, "purge deletes finished tasks only"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_gets_one_clear_line_and_a_non_zero_exit(
    settings: dict[str, str], tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    done = run(tmp_path, settings, "deadletters", *args)
    assert done.code == code
    assert done.err.startswith("error: ")
    assert done.err.count("\n") == 1, done.err
    assert message in done.err
    assert "Traceback" not in done.err


def test_a_database_that_does_not_answer_is_one_line_too(tmp_path: Path) -> None:
    settings = {"RETRYQUEUE_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/none"}
    for args in (["deadletters", "export"], ["deadletters", "purge", "--yes"]):
        done = scrapy(*args, cwd=tmp_path, settings=settings)
        assert done.code == 2
        assert done.err.startswith("error: the database at postgresql://postgres@127.0.0.1:9/none")
        assert "does not answer" in done.err and done.err.count("\n") == 1
    bad = scrapy(
        "deadletters", "export", cwd=tmp_path, settings={"RETRYQUEUE_DATABASE_URL": "mysql://x/y"}
    )
    assert bad.code == 2
    assert "RETRYQUEUE_DATABASE_URL must be a postgresql:// or sqlite:/// URL" in bad.err


def test_without_a_database_url_the_default_sqlite_store_is_used(tmp_path: Path) -> None:
    missing = scrapy("deadletters", "export", cwd=tmp_path)
    assert missing.code == 2
    assert "no store database here" in missing.err
    path = tmp_path / ".scrapy" / "retryqueue" / "retryqueue.sqlite3"
    store = Store(f"sqlite:///{path}")
    store.upgrade()
    fill(store, {"alpha": "alpha", "beta": "beta"})
    store.close()
    done = scrapy("deadletters", "export", "--format", "jsonl", "--kind", "forbidden", cwd=tmp_path)
    assert done.code == 0, done.err
    assert [json.loads(line)["url"] for line in done.out.splitlines()] == ["https://shop.example/d"]


# -- requeue -------------------------------------------------------------------------


def test_requeue_dry_run_shows_what_would_move_and_moves_nothing(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    alpha = pg["spiders"]["alpha"]
    done = run(tmp_path, settings, "deadletters", "requeue", "--spider", alpha, "--dry-run")
    assert done.code == 0, done.err
    assert len(done.out.splitlines()) == 3
    assert "https://www.shop.example/b" in done.out
    assert "would requeue 3 dead letter(s)" in done.err
    assert redis_client.zcard(keys_for(alpha).due) == 0
    assert status_of(pg, "r2")["status"] == "dead"


def test_requeue_puts_tasks_back_with_a_fresh_budget_and_keeps_their_history(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    alpha, beta = pg["spiders"]["alpha"], pg["spiders"]["beta"]
    done = run(
        tmp_path,
        settings,
        "deadletters",
        "requeue",
        "--spider",
        f"{alpha},{beta}",
        "--http-status",
        "503,403",
    )
    assert done.code == 0, done.err
    assert "requeued 2 dead letter(s) (fresh budget)" in done.err
    queue = RedisDelayedQueue(redis_client, alpha, node_id="test")
    raw = queue.get_task(pg["ids"]["r2"])
    assert raw is not None
    task = task_from_json(raw)
    assert task.attempts == {}
    assert task.dead_kind is None
    assert task.last_error is not None and task.last_error["status"] == 503
    assert task.request["meta"] == {"page": 2}
    assert queue.counts(now=10**13).due_now == 1
    row = status_of(pg, "r2")
    assert (row["status"], row["requeues"], row["finished_at"]) == ("waiting", 1, None)
    assert row["history"][0]["kind"] == "server_error"
    assert row["history"][0]["attempts"] == {"server_error": 2}
    assert row["history"][0]["last_error_status"] == 503
    assert row["first_error_message"] == "503"  # the failure history stays
    assert status_of(pg, "r1")["status"] == "dead"  # not matched


def test_requeue_by_id_can_keep_the_budget_and_skips_what_it_cannot_rebuild(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    ids = pg["ids"]
    row_id = str(status_of(pg, "r3")["id"])
    done = run(
        tmp_path,
        settings,
        "deadletters",
        "requeue",
        "--id",
        row_id,
        "--id",
        ids["malformed"],
        "--keep-budget",
    )
    assert done.code == 0, done.err
    assert "requeued 1 dead letter(s) (budget kept); 1 skipped (malformed)" in done.err
    assert f"skipped {status_of(pg, 'malformed')['id']}" in done.err
    task = task_from_json(
        RedisDelayedQueue(redis_client, pg["spiders"]["alpha"], node_id="t").get_task(ids["r3"])
        or ""
    )
    assert task.attempts == {"timeout": 2}
    assert status_of(pg, "malformed")["status"] == "dead"


def test_requeue_leaves_a_task_that_is_live_in_the_queue_alone(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    beta = pg["spiders"]["beta"]
    queue = RedisDelayedQueue(redis_client, beta, node_id="t")
    live = Task(
        id=pg["ids"]["r6"],
        spider=beta,
        request={"url": "https://shop.example/d"},
        kind="timeout",
        due=1,
    )
    assert queue.schedule(live, now=1)
    done = run(
        tmp_path, settings, "deadletters", "requeue", "--spider", beta, "--kind", "forbidden"
    )
    assert done.code == 0, done.err
    assert "requeued 0 dead letter(s) (fresh budget); 1 already had a live retry" in done.err
    assert status_of(pg, "r6")["status"] == "dead"


def test_purge_of_every_status_leaves_the_live_tasks_alone(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    alpha = pg["spiders"]["alpha"]
    done = run(
        tmp_path, settings, "deadletters", "purge", "--spider", alpha, "--status", "all", "--yes"
    )
    assert done.code == 0, done.err
    assert "purge leaves live tasks alone (waiting, retrying)" in done.err
    assert status_of(pg, "r5")["status"] == "waiting"


@pytest.mark.parametrize("make", ["symlink", "fifo", "directory"])
@pytest.mark.parametrize("option", ["-O", "-o"])
def test_export_never_replaces_nor_follows_what_is_not_a_regular_file(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, make: str, option: str
) -> None:
    target = tmp_path / "out.jsonl"
    pointed = tmp_path / "elsewhere.jsonl"
    pointed.write_text("kept\n")
    if make == "symlink":
        target.symlink_to(pointed)
    elif make == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    done = run(tmp_path, settings, "deadletters", "export", option, str(target))
    assert done.code == 2, done.err
    assert done.err.startswith("error: ") and done.err.count("\n") == 1, done.err
    assert ("symbolic link" if make == "symlink" else "regular file") in done.err
    # Nothing replaced, nothing written through, no temporary file left.
    assert pointed.read_text() == "kept\n"
    if make == "symlink":
        assert target.is_symlink()
    elif make == "fifo":
        assert stat.S_ISFIFO(target.lstat().st_mode)
    else:
        assert target.is_dir()
    assert not list(tmp_path.glob("*.part")) and not list(tmp_path.glob(".*.part"))


# -- purge ---------------------------------------------------------------------------


def test_purge_asks_for_confirmation_and_says_how_many_it_removed(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    alpha = pg["spiders"]["alpha"]
    refused = run(
        tmp_path, settings, "deadletters", "purge", "--spider", alpha, "--kind", "timeout,not_found"
    )
    assert refused.code == 2
    assert "would delete 2 dead letter(s)" in refused.err and "--yes" in refused.err
    assert status_of(pg, "r1")["status"] == "dead"
    done = run(
        tmp_path,
        settings,
        "deadletters",
        "purge",
        "--spider",
        alpha,
        "--kind",
        "timeout,not_found",
        "--yes",
    )
    assert done.code == 0, done.err
    assert done.err.strip() == "deleted 2 dead letter(s)"
    store, table = pg["store"], pg["store"].table
    with store.connect() as conn:
        left = set(conn.execute(select(table.c.task_id)).scalars())
    ids = pg["ids"]
    assert left == {ids[k] for k in ("r2", "r4", "r5", "r6", "malformed")}


# -- sync and status --------------------------------------------------------------------


def test_sync_writes_the_events_waiting_in_redis_and_status_shows_both_sides(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    alpha = pg["spiders"]["alpha"]
    queue = RedisDelayedQueue(redis_client, alpha, node_id="n9")
    now = int(datetime.now(UTC).timestamp() * 1000)
    for i in range(3):
        task = Task(
            id=f"live{i}",
            spider=alpha,
            request={"url": f"https://q.example/{i}"},
            kind="timeout",
            due=now + (0 if i else 10**8),
        )
        queue.schedule(task, now=now)
    queue.claim(now=now, limit=1, lease_until=now + 60_000, token="t")
    dead = Task(
        id="gone",
        spider=alpha,
        request={"url": "https://q.example/gone"},
        kind="not_found",
        dead_kind="not_found",
    )
    queue.deadletter(dead, None, now=now)

    status = run(tmp_path, settings, "retryqueue", "status", "--spider", alpha, "--json")
    assert status.code == 0, status.err
    before = json.loads(status.out)["spiders"][alpha]
    assert (before["due"], before["due_now"], before["leased"]) == (2, 1, 1)
    assert (before["dead_in_store"], before["dead_in_redis"], before["dead"]) == (3, 1, 4)
    assert before["events_unwritten"] == 5

    done = run(tmp_path, settings, "deadletters", "sync", "--spider", alpha)
    assert done.code == 0, done.err
    assert f"{alpha}: 5 event(s) written" in done.err
    assert redis_client.zcard(keys_for(alpha).dead) == 0

    after = json.loads(
        run(tmp_path, settings, "retryqueue", "status", "--spider", alpha, "--json").out
    )
    entry = after["spiders"][alpha]
    assert (entry["dead_in_store"], entry["dead_in_redis"], entry["events_unwritten"]) == (4, 0, 0)
    assert entry["by_kind"]["not_found"] == {"pending": 0, "dead": 2}
    assert entry["by_kind"]["timeout"] == {"pending": 3, "dead": 1}
    assert entry["top_domains"][0] == {"domain": "q.example", "pending": 3, "dead": 1}

    table = run(tmp_path, settings, "retryqueue", "status", "--spider", alpha)
    lines = table.out.splitlines()
    assert lines[0].split() == [
        "spider",
        "due",
        "due",
        "now",
        "leased",
        "dead",
        "succeeded",
        "today",
        "unwritten",
    ]
    assert lines[1].split()[:5] == [alpha, "2", "1", "1", "4"]
    assert "by kind:" in table.out and "top domains:" in table.out


def test_status_of_an_unknown_spider_and_of_nothing_reachable(
    settings: dict[str, str], tmp_path: Path
) -> None:
    # Outside a project no spider is known: a name with nothing recorded is an error.
    unknown = run(tmp_path, settings, "retryqueue", "status", "--spider", "nobody-here")
    assert unknown.code == 1
    assert unknown.err == (
        "error: nothing is recorded for spider 'nobody-here' in the queue or the store (run "
        "the command in the project to tell a spider never crawled from a wrong name)\n"
    )
    nothing = scrapy(
        "retryqueue", "status", cwd=tmp_path,
        settings={"RETRYQUEUE_REDIS_URL": "redis://127.0.0.1:9/0", "RETRYQUEUE_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/x"},
    )  # fmt: skip
    assert nothing.code == 2
    assert nothing.err.startswith("error: ") and nothing.err.count("\n") == 1


# -- pure helpers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("=1+1", "'=1+1"),
        ("+33 6", "'+33 6"),
        ("-2", "'-2"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("https://a/b", "https://a/b"),
        ("", ""),
    ],
)
def test_cells_a_spreadsheet_would_run_get_a_leading_quote(value: str, expected: str) -> None:
    assert escape_cell(value) == expected


def test_numbers_and_empty_values_are_written_as_they_are() -> None:
    assert csv_cell(-3) == -3
    assert csv_cell(None) == ""
    assert csv_cell(datetime(2024, 1, 2, tzinfo=UTC)) == "2024-01-02T00:00:00+00:00"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_shows_on_a_terminal_only() -> None:
    terminal = FakeTerminal()
    progress = Progress(4, "exporting", stream=terminal)
    for _ in range(4):
        progress.advance()
    progress.finish()
    assert "\rexporting 4 / 4  100.0%" in terminal.getvalue()
    assert terminal.getvalue().endswith("\n")
    pipe = io.StringIO()
    quiet = Progress(4, "exporting", stream=pipe)
    quiet.advance(4)
    quiet.finish()
    assert pipe.getvalue() == ""


# -- export: -o appends, -O overwrites (Scrapy's feed export habit) -----------------------


def export_args(pg: dict[str, Any], *args: str) -> list[str]:
    """``deadletters export`` of this test's two spiders only."""
    return ["deadletters", "export", "--spider", ",".join(pg["spiders"].values()), *args]


def test_big_o_overwrites_a_file_and_leaves_no_part_file(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "dead.jsonl"
    target.write_text('{"old": "export"}\n' * 50)
    done = run(tmp_path, settings, *export_args(pg, "-O", str(target)))
    assert done.code == 0, done.err
    assert done.err.strip() == f"exported 5 task(s) to {target} (jsonl)"
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert exported_keys(pg, rows) == {"r1", "r2", "r3", "r6", "malformed"}
    assert not list(tmp_path.glob("*.part"))


def test_small_o_appends_csv_rows_without_a_second_header(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "dead.csv"
    first = run(tmp_path, settings, *export_args(pg, "-o", str(target), "--kind", "not_found"))
    assert first.code == 0, first.err
    assert first.err.strip() == f"appended 1 task(s) to {target} (csv)"
    second = run(tmp_path, settings, *export_args(pg, "-o", str(target), "--kind", "forbidden"))
    assert second.code == 0, second.err
    text = target.read_text(encoding="utf-8")
    assert text.count("task_id,") == 1  # one header
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert exported_keys(pg, rows) == {"r1", "r6"}
    assert [r["kind"] for r in rows] == ["not_found", "forbidden"]  # in the order written
    assert not list(tmp_path.glob("*.part"))


def test_small_o_appends_jsonl_lines_even_after_a_last_line_without_newline(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    target = tmp_path / "dead.jsonl"
    target.write_text('{"earlier": 1}')  # no newline at the end
    done = run(tmp_path, settings, *export_args(pg, "-o", str(target), "--kind", "not_found"))
    assert done.code == 0, done.err
    again = run(tmp_path, settings, *export_args(pg, "-o", str(target), "--kind", "timeout"))
    assert again.code == 0, again.err
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert lines[0] == {"earlier": 1}
    assert [line["task_id"] for line in lines[1:]] == [pg["ids"]["r1"], pg["ids"]["r3"]]


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("dead.json", [], "-o appends, and a json file"),
        ("dead.txt", ["--format", "json"], "-o appends, and a json file"),
        ("other.csv", [], "does not start with this export's csv header"),
    ],
)
def test_small_o_refuses_what_cannot_be_appended_to_and_leaves_the_file_alone(
    pg: dict[str, Any],
    settings: dict[str, str],
    tmp_path: Path,
    name: str,
    args: list[str],
    message: str,
) -> None:
    target = tmp_path / name
    before = '[{"kept": true}]\n' if "json" in name or "--format" in args else "a,b\n1,2\n"
    target.write_text(before)
    done = run(tmp_path, settings, *export_args(pg, "-o", str(target), *args))
    assert done.code == 2
    assert done.err.startswith("error: ") and done.err.count("\n") == 1
    assert message in done.err
    assert "-O" in done.err  # says what to do instead
    assert target.read_text() == before
    assert not list(tmp_path.glob("*.part"))


def test_small_o_and_big_o_do_not_go_together(settings: dict[str, str], tmp_path: Path) -> None:
    done = run(tmp_path, settings, "deadletters", "export", "-o", "a.csv", "-O", "b.csv")
    assert done.code == 2
    assert "not allowed with argument -o/--output" in done.err
    assert done.err.count("\n") == 1


# -- export: secret headers masked unless asked for -------------------------------------


@pytest.fixture
def secret_row(pg: dict[str, Any]) -> str:
    """A dead letter whose stored request carries credentials; returns its task id."""
    spider = pg["spiders"]["alpha"]
    task_id = "secret" + uuid4().hex[:6]
    request = {
        "url": "https://shop.example/account",
        "headers": [
            ["Authorization", "Bearer tok-123"],
            ["cookie", "session=abc"],
            ["X-Api-Key", "key-456"],
            ["Accept", "text/html"],
        ],
        "cookies": {"session": "abc"},
    }
    error = {"kind": "forbidden", "type": "HttpError", "message": "403", "status": 403}
    envelope = Task(
        id=task_id, spider=spider, request=request, kind="forbidden", attempts={"forbidden": 1},
        first_error=error, last_error=error, dead_kind="forbidden",
    ).to_json()  # fmt: skip
    fields = {"type": "dead", "id": task_id, "kind": "forbidden", "ts": str(ms("2024-01-07T10:00"))}
    with pg["store"].begin() as conn:
        batch = build_batch(
            [Event("101-0", spider, fields)], {(spider, "dead", task_id): json.loads(envelope)}
        )
        apply_batch(conn, batch)
    return task_id


def exported_request(out: str, task_id: str, fmt: str) -> dict[str, Any]:
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out, newline="")))
        envelope = json.loads(next(r for r in rows if r["task_id"] == task_id)["envelope"])
    else:
        rows = [json.loads(line) for line in out.splitlines()]
        envelope = next(r for r in rows if r["task_id"] == task_id)["envelope"]
    request: dict[str, Any] = envelope["request"]
    return request


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_masks_secret_headers_unless_include_secrets_is_given(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, secret_row: str, fmt: str
) -> None:
    args = export_args(pg, "--format", fmt, "--kind", "forbidden")
    masked = run(tmp_path, settings, *args)
    assert masked.code == 0, masked.err
    request = exported_request(masked.out, secret_row, fmt)
    assert request["headers"] == [
        ["Authorization", "***"],
        ["cookie", "***"],
        ["X-Api-Key", "***"],  # in the default RETRYQUEUE_SECRET_HEADERS
        ["Accept", "text/html"],
    ]
    assert request["cookies"] == {"session": "***"}
    assert "tok-123" not in masked.out and "session=abc" not in masked.out
    assert "key-456" not in masked.out
    # The other rows are exported as they are.
    assert exported_request(masked.out, pg["ids"]["r6"], fmt)["url"] == "https://shop.example/d"

    target = tmp_path / f"with-secrets.{fmt}"
    included = run(tmp_path, settings, *args, "--include-secrets", "-O", str(target))
    assert included.code == 0, included.err
    assert "secret header values included" in included.err
    request = exported_request(target.read_text(encoding="utf-8"), secret_row, fmt)
    assert request["headers"][0] == ["Authorization", "Bearer tok-123"]
    assert request["cookies"] == {"session": "abc"}


def test_export_masks_the_headers_the_setting_names(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, secret_row: str
) -> None:
    own = {**settings, "RETRYQUEUE_SECRET_HEADERS": "X-Api-Key"}
    done = run(tmp_path, own, *export_args(pg, "--format", "json", "--kind", "forbidden"))
    assert done.code == 0, done.err
    rows = json.loads(done.out)
    request = next(r for r in rows if r["task_id"] == secret_row)["envelope"]["request"]
    assert request["headers"][:3] == [
        ["Authorization", "Bearer tok-123"],
        ["cookie", "session=abc"],
        ["X-Api-Key", "***"],
    ]
    assert request["cookies"] == {"session": "abc"}  # Cookie is not a secret here


def test_masking_decodes_only_envelopes_that_may_hold_a_secret() -> None:
    from scrapy_retryqueue.store.export import masked_envelope

    secret = frozenset({"authorization", "cookie"})
    plain = '{"request": {"url": "https://a/", "headers": [["Accept", "x"]]}}'
    assert masked_envelope(plain, secret) is plain  # returned untouched, not re-encoded
    assert masked_envelope("{oops", secret) == "{oops"  # not JSON: as stored
    assert masked_envelope(None, secret) is None
    holding = '{"request": {"headers": [["AUTHORIZATION", "Basic eA=="]]}, "id": "t"}'
    assert json.loads(masked_envelope(holding, secret) or "") == {
        "request": {"headers": [["AUTHORIZATION", "***"]]},
        "id": "t",
    }
    assert masked_envelope(holding, frozenset()) is holding


def test_masking_reads_escaped_names_and_base64_bytes_in_an_export() -> None:
    import base64

    from scrapy_retryqueue.store.export import masked_envelope

    secret = frozenset({"authorization"})
    # A hostile writer's envelope: the header name spelt with an escape, so that
    # "authorization" appears nowhere in the text as stored.
    escaped = '{"request": {"headers": [["\\u0041uthorization", "Bearer tok-123"]]}}'
    assert "authorization" not in escaped.lower()
    shown = masked_envelope(escaped, secret) or ""
    assert "tok-123" not in shown
    assert json.loads(shown)["request"]["headers"] == [["Authorization", "***"]]
    # A malformed dead letter's bytes that were not UTF-8, kept as base64.
    stored = b'{"request": {"headers": [["Authorization", "Bearer tok-456"]]}}\xff'
    dead = json.dumps({"raw_base64": base64.b64encode(stored).decode("ascii")})
    shown = masked_envelope(dead, secret) or ""
    inside = base64.b64decode(json.loads(shown)["raw_base64"])
    assert b"tok-456" not in inside and b"Authorization" in inside
    # Text that is not JSON keeps what it can show, less its secret values.
    cut = '{"request": {"headers": [["Authorization", "Bearer tok-789"'
    assert "tok-789" not in (masked_envelope(cut, secret) or "")


# -- purge: the confirmation prompt ------------------------------------------------------


def run_on_a_terminal(
    tmp_path: Path, settings: dict[str, str], args: list[str], keys: bytes
) -> Result:
    """Run scrapy with stdin on a pseudo-terminal, typing *keys* once the prompt shows."""
    import os
    import pty
    import subprocess
    import sys

    from .waiting import wait_for

    command = [sys.executable, "-m", "scrapy.cmdline", *args]
    for name, value in settings.items():
        command += ["-s", f"{name}={value}"]
    leader, follower = pty.openpty()
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        process = subprocess.Popen(
            command, cwd=tmp_path, stdin=follower, stdout=subprocess.PIPE, stderr=err, text=True
        )
        os.close(follower)
        try:
            wait_for(lambda: "[y/N]" in err_path.read_text(), "the prompt", timeout=60)
            os.write(leader, keys)
            out, _ = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            os.close(leader)
    return Result(process.returncode, out, err_path.read_text())


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        (b"\x04", "aborted: no answer (end of input): nothing changed"),  # Ctrl-D
        (b"n\n", "aborted: not confirmed: nothing changed"),
        (b"\n", "aborted: not confirmed: nothing changed"),
    ],
)
def test_purge_aborts_cleanly_at_the_prompt(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path, keys: bytes, line: str
) -> None:
    alpha = pg["spiders"]["alpha"]
    args = ["deadletters", "purge", "--spider", alpha, "--kind", "not_found"]
    done = run_on_a_terminal(tmp_path, settings, args, keys)
    assert done.code == 5, done.err
    assert done.err.endswith(f"{line}\n"), done.err
    assert "Traceback" not in done.err and "EOFError" not in done.err
    assert status_of(pg, "r1")["status"] == "dead"  # nothing deleted


def test_purge_deletes_once_confirmed_at_the_prompt(
    pg: dict[str, Any], settings: dict[str, str], tmp_path: Path
) -> None:
    alpha = pg["spiders"]["alpha"]
    args = ["deadletters", "purge", "--spider", alpha, "--kind", "not_found"]
    done = run_on_a_terminal(tmp_path, settings, args, b"y\n")
    assert done.code == 0, done.err
    assert "Delete 1 dead letter(s) (status=dead spider=" in done.err
    assert done.err.endswith("deleted 1 dead letter(s)\n")
    store, table = pg["store"], pg["store"].table
    with store.connect() as conn:
        left = set(conn.execute(select(table.c.task_id)).scalars())
    assert pg["ids"]["r1"] not in left
