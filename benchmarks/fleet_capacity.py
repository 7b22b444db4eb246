"""A fleet of hundreds of nodes, simulated: poll cost, claim latency, fairness and duplicates.

Run by ``python -m benchmarks.capacity`` (its ``--fleet-*`` options) on the
private Redis and cluster that module starts; tests/test_fleet_capacity.py runs
it small against the test Redis.

Each simulated node is what a crawl's poll loop is, minus Scrapy: its own
connection and :class:`~scrapy_retryqueue.queue.delayed.RedisDelayedQueue`, the
runtime's own :class:`~scrapy_retryqueue.runtime.leases.Leases` building each
poll's round trips (renew, reap, claim, heartbeat), and the extension's own
choice of when to poll next (``RetryQueueExtension._next_delay``: the poll
interval, jittered, or the next task's due time when sooner and the node is the
one of its spider's live nodes to poll for it, at most every 50 ms). A
claimed task is "fetched" for ``work`` seconds, then acknowledged through
``apply`` as the write path does. Nodes are threads, spread over a few worker
processes; a producer in each process parks failures (schedule.lua) at an even
rate, each due 0.5 to 3 s later.

A run has three phases: idle (nothing due: the fixed cost of a fleet at rest),
busy (failures parked at ``rate`` per second in all) and a drain (no new
failures; every task should be claimed and acknowledged). The driver reads the
servers' ``INFO commandstats`` and ``INFO cpu`` and the workers' CPU time (from
/proc) at the phases' edges, and never resets a server's statistics.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import redis
from redis.cluster import RedisCluster

from scrapy_retryqueue.decision.pollshare import live_nodes, polls_early
from scrapy_retryqueue.queue.delayed import RedisDelayedQueue, Write
from scrapy_retryqueue.queue.envelope import Task
from scrapy_retryqueue.queue.keys import all_keys, keys_for
from scrapy_retryqueue.queue.taskinfo import host_of

#: Seconds from a failure to its retry's due time, by default: drawn evenly from this range.
DUE_AFTER = (0.5, 3.0)
#: Seconds between a producer's batches of failures.
PRODUCER_TICK = 0.05
#: Share of a core above which a server (or the load generator) counts as saturated.
SATURATED = 0.85


@dataclass(frozen=True)
class FleetPlan:
    """One fleet run: its nodes, spiders, load and phases."""

    nodes: int
    spiders: tuple[str, ...]
    url: str
    cluster: bool = False
    #: Failures parked per second in all, during the busy phase.
    rate: float = 100.0
    idle: float = 5.0
    busy: float = 10.0
    poll_interval: float = 1.0
    #: Seconds a claimed task's request takes before its ack.
    work: float = 0.2
    #: Worker processes running the nodes; 0: threads of this process.
    processes: int = 2
    #: Seconds from a failure to its retry's due time: drawn evenly from this range.
    due_after: tuple[float, float] = DUE_AFTER
    #: Wall time (epoch s) the nodes start polling; set by :func:`run_fleet`.
    start: float = 0.0

    @property
    def drain(self) -> float:
        return self.due_after[1] + self.poll_interval + self.work + 1.0

    def edges(self) -> list[float]:
        """Wall times the phases start at: warm-up, idle, busy, drain, end. The
        warm-up is the first poll interval, while the nodes' first polls spread."""
        s = self.start
        warm = min(self.poll_interval, self.idle / 2)
        return [s, s + warm, s + self.idle, s + self.idle + self.busy]

    def end(self) -> float:
        return self.start + self.idle + self.busy + self.drain

    def phase(self, at: float) -> int:
        """0 warm-up, 1 idle, 2 busy, 3 drain."""
        return sum(at >= edge for edge in self.edges()[1:])


def new_client(plan: FleetPlan) -> Any:
    if plan.cluster:
        return RedisCluster.from_url(plan.url)
    return redis.Redis.from_url(plan.url)


