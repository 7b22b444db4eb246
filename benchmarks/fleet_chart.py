"""The fleet capacity curve: medians of a few runs as Markdown tables and an SVG chart.

    python -m benchmarks.capacity --only fleet --fleet-json round1.json   (and round2, ...)
    python -m benchmarks.fleet_chart docs/capacity-fleet.svg round1.json round2.json ...

Prints the tables docs/capacity.md holds (the median of the rounds for each
figure; duplicates and lost tasks summed) and draws, without a plotting
library, two panels against the number of simulated nodes: the busiest Redis
server's CPU (share of one core) at rest and under failures, and the claims'
p99 latency against the target (poll interval + 100 ms). A point drawn hollow is
one the load generator held back in a round (its "what limits" says generator).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WIDTH, HEIGHT = 900, 340
PANEL_W, PANEL_H = 340, 230
LEFT, TOP = 70, 50
GAP = 90
#: (server kind, phase) -> colour and dash of its line.
STYLES = {
    ("one server", "idle"): ("#1f77b4", "4 3"),
    ("one server", "busy"): ("#1f77b4", ""),
    ("cluster, 3 masters", "idle"): ("#d62728", "4 3"),
    ("cluster, 3 masters", "busy"): ("#d62728", ""),
}


def _nice_top(value: float) -> float:
    """A round axis maximum at or above *value*."""
    for top in (0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0):
        if value <= top:
            return top
    step = 10 ** (len(str(int(value))) - 1)
    return float(-(-value // step) * step)


class Panel:
    """One chart area: maps (nodes, value) to the SVG's coordinates."""

    def __init__(self, x0: float, x_max: float, y_max: float) -> None:
        self.x0, self.x_max, self.y_max = x0, x_max, y_max

    def at(self, x: float, y: float) -> tuple[float, float]:
        px = self.x0 + PANEL_W * x / self.x_max
        py = TOP + PANEL_H - PANEL_H * min(y, self.y_max) / self.y_max
        return round(px, 1), round(py, 1)

    def axes(self, title: str, y_label: Any, ticks: Sequence[float]) -> list[str]:
        out = [
            f'<text x="{self.x0}" y="{TOP - 18}" font-weight="bold">{title}</text>',
            f'<rect x="{self.x0}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" '
            'fill="none" stroke="#888"/>',
        ]
        for tick in ticks:
            _, py = self.at(0, tick)
            out.append(
                f'<line x1="{self.x0}" y1="{py}" x2="{self.x0 + PANEL_W}" y2="{py}" stroke="#eee"/>'
            )
            out.append(
                f'<text x="{self.x0 - 6}" y="{py + 4}" text-anchor="end">{y_label(tick)}</text>'
            )
        for nodes in range(0, int(self.x_max) + 1, 100):
            px, _ = self.at(nodes, 0)
            out.append(
                f'<text x="{px}" y="{TOP + PANEL_H + 16}" text-anchor="middle">{nodes}</text>'
            )
        out.append(
            f'<text x="{self.x0 + PANEL_W / 2}" y="{TOP + PANEL_H + 34}" '
            'text-anchor="middle">simulated nodes</text>'
        )
        return out

    def series(self, points: Sequence[tuple[float, float, bool]], colour: str, dash: str):
        """A line through *points* (nodes, value, held back by the generator)."""
        path = " ".join(f"{x},{y}" for x, y in (self.at(n, v) for n, v, _ in points))
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        out = [f'<polyline points="{path}" fill="none" stroke="{colour}"{dashed}/>']
        for nodes, value, held in points:
            px, py = self.at(nodes, value)
            fill = "white" if held else colour
            out.append(f'<circle cx="{px}" cy="{py}" r="3.5" fill="{fill}" stroke="{colour}"/>')
        return out


