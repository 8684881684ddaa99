"""The table of a `benchmarks/open_loop_runs.sh` directory: per variant and rate, first audio,
stalls, refusals and the server's build; per variant and closed-loop concurrency, audio-s/s
over its rounds; per variant and rate where the server's /metrics were read before and after
it, where the server's first audio went (its parts' means over that rate's requests, the
client's warm-up ones included; `serve/metrics.py`), how many steps prefilled arrivals alone,
how many windows an arrival cut (after any number of steps) and how many windows ran more
than one step; "-" where the server exported no such counter (an older tree) or died. The
rows of docs/performance.md's open-loop tables come from here, so a figure is copied from
one place and a rate whose client failed shows as failed, not as a gap in a hand-made table.

    python -m benchmarks.open_loop_table OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from omniflow.bench.open_summary import rejected_text
from omniflow.bench.samples import reading_of_text
from omniflow.bench.server_sums import first_audio_parts, server_totals

STAGE = "talker"
WINDOW_COUNTERS = ("arrival_steps", "cut", "executed")
OPEN = re.compile(r"^(?P<label>.+)_rps(?P<rps>\d+(?:\.\d+)?)\.json$")
CLOSED = re.compile(r"^(?P<label>.+)_c(?P<conc>\d+)_r(?P<round>\d+)\.json$")


def _load(path: Path) -> dict | None:
    """A client's summary, or None where the client wrote none (it failed: see its .err)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def open_rows(directory: Path) -> list[dict]:
    """One row per open-loop summary (`LABEL_rpsR.json`), by variant then rate."""
    rows = []
    for path in directory.iterdir():
        m = OPEN.match(path.name)
        if m:
            rows.append({"label": m["label"], "rps": float(m["rps"]), "summary": _load(path)})
    return sorted(rows, key=lambda r: (r["label"], r["rps"]))


def closed_rows(directory: Path) -> list[dict]:
    """One row per variant and concurrency: the audio-s/s of each round (`LABEL_cC_rN.json`,
    the closed-loop client's `--out`), failed requests summed."""
    runs: dict[tuple[str, int], list[dict | None]] = {}
    for path in directory.iterdir():
        m = CLOSED.match(path.name)
        if m:
            data = _load(path)
            runs.setdefault((m["label"], int(m["conc"])), []).append(
                None if data is None else data.get("summary")
            )
    rows = []
    for (label, conc), rounds in sorted(runs.items()):
        done = [r for r in rounds if r is not None]
        rows.append(
            {
                "label": label,
                "concurrency": conc,
                "rounds": len(rounds),
                "throughput": [r["audio_throughput"] for r in done],
                # past the opening burst and before the drain (omniflow/bench/steady.py);
                # rounds from clients before it have no such figure
                "steady": [r["steady"] for r in done if r.get("steady")],
                "failed": sum(r["failed"] for r in done),
                "missing": len(rounds) - len(done),
            }
        )
    return rows


def _server_totals(path: Path) -> dict[str, float | None] | None:
    """A reading's totals summed over its servers (one, or a Ray deployment's replicas);
    a window counter the server does not export (an older tree) is None. None: no reading
    (the server had died: `open_loop_runs.sh` leaves the file empty)."""
    reading = reading_of_text(path.read_text()) if path.is_file() else {}
    if not reading:
        return None
    totals: dict[str, float | None] = {}
    for samples in reading.values():
        for k, v in server_totals(samples, STAGE).items():
            totals[k] = (totals.get(k) or 0.0) + v
        for k in WINDOW_COUNTERS:
            name = f"omniflow_window_{k}_total"
            if samples.has(name, {"stage": STAGE}):
                totals[k] = (totals.get(k) or 0.0) + samples.value(name, {"stage": STAGE})
            else:
                totals.setdefault(k, None)
    return totals


def server_rows(directory: Path) -> list[dict]:
    """Per variant and rate with both readings (`LABEL_rpsR.before.metrics` and
    `LABEL_rpsR.metrics`): that rate's server-side first audio in parts (its requests, the
    client's warm-up ones included) and window counts; `first` None where a reading is
    missing or empty (the server died)."""
    rows = []
    for before in directory.glob("*.before.metrics"):
        m = OPEN.match(before.name.removesuffix(".before.metrics") + ".json")
        if not m:
            continue
        after = before.with_name(before.name.replace(".before.metrics", ".metrics"))
        was, now = _server_totals(before), _server_totals(after)
        row = {"label": m["label"], "rps": float(m["rps"]), "first": None}
        if was is None or now is None:
            rows.append(row | dict.fromkeys(WINDOW_COUNTERS))
            continue
        accrued = {k: (now[k] or 0.0) - (was[k] or 0.0) for k in now}
        windows = {
            k: None if now[k] is None or was[k] is None else int(accrued[k])
            for k in WINDOW_COUNTERS
        }
        rows.append(row | {"first": first_audio_parts(accrued)} | windows)
    return sorted(rows, key=lambda r: (r["label"], r["rps"]))


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _server_line(row: dict) -> str:
    f, rate = row["first"], f"{row['rps']:g}"
    windows = " | ".join(_count(row[k]) for k in WINDOW_COUNTERS)
    if f is None:
        return f"| {row['label']} | {rate} | - | - | - | - | - | {windows} |"
    made = f"{f['made_ms']:.1f}"
    if f["queued_ms"] is not None:
        made += f" = {f['queued_ms']:.1f} + {f['steps_ms']:.1f}"
    delivery = f"{f['delivery_ms']:.1f}"
    if f.get("handoff_ms") is not None:  # a server older than the split has none
        delivery += f" = {f['handoff_ms']:.1f} + {f['response_ms']:.1f}"
    return (
        f"| {row['label']} | {rate} | {f['requests']} | {f['total_ms']:.1f} | "
        f"{f['intake_ms']:.1f} | {made} | {delivery} | {windows} |"
    )


