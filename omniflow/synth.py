"""`omniflow synth text="..." out=hello.wav`: one offline request to an audio file.

Bare keys (`text=`, `out=`, `seed=`, `voice=`, `language=`, `max_new_tokens=`,
`ignore_eos=`, `instructions=`, and for a voice clone on a Base model `ref_audio=FILE`,
`ref_text=`, `x_vector_only_mode=`) are the `synth` section's; any other override configures the
pipeline. The output format follows `out`'s extension and is encoded as the server encodes
whole responses (serve/encoders.py). Everything that can be checked before generating is:
the device, the format, the reference recording (read, decoded and resampled as the server
does, serve/reference_audio.py, without the server's size limits), and the output directory
(a temporary file is created beside `out` first, then renamed over it, so a Ctrl-C or a
failure never leaves half a file or loses the previous one).
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from omniflow.config.compose import compose
from omniflow.config.graph import StageGraph
from omniflow.config.resolve import build_graph
from omniflow.config.schema import SynthConfig
from omniflow.config.suggest import closest
from omniflow.core.speech import SpeechRequest
from omniflow.errors import ConfigError
from omniflow.preflight import check_device
from omniflow.serve.encoders import encode_whole

if TYPE_CHECKING:  # torch loads with the model, after the checks (a mistake fails fast)
    import torch

_STRING_KEYS = {"text", "out", "voice", "language", "instructions", "ref_audio", "ref_text"}
DEFAULT_VOICE = "vivian"
"""The speaker of a request that names none and is no voice clone."""
FORMATS = {".wav": "wav", ".flac": "flac", ".mp3": "mp3", ".opus": "opus", ".ogg": "opus"}
FORMATS |= {".pcm": "pcm", ".raw": "pcm"}
"""Output extension -> encoding (.ogg holds Opus; .pcm/.raw are headerless s16le)."""


class SynthError(Exception):
    """A synth failure to report in one line: status 2 for what the user asked or did
    (input the model refuses, Ctrl-C), 1 for a generation that failed."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def synth_overrides(overrides: list[str]) -> list[str]:
    """Map bare synth keys onto `synth.*` (quoting strings, so commas and spaces survive).
    A bare key that is neither a synth key nor a config key is refused with the nearest."""
    mapped = []
    top = {"pipeline", "model", "platform", "experiment", "server", "synth", "bench", "hydra"}
    for item in overrides:
        key, sep, value = item.partition("=")
        bare = key.lstrip("+~")
        if sep and bare in SynthConfig.model_fields:
            if bare in _STRING_KEYS:
                value = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
            mapped.append(f"synth.{bare}={value}")
        elif sep and "." not in bare and "/" not in bare and bare not in top:
            guess = closest(bare, [*SynthConfig.model_fields, *top])
            hint = f"; did you mean {guess}?" if guess else ""
            raise ConfigError(bare, f"not a synth key or config group{hint}")
        else:
            mapped.append(item)
    return mapped


def output_format(out: str) -> str:
    """The encoding `out`'s extension names; refused (before generating) when unknown."""
    ext = Path(out).suffix.lower()
    if ext not in FORMATS:
        known = ", ".join(FORMATS)
        raise ConfigError(
            "synth.out", f"{out!r}: cannot write {ext or 'no extension'}; use {known}"
        )
    return FORMATS[ext]


