"""The local spool: writes kept while Redis is unreachable belong to one queue."""

from __future__ import annotations

from pathlib import Path

from scrapy_retryqueue.queue.connection import same_queue
from scrapy_retryqueue.queue.delayed import Write
from scrapy_retryqueue.queue.spool import Spool


def _spool(tmp_path: Path, queue: str, node: str = "n1", project: str = "") -> Spool:
    return Spool(
        tmp_path,
        "shop",
        node,
        queue=queue,
        memory_limit=10,
        limit=100,
        same_queue=lambda other: same_queue(queue, other),
        project=project,
    )


def _write(task_id: str) -> Write:
    return Write("schedule", task_id, 1, envelope="{}", due=2, kind="timeout", url="http://x/")


def test_writes_spooled_for_one_server_are_never_replayed_into_another(tmp_path: Path) -> None:
    first = _spool(tmp_path, "redis://10.0.0.1:6379/0")
    assert first.open() == []
    first.add(_write("a"))
    first.add(_write("b"))
    assert first.close() == 2  # left for the next crawl against that server

    other = _spool(tmp_path, "redis://10.0.0.2:6379/0")
    assert other.open() == []  # not adopted: another queue
    [(path, count, queue)] = other.elsewhere()
    assert (count, queue) == (2, "redis://10.0.0.1:6379/0")
    assert path.is_file()
    assert other.close() == 0

    same = _spool(tmp_path, "redis://10.0.0.1:6379/0", node="n2")
    assert [w.task_id for w in same.open()] == ["a", "b"]  # adopted by its own queue
    assert same.elsewhere() == []
    assert same.close() == 0


def test_a_cluster_spool_is_replayed_by_a_crawl_that_reaches_it_through_another_node(
    tmp_path: Path,
) -> None:
    # Spooled while the cluster never answered: only the seed node is known.
    down_at_start = _spool(tmp_path, "Redis Cluster 10.0.0.1:7000")
    down_at_start.open()
    down_at_start.add(_write("a"))
    assert down_at_start.close() == 1
    # Spooled by a crawl that knew the whole cluster.
    # A crawl that knew the whole cluster adopts it, and spools one more.
    known = _spool(tmp_path, "Redis Cluster 10.0.0.1:7000 10.0.0.2:7000 10.0.0.3:7000", "n2")
    adopted = known.open()
    assert [w.task_id for w in adopted] == ["a"]
    known.put_back(adopted)
    known.add(_write("b"))
    assert known.close() == 2
    # Another cluster, which shares no node: left alone.
    other = _spool(tmp_path, "Redis Cluster 10.0.0.9:7000", "n3")
    other.open()
    other.add(_write("z"))
    other.close()

    through_another_node = _spool(
        tmp_path, "Redis Cluster 10.0.0.1:7000 10.0.0.2:7000 10.0.0.3:7000 10.0.0.4:7000"
    )
    assert sorted(w.task_id for w in through_another_node.open()) == ["a", "b"]
    [(_, count, queue)] = through_another_node.elsewhere()
    assert (count, queue) == (1, "Redis Cluster 10.0.0.9:7000")
    assert through_another_node.close() == 0


def test_another_database_of_the_same_server_is_another_queue(tmp_path: Path) -> None:
    spool = _spool(tmp_path, "redis://cache:6379/0")
    spool.open()
    spool.add(_write("a"))
    spool.close()
    other = _spool(tmp_path, "redis://cache:6379/1")
    assert other.open() == []
    assert [count for _, count, _ in other.elsewhere()] == [1]
    other.close()


def test_a_spool_of_an_older_version_is_reported_not_replayed(tmp_path: Path) -> None:
    legacy = tmp_path / "spool" / "shop"
    legacy.mkdir(parents=True)
    (legacy / "old-node.jsonl").write_text('["schedule","a",1,null,"{}",2,"timeout",0,""]\n')
    spool = _spool(tmp_path, "redis://cache:6379/0")
    assert spool.open() == []
    [(path, count, queue)] = spool.elsewhere()
    assert path == legacy / "old-node.jsonl" and count == 1
    assert "older version" in queue
    spool.close()


def test_two_crawlers_of_one_spider_in_one_process_get_a_file_each(tmp_path: Path) -> None:
    first = _spool(tmp_path, "redis://cache:6379/0")
    second = _spool(tmp_path, "redis://cache:6379/0")
    first.open()
    second.open()
    assert first.path != second.path
    second.add(_write("b"))
    assert second.close() == 1
    assert first.close() == 0
    # The next crawl adopts what the second one left.
    again = _spool(tmp_path, "redis://cache:6379/0")
    assert [w.task_id for w in again.open()] == ["b"]
    again.close()


def test_a_write_keeps_its_creation_time_and_host_and_an_older_line_reads_without() -> None:
    from scrapy_retryqueue.queue.spool import _from_line, _to_line

    write = Write(
        "ack", "a", 5, "t", kind="timeout", url="http://x.test/", created=2, host="x.test"
    )
    assert _from_line(_to_line(write)) == write
    # A line spooled before the two fields existed: no creation time, the URL's host
    # (so a replayed task is held while its domain cools).
    older = '["ack","a",5,"t","",0,"timeout",0,"http://X.test:81/"]'
    assert _from_line(older) == Write(
        "ack", "a", 5, "t", kind="timeout", url="http://X.test:81/", host="x.test"
    )


def test_a_spooled_write_keeps_its_learning_update() -> None:
    # An ack spooled while Redis was away still teaches the recovery curve when
    # replayed: the outage it ends is the kind of fact the curve is made of.
    from scrapy_retryqueue.queue.spool import _from_line, _to_line

    write = Write("ack", "a", 5, "t", kind="timeout", learn="timeout", prior=1200, version=3)
    assert _from_line(_to_line(write)) == write
    # A line of the version before: no learning update, as before.
    before = '["ack","a",5,"t","",0,"timeout",0,"http://x.test/",null,"x.test",3,""]'
    read = _from_line(before)
    assert (read.learn, read.prior, read.version) == ("", None, 3)


def test_two_projects_with_one_spider_name_keep_their_spools_apart(tmp_path: Path) -> None:
    queue = "redis://cache:6379/0"
    books = _spool(tmp_path, queue, project="books")
    books.open()
    books.add(_write("a"))
    assert books.close() == 1
    quotes = _spool(tmp_path, queue, node="n2", project="quotes")
    assert quotes.open() == []  # the other project's writes are not replayed here
    assert [count for _, count, _ in quotes.elsewhere()] == []  # nor another queue's
    quotes.close()
    again = _spool(tmp_path, queue, node="n3", project="books")
    assert [w.task_id for w in again.open()] == ["a"]
    again.close()


def test_a_spool_from_before_namespaces_is_adopted_by_the_first_namespaced_crawl(
    tmp_path: Path,
) -> None:
    queue = "redis://cache:6379/0"
    before = _spool(tmp_path, queue)  # no namespace: the layout before them
    before.open()
    before.add(_write("a"))
    assert before.close() == 1
    upgraded = _spool(tmp_path, queue, node="n2", project="books")
    assert [w.task_id for w in upgraded.open()] == ["a"]
    assert upgraded.close() == 0
    assert _spool(tmp_path, queue, node="n3", project="quotes").open() == []
