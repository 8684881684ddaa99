"""The `deploy` config group (no Ray needed): local by default, ray's keys validated and
printed resolved by `omniflow config deploy=ray`, each mistake one line and exit 2, and
`serve deploy=ray` without Ray refused before anything is built."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from omniflow import cli
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.deploy.preflight import check_ingress
from omniflow.deploy.settings import resolve_deploy
from omniflow.errors import ConfigError


def test_local_is_the_default_and_prints_nothing_new(capsys):
    assert compose([]).deploy.name == "local"
    assert cli.main(["config", "platform=cpu"]) == 0
    assert "deploy" not in yaml.safe_load(capsys.readouterr().out)


def test_config_prints_ray_resolved(capsys):
    argv = ["config", "platform=cpu", "deploy=ray", "deploy.replicas=3"]
    assert cli.main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["deploy"]
    assert printed == {
        "name": "ray",
        "replicas": 3,
        "resources_per_replica": {"CPU": 1.0},
        "address": None,
        "router": "least_loaded",
    }


@pytest.mark.parametrize(
    ("overrides", "resources"),
    [
        (["platform=cpu"], {"CPU": 1.0}),
        (["platform=cuda"], {"GPU": 1.0}),
        (["platform=cuda", "deploy.resources_per_replica={GPU:0.5,CPU:2}"], {"GPU": 0.5, "CPU": 2}),
        (["platform=cpu", "deploy.resources_per_replica={CPU:2,memory:1e9}"], None),
    ],
)
def test_resources_default_by_platform(overrides, resources):
    spec = compose(["deploy=ray", *overrides])
    deploy = resolve_deploy(spec.deploy, build_graph(spec))
    assert deploy.resources_per_replica == (resources or spec.deploy.resources_per_replica)


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["deploy=ray", "deploy.replicas=0"], "deploy.replicas", "greater than or equal to 1"),
        (["deploy=ray", "deploy.replicas=two"], "deploy.replicas", "integer"),
        (["deploy=ray", "deploy.address=localhost"], "deploy.address", "ray://host:port"),
        (["deploy=ray", "deploy.address=ray://head:10001"], None, None),
        (["deploy=ray", "deploy.resources_per_replica={CPU:-1}"], "resources_per_replica", "neg"),
        (["deploy=ray", "deploy.resources_per_replica={CPU:0}"], "resources_per_replica", "holds"),
        (["deploy=ray", "deploy.resources_per_replica={GPU:1}"], "resources_per_replica", "cpu"),
        (["deploy.replicas=2"], "deploy.replicas", "only with deploy=ray"),
        (["deploy.address=auto"], "deploy.address", "only with deploy=ray"),
        (["deploy=ray", "deploy.router=random"], "deploy.router", "'least_loaded' or 'default'"),
        (["deploy=ray", "deploy.router=default"], None, None),
        (["deploy.router=default"], "deploy.router", "only with deploy=ray"),
        (["deploy=ray", "deploy.replica=2"], "deploy.replica", "did you mean deploy.replicas"),
        (["deploy=kubernetes"], "", "Available options in 'deploy': local ray"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(capsys, overrides, key, words):
    code = cli.main(["config", "platform=cpu", *overrides])
    err = capsys.readouterr().err
    if key is None:
        assert code == 0, err
        return
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert key in err and words in err


def test_serve_without_ray_is_one_line_before_any_build(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    monkeypatch.setattr("omniflow.preflight.check_memory", _must_not_run)
    code = cli.main(["serve", "platform=cpu", "deploy=ray", "server.port=1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "deploy: deploy=ray needs Ray Serve" in err and 'pip install "omniflow[ray]"' in err


def test_serve_refuses_more_replicas_than_a_local_cluster_has(capsys, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("omniflow.deploy.preflight.require_ray", lambda: None)  # CI: no Ray
    code = cli.main(["serve", "platform=cpu", "deploy=ray", "deploy.replicas=3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "deploy.replicas: 3 replicas x CPU: 1 = 3 CPUs, and this machine has 2" in err


def test_serve_refuses_the_custom_router_beside_ray_serves_haproxy(capsys, monkeypatch):
    """Ray refuses a custom router with its HAProxy ingress only once the deployment starts,
    as a traceback (docs/deploy.md): one line naming deploy.router instead, before any
    build; with deploy.router=default the check lets it through."""
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    monkeypatch.setattr("omniflow.deploy.preflight.require_ray", lambda: None)  # CI: no Ray
    monkeypatch.setattr("omniflow.preflight.check_memory", _must_not_run)
    code = cli.main(["serve", "platform=cpu", "deploy=ray", "server.port=1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "deploy.router: RAY_SERVE_ENABLE_HA_PROXY=1 is set" in err
    assert "deploy.router=default" in err
    spec = compose(["platform=cpu", "deploy=ray", "deploy.router=default"])
    check_ingress(resolve_deploy(spec.deploy, build_graph(spec)))  # no error


def _must_not_run(*_):
    raise AssertionError("built or checked beyond the deploy check")


def test_schema_error_is_a_config_error():
    with pytest.raises(ConfigError, match="deploy.replicas"):
        compose(["deploy=ray", "deploy.replicas=-3"])


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["synth", "deploy=ray"], "deploy: does not act in `omniflow synth`"),
        (["synth", "deploy.replicas=2"], "deploy.replicas: does not act in `omniflow synth`"),
    ],
)
def test_commands_that_run_their_own_pipeline_refuse_deploy_ray(capsys, argv, words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


# every key `omniflow config deploy=ray` prints -> (file under omniflow/ that reads it, field)
DEPLOY_READ = {
    "deploy.name": ("cli.py", "name"),
    "deploy.replicas": ("deploy/launch.py", "replicas"),
    "deploy.resources_per_replica": ("deploy/launch.py", "resources_per_replica"),
    "deploy.address": ("deploy/launch.py", "address"),
    "deploy.router": ("deploy/launch.py", "router"),
}


def test_every_printed_deploy_key_is_read(capsys):
    assert cli.main(["config", "platform=cpu", "deploy=ray"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["deploy"]
    assert {f"deploy.{k}" for k in printed} == set(DEPLOY_READ)
    root = Path(cli.__file__).parent
    for key, (where, field) in DEPLOY_READ.items():
        assert re.search(rf"\.{field}\b", (root / where).read_text()), key