def make_failure(
    spider: str, now: int, serial: int, rng: random.Random, due_after: tuple[float, float]
) -> Task:
    """A parked failure of realistic size (an envelope of about 700 bytes); its id
    carries its due time, so a claim's latency is read off the id."""
    due = now + int(rng.uniform(*due_after) * 1000)
    error = {"kind": "server_error", "type": "HttpStatus", "message": "HTTP 503", "status": 503}
    return Task(
        id=f"{due}-{uuid.uuid4().hex[:20]}",
        spider=spider,
        request={
            "url": f"https://shop{serial % 50}.example.com/item/{serial}?ref=list",
            "headers": [["Accept", "text/html,application/xhtml+xml"], ["Referer", "https://x/"]],
            "meta": {"depth": 3, "category": f"c{serial % 977}", "listing": {"page": serial % 9}},
            "callback": "parse_item",
        },
        attempts={"server_error": 1},
        kind="server_error",
        first_error=error,
        last_error=error,
        node="producer",
        created=now,
        updated=now,
        due=due,
    )


class SimNode:
    """One node's poll loop: polls (the runtime's round trip), holds what it claims
    for ``work`` seconds, then acknowledges it."""

    def __init__(self, plan: FleetPlan, index: int, base_config: Any) -> None:
        from scrapy_retryqueue.crawl.extension import RetryQueueExtension
        from scrapy_retryqueue.runtime.leases import Leases

        self.plan = plan
        self.name = f"sim-{index}"
        self.client = new_client(plan)
        spider = plan.spiders[index % len(plan.spiders)]
        self.queue = RedisDelayedQueue(self.client, spider, node_id=self.name)
        config = replace(base_config, node_id=self.name)
        self.leases = Leases(config)
        # The extension's own schedule of polls, called on a stand-in for its state
        # (config, the last counts, the runtime's room), so this loop polls as a crawl does.
        self._next_delay = RetryQueueExtension._next_delay
        self._state = SimpleNamespace(
            config=config,
            _counts=None,
            runtime=SimpleNamespace(down=False, room=0, polls_early=self._polls_early),
        )
        #: What the last poll read of the fleet (the facade's ``fleet``).
        self.fleet: dict[str, tuple[int, int, int]] = {}
        self.registered = 0
        self.last_busy = 0
        #: (done at, task id, token, url), in claim order: the requests being fetched.
        self.working: list[tuple[float, str, str, str]] = []
        #: (task id, claimed at ms) of every task this node claimed.
        self.claims: list[tuple[str, int]] = []
        self.polls = [0, 0, 0, 0]
        self.acks_refused = 0
        self.errors: list[str] = []

    def poll(self) -> float:
        """One poll; the seconds until the next one."""
        now = time.time()
        if self.working:
            self.last_busy = int(now * 1000)
        io, token = self.leases.poll_io(
            self.queue, None, last_busy=self.last_busy, registered=self.registered
        )
        result = io()
        got = int(time.time() * 1000)
        self.polls[self.plan.phase(now)] += 1
        for task_id, raw in result.claimed.tasks:
            self.leases.hold(task_id, token)
            self.claims.append((task_id, got))
            self.working.append((got / 1000 + self.plan.work, task_id, token, _url_of(raw)))
        state = self._state
        state._counts = result.claimed
        self.fleet = result.nodes
        state.runtime.room = self.leases.room
        return float(self._next_delay(state))

    def _polls_early(self, due_ms: int) -> bool:
        # RetryQueueRuntime.polls_early, on this node's view of the fleet.
        live = live_nodes(self.fleet, int(time.time() * 1000), self.plan.poll_interval)
        return polls_early(self.name, live, due_ms)

    def ack_done(self, now: float) -> None:
        done = [w for w in self.working if w[0] <= now]
        self.working = [w for w in self.working if w[0] > now]
        at = int(now * 1000)
        writes = [
            Write("ack", task_id, at, token, kind="server_error", url=url, host=host_of(url))
            for _, task_id, token, url in done
        ]
        self.acks_refused += sum(not ok for ok in self.queue.apply(writes))
        for _, task_id, _, _ in done:
            self.leases.held.pop(task_id, None)

    def run(self, plan: FleetPlan) -> None:
        self.plan = plan
        rng = random.Random(self.name)
        # A fleet's nodes start at different times: the first polls spread over an interval.
        next_poll = plan.start + rng.uniform(0, plan.poll_interval)
        self.registered = int(plan.start * 1000)
        end = plan.end()
        try:
            while (now := time.time()) < end:
                if self.working and self.working[0][0] <= now:
                    self.ack_done(now)
                if now >= next_poll:
                    next_poll = time.time() + self.poll()
                wake = min(next_poll, end, self.working[0][0] if self.working else end)
                time.sleep(max(0.0, wake - time.time()))
            if self.working:
                self.ack_done(math.inf)
            self.queue.leave()
        except Exception as exc:  # reported: a failed node must not pass for a quiet one
            self.errors.append(f"{self.name}: {exc!r}")
        finally:
            self.client.close()


