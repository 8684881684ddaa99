"""Prove that a refactor left behaviour identical: seeded PCM of two revisions, bit for bit.

A restructure (moved packages, renamed modules) should change no sample of audio. This script
checks out BASE_REV and HEAD_REV as temporary git worktrees (HEAD_REV left out: the checkout
itself, uncommitted edits included), runs the same fixed list of seeded cases in each, in a
subprocess whose PYTHONPATH is that tree (same virtual environment, that tree's `omniflow`;
the driver checks `omniflow.__file__`), and compares each output's sha256.

Cases (tiny dummy-weight model, CPU): `omniflow synth` for one request on the two-stage and
the fused pipeline under sync and async scheduling (s16le, as synth writes `.pcm`); and an
in-process driver (float32 PCM, several requests submitted before the engines start, so every
run schedules them alike) for multi-step windows (K=4 beside K=0), preemption under a KV pool
too small for its requests, and a batch of requests of different lengths. The driver asserts
from the pipeline's public stats that windows ran and that requests were preempted.

    python scripts/compare_pcm.py BASE_REV [HEAD_REV]
    python scripts/compare_pcm.py 7e418aa 7e418aa   # sanity: a revision against itself

Exit status 0 only when every case has non-empty, identical PCM in both trees.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BASE = ["model=qwen3_tts_tiny", "platform=cpu"]
TALKER = "pipeline.stages.talker"
ASYNC = f"{TALKER}.scheduler.async_scheduling"
SQUEEZE = [f"{TALKER}.scheduler.{k}" for k in ("block_size=4", "num_kv_blocks=12")]
SQUEEZE.append(f"{TALKER}.scheduler.max_model_len=48")
TEXT = "Hello there. This is a seeded comparison."

# name -> synth overrides (one request each, written by the CLI as s16le).
CLI_CASES = {
    "cli/two_stage_sync": ["pipeline=qwen3_tts", f"{ASYNC}=false"],
    "cli/two_stage_async": ["pipeline=qwen3_tts", f"{ASYNC}=true"],
    "cli/fused_sync": ["pipeline=qwen3_tts_fused", f"{ASYNC}=false"],
    "cli/fused_async": ["pipeline=qwen3_tts_fused", f"{ASYNC}=true"],
}


def req(rid: str, seed: int, text: str = TEXT, **kw) -> dict:
    return dict(request_id=rid, text=text, seed=seed, voice="vivian", **kw)


PAIR = [req("r0", 1), req("r1", 2, "Windows.", max_new_tokens=23, ignore_eos=True)]
PREEMPT = [
    req(f"p{i}", i, "Preemption test sentence.", max_new_tokens=14 + i, ignore_eos=True)
    for i in range(3)
]
for r in PREEMPT:
    r["non_streaming_mode"] = False  # the squeezed pool fits the streaming-text prompt
BATCH = [
    req("b0", 5, "Short."),
    req("b1", 6, "A somewhat longer sentence for the batch."),
    req("b2", 7, "Medium length text here."),
    req("b3", 8, "Fixed.", max_new_tokens=31, ignore_eos=True),
    req("b4", 9, "The longest request of this batch by a comfortable margin of letters."),
]

# name -> (overrides, requests, what its stats must show: "windows" | "preemptions" | None)
DRIVER_CASES = {
    "window_k0/fused": (["pipeline=qwen3_tts_fused", f"{TALKER}.window_k=0"], PAIR, None),
    "window_k4/fused": (["pipeline=qwen3_tts_fused", f"{TALKER}.window_k=4"], PAIR, "windows"),
    "window_k4/two_stage": (["pipeline=qwen3_tts", f"{TALKER}.window_k=4"], PAIR, "windows"),
    "preempt/fused_async": (["pipeline=qwen3_tts_fused", *SQUEEZE], PREEMPT, "preemptions"),
    "preempt/two_stage_sync": (["pipeline=qwen3_tts", *SQUEEZE], PREEMPT, "preemptions"),
    "batch/two_stage": (["pipeline=qwen3_tts"], BATCH, None),
}

DRIVER = r"""
import json, sys, threading
from pathlib import Path

import numpy as np
import omniflow
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.speech import SpeechRequest

try:
    from omniflow.build.pipeline import build_pipeline  # after the restructure
except ImportError:
    from omniflow.stages.build import build_pipeline  # before it (7e418aa)

