"""Which build is running: the commit and a fingerprint of the package's own files.

The fingerprint tells two builds apart where no repository says which commit a copy is (a
GPU machine's copy of the tree, a `git archive` of an older commit): an A/B whose two
servers report the same fingerprint ran one build twice (docs/performance.md, "Two earlier
A/Bs compared a build with itself"). `/health` reports both; benchmark results record them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SOURCES = ("*.py", "*.yaml")
"""The files that make the build: code and the shipped configuration."""


def commit() -> str:
    """The commit under test: OMNIFLOW_COMMIT when set (a GPU machine's copy of the tree may
    carry no repository, or a stale one), else git's HEAD ("" outside a repository or
    without git: a server must start anyway)."""
    if os.environ.get("OMNIFLOW_COMMIT"):
        return os.environ["OMNIFLOW_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=PACKAGE,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):  # no git on this machine: the tree says
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


@functools.cache
def tree_fingerprint(package: Path = PACKAGE) -> str:
    """The first 12 hex digits of a SHA-256 over the package's source files (relative path
    and contents, in path order): equal exactly when the running code and shipped configs
    are. Read once per process: it hashes every source file."""
    digest = hashlib.sha256()
    files = sorted({p for pattern in SOURCES for p in package.rglob(pattern)})
    for path in files:
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build() -> dict[str, str]:
    """What `/health` and benchmark results say of the running build."""
    return {"commit": commit(), "tree": tree_fingerprint()}