def _url_of(raw: str | bytes) -> str:
    # The url is all an ack needs of the envelope; a crawl would decode it whole.
    import json

    return str(json.loads(raw)["request"]["url"])


def produce(plan: FleetPlan, share: float, seed: int, scheduled: list[int]) -> None:
    """Park failures at *share* per second over the busy phase, spread over the spiders."""
    client = new_client(plan)
    queues = [RedisDelayedQueue(client, s, node_id=f"producer-{seed}") for s in plan.spiders]
    rng = random.Random(seed)
    busy_from, busy_to = plan.edges()[2], plan.edges()[3]
    time.sleep(max(0.0, busy_from - time.time()))
    owed, serial, last = 0.0, seed * 10**7, time.time()
    while (now := time.time()) < busy_to:
        owed += share * (now - last)
        last = now
        batches: list[list[Write]] = [[] for _ in queues]
        at = int(now * 1000)
        while owed >= 1:
            owed -= 1
            serial += 1
            q = serial % len(queues)
            task = make_failure(plan.spiders[q], at, serial, rng, plan.due_after)
            batches[q].append(Write.for_task("schedule", task, None, at))
        for queue, writes in zip(queues, batches, strict=True):
            if writes:
                scheduled[0] += sum(queue.apply(writes))
        time.sleep(max(0.0, now + PRODUCER_TICK - time.time()))
    client.close()


def build_share(plan: FleetPlan, indices: Sequence[int]) -> list[SimNode]:
    """The nodes *indices*, connected (their clock not started)."""
    from scrapy.settings import Settings

    from scrapy_retryqueue.config.load import load_config

    base = load_config(
        Settings({"RETRYQUEUE_NODE_ID": "sim", "RETRYQUEUE_POLL_INTERVAL": plan.poll_interval})
    )
    nodes = [SimNode(plan, i, base) for i in indices]
    for node in nodes:
        node.client.ping()
    return nodes


def run_share(plan: FleetPlan, nodes: Sequence[SimNode], produce_share: float, seed: int) -> dict:
    """Run *nodes* (threads) and a producer from ``plan.start``; what they saw."""
    scheduled = [0]
    threads = [threading.Thread(target=n.run, args=(plan,), daemon=True) for n in nodes]
    if produce_share > 0:
        threads.append(
            threading.Thread(target=produce, args=(plan, produce_share, seed, scheduled))
        )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "claims": [(n.name, task_id, at) for n in nodes for task_id, at in n.claims],
        "polls": [sum(n.polls[p] for n in nodes) for p in range(4)],
        "acks_refused": sum(n.acks_refused for n in nodes),
        "errors": [e for n in nodes for e in n.errors],
        "scheduled": scheduled[0],
        "nodes": [n.name for n in nodes],
    }


def _worker(plan: FleetPlan, indices: list[int], share: float, seed: int, inbox: Any, out: Any):
    try:
        nodes = build_share(plan, indices)
        out.put(("ready", os.getpid()))
        start = inbox.get()
        out.put(("done", run_share(replace(plan, start=start), nodes, share, seed)))
    except BaseException as exc:
        out.put(("error", repr(exc)))


# -- measuring -------------------------------------------------------------------


@dataclass
class Reading:
    """The servers' CPU seconds (each) and command calls, and the workers' CPU, at one time."""

    at: float
    cpu: list[float]
    calls: Counter[str]
    generator: float


def read_servers(clients: Sequence[Any], pids: Sequence[int]) -> Reading:
    cpu, calls = [], Counter[str]()
    for client in clients:
        info = client.info("cpu")
        cpu.append(info["used_cpu_user"] + info["used_cpu_sys"])
        for name, value in client.info("commandstats").items():
            calls[name.removeprefix("cmdstat_")] += value["calls"]
    generator = sum(_proc_cpu(pid) for pid in pids) if pids else time.process_time()
    return Reading(time.time(), cpu, calls, generator)


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class PhaseLoad:
    seconds: float
    #: Each server's CPU over the phase, as a share of one core.
    server_cores: list[float]
    server_cpu: float
    generator_cores: float
    #: Calls per command (INFO and CONFIG aside), top level and inside scripts alike.
    calls: dict[str, int] = field(default_factory=dict)

    @classmethod
    def between(cls, a: Reading, b: Reading) -> PhaseLoad:
        seconds = max(1e-9, b.at - a.at)
        each = [y - x for x, y in zip(a.cpu, b.cpu, strict=True)]
        calls = {
            k: b.calls[k] - a.calls.get(k, 0)
            for k in b.calls
            if k not in ("info", "config") and b.calls[k] > a.calls.get(k, 0)
        }
        return cls(
            seconds,
            [c / seconds for c in each],
            sum(each),
            (b.generator - a.generator) / seconds,
            calls,
        )


