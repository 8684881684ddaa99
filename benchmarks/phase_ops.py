"""Where does one engine phase's host time go? The host ops inside each range of that phase in
a `talker_baseline --timeline` trace, summed by name.

Why: `timeline.phase_gpu` says how long a phase held the host (and the kernels it launched),
not what it did meanwhile; a phase that costs milliseconds of host time before the GPU can
start (an admitting step's `sample` or `audio`) is read here op by op. Only the outermost ops
of a range count (`aten::linear` holds its `aten::addmm`), so the ops and what is left over
(Python between ops, the profiler's own cost) add up to the range.

    python -m benchmarks.phase_ops TRACE.json.gz 'talker.mixed_step>talker.sample'
    python -m benchmarks.phase_ops TRACE.json.gz talker.audio --top 8

A nest (`A>B`) picks the ranges of B that lie inside a range of A on the same thread; a
single name picks all its ranges (quote a nest: `>` is the shell's redirection).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.timeline import RANGE_PREFIX, load_trace

Span = tuple[float, float]


def _ranges(events: list[dict[str, Any]], phase: str) -> dict[Any, list[Span]]:
    """Per thread, the (start, end) in µs of every `omniflow.<phase>` range."""
    out: dict[Any, list[Span]] = defaultdict(list)
    name = RANGE_PREFIX + phase
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") == name:
            start = float(e["ts"])
            out[(e.get("pid"), e.get("tid"))].append((start, start + float(e["dur"])))
    return out


def _inside(span: Span, spans: list[Span]) -> bool:
    return any(s <= span[0] and span[1] <= e for s, e in spans)


def phase_ops(events: list[dict[str, Any]], nest: str, top: int = 10) -> dict[str, Any]:
    """For the ranges `nest` names: how many, their mean host ms, and the `top` outermost
    host ops by summed time (calls and mean ms per range), with the rest (`other_ms`, the
    ops below the top) and the time no op covers (`between_ms`), also per range."""
    *outer, phase = nest.split(">")
    ranges = _ranges(events, phase)
    for name in outer:  # keep the ranges inside one of each enclosing phase
        around = _ranges(events, name)
        ranges = {t: [r for r in rs if _inside(r, around.get(t, []))] for t, rs in ranges.items()}
    ops: dict[Any, list[tuple[Span, str]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            start = float(e["ts"])
            ops[(e.get("pid"), e.get("tid"))].append(((start, start + float(e["dur"])), e["name"]))
    count, total = 0, 0.0
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for thread, spans in ranges.items():
        for span in spans:
            count += 1
            total += span[1] - span[0]
            within = sorted(
                (op for op in ops.get(thread, []) if _inside(op[0], [span])),
                key=lambda op: (op[0][0], -op[0][1]),
            )
            end = float("-inf")
            for (s, e), name in within:
                if s >= end:  # not inside the previous outermost op
                    by_name[name][0] += 1
                    by_name[name][1] += e - s
                    end = e
    if count == 0:
        return {"ranges": 0, "mean_ms": 0.0, "ops": [], "other_ms": 0.0, "between_ms": 0.0}
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    covered = sum(v[1] for v in by_name.values())
    shown = [
        {"op": name, "calls": calls / count, "ms": ms / 1e3 / count}
        for name, (calls, ms) in ranked[:top]
    ]
    rest = sum(v[1] for _, v in ranked[top:])
    return {
        "ranges": count,
        "mean_ms": total / 1e3 / count,
        "ops": shown,
        "other_ms": rest / 1e3 / count,
        "between_ms": (total - covered) / 1e3 / count,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="a chrome trace (.json or .json.gz)")
    parser.add_argument("nest", help="a phase or a nest of phases, e.g. talker.sample")
    parser.add_argument("--top", type=int, default=10, help="ops to list (default 10)")
    args = parser.parse_args(argv)
    got = phase_ops(load_trace(args.trace), args.nest, args.top)
    print(f"{args.nest}: {got['ranges']} ranges, {got['mean_ms']:.3f} ms each on the host")
    for row in got["ops"]:
        print(f"  {row['op']:<40} {row['calls']:6.1f} calls {row['ms']:8.3f} ms")
    print(f"  {'(other ops)':<40} {'':12} {got['other_ms']:8.3f} ms")
    print(f"  {'(between ops)':<40} {'':12} {got['between_ms']:8.3f} ms")


if __name__ == "__main__":
    main()
