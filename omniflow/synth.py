"""`omniflow synth text="..." out=hello.wav`: one offline request to an audio file.

Bare keys (`text=`, `out=`, `seed=`, `voice=`, `language=`, `max_new_tokens=`,
`ignore_eos=`, `instructions=`, `speed=`, and for a voice clone on a Base model `ref_audio=FILE`,
`ref_text=`, `x_vector_only_mode=`) are the `synth` section's; any other override configures the
pipeline. The output format follows `out`'s extension and is encoded as the server encodes
whole responses (serve/encoders.py). Everything that can be checked before generating is:
the device, the format, the request by the server's own rules (serve/validation.py, every
broken rule at once, from the model config alone), the memory the build takes on the CPU
(preflight.py), the reference recording (read, decoded and resampled as the server does,
serve/reference_audio.py, without the server's size limits), and the output directory (a
temporary file is created beside `out` first, then renamed over it with the mode a new file
gets, so a Ctrl-C or a failure never leaves half a file or loses the previous one).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import ValidationError
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from omniflow.config.compose import compose
from omniflow.config.graph import StageGraph
from omniflow.config.resolve import build_graph
from omniflow.config.schema import OmniflowSpec, SynthConfig
from omniflow.config.suggest import closest
from omniflow.errors import ConfigError, ConfigErrors
from omniflow.preflight import check_device, check_memory
from omniflow.serve.encoders import encode_whole
from omniflow.serve.protocol import SpeechBody
from omniflow.serve.speed import stretch
from omniflow.serve.voices import Clone, speech_request

if TYPE_CHECKING:  # torch loads with the model, after the checks (a mistake fails fast)
    import torch

_STRING_KEYS = {"text", "out", "voice", "language", "instructions", "ref_audio", "ref_text"}
_STRING_KEYS |= {"texts", "out_dir"}
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
    """The voice-clone reference as mono samples at `rate` (None for a plain request), read
    from its file and decoded as the server decodes one; its fields were checked by the
    server's rules first (`check_request`)."""
    if s.ref_audio is None:
        return None
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


SYNTH_KEYS = {"input": "text", "task_type": "ref_audio"}
"""The speech request's fields that synth names otherwise (a task is asked for by giving
`ref_audio`); every other field is the synth key of the same name."""


def check_request(graph: StageGraph, spec: OmniflowSpec, fmt: str) -> SpeechBody:
    """The server's request rules (serve/validation.py) applied to synth's request, from
    the model config alone (`build/checks.py` `request_info`): every rule it breaks is a
    `ConfigError` keyed `synth.KEY`, all of them reported at once. Returns the request as
    the server would submit it (a CustomVoice request without a voice has the default)."""
    # here, not at the top: the model's facts come from its prompt code, which loads torch
    from omniflow.build.checks import request_info
    from omniflow.serve.errors import ApiError
    from omniflow.serve.request_body import FieldErrors
    from omniflow.serve.validation import (
        default_voice,
        passing_fields,
        request_errors,
        with_rule_errors,
    )

    s = spec.synth
    info = request_info(graph)
    fields = {
        "model": info.model,
        "input": s.text,
        "voice": s.voice,
        "response_format": fmt,
        "instructions": s.instructions,
        "language": s.language,
        "task_type": "Base" if s.ref_audio is not None else info.task_types[0],
        "seed": s.seed,
        "max_new_tokens": s.max_new_tokens,
        "ignore_eos": s.ignore_eos,
        "speed": s.speed,
        "ref_audio": s.ref_audio,
        "ref_text": s.ref_text,
        "x_vector_only_mode": s.x_vector_only_mode or None,
    }
    try:
        body = SpeechBody.model_validate(fields)
    except ValidationError as exc:
        # the schema's refusals and the model's rules on the fields that passed, at once
        schema = [ApiError(400, e["msg"], str(e["loc"][0])) for e in exc.errors()]
        refused = FieldErrors(schema, fields)
        every = with_rule_errors(refused, passing_fields(refused, info), info, spec.server)
        found = every.errors or [every]
        raise _one_or_all([_config_error(e.param, e.message) for e in found]) from None
    errors = request_errors(body, info, spec.server)
    if errors:
        raise _one_or_all([_config_error(e.param, e.message) for e in errors])
    if body.task_type != "Base" and body.voice is None:
        body.voice = default_voice(info.voices)
    return body