@dataclass
class FleetResult:
    """What one fleet run measured."""

    nodes: int
    kind: str
    poll_interval: float
    idle: PhaseLoad
    busy: PhaseLoad
    polls_idle: int
    polls_busy: int
    scheduled: int
    claimed: int
    duplicates: int
    lost: int
    acks_refused: int
    latency_ms: dict[str, float]
    fairness: dict[str, float]
    errors: list[str]

    def idle_figures(self) -> dict[str, float]:
        polls = max(1, self.polls_idle)
        calls = self.idle.calls
        trips = sum(calls.get(c, 0) for c in ("evalsha", "eval", "hgetall"))
        return {
            "polls/s per node": polls / self.idle.seconds / self.nodes,
            "round trips per poll": trips / polls,
            "commands per poll": sum(calls.values()) / polls,
            "server CPU µs per poll": self.idle.server_cpu * 1e6 / polls,
            "busiest server, cores": max(self.idle.server_cores),
            "generator, cores": self.idle.generator_cores,
        }

    def busy_figures(self) -> dict[str, float]:
        polls = max(1, self.polls_busy)
        return {
            "polls/s per node": polls / self.busy.seconds / self.nodes,
            "server CPU µs per poll": self.busy.server_cpu * 1e6 / polls,
            "busiest server, cores": max(self.busy.server_cores),
            "generator, cores": self.busy.generator_cores,
        }

    def bottleneck(self) -> str:
        """What held the busy phase back: Redis (its busiest server near a core), the
        load generator (claims late, or a core of its own used, while Redis had room),
        or nothing ("-")."""
        if max(self.busy.server_cores) >= SATURATED:
            return "Redis"
        late = self.latency_ms["p99"] > self.poll_interval * 1000 + 100
        if late or self.busy.generator_cores >= 1.0:
            return "generator" + (", claims late" if late else "")
        return "-"

    def saturates_at(self, phase: str) -> float:
        """Nodes at which the busiest server would reach SATURATED of a core, at this
        run's cost per node (a straight line through zero)."""
        cores = max((self.idle if phase == "idle" else self.busy).server_cores)
        return self.nodes * SATURATED / cores if cores > 0 else math.inf

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "idle_figures": self.idle_figures(),
            "busy_figures": self.busy_figures(),
            "bottleneck": self.bottleneck(),
        }


def jain(counts: Sequence[int]) -> float:
    """Jain's fairness index: 1 when every node claimed the same, 1/n when one claimed all."""
    total, squares = sum(counts), sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else 1.0