tree, out, cases = Path(sys.argv[1]).resolve(), Path(sys.argv[2]), json.loads(sys.argv[3])
here = Path(omniflow.__file__).resolve()
assert here.is_relative_to(tree), f"imported {here}, not the tree {tree}"
report = {"omniflow": str(here), "cases": {}}
for name, (overrides, requests, expect) in cases.items():
    orch = build_pipeline(build_graph(compose(overrides)))
    done, pcm = {}, {}
    for r in requests:  # all queued before the engines start: the same schedule every run
        rid = r["request_id"]
        done[rid], pcm[rid] = threading.Event(), []

        def sink(ev, rid=rid):
            if ev.pcm is not None:
                pcm[rid].append(ev.pcm)
            if ev.finished:
                assert ev.error is None, f"{name}/{rid}: {ev.error}"
                done[rid].set()

        orch.submit(SpeechRequest(**r), sink)
    orch.start()
    try:
        for rid, ev in done.items():
            assert ev.wait(120), f"{name}/{rid} did not finish"
        stats = orch.stats()
    finally:
        orch.stop()
    talker = next(s for s in stats.stages if s.name == "talker")
    w = talker.windows
    seen = {"preemptions": talker.preemptions or 0, "windows": w.executed if w else 0}
    seen["window_steps"] = w.steps if w else 0
    assert expect is None or seen[expect] > 0, f"{name}: no {expect} happened ({seen})"
    report["cases"][name] = seen
    for rid, parts in pcm.items():
        data = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        (out / f"{name.replace('/', '~')}~{rid}.f32").write_bytes(data.astype("<f4").tobytes())
print(json.dumps(report))
"""


def git(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        sys.exit(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def run(cmd: list[str], tree: Path, cwd: Path) -> str:
    # PYTHONPATH alone selects the tree's package (the venv's editable finder comes last);
    # a fixed hash seed keeps set/dict orders of strings the same in every run.
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed in {tree}: {' '.join(cmd[:4])} ...\n{proc.stderr[-3000:]}")
    return proc.stdout


def run_tree(tree: Path, out: Path) -> tuple[dict[str, tuple[int, str]], dict]:
    """Every case in `tree`: {case: (samples, sha256)} and the driver's report."""
    out.mkdir(parents=True)
    results: dict[str, tuple[int, str]] = {}
    for name, overrides in CLI_CASES.items():
        path = out / f"{name.replace('/', '~')}.pcm"
        synth = [sys.executable, "-m", "omniflow", "synth", f"text={TEXT}", "seed=11"]
        run([*synth, f"out={path}", *BASE, *overrides], tree, out)
        data = path.read_bytes()
        results[name] = (len(data) // 2, hashlib.sha256(data).hexdigest())
    driver = out / "driver.py"
    driver.write_text(DRIVER)
    cases = {k: ([*BASE, *o], r, e) for k, (o, r, e) in DRIVER_CASES.items()}
    stdout = run([sys.executable, str(driver), str(tree), str(out), json.dumps(cases)], tree, out)
    report = json.loads(stdout.strip().splitlines()[-1])
    for path in sorted(out.glob("*.f32")):
        data = path.read_bytes()
        results[path.stem.replace("~", "/")] = (len(data) // 4, hashlib.sha256(data).hexdigest())
    return results, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", metavar="BASE_REV")
    ap.add_argument("head", metavar="HEAD_REV", nargs="?", help="default: the working tree")
    args = ap.parse_args()
    top = Path(git("rev-parse", "--show-toplevel").strip())
    with tempfile.TemporaryDirectory(prefix="compare_pcm_") as tmp:
        made: list[Path] = []
        try:
            trees = []
            for label, rev in (("base", args.base), ("head", args.head)):
                if rev is None:
                    trees.append((label, "working tree", top))
                    continue
                sha = git("-C", str(top), "rev-parse", "--verify", f"{rev}^{{commit}}").strip()
                path = Path(tmp) / label
                git("-C", str(top), "worktree", "add", "--detach", str(path), sha)
                made.append(path)
                trees.append((label, sha[:12], path))
            runs = {}
            for label, name, path in trees:
                print(f"{label}: {name} ...", file=sys.stderr, flush=True)
                runs[label] = run_tree(path, Path(tmp) / "out" / label)
                print(f"  omniflow from {runs[label][1]['omniflow']}", file=sys.stderr)
                for case, seen in runs[label][1]["cases"].items():
                    print(f"  {case}: {seen}", file=sys.stderr)
        finally:
            for path in made:
                git("-C", str(top), "worktree", "remove", "--force", str(path), check=False)
            git("-C", str(top), "worktree", "prune", check=False)
    (base, _), (head, _) = runs["base"], runs["head"]
    print(f"base {trees[0][1]}  head {trees[1][1]}")
    print(f"{'case':<30} {'samples':>9}  {'base':<12}  {'head':<12}  equal")
    ok = True
    for case in sorted(set(base) | set(head)):
        (bn, bh), (hn, hh) = base.get(case, (0, "-")), head.get(case, (0, "-"))
        same = bh == hh and bn > 0
        ok &= same
        n = str(bn) if bn == hn else f"{bn}/{hn}"
        print(f"{case:<30} {n:>9}  {bh[:12]:<12}  {hh[:12]:<12}  {'yes' if same else 'no'}")
    print("ALL EQUAL" if ok else "DIFFERENT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
