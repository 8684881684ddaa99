"""What `omniflow synth` checks before it builds anything: the request by the server's own
rules (serve/validation.py, every broken rule at once, from the model config alone), the
voice and language by the prompt builder's, and the reference recording (read, decoded and
resampled as the server does, serve/reference_audio.py, without the server's size limits).
Each broken rule is a `ConfigError` keyed `synth.KEY`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from omniflow.config.commands import SynthConfig
from omniflow.config.compose import compose, override_key
from omniflow.config.graph import StageGraph
from omniflow.config.schema import OmniflowSpec
from omniflow.errors import ConfigError, ConfigErrors
from omniflow.serve.protocol import SpeechBody

T = TypeVar("T")

if TYPE_CHECKING:  # torch loads with the model, after the checks (a mistake fails fast)
    import torch


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


def request_and_reference(
    graph: StageGraph, spec: OmniflowSpec, fmt: str
) -> tuple[SpeechBody, torch.Tensor | None]:
    """`check_request` and `read_reference`, every rule either breaks reported at once (a
    missing ref_text and a ref_audio that does not exist are two lines of one error)."""
    errors: list[ConfigError] = []
    body = reference = None
    try:
        body = check_request(graph, spec, fmt)
    except ConfigErrors as exc:
        errors.extend(exc.errors)
    except ConfigError as exc:
        errors.append(exc)
    try:
        reference = read_reference(spec.synth, graph.model.codec.sample_rate)
    except ConfigError as exc:
        errors.append(exc)
    if errors or body is None:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return body, reference


def compose_synth(
    mapped: list[str], config_dir: str | None
) -> tuple[OmniflowSpec, list[ConfigError]]:
    """The spec, and the schema's refusals of synth's own keys (`seed=abc`, `speed=9`):
    those keys are left at their defaults so that the request's rules still check the rest
    (`voice=nobody`), and `refused_with` reports every error at once."""
    try:
        return compose(mapped, config_dir), []
    except ConfigError as exc:
        refused = exc.errors if isinstance(exc, ConfigErrors) else [exc]
        keys = {e.key for e in refused}
        if not all(k.startswith("synth.") for k in keys):
            raise
        kept = [o for o in mapped if override_key(o) not in keys]
        try:
            return compose(kept, config_dir), refused
        except ConfigError:
            raise exc from None


def refused_with(refused: list[ConfigError], check: Callable[[], T]) -> T:
    """`check()`'s result; with keys refused before (`compose_synth`), its errors and
    theirs at once, less its errors about a refused key or one such a rule reads (checked
    at its default, `max_new_tokens` would make `ignore_eos` look unset)."""
    try:
        result = check()
    except ConfigError as exc:
        found = exc.errors if isinstance(exc, ConfigErrors) else [exc]
        keys = {e.key for e in refused}
        refused = [*refused, *(e for e in found if not _reads_any(e.key, keys))]
    if refused:
        raise _one_or_all(refused)
    return result


def _reads_any(key: str, refused: set[str]) -> bool:
    """Whether a rule's error at synth `key` is about one of the `refused` synth keys, or
    reads one (`validation.READS`, in synth's names)."""
    from omniflow.serve.validation import READS

    if key in refused:
        return True
    fields = [f for f in {*READS, key.removeprefix("synth.")} if _synth_key(f) == key]
    return any(_synth_key(read) in refused for f in fields for read in READS.get(f, ()))