def fairness(per_node: Sequence[int]) -> dict[str, float]:
    mean = statistics.fmean(per_node) if per_node else 0.0
    return {
        "jain": jain(per_node),
        # What a fair lottery gives: claims per node drawn at random (Poisson), Jain ≈ μ/(μ+1).
        "jain_if_random": mean / (mean + 1) if mean else 1.0,
        "min_share": min(per_node) / mean if mean else 0.0,
        "max_share": max(per_node) / mean if mean else 0.0,
        "mean": mean,
    }


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def run_fleet(plan: FleetPlan, kind: str, info_clients: Sequence[Any], cleaner: Any) -> FleetResult:
    """Run *plan*'s fleet; *info_clients*: a client of each server (INFO is read from
    each); *cleaner*: a client that deletes the spiders' keys afterwards."""
    workers = max(0, plan.processes)
    shares = [list(range(w, plan.nodes, max(1, workers))) for w in range(max(1, workers))]
    rate_share = plan.rate / len(shares)
    pids: list[int] = []
    outputs: list[dict] = []
    if workers:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        inboxes = [ctx.Queue() for _ in shares]
        procs = [
            ctx.Process(target=_worker, args=(plan, s, rate_share, w + 1, inboxes[w], out))
            for w, s in enumerate(shares)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            tag, value = _get(out, procs, 120)
            if tag != "ready":
                raise SystemExit(f"a fleet worker failed: {value}")
            pids.append(value)
        # Every node is connected: its first polls spread over the warm-up.
        start = time.time() + 1.0
        plan = replace(plan, start=start)
        for inbox in inboxes:
            inbox.put(start)
        readings = _read_at_edges(plan, info_clients, pids)
        for _ in procs:
            tag, value = _get(out, procs, plan.end() - time.time() + 120)
            if tag != "done":
                raise SystemExit(f"a fleet worker failed: {value}")
            outputs.append(value)
        for p in procs:
            p.join(30)
    else:
        nodes = build_share(plan, shares[0])
        plan = replace(plan, start=time.time() + 0.5)
        box: list[dict] = []
        thread = threading.Thread(
            target=lambda: box.append(run_share(plan, nodes, plan.rate, 1)), daemon=True
        )
        thread.start()
        readings = _read_at_edges(plan, info_clients, [])
        thread.join()
        outputs = box
    for spider in plan.spiders:
        cleaner.delete(*all_keys(keys_for(spider)))
    return _summarise(plan, kind, outputs, readings)


def _get(out: Any, procs: Sequence[Any], timeout: float) -> tuple[str, Any]:
    """The next message of a worker; fails when one died without a word."""
    import queue

    deadline = time.monotonic() + timeout
    while True:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
                raise SystemExit("a fleet worker died or hung") from None


def _read_at_edges(plan: FleetPlan, clients: Sequence[Any], pids: list[int]) -> list[Reading]:
    readings = []
    for edge in plan.edges()[1:]:
        time.sleep(max(0.0, edge - time.time()))
        readings.append(read_servers(clients, pids))
    return readings


def _summarise(plan: FleetPlan, kind: str, outputs: list[dict], readings: list[Reading]):
    claims = [c for o in outputs for c in o["claims"]]
    times = Counter(task_id for _, task_id, _ in claims)
    busy_from = int(plan.edges()[2] * 1000)
    latencies = [at - int(task_id.split("-", 1)[0]) for _, task_id, at in claims]
    per_node = Counter(name for name, _, _ in claims)
    names = [n for o in outputs for n in o["nodes"]]
    scheduled = sum(o["scheduled"] for o in outputs)
    assert all(int(t.split("-", 1)[0]) >= busy_from for t in times), "a task before the busy phase"
    return FleetResult(
        nodes=plan.nodes,
        kind=kind,
        poll_interval=plan.poll_interval,
        idle=PhaseLoad.between(readings[0], readings[1]),
        busy=PhaseLoad.between(readings[1], readings[2]),
        polls_idle=sum(o["polls"][1] for o in outputs),
        polls_busy=sum(o["polls"][2] for o in outputs),
        scheduled=scheduled,
        claimed=len(times),
        duplicates=sum(n - 1 for n in times.values()),
        lost=scheduled - len(times),
        acks_refused=sum(o["acks_refused"] for o in outputs),
        latency_ms={
            "p50": percentile(latencies, 0.5),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies, default=float("nan")),
        },
        fairness=fairness([per_node.get(n, 0) for n in names]),
        errors=[e for o in outputs for e in o["errors"]],
    )


def spread_names(count: int, masters: int, slot_owner: Callable[[int], int] | None) -> tuple:
    """*count* spider names; with *slot_owner* (slot -> master index), chosen so that
    the masters get as even a share of them as can be (a spider's hash tag decides its
    master; docs/capacity.md says to check where busy spiders land)."""
    from redis.crc import key_slot

    names: list[str] = []
    want = [0] * max(1, masters)
    while len(names) < count:
        name = f"fleet{uuid.uuid4().hex[:6]}"
        if slot_owner is not None:
            owner = slot_owner(key_slot(keys_for(name).due.encode()))
            if want[owner] > min(want):
                continue
            want[owner] += 1
        names.append(name)
    return tuple(names)


def slot_owners(clients: Sequence[Any]) -> Callable[[int], int]:
    """Slot -> index in *clients* (the cluster's masters) of the master serving it."""
    ports = [c.connection_pool.connection_kwargs["port"] for c in clients]
    ranges = [
        (int(start), int(end), ports.index(int(master[1])))
        for start, end, master, *_ in clients[0].cluster("slots")
    ]
    return lambda slot: next(i for start, end, i in ranges if start <= slot <= end)