def _ms(x: dict | None) -> str:
    if not x:
        return "-"
    return " / ".join(f"{x[k]:.1f}" for k in ("p50", "p95", "p99"))


def _open_line(row: dict) -> str:
    rate = f"{row['rps']:g}"
    s = row["summary"]
    if s is None:
        return f"| {row['label']} | {rate} | failed: no summary (see its .err) | | | | |"
    server = s.get("server") or {}
    build = f"{(server.get('commit') or '?')[:7]} / {server.get('tree', '?')}"
    stalled = f"{s['underrun_requests']} of {s['succeeded']}"
    return (
        f"| {row['label']} | {rate} | {s['requests']} | {rejected_text(s)} | "
        f"{_ms(s.get('first_audio_ms'))} | {stalled} | {build} |"
    )


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _closed_line(row: dict) -> str:
    t = row["throughput"]
    figure = _spread(t) if t else "failed: no summary"
    steady = row["steady"]
    firsts = [1e3 * s["ttfp_mean_s"] for s in steady if s["ttfp_mean_s"] is not None]
    failed = sum(s.get("failed", 0) for s in steady)  # clients before it did not count them
    held = (
        f"{_spread([s['audio_throughput'] for s in steady])}"
        + (f", first audio {statistics.fmean(firsts):.0f} ms" if firsts else "")
        + (f", {failed} failed in it" if failed else "")
        if steady
        else "-"
    )
    lost = f", {row['missing']} round(s) without a summary" if row["missing"] else ""
    rounds = f"{row['rounds']}{lost}"
    return (
        f"| {row['label']} | c{row['concurrency']} | {rounds} | {figure} | {held} | "
        f"{row['failed']} |"
    )


PASS = re.compile(r"^(?P<variant>.+)_(?P<pass>[12])$")


def both_orders(opened: list[dict], closed: list[dict]) -> list[str]:
    """`ORDER=abba` runs (labels VARIANT_1, VARIANT_2): per variant and rate, p95 first audio
    and stalls of each pass and their mean; per variant and concurrency, audio-s/s of each
    pass (its median) and their mean. Only where both passes have a figure."""
    lines: list[str] = []
    runs: dict[tuple[str, str], dict[str, float]] = {}
    for row in opened:
        m, summary = PASS.match(row["label"]), row["summary"]
        p95 = ((summary or {}).get("first_audio_ms") or {}).get("p95")
        if m and p95 is not None:
            runs.setdefault((m["variant"], f"{row['rps']:g} req/s p95 ms"), {})[m["pass"]] = p95
    for row in closed:
        m = PASS.match(row["label"])
        if m and row["throughput"]:
            key = (m["variant"], f"c{row['concurrency']} audio-s/s")
            runs.setdefault(key, {})[m["pass"]] = statistics.median(row["throughput"])
    for (variant, what), passes in sorted(runs.items()):
        if set(passes) == {"1", "2"}:
            mean = (passes["1"] + passes["2"]) / 2
            lines.append(
                f"| {variant} | {what} | {passes['1']:.2f} | {passes['2']:.2f} | {mean:.2f} |"
            )
    if not lines:
        return []
    head = "| variant | figure | first pass | second pass | mean |"
    return [head, "| --- | --- | --- | --- | --- |", *lines]


def table(directory: Path) -> str:
    """Markdown: the open-loop rows, then the closed-loop rows (each only if present), and
    with `ORDER=abba` both passes side by side."""
    parts = []
    opened = open_rows(directory)
    if opened:
        parts += [
            "| variant | req/s | requests | refused | first audio p50 / p95 / p99 (ms) | "
            "stalled | server commit / tree |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *map(_open_line, opened),
        ]
    closed = closed_rows(directory)
    if closed:
        parts += [
            "" if parts else None,
            "| variant | closed loop | rounds | audio-s/s median (min-max) | steady state "
            "(mean first audio) | failed requests |",
            "| --- | --- | --- | --- | --- | --- |",
            *map(_closed_line, closed),
        ]
    served = server_rows(directory)
    if served:
        parts += [
            "" if parts else None,
            "| variant | req/s | first audios | server's mean (ms) | intake | made = queued + "
            "steps | delivery = handoff + response | arrival steps | windows cut | windows over "
            "one step |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *map(_server_line, served),
        ]
    paired = both_orders(opened, closed)
    if paired:
        parts += ["" if parts else None, *paired]
    lines = [p for p in parts if p is not None]
    return "\n".join(lines) if lines else f"no open_loop_runs.sh results in {directory}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("directory", type=Path)
    args = ap.parse_args()
    if not args.directory.is_dir():
        ap.error(f"{args.directory} is not a directory")
    print(table(args.directory))


if __name__ == "__main__":
    main()