def _synth_key(param: str | None) -> str:
    return "synth" if param is None else f"synth.{SYNTH_KEYS.get(param, param)}"


def _config_error(param: str | None, message: str) -> ConfigError:
    """A request rule's error as synth names its key (`input` is `text` here)."""
    if param is not None and param in SYNTH_KEYS and message.startswith(param + " "):
        message = SYNTH_KEYS[param] + message[len(param) :]
    return ConfigError(_synth_key(param), message)


def _one_or_all(errors: list[ConfigError]) -> ConfigError:
    return errors[0] if len(errors) == 1 else ConfigErrors(errors)


def check_request_fields(graph: StageGraph, voice: str | None, s: SynthConfig) -> None:
    """The voice and language against the prompt builder's own rules (the registry's
    `request_check` of each stage that takes the prompt), before the build: a mistyped
    voice is one line and exit status 2 at once, not after the weights load."""
    from omniflow.build.checks import request_check

    for stage in graph.stages.values():
        check = request_check(stage.arch)
        if stage.upstream is None and check is not None:
            try:
                check(graph.model, voice, s.language)
            except ConfigError as exc:
                raise ConfigError(f"synth.{exc.key}", exc.reason) from None


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (kill, timeout, docker stop) ends a synth as Ctrl-C does: the partial output
    removed, one line. Python's default for SIGTERM ends the process at once, leaving the
    temporary file beside `out`. Main thread only (where signal handlers can be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def run_synth(overrides: list[str], config_dir: str | None) -> int:
    with terminate_as_interrupt():
        return _run_synth(overrides, config_dir)


def _run_synth(overrides: list[str], config_dir: str | None) -> int:
    spec = compose(synth_overrides(overrides), config_dir)
    graph = build_graph(spec)
    check_device(graph)
    s = spec.synth
    from omniflow.synth_batch import check_batch_keys, run_batch

    check_batch_keys(s)
    if s.texts is not None:
        check_memory(graph)
        return run_batch(spec, graph)
    fmt = output_format(s.out)
    body = check_request(graph, spec, fmt)
    reference = read_reference(s, graph.model.codec.sample_rate)
    check_request_fields(graph, body.voice if reference is None else None, s)
    check_memory(graph)  # after the request's own, cheaper checks (counting weights is not)
    tmp = reserve(s.out)
    try:
        audio, finish, elapsed, rate = _generate(graph, body, reference)
        audio = stretch(audio, body.speed, rate)
        Path(tmp).write_bytes(encode_whole(audio, fmt, rate))
        os.chmod(tmp, new_file_mode(Path(s.out)))
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


def new_file_mode(out: Path) -> int:
    """The mode `out` gets: an existing file's own (it is replaced, not re-permissioned),
    else what `open` would create it with (0666 less the umask). The temporary file that
    becomes `out` is made 0600 by `mkstemp`, which would otherwise stay."""
    try:
        return stat.S_IMODE(out.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _generate(
    graph: StageGraph, body: SpeechBody, reference: torch.Tensor | None
) -> tuple[np.ndarray, str | None, float, int]:
    """Run the request; (audio, finish reason, seconds of wall time, sample rate)."""
    from omniflow.build.pipeline import build_pipeline
    from omniflow.core.events import AudioEvent

    orch = build_pipeline(graph)
    events: queue.Queue[AudioEvent] = queue.Queue()
    clone = None
    if reference is not None:
        encoder = orch.reference_encoder()
        if encoder is None:  # run_synth refused ref_audio on a model without encoders
            raise RuntimeError(f"model {graph.model.name} built no reference encoders")
        voice = encoder.encode(reference)
        clone = Clone.of(voice, body.ref_text, bool(body.x_vector_only_mode))
    request = speech_request(body, clone, id_prefix="synth")
    rate = orch.info().sample_rate
    total = body.max_new_tokens if body.ignore_eos else None
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
