"""The layering the architecture promises, checked in a fresh interpreter: the HTTP app's
modules and the config layer import nothing of the engine's internals or the models."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from omniflow.build.registry import BUILDERS
from omniflow.core.capabilities import ARCH_CAPABILITIES

INTERNALS = ("omniflow.models", "omniflow.kernels", "omniflow.sched", "omniflow.worker")


def loaded_after(*modules: str) -> set[str]:
    """The modules a fresh interpreter holds after importing `modules`."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(modules)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


def under(loaded: set[str], packages: tuple[str, ...]) -> list[str]:
    inside = tuple(p + "." for p in packages)
    return sorted(m for m in loaded if m in packages or m.startswith(inside))


@pytest.mark.parametrize(
    "module",
    [
        "omniflow.serve.routes",
        "omniflow.serve.streaming",
        "omniflow.serve.validation",
        "omniflow.serve.encoders",
    ],
)
def test_http_app_modules_import_no_engine_internals(module):
    loaded = loaded_after(module)
    assert under(loaded, INTERNALS + ("omniflow.build", "omniflow.engine")) == []


def test_config_layer_imports_no_model_code():
    loaded = loaded_after("omniflow.config.resolve", "omniflow.config.compose")
    # the preset's schema (`models/shapes.py`, pydantic only) is the one models/ module it reads
    assert under(loaded, INTERNALS + ("omniflow.build", "omniflow.engine")) == [
        "omniflow.models",
        "omniflow.models.shapes",
    ]
    assert "torch" not in loaded_after("omniflow.config.resolve")


def test_every_arch_has_capabilities_and_a_builder():
    assert set(BUILDERS) == set(ARCH_CAPABILITIES)


def direct_imports(package: str) -> dict[str, set[str]]:
    """Each module of `package` -> the omniflow packages its own import lines name."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found: dict[str, set[str]] = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[path.name] = {".".join(n.split(".")[:2]) for n in names if n.startswith("omniflow")}
    return found


DEPLOYING = {"omniflow.bench/ray_target.py", "omniflow.bench/target_check.py"}
"""The bench's modules that check and start a `deploy=ray` deployment (its entry points)."""


def test_serve_and_the_bench_app_name_no_engine_internals():
    """They reach a pipeline through core's protocol and the one build entry only."""
    allowed = {
        "omniflow.core",
        "omniflow.config",
        "omniflow.errors",
        "omniflow.logs",
        "omniflow.provenance",  # which build runs: stdlib only
        "omniflow.preflight",
        "omniflow.serve",
        "omniflow.bench",
    }
    for package in ("omniflow.serve", "omniflow.bench"):
        for module, names in direct_imports(package).items():
            extra = names - allowed - {"omniflow.build"}
            if f"{package}/{module}" in DEPLOYING:
                extra -= {"omniflow.deploy"}  # a job under deploy=ray starts the deployment
            assert not extra, f"{package}/{module} imports {sorted(extra)}"
    builders = {
        f"{p}/{m}"
        for p in ("omniflow.serve", "omniflow.bench")
        for m, names in direct_imports(p).items()
        if "omniflow.build" in names
    }
    # the modules that start a server or a job build the pipeline; nothing else does
    assert builders <= {
        "omniflow.serve/run.py",
        "omniflow.bench/target.py",  # a job's in-process server (closed and open loop)
        "omniflow.bench/reuse.py",
    }
