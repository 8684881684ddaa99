"""Running Triton kernels on the CPU: the Triton interpreter, in a child process.

Triton reads TRITON_INTERPRET when a kernel is decorated (its own `tl.max`, `tl.cdiv`... are
kernels too), so it must be set before triton is imported; setting it inside the test session
would make every kernel imported later interpreted, the CUDA tests' included. A parent test
therefore runs one named group of checks in a child (`run_group_in_child`), whose entry point
(`run_checks`) runs each check and reports every failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

Check = tuple[str, Callable[[], None]]


def fix_interpreter_scalars() -> None:
    """triton 3.6's interpreter turns a scalar into an int with int(<array of shape (1,)>),
    which numpy >= 2.4 rejects, so a `range` with tensor bounds fails (triton-lang/triton#9171,
    fixed upstream by squeezing first). Apply that fix here, in the child only."""
    try:
        int(np.zeros(1))
        return
    except TypeError:
        pass
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


def run_group_in_child(module: str, group: str) -> None:
    """Parent side: `module.run_interpreted(group)` in a child with TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = f"import sys; from {module} import run_interpreted; sys.exit(run_interpreted({group!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]


def expect_refusal(fn: Callable[..., object], args: tuple[object, ...], word: str) -> None:
    """Child side (plain asserts, no pytest): `fn(*args)` raises a ValueError naming `word`."""
    try:
        fn(*args)
    except ValueError as err:
        assert word in str(err), err
    else:
        raise AssertionError(f"no refusal ({word})")
