"""The driver's side of a source stage in a Ray actor (`deploy/remote_stage.py`
`RemoteFrontend.make_request`), without a cluster: what the actor's `prepare` raised becomes
the in-process error: invalid input a ValueError (a 400), a stage Ray restarted and the
driver has not started yet `PipelineUnavailable` (a 503)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")  # remote_stage.py imports Ray (no cluster started here)

from ray.exceptions import RayTaskError  # noqa: E402

from omniflow.core.pipeline import PipelineUnavailable  # noqa: E402
from omniflow.deploy.remote_stage import RemoteFrontend  # noqa: E402
from omniflow.deploy.stage_wire import NotStarted, Prepared  # noqa: E402
from tests.factories import speech  # noqa: E402


class Method:
    def remote(self, *args):
        return args


class Actor:
    prepare = Method()


def frontend_raising(monkeypatch, cause: Exception | None) -> RemoteFrontend:
    """A front end whose actor's `prepare` raised `cause` (None: it succeeded)."""

    def get(ref, *args, **kwargs):
        if cause is not None:
            raise RayTaskError("prepare", "a traceback", cause)
        return None

    monkeypatch.setattr(ray, "get", get)
    return RemoteFrontend(Actor(), ("vivian",), ("english",), 100, False)


def test_a_request_made_in_the_actor_is_prepared_there(monkeypatch):
    assert frontend_raising(monkeypatch, None).make_request(speech("a")) == Prepared("a")


def test_invalid_input_in_the_actor_is_a_value_error(monkeypatch):
    front = frontend_raising(monkeypatch, ValueError("unknown voice 'nobody'"))
    with pytest.raises(ValueError, match="^unknown voice 'nobody'$"):
        front.make_request(speech("b"))


def test_a_restarted_actor_not_yet_started_answers_as_a_stage_that_is_down(monkeypatch):
    front = frontend_raising(monkeypatch, NotStarted("stage talker is restarting"))
    with pytest.raises(PipelineUnavailable, match="stage talker is restarting"):
        front.make_request(speech("c"))
