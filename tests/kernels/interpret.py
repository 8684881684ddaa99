"""Running Triton kernels on the CPU: the Triton interpreter, in a child process.

Triton reads TRITON_INTERPRET when a kernel is decorated (its own `tl.max`, `tl.cdiv`... are
kernels too), so it must be set before triton is imported; setting it inside the test session
would make every kernel imported later interpreted, the CUDA tests' included. A parent test
therefore runs named groups of checks in a child (`run_group_in_child`), whose entry point
(`run_checks`) runs each check and reports every failure.

Each child pays ~2.5 s of imports, so the first test to ask runs every group the test modules
registered at import (`register`) in one child, and the others read their result: the
kernel tests take ~10 s instead of ~24 (the CI suite has a five-minute budget).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

Check = tuple[str, Callable[[], None]]


_PATCHED: list[bool] = []


def fix_interpreter_scalars() -> None:
    """triton 3.6's interpreter turns a scalar into an int with int(<array of shape (1,)>),
    which numpy >= 2.4 rejects, so a `range` with tensor bounds fails (triton-lang/triton#9171,
    fixed upstream by squeezing first). Apply that fix here, in the child only."""
    try:
        int(np.zeros(1))
        return
    except TypeError:
        pass
    if _PATCHED:  # once per child: several groups run in one
        return
    _PATCHED.append(True)
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patched


def run_checks(label: str, kernels: Sequence[object], checks: Sequence[Check]) -> int:
    """Child side: assert the kernels really are interpreted, run every check, print the
    failures, return an exit code."""
    from triton.runtime.interpreter import InterpretedFunction

    assert os.environ.get("TRITON_INTERPRET") == "1"
    for kernel in kernels:
        assert isinstance(kernel, InterpretedFunction), "kernels are not interpreted"
    fix_interpreter_scalars()
    failures = []
    for name, check in checks:
        try:
            check()
        except AssertionError as err:
            failures.append(f"FAILED {name}: {err}")
    print("\n".join(failures) or f"{label}: all passed")
    return 1 if failures else 0


Pair = tuple[str, str]
"""(test module, group) whose `run_interpreted(group)` runs in the child."""

_REGISTERED: list[Pair] = []
_RESULTS: dict[Pair, tuple[int, str]] = {}
_SENTINEL = "@@interpreted-results@@"


def register(module: str, groups: Sequence[str]) -> None:
    """Declare a test module's groups at import, so the first child runs them all."""
    for group in groups:
        if (module, group) not in _REGISTERED:
            _REGISTERED.append((module, group))


def run_group_in_child(module: str, group: str) -> None:
    """Parent side: assert `module.run_interpreted(group)` passed in a child with
    TRITON_INTERPRET=1 (run now, with every registered group not yet run, or earlier)."""
    pair = (module, group)
    if pair not in _RESULTS:
        pending = [p for p in _REGISTERED if p not in _RESULTS]
        if pair not in pending:
            pending.append(pair)
        _RESULTS.update(_run_in_child(pending))
    rc, output = _RESULTS[pair]
    assert rc == 0, output


def _run_in_child(pairs: list[Pair]) -> dict[Pair, tuple[int, str]]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = f"from tests.kernels.interpret import child_main; child_main({json.dumps(pairs)!r})"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    head, found, tail = proc.stdout.partition(_SENTINEL)
    if proc.returncode != 0 or not found:
        crash = f"the interpreter child failed (rc {proc.returncode}):\n{head}{proc.stderr[-4000:]}"
        return {p: (1, crash) for p in pairs}
    return {(m, g): (rc, out) for m, g, rc, out in json.loads(tail)}


def child_main(pairs_json: str) -> None:
    """Child entry point: each pair's `run_interpreted(group)` with its output captured; the
    results printed as JSON after a sentinel line."""
    import importlib

    results = []
    for module, group in json.loads(pairs_json):
        run = importlib.import_module(module).run_interpreted
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = run(group)
        results.append((module, group, rc, buf.getvalue()))
    print(_SENTINEL + json.dumps(results))


def expect_refusal(fn: Callable[..., object], args: tuple[object, ...], word: str) -> None:
    """Child side (plain asserts, no pytest): `fn(*args)` raises a ValueError naming `word`."""
    try:
        fn(*args)
    except ValueError as err:
        assert word in str(err), err
    else:
        raise AssertionError(f"no refusal ({word})")
