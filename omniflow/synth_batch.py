"""`omniflow synth texts=LINES.jsonl out_dir=DIR`: many requests through one pipeline.

Each line is a JSON object: `id` (the file's name), `text`, and optionally `voice`,
`language`, `instructions`, `seed`, `max_new_tokens`, `speed`, `ref_audio` + `ref_text` or
`x_vector_only_mode` (a voice clone on a Base model); the same synth keys given on the
command line (and `ignore_eos`) are every line's defaults. Every line is checked by the
server's request rules before anything is built; a bad line is reported with its number and
the rest go on. Up to `synth.concurrency` requests are in flight at once (the engine batches
them), each file is written to a temporary name and renamed when complete, a file already in
`out_dir` is skipped (a rerun resumes), and Ctrl-C aborts what is in flight and leaves only
complete files.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from omniflow.config.commands import SynthConfig
from omniflow.config.graph import StageGraph
from omniflow.config.schema import OmniflowSpec
from omniflow.core.speech import SpeechRequest
from omniflow.errors import ConfigError, ConfigErrors
from omniflow.serve.encoders import encode_whole
from omniflow.serve.protocol import SpeechBody
from omniflow.serve.speed import stretch
from omniflow.serve.voices import Clone, speech_request

if TYPE_CHECKING:
    import torch

    from omniflow.core.events import AudioEvent
    from omniflow.core.pipeline import Pipeline

LINE_KEYS = {"id", "text", "voice", "language", "instructions", "seed", "max_new_tokens"}
LINE_KEYS |= {"speed", "ref_audio", "ref_text", "x_vector_only_mode"}
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
EXTENSIONS = {"wav": ".wav", "flac": ".flac", "mp3": ".mp3", "opus": ".opus", "pcm": ".pcm"}
ONLY_WITH_TEXTS = ("out_dir", "format", "concurrency")
"""Keys that act only in a batch (null by default; set without `texts`, refused)."""
BATCH_FORMAT = "wav"
BATCH_CONCURRENCY = 8
"""What a batch's null `format` and `concurrency` mean."""


@dataclass(frozen=True)
class Item:
    """One valid line: its number, its file, its request as the server would take it, and
    a voice clone's reference, decoded."""

    line: int
    out: Path
    body: SpeechBody
    reference: torch.Tensor | None = None


def check_batch_keys(s: SynthConfig, given: frozenset[str] = frozenset()) -> None:
    """Batch keys act only with `texts`, and one-request keys only without it, whether set
    to another value or written on the command line (`given`: the synth keys it names) at
    their default; a batch's `out_dir` is made when it does not exist."""
    if s.texts is None:
        errors = [
            ConfigError(f"synth.{key}", "acts only in a batch: set synth.texts=FILE")
            for key in ONLY_WITH_TEXTS
            if getattr(s, key) is not None
        ]
    else:
        errors = [
            ConfigError(f"synth.{key}", "each line of synth.texts has its own; leave it out")
            for key in ("text", "out", "ref_audio", "ref_text")
            if key in given or getattr(s, key) != SynthConfig.model_fields[key].default
        ]
        if s.out_dir is None:
            msg = "a batch (synth.texts) writes its files there; set it"
            errors.insert(0, ConfigError("synth.out_dir", msg))
    if errors:  # every conflict at once
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    if s.texts is None or s.out_dir is None:
        return
    try:  # made here, as `mkdir -p` would, so a path it cannot be is said before the build
        Path(s.out_dir).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError("synth.out_dir", f"{s.out_dir!r} is a file, not a directory") from None
    except OSError as exc:
        raise ConfigError("synth.out_dir", f"{s.out_dir!r}: {exc.strerror}") from None