# -- reporting -------------------------------------------------------------------


def fleet_table(results: Sequence[FleetResult], plan: FleetPlan) -> str:
    """The fleet runs of one server kind as Markdown: at rest, then under failures."""
    lines = [
        "At rest (nothing due):",
        "",
        "| nodes | polls/s per node | round trips per poll | commands per poll "
        "| server CPU µs per poll | busiest server, % of a core "
        "| nodes at 85 % of a core (extrapolated) | generator, cores |",
        "|" + "---|" * 8,
    ]
    for r in results:
        i = r.idle_figures()
        lines.append(
            f"| {r.nodes} | {i['polls/s per node']:.2f} | {i['round trips per poll']:.2f} "
            f"| {i['commands per poll']:.1f} | {i['server CPU µs per poll']:.0f} "
            f"| {i['busiest server, cores']:.1%} | {r.saturates_at('idle'):,.0f} "
            f"| {i['generator, cores']:.2f} |"
        )
    lines += [
        "",
        f"Under failures ({plan.rate:.0f}/s in all over {len(plan.spiders)} spiders, each due "
        f"{plan.due_after[0]:g} to {plan.due_after[1]:g} s later; a claimed request takes "
        f"{plan.work:g} s):",
        "",
        "| nodes | polls/s per node | server CPU µs per poll | busiest server, % of a core "
        "| nodes at 85 % of a core (extrapolated) | claim latency p50 / p99 / max, ms "
        "| fairness: Jain (a random draw's) | least / most claims, of the mean "
        "| retries claimed | duplicates | lost | generator, cores | what limits |",
        "|" + "---|" * 13,
    ]
    for r in results:
        b, lat, fair = r.busy_figures(), r.latency_ms, r.fairness
        lines.append(
            f"| {r.nodes} | {b['polls/s per node']:.2f} | {b['server CPU µs per poll']:.0f} "
            f"| {b['busiest server, cores']:.1%} | {r.saturates_at('busy'):,.0f} "
            f"| {lat['p50']:.0f} / {lat['p99']:.0f} / {lat['max']:.0f} "
            f"| {fair['jain']:.2f} ({fair['jain_if_random']:.2f}) "
            f"| {fair['min_share']:.2f} / {fair['max_share']:.2f} | {r.claimed} "
            f"| {r.duplicates} | {r.lost} | {b['generator, cores']:.2f} | {r.bottleneck()} |"
        )
    errors = [e for r in results for e in r.errors]
    if errors:
        lines += ["", f"{len(errors)} node error(s), first: {errors[0]}"]
    return "\n".join(lines)


def add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("fleet (hundreds of simulated nodes)")
    group.add_argument("--fleet-nodes", type=int, nargs="+", default=[16, 50, 100, 200, 500])
    group.add_argument("--fleet-spiders", type=int, default=6, help="spiders the nodes share")
    group.add_argument("--fleet-rate", type=float, default=100, help="failures/s, busy phase")
    group.add_argument("--fleet-idle", type=float, default=5, help="seconds at rest")
    group.add_argument("--fleet-busy", type=float, default=10, help="seconds of failures")
    group.add_argument("--fleet-poll", type=float, default=1.0, help="RETRYQUEUE_POLL_INTERVAL")
    group.add_argument("--fleet-processes", type=int, default=2, help="worker processes")
    group.add_argument("--fleet-json", default="", help="write the figures to this file")


def measure(args: Any, servers: Any) -> list[FleetResult]:
    """Every fleet size of *args* on *servers* (capacity.Servers); prints its table."""
    owner = slot_owners(servers.clients) if servers.cluster else None
    results = []
    for nodes in args.fleet_nodes:
        plan = FleetPlan(
            nodes=nodes,
            spiders=spread_names(args.fleet_spiders, len(servers.clients), owner),
            url=servers.url,
            cluster=servers.cluster,
            rate=args.fleet_rate,
            idle=args.fleet_idle,
            busy=args.fleet_busy,
            poll_interval=args.fleet_poll,
            processes=args.fleet_processes,
        )
        cleaner = servers.make_client()
        results.append(run_fleet(plan, servers.kind, servers.clients, cleaner))
        cleaner.close()
        print(f"  {servers.kind}: {nodes} nodes done", flush=True)
    print(fleet_table(results, plan), "\n", flush=True)
    return results
