"""`python -m omniflow synth` as a user runs it."""

from __future__ import annotations

import subprocess
import sys
import wave

import numpy as np
import pytest
import soundfile


def synth(tmp_path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "omniflow",
            "synth",
            "pipeline=qwen3_tts",
            "platform=cpu",
            "text=Hello there, this is a test.",
            f"out={tmp_path / name}",
            "seed=7",
            "max_new_tokens=24",
            "ignore_eos=true",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


ARGS = [
    "pipeline=qwen3_tts",
    "platform=cpu",
    "text=Hello there, this is a test.",
    "seed=7",
    "max_new_tokens=24",
    "ignore_eos=true",
]


def test_synth_writes_24_frames_deterministically(tmp_path):
    from omniflow.synth import run_synth

    a = synth(tmp_path, "a.wav")
    assert a.returncode == 0, a.stderr
    assert "synth: 100%" in a.stderr and "24/24" in a.stderr  # the progress bar ran to 24
    with wave.open(str(tmp_path / "a.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == 24 * 1920
    # the same request again (in this process: the command's own code, without a second
    # interpreter start) gives the same bytes
    assert run_synth([*ARGS, f"out={tmp_path / 'b.wav'}"], None) == 0
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_synth_fused_pipeline_and_bad_voice(tmp_path, capsys):
    from omniflow.synth import run_synth

    fused = ["pipeline=qwen3_tts_fused", *ARGS[1:]]
    assert run_synth([*fused, f"out={tmp_path / 'f.wav'}"], None) == 0
    with wave.open(str(tmp_path / "f.wav")) as w:
        assert w.getnframes() == 24 * 1920
    assert list(tmp_path.iterdir()) == [tmp_path / "f.wav"]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("voice", "nobody", "unknown voice 'nobody'"), ("language", "klingon", "unknown language")],
)
def test_synth_refuses_a_voice_or_language_before_building(
    tmp_path, monkeypatch, field, value, says
):
    """Checked against the model config alone: the pipeline is never built (on a GPU a 1.7B
    build takes about a minute), the error names the key, and nothing is written."""
    import omniflow.build.pipeline as build
    from omniflow.errors import ConfigError
    from omniflow.synth import run_synth

    def no_build(*args, **kwargs):
        raise AssertionError("the pipeline was built for a request it must refuse")

    monkeypatch.setattr(build, "build_pipeline", no_build)
    with pytest.raises(ConfigError) as exc:
        run_synth([*ARGS, f"{field}={value}", f"out={tmp_path / 'x.wav'}"], None)
    assert exc.value.key == f"synth.{field}" and says in exc.value.reason
    assert list(tmp_path.iterdir()) == []
    # a preset voice in another case, and a known language, pass the check
    monkeypatch.undo()
    assert (
        run_synth([*ARGS, "voice=Ryan", "language=english", f"out={tmp_path / 'r.wav'}"], None) == 0
    )


def test_synth_reports_the_schemas_and_the_models_errors_at_once(tmp_path):
    """An out-of-range speed (the request schema) and an unknown voice (the served model's
    rule) in one refusal, before anything is built."""
    from omniflow.errors import ConfigErrors
    from omniflow.synth import run_synth

    with pytest.raises(ConfigErrors) as exc:
        run_synth([*ARGS, "speed=9", "voice=nobody", f"out={tmp_path / 'x.wav'}"], None)
    keys = {e.key for e in exc.value.errors}
    assert keys == {"synth.speed", "synth.voice"}
    assert list(tmp_path.iterdir()) == []


def test_synth_cli_says_which_voice_is_unknown(tmp_path):
    r = synth(tmp_path, "x.wav", "voice=nobody")
    assert r.returncode == 2
    assert "invalid configuration: synth.voice: unknown voice 'nobody'; known:" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x.wav").exists()


def test_a_missing_reference_is_refused_before_the_memory_estimate(tmp_path, monkeypatch):
    """The request's own checks (the reference file read here) are cheap; counting the
    weights for the memory estimate is not, so it comes after them."""
    from omniflow import synth as synth_module
    from omniflow.errors import ConfigError

    def counted(graph):
        raise AssertionError("the memory estimate ran before the reference was read")

    monkeypatch.setattr(synth_module, "check_memory", counted)
    args = ["model=qwen3_tts_tiny_base", "platform=cpu", "ref_text=x"]
    args += [f"ref_audio={tmp_path / 'missing.wav'}", f"out={tmp_path / 'x.wav'}"]
    with pytest.raises(ConfigError, match="does not exist"):
        synth_module.run_synth(args, None)


@pytest.mark.parametrize(
    ("ext", "container", "subtype"),
    [("flac", "FLAC", "PCM_16"), ("mp3", "MP3", "MPEG_LAYER_III"), ("opus", "OGG", "OPUS")],
)
def test_synth_writes_the_format_its_extension_names(tmp_path, capsys, ext, container, subtype):
    """Never a WAV under another name: the file is what its extension says."""
    from omniflow.synth import run_synth

    out = tmp_path / f"x.{ext}"
    args = ["platform=cpu", "text=Hi.", f"out={out}", "max_new_tokens=6", "ignore_eos=true"]
    assert run_synth(args, None) == 0
    info = soundfile.info(str(out))
    assert (info.format, info.subtype, info.samplerate) == (container, subtype, 24000)
    assert abs(info.frames - 6 * 1920) <= 2 * 1152  # mp3/opus add encoder padding
    assert f", {ext}), " in capsys.readouterr().out  # the summary names the format
    assert [p.name for p in tmp_path.iterdir()] == [f"x.{ext}"]  # no temporary file left


def reference_wav(path, rate: int = 16000) -> str:
    t = np.arange(rate) / rate
    soundfile.write(path, (0.4 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), rate)
    return str(path)


def test_synth_clones_a_voice_from_a_reference_file(tmp_path, monkeypatch):
    """ref_audio=FILE on the tiny Base model: the file is read, resampled (16 kHz here) and
    encoded; in context and x-vector only both write audio, and differ."""
    from omniflow.synth import run_synth

    ref = reference_wav(tmp_path / "ref.wav")
    base = ["model=qwen3_tts_tiny_base", *ARGS[1:], f"ref_audio={ref}"]
    assert run_synth([*base, "ref_text=A low hum.", f"out={tmp_path / 'icl.wav'}"], None) == 0
    xvec = [*base, "x_vector_only_mode=true", f"out={tmp_path / 'x.wav'}"]
    assert run_synth(xvec, None) == 0
    icl_audio, rate = soundfile.read(tmp_path / "icl.wav")
    x_audio, _ = soundfile.read(tmp_path / "x.wav")
    assert rate == 24000 and icl_audio.shape == x_audio.shape == (24 * 1920,)
    assert not np.array_equal(icl_audio, x_audio)
    # A CustomVoice model has no encoders: refused before anything is built (its key named,
    # ahead of the transcript a clone would need), nothing written.
    import omniflow.build.pipeline as build
    from omniflow.errors import ConfigError

    def no_build(*args, **kwargs):
        raise AssertionError("the pipeline was built for a request it must refuse")

    monkeypatch.setattr(build, "build_pipeline", no_build)
    for extra in (["ref_text=x"], []):
        custom = [*ARGS, f"ref_audio={ref}", *extra, f"out={tmp_path / 'c.wav'}"]
        with pytest.raises(ConfigError) as exc:
            run_synth(custom, None)
        assert exc.value.key == "synth.ref_audio"
        assert "does not support voice cloning" in exc.value.reason
    assert not (tmp_path / "c.wav").exists()


def test_synth_help_names_every_extension_synth_takes():
    """`omniflow synth --help` lists the formats out's extension picks (`synth.FORMATS`)."""
    from omniflow.cli_help import command_help
    from omniflow.synth import FORMATS

    head = command_help("synth", None).split("keys")[0]
    assert FORMATS and all(ext in head for ext in FORMATS), head


def test_a_speed_out_of_range_is_reported_with_the_other_key_errors(capsys):
    """Checked by the schema with the rest (it was checked after them, by the request's
    rules, so a seed's type error hid it); the keys the schema refused are left at their
    defaults while the model's rules check the others, so all three come at once."""
    from omniflow import cli

    assert cli.main(["synth", "text=Hi", "speed=9", "seed=abc", "voice=nobody"]) == 2
    err = capsys.readouterr().err
    assert "3 configuration errors" in err and "synth.speed:" in err and "synth.seed:" in err
    assert "synth.voice: unknown voice 'nobody'" in err  # the served model's rule, too


def test_a_rule_reading_a_refused_key_is_not_reported_against_its_default(capsys):
    """`max_new_tokens=0` refused, `ignore_eos=true` must not read "needs max_new_tokens" as
    if none were given (the refused key sits at its default for the other rules)."""
    from omniflow import cli

    assert cli.main(["synth", "ignore_eos=true", "max_new_tokens=0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "synth.max_new_tokens:" in err, err
    assert cli.main(["synth", "ignore_eos=true", "max_new_tokens=abc", "voice=nobody"]) == 2
    err = capsys.readouterr().err
    assert "2 configuration errors" in err and "synth.voice:" in err and "ignore_eos" not in err