def merged(rounds: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per server kind and node count: the rounds' medians."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for results in rounds:
        for r in results:
            groups.setdefault((r["kind"], r["nodes"]), []).append(r)
    out = []
    for (kind, nodes), rs in groups.items():

        def med(get: Any, rs: list[dict[str, Any]] = rs) -> float:
            return float(statistics.median(get(r) for r in rs))

        out.append(
            {
                "kind": kind,
                "nodes": nodes,
                "rounds": len(rs),
                "poll_interval": rs[0]["poll_interval"],
                "idle_polls": med(lambda r: r["idle_figures"]["polls/s per node"]),
                "idle_trips": med(lambda r: r["idle_figures"]["round trips per poll"]),
                "idle_commands": med(lambda r: r["idle_figures"]["commands per poll"]),
                "idle_us": med(lambda r: r["idle_figures"]["server CPU µs per poll"]),
                "idle_cores": med(lambda r: max(r["idle"]["server_cores"])),
                "idle_generator": med(lambda r: r["idle"]["generator_cores"]),
                "busy_polls": med(lambda r: r["busy_figures"]["polls/s per node"]),
                "busy_us": med(lambda r: r["busy_figures"]["server CPU µs per poll"]),
                "busy_cores": med(lambda r: max(r["busy"]["server_cores"])),
                "busy_generator": med(lambda r: r["busy"]["generator_cores"]),
                "p50": med(lambda r: r["latency_ms"]["p50"]),
                "p99": med(lambda r: r["latency_ms"]["p99"]),
                "p99_range": (
                    min(r["latency_ms"]["p99"] for r in rs),
                    max(r["latency_ms"]["p99"] for r in rs),
                ),
                "jain": med(lambda r: r["fairness"]["jain"]),
                "jain_random": med(lambda r: r["fairness"]["jain_if_random"]),
                "min_share": med(lambda r: r["fairness"]["min_share"]),
                "max_share": med(lambda r: r["fairness"]["max_share"]),
                "claimed": sum(r["claimed"] for r in rs),
                "duplicates": sum(r["duplicates"] for r in rs),
                "lost": sum(r["lost"] for r in rs),
                "acks_refused": sum(r["acks_refused"] for r in rs),
                "generator_bound": sum(r["bottleneck"].startswith("generator") for r in rs),
                "redis_bound": sum(r["bottleneck"] == "Redis" for r in rs),
            }
        )
    return sorted(out, key=lambda r: (r["kind"] != "one server", r["nodes"]))


def tables(records: Sequence[dict[str, Any]]) -> str:
    """The medians as the two Markdown tables of docs/capacity.md."""
    lines = [
        "| server | nodes | round trips per poll | commands per poll | Redis CPU µs per poll "
        "| busiest server, % of a core | generator, cores |",
        "|" + "---|" * 7,
    ]
    for r in records:
        lines.append(
            f"| {r['kind']} | {r['nodes']} | {r['idle_trips']:.2f} | {r['idle_commands']:.1f} "
            f"| {r['idle_us']:.0f} | {r['idle_cores']:.1%} | {r['idle_generator']:.2f} |"
        )
    lines += [
        "",
        "| server | nodes | polls/s per node | Redis CPU µs per poll | busiest server, % of a core "
        "| claim p50 / p99 ms (the rounds' p99, lowest to highest) | Jain (a random draw's) "
        "| least / most claims, of the mean | retries claimed | duplicates | lost "
        "| generator, cores | rounds the generator limited |",
        "|" + "---|" * 13,
    ]
    for r in records:
        low, high = r["p99_range"]
        lines.append(
            f"| {r['kind']} | {r['nodes']} | {r['busy_polls']:.1f} | {r['busy_us']:.0f} "
            f"| {r['busy_cores']:.1%} | {r['p50']:.0f} / {r['p99']:.0f} ({low:.0f} to {high:.0f}) "
            f"| {r['jain']:.2f} ({r['jain_random']:.2f}) "
            f"| {r['min_share']:.2f} / {r['max_share']:.2f} | {r['claimed']:,} "
            f"| {r['duplicates']} | {r['lost']} | {r['busy_generator']:.2f} "
            f"| {r['generator_bound']} of {r['rounds']} |"
        )
    return "\n".join(lines)


def chart(results: Sequence[dict[str, Any]]) -> str:
    kinds = list(dict.fromkeys(r["kind"] for r in results))
    x_max = max(100.0, -(-max(r["nodes"] for r in results) // 100) * 100)
    cpu_max = max(max(r["idle_cores"], r["busy_cores"]) for r in results)
    cpu = Panel(LEFT, x_max, _nice_top(cpu_max * 1.1))
    target = results[0]["poll_interval"] * 1000 + 100
    p99_max = max(max(r["p99"] for r in results), target)
    latency = Panel(LEFT + PANEL_W + GAP, x_max, _nice_top(p99_max * 1.1))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    out += cpu.axes(
        "Busiest Redis server's CPU",
        lambda v: f"{v:.0%}",
        [cpu.y_max * i / 5 for i in range(6)],
    )
    out += latency.axes(
        "Claim latency p99 (busy)",
        lambda v: f"{v:.0f} ms",
        [latency.y_max * i / 5 for i in range(6)],
    )
    _, ty = latency.at(0, target)
    out.append(
        f'<line x1="{latency.x0}" y1="{ty}" x2="{latency.x0 + PANEL_W}" y2="{ty}" '
        'stroke="#2ca02c" stroke-dasharray="6 3"/>'
    )
    out.append(
        f'<text x="{latency.x0 + PANEL_W - 4}" y="{ty - 4}" text-anchor="end" '
        f'fill="#2ca02c">target: poll interval + 100 ms</text>'
    )
    for kind in kinds:
        rows = sorted((r for r in results if r["kind"] == kind), key=lambda r: r["nodes"])
        held = [r["generator_bound"] > 0 for r in rows]
        for phase in ("idle", "busy"):
            colour, dash = STYLES.get((kind, phase), ("#555", ""))
            points = [
                (r["nodes"], r[f"{phase}_cores"], h and phase == "busy")
                for r, h in zip(rows, held, strict=True)
            ]
            out += cpu.series(points, colour, dash)
        colour, _ = STYLES.get((kind, "busy"), ("#555", ""))
        out += latency.series(
            [(r["nodes"], r["p99"], h) for r, h in zip(rows, held, strict=True)],
            colour,
            "",
        )
    legend_y = HEIGHT - 18
    x = LEFT
    for (kind, phase), (colour, dash) in STYLES.items():
        if kind not in kinds:
            continue
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{x}" y1="{legend_y}" x2="{x + 22}" y2="{legend_y}" '
            f'stroke="{colour}"{dashed}/>'
        )
        label = f"{kind}, {'at rest' if phase == 'idle' else 'under failures'}"
        out.append(f'<text x="{x + 26}" y="{legend_y + 4}">{label}</text>')
        x += 30 + 6 * len(label)
    out.append(
        f'<text x="{LEFT}" y="{HEIGHT - 2}" fill="#555">medians of the rounds; hollow: the '
        "load generator (2 shared cores), not Redis, held a round back</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    records = merged([json.loads(Path(path).read_text()) for path in argv[1:]])
    Path(argv[0]).write_text(chart(records))
    print(tables(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