def read_lines(spec: OmniflowSpec, graph: StageGraph) -> tuple[list[Item], list[str]]:
    """The valid lines of `synth.texts` and one message per bad one (its number first)."""
    from omniflow.build.checks import request_info
    from omniflow.serve.validation import default_voice, request_errors

    s = spec.synth
    assert s.texts is not None and s.out_dir is not None
    try:
        raw = Path(s.texts).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError("synth.texts", f"{s.texts!r}: {exc.strerror}") from None
    info, items, bad, seen = request_info(graph), [], [], set()
    for n, text in enumerate(raw, 1):
        if not text.strip():
            continue
        try:
            obj = _line_object(text)
        except ValueError as exc:
            bad.append(f"line {n}: {exc}")
            continue
        wrong = _id_errors(obj, seen)  # with the request's own, every broken rule at once
        rid = obj.get("id")
        # the served task unless the line clones (as synth's one request: synth.py)
        task, fmt = info.task_types[0], s.format or BATCH_FORMAT
        fields = {"model": info.model, "response_format": fmt, "task_type": task}
        try:
            body = SpeechBody.model_validate(fields | _request_fields(obj, s))
        except ValidationError as exc:
            bad.append(f"line {n}: " + "; ".join([*wrong, _message(exc)]))
            continue
        wrong += [_named(e.param, e.message) for e in request_errors(body, info, spec.server)]
        if wrong:
            bad.append(f"line {n}: " + "; ".join(wrong))
            continue
        if body.task_type != "Base" and body.voice is None:
            body.voice = default_voice(info.voices)
        try:
            reference = _reference(body, graph.model.codec.sample_rate)
        except ValueError as exc:
            bad.append(f"line {n}: ref_audio: {exc}")
            continue
        out = Path(s.out_dir) / (rid + EXTENSIONS[s.format or BATCH_FORMAT])
        items.append(Item(n, out, body, reference))
    return items, bad


def _reference(body: SpeechBody, rate: int) -> torch.Tensor | None:
    """A line's reference recording, read and decoded as the server decodes one."""
    if body.ref_audio is None:
        return None
    from omniflow.serve.reference_audio import ReferenceAudioError, decode_reference

    try:
        raw = Path(body.ref_audio).read_bytes()
    except OSError as exc:
        raise ValueError(f"{body.ref_audio!r}: {exc.strerror}") from None
    try:
        return decode_reference(raw, rate)
    except ReferenceAudioError as exc:
        raise ValueError(f"{body.ref_audio!r} {exc}") from None


def _line_object(text: str) -> dict[str, Any]:
    """The line as a JSON object of known keys (ValueError naming what is wrong)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"not JSON ({exc.msg} at column {exc.colno}); a line is a JSON object"
        ) from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(obj) - LINE_KEYS)
    if unknown:
        missing = " (and no 'id')" if "id" not in obj else ""
        raise ValueError(f"unknown keys {unknown}{missing}; a line takes {sorted(LINE_KEYS)}")
    return obj


def _id_errors(obj: dict[str, Any], seen: set[str]) -> list[str]:
    """What is wrong with the line's `id` (its file's name); a good one joins `seen`."""
    rid = obj.get("id")
    if rid is None:
        return ['no \'id\': each line names its file, e.g. {"id": "n1", "text": ...}']
    if not isinstance(rid, str) or not SAFE_ID.fullmatch(rid):
        return ["id must be a file name: letters, digits, '.', '_', '-' (<= 128)"]
    if rid in seen:
        return [f"id {rid!r} repeats an earlier line's"]
    seen.add(rid)
    return []


def _request_fields(obj: dict[str, Any], s: SynthConfig) -> dict[str, Any]:
    """The line's request: synth's keys as every line's defaults, the line's own winning."""
    defaults = {
        "voice": s.voice,
        "language": s.language,
        "instructions": s.instructions,
        "seed": s.seed,
        "speed": s.speed,
        "max_new_tokens": s.max_new_tokens,
        "ignore_eos": s.ignore_eos,
        "x_vector_only_mode": s.x_vector_only_mode or None,
    }
    fields = {**defaults, **obj, "input": obj.get("text")}
    fields.pop("text", None)
    fields.pop("id", None)
    if "ref_audio" in obj:
        fields["task_type"] = "Base"
    return fields


def _message(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{_field(str(e['loc'][0])) if e['loc'] else 'line'}: {e['msg']}" for e in exc.errors()
        )
    return str(exc)


def _field(name: str) -> str:
    """A request field as a line names it: the line's `text` is the request's `input`."""
    return "text" if name == "input" else name


def _named(param: str | None, message: str) -> str:
    """A server rule's message about `param`, with the field named as the line names it."""
    if param is not None and message.startswith(param + " "):
        return _field(param) + message[len(param) :]
    return message


