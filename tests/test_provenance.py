"""Which build is running (`omniflow/provenance.py`): the tree fingerprint tells two copies
of the package apart exactly when their code or shipped configs differ, commit or not."""

from __future__ import annotations

import shutil

from omniflow.provenance import PACKAGE, commit, tree_fingerprint


def test_the_fingerprint_follows_the_code_and_configs_and_nothing_else(tmp_path):
    a = tmp_path / "a" / "omniflow"
    shutil.copytree(PACKAGE, a, ignore=shutil.ignore_patterns("__pycache__"))
    b = tmp_path / "b" / "omniflow"
    shutil.copytree(a, b)
    assert tree_fingerprint(a) == tree_fingerprint(b) == tree_fingerprint(PACKAGE)
    (b / "notes.txt").write_text("not code")  # neither code nor shipped config
    (b / "__pycache__").mkdir(exist_ok=True)
    assert tree_fingerprint.__wrapped__(b) == tree_fingerprint(a)
    (b / "provenance.py").write_text((b / "provenance.py").read_text() + "\n# changed\n")
    assert tree_fingerprint.__wrapped__(b) != tree_fingerprint(a)
    c = tmp_path / "c" / "omniflow"
    shutil.copytree(a, c)
    yaml = next(c.rglob("*.yaml"))
    yaml.write_text(yaml.read_text() + "\n# changed\n")
    assert tree_fingerprint.__wrapped__(c) != tree_fingerprint(a)


def test_the_commit_is_the_environment_s_where_set(monkeypatch):
    monkeypatch.setenv("OMNIFLOW_COMMIT", "abc1234")
    assert commit() == "abc1234"


def test_without_git_or_a_repository_the_commit_is_empty_and_nothing_fails(monkeypatch):
    """A server on a machine without git (or outside a checkout) still starts."""
    monkeypatch.delenv("OMNIFLOW_COMMIT", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # git cannot be found
    assert commit() == ""