def reserve(out: str) -> Path:
    """A temporary file beside `out` (proves the directory exists and is writable)."""
    path = Path(out)
    if not path.parent.is_dir():
        raise ConfigError("synth.out", f"{out!r}: directory {str(path.parent)!r} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    except OSError as exc:
        raise ConfigError("synth.out", f"{out!r}: cannot write there: {exc.strerror}") from None
    os.close(fd)
    return Path(tmp)


def read_reference(s: SynthConfig, rate: int) -> torch.Tensor | None:
    """The voice-clone reference as mono samples at `rate`, after the field checks the
    server makes (compat.py): None for a plain request."""
    if s.ref_audio is None:
        for key, value in (("ref_text", s.ref_text), ("x_vector_only_mode", s.x_vector_only_mode)):
            if value not in (None, False):
                raise ConfigError(f"synth.{key}", "is a voice-clone key: it needs ref_audio=FILE")
        return None
    if s.voice is not None:
        raise ConfigError("synth.voice", "a voice clone (ref_audio) names no voice")
    if s.instructions:
        raise ConfigError("synth.instructions", "not supported with voice clone (ref_audio)")
    if s.x_vector_only_mode and s.ref_text is not None:
        raise ConfigError("synth.ref_text", "not used with x_vector_only_mode=true")
    if not s.x_vector_only_mode and not (s.ref_text and s.ref_text.strip()):
        raise ConfigError(
            "synth.ref_text", "the reference's transcript is needed (or x_vector_only_mode=true)"
        )
    try:
        raw = Path(s.ref_audio).read_bytes()
    except FileNotFoundError:
        raise ConfigError("synth.ref_audio", f"{s.ref_audio!r} does not exist") from None
    except OSError as exc:
        raise ConfigError("synth.ref_audio", f"{s.ref_audio!r}: {exc.strerror}") from None
    from omniflow.serve.reference_audio import ReferenceAudioError, decode_reference

    try:
        return decode_reference(raw, rate)
    except ReferenceAudioError as exc:
        raise ConfigError("synth.ref_audio", f"{s.ref_audio!r} {exc}") from None


def check_request_fields(graph: StageGraph, voice: str | None, s: SynthConfig) -> None:
    """The voice and language against the model config, before the build (the registry's
    `request_check` of each stage that takes the prompt): a mistyped voice is one line and
    exit status 2 at once, not after the weights load."""
    # here, not at the top: the checks read the model's prompt code, which loads torch
    from omniflow.build.checks import request_check

    for stage in graph.stages.values():
        check = request_check(stage.arch)
        if stage.upstream is None and check is not None:
            try:
                check(graph.model, voice, s.language)
            except ConfigError as exc:
                raise ConfigError(f"synth.{exc.key}", exc.reason) from None


def run_synth(overrides: list[str], config_dir: str | None) -> int:
    spec = compose(synth_overrides(overrides), config_dir)
    graph = build_graph(spec)
    check_device(graph)
    s = spec.synth
    fmt = output_format(s.out)
    if s.ref_audio is not None and graph.model.speaker_encoder is None:
        # the resolve layer's predicate for a CustomVoice model: no encoders are built
        raise ConfigError(
            "synth.ref_audio",
            f"model {graph.model.name} does not support voice cloning (ref_audio needs a Base "
            "model, e.g. model=qwen3_tts_tiny_base)",
        )
    reference = read_reference(s, graph.model.codec.sample_rate)
    check_request_fields(graph, None if reference is not None else s.voice or DEFAULT_VOICE, s)
    tmp = reserve(s.out)
    try:
        audio, finish, elapsed, rate = _generate(graph, s, reference)
        Path(tmp).write_bytes(encode_whole(audio, fmt, rate))
        os.replace(tmp, s.out)
    except SynthError as exc:
        print(f"omniflow synth: {exc}", file=sys.stderr)
        return exc.status
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    seconds = audio.size / rate
    print(
        f"wrote {s.out}: {audio.size} samples ({seconds:.2f} s at {rate} Hz, {fmt}), "
        f"{elapsed:.2f} s wall, RTF {elapsed / seconds:.3f}, finish: {finish}"
    )
    return 0


def _generate(
    graph: StageGraph, s: SynthConfig, reference: torch.Tensor | None
) -> tuple[np.ndarray, str | None, float, int]:
    """Run the request; (audio, finish reason, seconds of wall time, sample rate)."""
    from omniflow.build.pipeline import build_pipeline
    from omniflow.core.events import AudioEvent

    orch = build_pipeline(graph)
    events: queue.Queue[AudioEvent] = queue.Queue()
    embedding = codes = None
    if reference is not None:
        encoder = orch.reference_encoder()
        if encoder is None:  # run_synth refused ref_audio on a model without encoders
            raise RuntimeError(f"model {graph.model.name} built no reference encoders")
        voice = encoder.encode(reference)
        embedding = voice.speaker_embedding
        codes = None if s.x_vector_only_mode else voice.ref_codes
    request = SpeechRequest.create(
        s.text,
        id_prefix="synth",
        voice=s.voice if reference is not None else s.voice or DEFAULT_VOICE,
        language=s.language,
        seed=s.seed,
        max_new_tokens=s.max_new_tokens,
        ignore_eos=s.ignore_eos,
        instructions=s.instructions,
        speaker_embedding=embedding,
        ref_codes=codes,
        ref_text=None if s.x_vector_only_mode else s.ref_text,
    )
    rate = orch.info().sample_rate
    total = s.max_new_tokens if s.ignore_eos else None
    pcm: list[np.ndarray] = []
    orch.start()
    try:
        try:
            orch.submit(request, events.put)
        except ValueError as exc:
            raise SynthError(str(exc)) from None
        t0 = time.monotonic()
        bar = tqdm(total=total, desc="synth", unit=" frames", file=sys.stderr, dynamic_ncols=True)
        with bar, logging_redirect_tqdm():
            try:
                while True:
                    ev = events.get()
                    if ev.pcm is not None:
                        pcm.append(ev.pcm)
                    if ev.frames > bar.n:
                        bar.update(ev.frames - bar.n)
                    if ev.finished:
                        break
            except KeyboardInterrupt:
                raise SynthError(f"interrupted after {bar.n} frames; nothing written") from None
        elapsed = time.monotonic() - t0
    finally:
        orch.stop()
    if ev.error is not None:
        raise SynthError(f"request failed: {ev.error}", status=1)
    if not pcm:
        raise SynthError("the model produced no audio", status=1)
    return np.concatenate(pcm), ev.finish_reason, elapsed, rate
