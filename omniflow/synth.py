"""`omniflow synth text="..." out=hello.wav`: one offline request to an audio file.

Bare keys (`text=`, `out=`, `seed=`, `voice=`, `language=`, `max_new_tokens=`,
`ignore_eos=`, `instructions=`, `speed=`, and for a voice clone on a Base model `ref_audio=FILE`,
`ref_text=`, `x_vector_only_mode=`) are the `synth` section's; any other override configures the
pipeline. The output format follows `out`'s extension and is encoded as the server encodes
whole responses (serve/encoders.py). Everything that can be checked before generating is:
the device, the format, the request and the reference recording (synth_checks.py, every
broken rule at once), the memory the build takes on the CPU (preflight.py), and the output
directory (a temporary file is created beside `out` first, then renamed over it with the
mode a new file gets, so a Ctrl-C, SIGTERM or a failure never leaves half a file or loses
the previous one).
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
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from omniflow.config.commands import SynthConfig
from omniflow.config.compose import override_key
from omniflow.config.graph import StageGraph
from omniflow.config.resolve import build_graph
from omniflow.config.suggest import closest
from omniflow.errors import ConfigError
from omniflow.preflight import check_device, check_memory
from omniflow.serve.encoders import encode_whole
from omniflow.serve.protocol import SpeechBody
from omniflow.serve.speed import stretch
from omniflow.serve.voices import Clone, speech_request
from omniflow.synth_checks import (
    check_request_fields,
    compose_synth,
    refused_with,
    request_and_reference,
)

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
    if Path(out).is_dir():
        raise ConfigError("synth.out", f"{out!r} is a directory; name the file to write")
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
    mapped = synth_overrides(overrides)
    spec, refused = compose_synth(mapped, config_dir)  # refused: reported with the rest
    graph = build_graph(spec, engine_here=True)  # no server to share the interpreter with
    check_device(graph)
    s = spec.synth
    from omniflow.synth_batch import check_batch_keys, run_batch

    given = {override_key(o).removeprefix("synth.") for o in mapped}
    if s.texts is not None:
        refused_with(refused, lambda: check_batch_keys(s, frozenset(given)))
        check_memory(graph)
        return run_batch(spec, graph)
    check_batch_keys(s, frozenset(given))
    fmt = output_format(s.out)
    body, reference = refused_with(refused, lambda: request_and_reference(graph, spec, fmt))
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
