"""The sizes the house keeps (docs/architecture.md): no file of the package over 400 lines,
and docs/performance.md, the current figures and how to measure them again, within 300 (the
dated journal is git history, not this file)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_package_file_over_400_lines():
    sources = sorted((ROOT / "omniflow").rglob("*.py"))
    assert len(sources) > 100  # the package, not an empty glob
    over = {str(p.relative_to(ROOT)): n for p in sources if (n := lines(p)) > 400}
    assert not over, f"split these (one job a file): {over}"


def test_performance_doc_stays_current_figures_only():
    n = lines(ROOT / "docs" / "performance.md")
    assert n <= 300, f"docs/performance.md has {n} lines: move superseded rows to git history"
