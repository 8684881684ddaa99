"""VoiceDesign over HTTP on the tiny VoiceDesign model: `task_type: "VoiceDesign"` with the
voice described in `instructions` (as vLLM-Omni's clients send it), and each request that
does not fit a 400 naming the field; the request rules alone (no server) for the models
that design no voice; `synth instructions=` on the same model."""

from __future__ import annotations

import base64
import io
import json
import wave

import httpx
import pytest

from omniflow.config.server import ServerConfig
from omniflow.core.pipeline import PipelineInfo
from omniflow.serve.protocol import SpeechBody
from omniflow.serve.validation import request_errors
from tests.serve.conftest import LiveServer
from tests.serve.fake_pipeline import INFO

MODEL = "qwen3-tts-tiny-voicedesign"
DESCRIPTION = "A warm, low female voice, speaking slowly."


@pytest.fixture(scope="module")
def design():
    with LiveServer("model=qwen3_tts_tiny_voicedesign") as server:
        yield server


def speech(server, **fields) -> httpx.Response:
    body = {"model": MODEL, "input": "Hello there.", "max_new_tokens": 4, "seed": 1, **fields}
    return httpx.post(server.url + "/v1/audio/speech", json=body, timeout=60)


def frames(response: httpx.Response) -> int:
    with wave.open(io.BytesIO(response.content)) as w:
        return w.getnframes()


def test_a_described_voice_is_spoken_and_task_type_defaults_to_the_model_s(design):
    r = speech(design, task_type="VoiceDesign", instructions=DESCRIPTION, ignore_eos=True)
    assert r.status_code == 200, r.text
    assert frames(r) == 4 * 1920
    # the served task is the default (a plain OpenAI body with instructions designs a voice)
    again = speech(design, instructions=DESCRIPTION, ignore_eos=True)
    assert again.status_code == 200 and again.content == r.content  # same seed, same audio


def test_the_voices_endpoint_lists_the_served_task_and_no_preset_voices(design):
    listed = httpx.get(design.url + "/v1/audio/voices", timeout=10).json()
    assert listed["task_types"] == ["VoiceDesign"]
    assert listed["voices"] == []


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({}, "instructions", "needs instructions"),
        ({"instructions": "   "}, "instructions", "needs instructions"),
        ({"instructions": DESCRIPTION, "voice": "vivian"}, "voice", "no preset voices"),
        (
            {"instructions": DESCRIPTION, "ref_audio": base64.b64encode(b"RIFF").decode()},
            "ref_audio",
            "voice-clone field",
        ),
        ({"instructions": DESCRIPTION, "task_type": "CustomVoice"}, "task_type", "not served"),
        ({"instructions": DESCRIPTION, "task_type": "Base"}, "task_type", "voice cloning"),
    ],
)
def test_a_request_that_does_not_fit_is_a_400_naming_the_field(design, fields, param, says):
    r = speech(design, **{"task_type": "VoiceDesign", **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_voice_and_no_description_are_both_reported_at_once(design):
    r = speech(design, task_type="VoiceDesign", voice="ryan")
    error = r.json()["error"]
    assert r.status_code == 400 and error["message"].startswith("2 errors: voice 'ryan'")
    assert "needs instructions" in error["message"]


def _errors(info: PipelineInfo, **fields) -> list[tuple[str | None, str]]:
    body = SpeechBody.model_validate({"model": info.model, "input": "Hello.", **fields})
    return [(e.param, e.message) for e in request_errors(body, info, ServerConfig())]


def test_a_description_on_a_model_that_designs_no_voice_is_refused():
    """VoiceDesign on a CustomVoice or Base model names the task; a style instruction on a
    model without instructions (the 0.6B) names them."""
    design = {"task_type": "VoiceDesign", "instructions": DESCRIPTION}
    for task in ("CustomVoice", "Base"):
        info = PipelineInfo(**{**INFO.__dict__, "task_types": (task,)})
        ((param, message),) = _errors(info, **design)
        assert param == "task_type" and "VoiceDesign model" in message
    small = PipelineInfo(**{**INFO.__dict__, "supports_instructions": False})
    assert [p for p, _ in _errors(small, instructions=DESCRIPTION)] == ["instructions"]


def test_synth_designs_a_voice_and_refuses_a_missing_description(tmp_path, capsys):
    from omniflow.errors import ConfigError
    from omniflow.synth import run_synth

    args = ["model=qwen3_tts_tiny_voicedesign", "platform=cpu", "text=Hi.", "seed=1"]
    out = tmp_path / "d.wav"
    assert run_synth([*args, f"instructions={DESCRIPTION}", f"out={out}"], None) == 0
    assert out.stat().st_size > 44
    with pytest.raises(ConfigError) as exc:
        run_synth([*args, f"out={tmp_path / 'x.wav'}"], None)
    assert exc.value.key == "synth.instructions" and "needs instructions" in exc.value.reason
    with pytest.raises(ConfigError) as exc:
        run_synth([*args, "voice=vivian", "instructions=x", f"out={tmp_path / 'y.wav'}"], None)
    assert exc.value.key == "synth.voice"
    assert not (tmp_path / "x.wav").exists() and not (tmp_path / "y.wav").exists()


def test_a_batch_designs_each_line_s_voice_and_reports_a_line_without_one(tmp_path, capsys):
    from omniflow.synth import run_synth

    lines = tmp_path / "in.jsonl"
    rows = [
        {"id": "a", "text": "Hi.", "instructions": DESCRIPTION, "seed": 1},
        {"id": "b", "text": "Hi."},
    ]
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["model=qwen3_tts_tiny_voicedesign", "platform=cpu", f"texts={lines}"]
    assert run_synth([*args, f"out_dir={tmp_path}"], None) == 1  # a line failed
    assert (tmp_path / "a.wav").stat().st_size > 44 and not (tmp_path / "b.wav").exists()
    assert "line 2: task_type 'VoiceDesign' needs instructions" in capsys.readouterr().err
