"""`python -m omniflow synth text="..." out=hello.wav`: one offline request to a WAV file.

Bare keys (`text=`, `out=`, `seed=`, `voice=`, `language=`, `max_new_tokens=`,
`ignore_eos=`) are the `synth` section's; any other override configures the pipeline.
"""

from __future__ import annotations

import queue
import sys
import time

import numpy as np

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.schema import SynthConfig
from omniflow.core.speech import SpeechRequest
from omniflow.serve.encoders import write_wav
from omniflow.stages.build import build_pipeline
from omniflow.stages.orchestrator import AudioEvent

_STRING_KEYS = {"text", "out", "voice", "language", "instructions"}


def synth_overrides(overrides: list[str]) -> list[str]:
    """Map bare synth keys onto `synth.*` (quoting strings, so commas and spaces survive)."""
    mapped = []
    for item in overrides:
        key, sep, value = item.partition("=")
        bare = key.lstrip("+")
        if sep and bare in SynthConfig.model_fields:
            if bare in _STRING_KEYS:
                value = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
            mapped.append(f"synth.{bare}={value}")
        else:
            mapped.append(item)
    return mapped


class Progress:
    """One status line on stderr: rewritten in place on a terminal, else once a second."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def show(self, frames: int, seconds: float, final: bool = False) -> None:
        now = time.monotonic()
        if not final and not self.tty and now - self.last < 1.0:
            return
        self.last = now
        total = f"/{self.total}" if self.total else ""
        line = f"synth: {frames}{total} frames, {seconds:.2f} s of audio"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        if final and self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()


def run_synth(overrides: list[str], config_dir: str | None) -> int:
    spec = compose(synth_overrides(overrides), config_dir)
    graph = build_graph(spec)
    s = spec.synth
    orch = build_pipeline(graph)
    events: queue.Queue[AudioEvent] = queue.Queue()
    request = SpeechRequest.create(
        s.text,
        id_prefix="synth",
        voice=s.voice,
        language=s.language,
        seed=s.seed,
        max_new_tokens=s.max_new_tokens,
        ignore_eos=s.ignore_eos,
        instructions=s.instructions,
    )
    sample_rate = orch.info().sample_rate
    orch.start()
    try:
        try:
            orch.submit(request, events.put)
        except ValueError as exc:
            print(f"omniflow synth: {exc}", file=sys.stderr)
            return 2
        progress = Progress(s.max_new_tokens)
        pcm: list[np.ndarray] = []
        samples = 0
        t0 = time.monotonic()
        while True:
            ev = events.get()
            if ev.pcm is not None:
                pcm.append(ev.pcm)
                samples += ev.pcm.size
            progress.show(ev.frames, samples / sample_rate, final=ev.finished)
            if ev.finished:
                break
        elapsed = time.monotonic() - t0
    finally:
        orch.stop()
    if ev.error is not None:
        print(f"omniflow synth: request failed: {ev.error}", file=sys.stderr)
        return 1
    if not samples:
        print("omniflow synth: the model produced no audio", file=sys.stderr)
        return 1
    audio = np.concatenate(pcm)
    write_wav(s.out, audio, sample_rate)
    seconds = audio.size / sample_rate
    print(
        f"wrote {s.out}: {audio.size} samples ({seconds:.2f} s at {sample_rate} Hz), "
        f"{elapsed:.2f} s wall, RTF {elapsed / seconds:.3f}, finish: {ev.finish_reason}"
    )
    return 0
