"""The speech request's rules (serve/validation.py), the ones `omniflow synth` applies too
(issue 36): a CustomVoice request without a voice gets the one default, ignore_eos needs the
length it fixes, and every rule a request breaks is answered at once."""

from __future__ import annotations

import json

import pytest

from omniflow.config.server import ServerConfig
from omniflow.core.pipeline import PipelineInfo
from omniflow.serve.errors import ApiError, error_body
from omniflow.serve.protocol import SpeechBody
from omniflow.serve.request_body import FieldErrors, parse_body
from omniflow.serve.validation import (
    DEFAULT_VOICE,
    passing_fields,
    request_errors,
    validate,
    with_rule_errors,
)

INFO = PipelineInfo(
    model="m",
    pipeline="p",
    voices=("ryan", "vivian"),
    languages=("auto", "english"),
    sample_rate=24000,
    max_new_tokens=4096,
    supports_instructions=True,
    stages=("talker",),
)
SERVER = ServerConfig()


def body(**fields) -> SpeechBody:
    return SpeechBody.model_validate({"model": "m", "input": "Hello.", **fields})


def test_a_request_without_a_voice_gets_the_default():
    b = body()
    validate(b, INFO, SERVER)
    assert b.voice == DEFAULT_VOICE == "vivian"
    other = PipelineInfo(**{**INFO.__dict__, "voices": ("alice", "bob")})
    b = body()
    validate(b, other, SERVER)
    assert b.voice == "alice"  # a model without vivian: its first speaker


def test_ignore_eos_needs_max_new_tokens():
    with pytest.raises(ApiError) as exc:
        validate(body(ignore_eos=True), INFO, SERVER)
    assert exc.value.param == "ignore_eos" and "needs max_new_tokens" in exc.value.message
    validate(body(ignore_eos=True, max_new_tokens=8), INFO, SERVER)


def test_stream_false_beside_sse_is_refused_and_beside_audio_is_a_whole_response():
    """vLLM-Omni's request model sends `stream: false` and `stream_format: "audio"` by
    default and means a whole file; events cannot be a whole response."""
    with pytest.raises(ApiError) as exc:
        validate(body(stream=False, stream_format="sse"), INFO, SERVER)
    assert exc.value.param == "stream" and "stream is false" in exc.value.message
    whole = body(stream=False, stream_format="audio")
    validate(whole, INFO, SERVER)
    assert not whole.streaming
    for streams in (body(stream_format="audio"), body(stream_format="sse"), body(stream=True)):
        validate(streams, INFO, SERVER)
        assert streams.streaming  # stream left out: stream_format streams


def test_a_task_the_model_does_not_serve_is_refused_alone():
    """On a Base model, task_type CustomVoice is refused as a task; its voice is not also
    checked against preset speakers the model does not serve."""
    base = PipelineInfo(**{**INFO.__dict__, "task_types": ("Base",)})
    errors = request_errors(body(task_type="CustomVoice", voice="voice_1234"), base, SERVER)
    assert [e.param for e in errors] == ["task_type"], [e.message for e in errors]


def test_every_broken_rule_is_reported_at_once():
    b = body(input=" ", voice="nobody", language="klingon", ignore_eos=True)
    params = [e.param for e in request_errors(b, INFO, SERVER)]
    assert params == ["input", "voice", "language", "ignore_eos"]
    with pytest.raises(ApiError) as exc:
        validate(b, INFO, SERVER)
    assert exc.value.status == 400 and exc.value.param == "input"
    assert exc.value.message.startswith("4 errors: input is empty")
    for needle in ("unknown voice 'nobody'", "klingon", "ignore_eos"):
        assert needle in exc.value.message


def all_errors(**fields) -> ApiError:
    """What the speech route answers for a body the schema refuses (routes.py `checked`)."""
    raw = json.dumps({"model": "m", "input": "Hello.", **fields}).encode()
    with pytest.raises(FieldErrors) as exc:
        parse_body(raw, SpeechBody)
    return with_rule_errors(exc.value, passing_fields(exc.value, INFO), INFO, SERVER)


def test_the_schema_s_refusals_come_with_the_model_s_rules():
    err = all_errors(input=" ", language="klingon", seed="7", stream="yes", colour="blue")
    assert [e.param for e in err.errors or []] == ["input", "stream", "language", "seed", "colour"]
    assert err.status == 400 and err.param == "input"
    listed = error_body(err)["error"]["errors"]
    assert [e["field"] for e in listed] == ["input", "stream", "language", "seed", "colour"]
    assert listed[0]["message"].startswith("input is empty")


def test_a_refused_field_hides_only_the_rules_that_read_it():
    """A rule that reads a refused field would judge a default nobody sent: left out."""
    err = all_errors(max_new_tokens="8", ignore_eos=True)  # ignore_eos reads max_new_tokens
    assert [e.param for e in err.errors or []] == ["max_new_tokens"]
    err = all_errors(task_type="Clone", ref_audio="UklGR", voice="nobody")  # both read it
    assert [e.param for e in err.errors or []] == ["task_type"]
    err = all_errors(input=3, language="klingon")  # a refused input: no placeholder's error
    assert [e.param for e in err.errors or []] == ["input", "language"]
    err = all_errors(model=None, voice="nobody")
    assert [e.param for e in err.errors or []] == ["model", "voice"]