def run_batch(spec: OmniflowSpec, graph: StageGraph) -> int:
    """Check every line, then generate what is not written yet; the exit status."""
    items, bad = read_lines(spec, graph)
    for message in bad:
        print(f"omniflow synth: {spec.synth.texts}: {message}", file=sys.stderr)
    todo = [i for i in items if not i.out.exists()]
    skipped = len(items) - len(todo)
    if skipped:
        print(f"omniflow synth: {skipped} files already written, skipped", file=sys.stderr)
    if not todo:
        return 1 if bad else 0
    from omniflow.build.pipeline import build_pipeline

    pipeline = build_pipeline(graph)
    pipeline.start()
    try:
        written, failed, audio_s, wall = _generate_all(pipeline, todo, spec.synth)
    except KeyboardInterrupt:
        done = sum(item.out.exists() for item in todo)  # none was there before this run
        print(
            f"omniflow synth: interrupted; {done} of {len(todo)} files written, each whole "
            "(a rerun resumes)",
            file=sys.stderr,
        )
        return 2
    finally:
        pipeline.stop()
    rtf = wall / audio_s if audio_s else float("nan")
    print(
        f"wrote {written} file{'' if written == 1 else 's'} to {spec.synth.out_dir} "
        f"({audio_s:.2f} s of audio), "
        f"{skipped} skipped, {failed + len(bad)} failed; {wall:.2f} s wall, RTF {rtf:.3f}"
    )
    return 1 if failed or bad else 0


def _generate_all(
    pipeline: Pipeline, todo: list[Item], s: SynthConfig
) -> tuple[int, int, float, float]:
    """(files written, requests failed, seconds of audio, seconds of wall time)."""
    events: queue.Queue[AudioEvent] = queue.Queue()
    rate = pipeline.info().sample_rate
    pending, live = list(reversed(todo)), {}
    pcm: dict[str, list[np.ndarray]] = {}
    written = failed = 0
    audio_s, t0 = 0.0, time.monotonic()
    bar = tqdm(total=len(todo), desc="synth", unit=" files", file=sys.stderr, dynamic_ncols=True)
    try:
        with bar, logging_redirect_tqdm():
            while pending or live:
                while pending and len(live) < (s.concurrency or BATCH_CONCURRENCY):
                    item = pending.pop()
                    request = _request(pipeline, item)
                    live[request.request_id] = item
                    pcm[request.request_id] = []
                    pipeline.submit(request, events.put)
                ev = events.get()
                if ev.pcm is not None:
                    pcm[ev.request_id].append(ev.pcm)
                if not ev.finished:
                    continue
                item, parts = live.pop(ev.request_id), pcm.pop(ev.request_id)
                bar.update(1)
                if ev.error is not None or not parts:
                    failed += 1
                    why = ev.error or "no audio"
                    tqdm.write(f"omniflow synth: line {item.line}: failed: {why}", file=sys.stderr)
                    continue
                audio = stretch(np.concatenate(parts), item.body.speed, rate)
                _write(item.out, encode_whole(audio, s.format or BATCH_FORMAT, rate))
                written, audio_s = written + 1, audio_s + audio.size / rate
    finally:
        for rid in live:  # interrupted: nothing half-written stays
            pipeline.abort(rid)
    return written, failed, audio_s, time.monotonic() - t0


def _request(pipeline: Pipeline, item: Item) -> SpeechRequest:
    b = item.body
    clone = None
    if item.reference is not None:
        encoder = pipeline.reference_encoder()
        if encoder is None:  # the line's rules refused a reference on a model without one
            raise RuntimeError(f"line {item.line}: the model has no reference encoders")
        voice = encoder.encode(item.reference)
        clone = Clone.of(voice, b.ref_text, bool(b.x_vector_only_mode))
    return speech_request(b, clone, id_prefix=f"synth-{item.out.stem}")


def _write(out: Path, data: bytes) -> None:
    """`data` to `out` through a temporary name beside it, renamed when complete (with the
    mode a new file gets, as synth's single file)."""
    from omniflow.synth import new_file_mode

    tmp = out.with_name(f".{out.name}.partial")
    try:
        tmp.write_bytes(data)
        os.chmod(tmp, new_file_mode(out))
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
