"""Capacity inputs: what one retry cycle costs Redis, on one server and on a cluster.

    python -m benchmarks.capacity [--tasks 6000] [--nodes 16] [--rate 3000] [--no-cluster]
                                  [--only steps|fleet] [--fleet-nodes 16 50 100 200 500] ...

Many lightweight simulated nodes (threads, each with its own connection and
its own :class:`~scrapy_retryqueue.queue.delayed.RedisDelayedQueue`) issue the
project's real scripts at a controlled aggregate rate against a private Redis
(and then a private three-master Redis Cluster), phase by phase: schedule
(a failure parked), claim (a poll that finds due tasks), ack (a recovered
retry), reschedule (a retry that failed again), deadletter, the store
writer's sync of the events (read, envelopes, forget + acknowledge), and the
fixed cost of a poll that finds nothing due (reap, renew, claim). Before each
phase the servers' statistics are reset (CONFIG RESETSTAT on the private
servers only); after it, INFO commandstats, stats and cpu give, per task: the
commands Redis ran (script calls and the commands inside them), the bytes in
and out, and the server's CPU time. Each phase runs at batch sizes 1, 10 and
100 tasks per call (a busy node batches; a quiet one does not).

Then a fleet of hundreds (16 to 500 simulated nodes by default, each the
runtime's own poll loop: benchmarks/fleet_capacity.py) shares each kind of
server: at rest and under a stream of failures, the cost of a poll, the claim
latency, how evenly the nodes share the claims, and that no task is claimed
twice; ``--fleet-json`` keeps the figures for benchmarks/fleet_chart.py.

It prints Markdown tables per server kind; docs/capacity.md is built from them.
The servers are started on free ports and stopped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys
from scrapy_retryqueue.store.redisops import EventStream
from scrapy_retryqueue.store.writer import ENVELOPE_FROM_DEAD, ENVELOPE_FROM_TASKS, parse_entries

from . import fleet_capacity
from .common import own_redis, run_threads

T0 = 1_700_000_000_000
LEASE = 10**9
BATCHES = (1, 10, 100)


def make_task(spider: str, i: int) -> Task:
    """A task of realistic size (an envelope of about 700 bytes)."""
    error = {
        "kind": "server_error",
        "type": "HttpStatus",
        "message": "HTTP 503 Service Unavailable",
        "status": 503,
    }
    return Task(
        id=uuid.uuid4().hex + uuid.uuid4().hex[:8],
        spider=spider,
        request={
            "url": f"https://shop{i % 50}.example.com/category/{i % 977}/item/{i}?ref=list",
            "headers": [["Accept", "text/html,application/xhtml+xml"], ["Referer", "https://x/"]],
            "meta": {"depth": 3, "category": f"c{i % 977}", "listing": {"page": i % 9}},
            "callback": "parse_item",
        },
        attempts={"server_error": 1},
        kind="server_error",
        first_error=error,
        last_error=error,
        node="node-0",
        created=T0,
        updated=T0,
        due=T0,
    )


# -- servers -------------------------------------------------------------------


@dataclass
class Servers:
    """The Redis servers of one run: one, or the masters of a cluster."""

    kind: str
    clients: list[redis.Redis]
    make_client: Callable[[], Any]
    #: A URL of the servers, for processes that make clients of their own.
    url: str = ""
    cluster: bool = False

    def reset(self) -> None:
        for client in self.clients:
            client.config_resetstat()

    def snapshot(self) -> dict[str, Any]:
        """Commands, bytes and CPU seconds since the last reset, summed over the
        servers; ``cpu_each``: each server's CPU seconds so far; ``calls``: calls
        per command."""
        total: dict[str, Any] = {"commands": 0, "scripts": 0, "in": 0, "out": 0, "cpu": 0.0}
        total["cpu_each"] = []
        total["calls"] = {}
        for client in self.clients:
            stats = client.info("commandstats")
            net = client.info("stats")
            cpu = client.info("cpu")
            # The INFO calls themselves are not the workload's.
            calls = {k: v for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config")}
            for name, value in calls.items():
                command = name.removeprefix("cmdstat_")
                total["calls"][command] = total["calls"].get(command, 0) + value["calls"]
            total["commands"] += sum(v["calls"] for v in calls.values())
            total["scripts"] += sum(
                v["calls"] for k, v in calls.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
            )
            total["in"] += net["total_net_input_bytes"]
            total["out"] += net["total_net_output_bytes"]
            seconds = cpu["used_cpu_user"] + cpu["used_cpu_sys"]
            total["cpu"] += seconds
            total["cpu_each"].append(seconds)
        return total


@contextmanager
def single_server() -> Iterator[Servers]:
    with own_redis() as url:
        client = redis.Redis.from_url(url)
        yield Servers("one server", [client], lambda: redis.Redis.from_url(url), url)
        client.close()


def _start_node(binary: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    # A cluster node also binds port + 10000: below Linux's ephemeral range both.
    pick = random.SystemRandom()
    for _ in range(20):
        port = pick.randrange(10_000, 20_000)
        log = workdir / f"{port}.log"
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
            + ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
            + ["--save", "", "--appendonly", "no", "--logfile", str(log)],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.poll() is None:
            if log.exists() and "Ready to accept connections" in log.read_text(errors="replace"):
                return process, port
            time.sleep(0.05)
        process.kill()
        process.wait(10)
    raise SystemExit("could not start a redis-server for the cluster")


@contextmanager
def cluster_servers() -> Iterator[Servers]:
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        raise SystemExit("redis-server and redis-cli are needed: bash scripts/ensure-services")
    workdir = Path(tempfile.mkdtemp(prefix="retryqueue-capacity-cluster-"))
    nodes: list[tuple[subprocess.Popen[bytes], int]] = []
    try:
        for _ in range(3):
            nodes.append(_start_node(binary, workdir))
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{port}" for _, port in nodes)]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        probe = redis.Redis(port=nodes[0][1])
        deadline = time.monotonic() + 30
        while probe.cluster("info")["cluster_state"] != "ok":
            if time.monotonic() > deadline:
                raise SystemExit("the capacity cluster did not become ready")
            time.sleep(0.1)
        probe.close()
        clients = [redis.Redis(port=port) for _, port in nodes]
        url = f"redis://127.0.0.1:{nodes[0][1]}/0"
        yield Servers(
            "cluster, 3 masters", clients, lambda: RedisCluster.from_url(url), url, cluster=True
        )
        for client in clients:
            client.close()
    finally:
        for process, _ in nodes:
            process.terminate()
        for process, _ in nodes:
            process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


# -- simulated nodes -------------------------------------------------------------


@dataclass
class Node:
    """One simulated crawler node: a connection and a queue per spider it works on."""

    name: str
    client: Any
    queues: dict[str, RedisDelayedQueue] = field(default_factory=dict)

    def queue(self, spider: str) -> RedisDelayedQueue:
        if spider not in self.queues:
            self.queues[spider] = RedisDelayedQueue(self.client, spider, node_id=self.name)
        return self.queues[spider]


def run_paced(nodes: list[Node], jobs: list[list[Callable[[], int]]], rate: float) -> float:
    """Run each node's jobs on a thread of its own, all nodes together at about
    *rate* tasks per second (each job returns the tasks it handled); wall seconds."""
    share = rate / max(1, len(nodes))
    errors: list[BaseException] = []

    def work(node_jobs: list[Callable[[], int]]) -> None:
        started, done = time.monotonic(), 0
        try:
            for job in node_jobs:
                done += job()
                ahead = done / share - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        except BaseException as exc:
            errors.append(exc)

    started = time.monotonic()
    run_threads([threading.Thread(target=work, args=(j,)) for j in jobs], errors)
    return time.monotonic() - started


@dataclass
class PhaseCost:
    tasks: int
    commands: float
    scripts: float
    bytes_in: float
    bytes_out: float
    cpu_us: float
    #: Largest share of one server's CPU in the phase (1/3 when a cluster is even).
    busiest: float
    seconds: float
    calls: dict[str, int] = field(default_factory=dict)

    def per_task(self) -> dict[str, float]:
        n = max(1, self.tasks)
        return {
            "commands": self.commands / n,
            "script calls": self.scripts / n,
            "bytes in": self.bytes_in / n,
            "bytes out": self.bytes_out / n,
            "server CPU µs": self.cpu_us / n,
        }


def measure_phase(
    servers: Servers, nodes: list[Node], jobs: list[list[Callable[[], int]]], rate: float
) -> PhaseCost:
    servers.reset()
    before = servers.snapshot()  # the reset leaves the CPU counters alone
    seconds = run_paced(nodes, jobs, rate)
    after = servers.snapshot()
    cpu = after["cpu"] - before["cpu"]
    each = [a - b for a, b in zip(after["cpu_each"], before["cpu_each"], strict=True)]
    return PhaseCost(
        tasks=0,  # the caller knows how many tasks the phase handled
        commands=after["commands"],
        scripts=after["scripts"],
        bytes_in=after["in"],
        bytes_out=after["out"],
        cpu_us=cpu * 1e6,
        busiest=max(each) / cpu if cpu > 0 else 0.0,
        seconds=seconds,
        calls=after["calls"],
    )


def cycle_costs(
    servers: Servers, *, tasks: int, node_count: int, spiders: int, batch: int, rate: float
) -> dict[str, PhaseCost]:
    """Per phase of a retry cycle, what *tasks* tasks cost the servers."""
    names = [f"cap{uuid.uuid4().hex[:6]}" for _ in range(spiders)]
    nodes = [Node(f"node-{n}", servers.make_client()) for n in range(node_count)]
    # Each node works on its share of the tasks, of every spider in turn.
    plan: list[list[Task]] = [[] for _ in nodes]
    for i in range(tasks):
        plan[i % node_count].append(make_task(names[i % spiders], i))
    results: dict[str, PhaseCost] = {}
    held: list[dict[str, list[tuple[str, str]]]] = [{} for _ in nodes]

    def batched(node: Node, writes: list[Write], spider_of: list[str]) -> list[Callable[[], int]]:
        jobs: list[Callable[[], int]] = []
        by_spider: dict[str, list[Write]] = {}
        for write, spider in zip(writes, spider_of, strict=True):
            by_spider.setdefault(spider, []).append(write)
        for spider, items in by_spider.items():
            queue = node.queue(spider)
            for start in range(0, len(items), batch):
                chunk = items[start : start + batch]
                jobs.append(lambda q=queue, c=chunk: (q.apply(c), len(c))[1])
        return jobs

    def run(name: str, jobs: list[list[Callable[[], int]]], count: int) -> None:
        cost = measure_phase(servers, nodes, jobs, rate)
        cost.tasks = count
        results[name] = cost

    # schedule: each failure parked (due at once, so the claims find them).
    run(
        "schedule",
        [
            batched(
                node,
                [Write.for_task("schedule", t, None, T0) for t in plan[n]],
                [t.spider for t in plan[n]],
            )
            for n, node in enumerate(nodes)
        ],
        tasks,
    )

    # claim: each node polls every spider until nothing is due; batches of `batch`.
    def claimer(n: int, node: Node, spider: str) -> Callable[[], int]:
        def job() -> int:
            got = node.queue(spider).claim(now=T0 + 1, limit=batch, lease_until=LEASE, token="t")
            held[n].setdefault(spider, []).extend(got.tasks)
            return len(got.tasks)

        return job

    share = -(-tasks // (node_count * spiders))  # per node and spider, rounded up
    claims_each = -(-share // batch) + 1
    run(
        "claim",
        [
            [claimer(n, node, s) for s in names for _ in range(claims_each)]
            for n, node in enumerate(nodes)
        ],
        tasks,
    )
    claimed = [(s, t) for h in held for s, ts in h.items() for t in ts]
    assert len(claimed) == tasks, (len(claimed), tasks)
    # Settle what was claimed: ack the first half, reschedule a quarter, dead-letter a quarter.
    by_id = {t.id: t for ts in plan for t in ts}
    acks, reschedules, deaths = [], [], []
    for n in range(node_count):
        mine = [(s, t) for s, ts in held[n].items() for t, _ in ts]
        quarter = len(mine) // 4
        acks.append(mine[: 2 * quarter])
        reschedules.append(mine[2 * quarter : 3 * quarter])
        deaths.append(mine[3 * quarter :])

    def settle(
        name: str, groups: list[list[tuple[str, str]]], make: Callable[[str], Write]
    ) -> None:
        jobs = [
            batched(node, [make(t) for _, t in group], [s for s, _ in group])
            for node, group in zip(nodes, groups, strict=True)
        ]
        run(name, jobs, sum(len(g) for g in groups))

    settle("ack", acks, lambda t: Write("ack", t, T0 + 2, "t", kind="server_error", url="u"))
    later = T0 + 3_600_000

    def rescheduled(task_id: str) -> Write:
        task = by_id[task_id]
        task.due = later
        return Write.for_task("reschedule", task, "t", T0 + 2)

    settle("reschedule", reschedules, rescheduled)

    def dead(task_id: str) -> Write:
        task = by_id[task_id]
        task.dead_kind = "server_error"
        return Write.for_task("deadletter", task, "t", T0 + 2)

    settle("deadletter", deaths, dead)

    # Store sync: one writer per spider reads every event (in batches of up to
    # 500), fetches the envelopes it needs, and forgets + acknowledges (no SQL).
    def syncer(node: Node, spider: str) -> Callable[[], int]:
        stream = EventStream(node.client, spider, consumer=node.name)

        def job() -> int:
            done = 0
            while entries := stream.read_new(max(batch, 1) if batch > 1 else 1, 0):
                events = parse_entries(spider, entries)
                tasks_ids = [e.task_id for e in events if e.type in ENVELOPE_FROM_TASKS]
                dead_ids = [e.task_id for e in events if e.type in ENVELOPE_FROM_DEAD]
                stream.envelopes(tasks_ids, dead_ids)
                stream.forget_dead(
                    [(d, T0 + 2) for d in dead_ids], acks=[entry[0] for entry in entries]
                )
                done += len(events)
            return done

        return job

    events = 0
    for spider in names:
        events += int(nodes[0].client.xlen(nodes[0].queue(spider).keys.events))
    writers = [[syncer(nodes[i % node_count], s)] for i, s in enumerate(names)]
    run("store sync (per event)", writers, events)

    # A poll that finds nothing due: reap, renew this node's leases (none), claim.
    def idle_poll(node: Node, spider: str) -> Callable[[], int]:
        queue = node.queue(spider)

        def job() -> int:
            queue.reap(now=T0 + 5, limit=500, max_reclaims=3)
            queue.renew({}, lease_until=LEASE)
            queue.claim(now=T0 + 5, limit=batch, lease_until=LEASE, token="t")
            return 1

        return job

    polls = 200
    run(
        "idle poll (per poll)",
        [[idle_poll(node, names[n % spiders])] * polls for n, node in enumerate(nodes)],
        polls * node_count,
    )
    cleaner = servers.make_client()
    for spider in names:
        for key in all_keys(nodes[0].queue(spider).keys):
            cleaner.delete(key)
    cleaner.close()
    for node in nodes:
        node.client.close()
    return results


def table(kind: str, rows: dict[int, dict[str, PhaseCost]]) -> str:
    lines = [
        f"#### {kind}",
        "",
        "| phase | batch | commands | script calls | bytes in | bytes out | server CPU µs | busiest server |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for batch, phases in rows.items():
        for name, cost in phases.items():
            p = cost.per_task()
            lines.append(
                f"| {name} | {batch} | {p['commands']:.2f} | {p['script calls']:.3f} "
                f"| {p['bytes in']:.0f} | {p['bytes out']:.0f} | {p['server CPU µs']:.1f} "
                f"| {cost.busiest:.0%} |"
            )
    for batch in (min(rows), max(rows)):
        lines += ["", f"Commands per task, batch {batch}:", ""]
        for name, cost in rows[batch].items():
            mix = ", ".join(
                f"{command} {n / max(1, cost.tasks):.2f}"
                for command, n in sorted(cost.calls.items(), key=lambda kv: -kv[1])
            )
            lines.append(f"- {name}: {mix}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=6000, help="tasks per phase")
    parser.add_argument("--nodes", type=int, default=16, help="simulated nodes")
    parser.add_argument("--spiders", type=int, default=6, help="spiders (hash tags)")
    parser.add_argument("--rate", type=float, default=3000, help="tasks per second, in all")
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--no-single", action="store_true", help="the cluster only")
    parser.add_argument("--only", choices=("steps", "fleet"), help="one part of the run")
    fleet_capacity.add_arguments(parser)
    args = parser.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores "
        f"(shared), Python {platform.python_version()}, redis-py {redis.__version__}, "
        f"{args.tasks} tasks per phase, {args.nodes} nodes, {args.spiders} spiders, "
        f"{args.rate:.0f} tasks/s; fleet: {args.fleet_nodes} nodes, {args.fleet_spiders} "
        f"spiders, {args.fleet_rate:.0f} failures/s, {args.fleet_processes} processes\n"
    )
    kinds: list[Callable[[], Any]] = [] if args.no_single else [single_server]
    if not args.no_cluster:
        kinds.append(cluster_servers)
    fleets: list[dict[str, Any]] = []
    for kind in kinds:
        with kind() as servers:
            version = servers.clients[0].info("server")["redis_version"]
            if args.only != "steps":
                print(f"#### fleet, {servers.kind} (Redis {version})\n", flush=True)
                fleets += [r.as_dict() for r in fleet_capacity.measure(args, servers)]
            if args.only == "fleet":
                continue
            rows = {
                batch: cycle_costs(
                    servers,
                    tasks=args.tasks,
                    node_count=args.nodes,
                    spiders=args.spiders,
                    batch=batch,
                    rate=args.rate,
                )
                for batch in BATCHES
            }
            print(table(f"{servers.kind} (Redis {version})", rows), "\n", flush=True)
    if args.fleet_json and fleets:
        Path(args.fleet_json).write_text(json.dumps(fleets, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
