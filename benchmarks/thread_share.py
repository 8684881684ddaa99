"""Which threads of a served process hold the GIL, and for how much of the wall time: the
question issue 35 asks of the HTTP side at c128 (does the event loop's work cost the engine
its interpreter?). Reads py-spy's raw (collapsed) stacks recorded with `--threads --gil`:
each line is `thread (TID): NAME;frame;...;frame COUNT`, one sample a line per distinct stack.

    py-spy record --pid PID --rate 200 --duration 20 --threads --gil --format raw -o gil.txt
    python -m benchmarks.thread_share gil.txt --rate 200 --duration 20

Per thread name (a pool's numbered workers summed: `talker-runner_0` -> `talker-runner`):
the samples in which it held the GIL, their share of all samples taken, and the seconds they
stand for. The sum over threads against the wall time says how busy the interpreter was;
near 1.0 every thread that wanted it waited for it.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

LINE = re.compile(r"^thread \((?P<tid>[^)]*)\)(?::\s*(?P<name>[^;]*))?(?:;.*)?\s(?P<count>\d+)$")
WORKER = re.compile(r"_\d+$")


def thread_samples(text: str) -> Counter[str]:
    """Samples per thread name (numbered pool workers summed; an unnamed thread by its id)."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m is None:
            continue
        name = (m["name"] or "").strip() or f"thread {m['tid']}"
        counts[WORKER.sub("", name)] += int(m["count"])
    return counts


def summary(counts: Counter[str], rate: float, duration_s: float) -> dict[str, object]:
    """Each thread's GIL samples, seconds and share of the wall time; the interpreter's total."""
    taken = rate * duration_s
    threads = {
        name: {"samples": n, "seconds": round(n / rate, 3), "wall_share": round(n / taken, 4)}
        for name, n in counts.most_common()
    }
    total = sum(counts.values())
    return {"threads": threads, "gil_busy_share": round(total / taken, 4), "samples": total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("raw", type=Path, help="py-spy record --format raw output")
    ap.add_argument("--rate", type=float, required=True, help="py-spy's --rate")
    ap.add_argument("--duration", type=float, required=True, help="seconds recorded")
    args = ap.parse_args()
    counts = thread_samples(args.raw.read_text())
    if not counts:
        raise SystemExit(f"{args.raw}: no `thread (...)` lines (record with --threads)")
    print(json.dumps(summary(counts, args.rate, args.duration), indent=2))


if __name__ == "__main__":
    main()
