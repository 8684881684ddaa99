"""Did-you-mean hints for mistyped keys and group options.

A key is looked up level by level in the composed default config (what the YAML lists) and
in the schema (what may be added with `+`); at the first level where it is missing, the
closest name there is suggested (difflib). The hint is appended to the one-line error.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from omniflow.config.schema import OmniflowSpec


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest to `word`, if one is near enough to be a typo of it."""
    found = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return found[0] if found else None


def hint_for_key(key: str, data: dict[str, Any]) -> str:
    """'; did you mean a.b.c?' for a dotted key missing from `data` and the schema, else ''."""
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        listed = set(node) if isinstance(node, dict) else set()
        schema = set(schema_fields(parts[:i], data) or ())
        if part in listed or part in schema:
            node = node.get(part) if isinstance(node, dict) else None
            continue
        # `seed=3`: not "server"; `pipeline.stages.talker.async_scheduling`: under scheduler
        exact = _elsewhere(parts, data) if i == 0 else _below(parts[:i], parts[i:], node)
        if exact:
            return exact
        guess = closest(part, listed | schema)
        if guess is None and i == 0:
            return f"; keys start with one of: {', '.join(sorted(listed))}"
        if guess is None:
            return _not_at(parts[:i], part, listed, data)
        plus = "" if guess in listed else "+"
        return f"; did you mean {plus}{'.'.join([*parts[:i], guess, *parts[i + 1 :]])}?"
    return ""


def _elsewhere(parts: list[str], data: dict[str, Any]) -> str:
    """A key written without its section (`port=9000`, `window_k=4`): the paths of the
    composed config that end with it."""
    tail = tuple(parts)
    found = sorted(".".join(p) for p in _paths(data) if p[-len(tail) :] == tail and p != tail)
    if not found or len(found) > 3:
        return ""
    return f"; did you mean {' or '.join(found)}?"


def _below(parent: list[str], tail: list[str], node: Any) -> str:
    """A key written a level or more too high: the paths under `parent` that end with it."""
    found = sorted(
        ".".join([*parent, *p])
        for p in _paths(node)
        if len(p) > len(tail) and p[-len(tail) :] == tuple(tail)
    )
    return f"; did you mean {' or '.join(found)}?" if 0 < len(found) <= 3 else ""


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> Iterable[tuple[str, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, str(key))
            yield from _paths(value, (*prefix, str(key)))


def _not_at(parent: list[str], part: str, listed: set[str], data: dict[str, Any]) -> str:
    """No name near `part` under `parent`: what is there, when it is a short list (a stage
    the pipeline lacks, a key a generation stage's scheduler does not have)."""
    where = ".".join(parent)
    if parent == ["pipeline", "stages"]:
        name = data.get("pipeline", {}).get("name", "this pipeline")
        return f"; pipeline {name} has no stage {part!r} (its stages: {', '.join(sorted(listed))})"
    keys = sorted(listed | set(schema_fields(parent, data) or ()))
    if not keys or len(keys) > 12:
        return ""
    return f"; {where} has no key {part!r} (its keys: {', '.join(keys)})"


def hint_for_field(key: str, data: dict[str, Any]) -> str:
    """'; did you mean ...?' for a key the schema refuses (it is in `data`, so only the
    schema's names at its level are candidates)."""
    *parent, last = key.split(".")
    fields = schema_fields(parent, data) or ()
    guess = closest(last, fields)
    if guess:
        return f"; did you mean {'.'.join([*parent, guess])}?"
    return _not_at(parent, last, set(fields), data) if parent else _elsewhere([last], data)


OPTION_ALIASES = {"platform": {"gpu": "cuda", "nvidia": "cuda", "cuda0": "cuda"}}
"""Group options people write for another one that spelling would not find (`gpu` is as
close to `npu` as to `cpu`, and nowhere near `cuda`)."""


def hint_for_option(group: str, option: str, search_dirs: Sequence[Path]) -> str:
    """'; did you mean group=option?' for an unknown option of a config group."""
    options = [p.stem for d in search_dirs for p in (d / group).glob("*.yaml")]
    alias = OPTION_ALIASES.get(group, {}).get(option.lower().replace(":", ""))
    guess = alias if alias in options else closest(option, options)
    return f"; did you mean {group}={guess}?" if guess else ""


def schema_fields(path: Sequence[str], data: dict[str, Any]) -> list[str] | None:
    """Field names of the schema model at `path` (dict keys and stage kinds followed through
    the composed `data`), or None where `path` is not a model."""
    annotation: Any = OmniflowSpec
    node: Any = data
    for part in path:
        models = _models_in(annotation)
        if len(models) > 1:  # a discriminated union: pick by the node's `kind`
            kind = node.get("kind") if isinstance(node, dict) else None
            models = [m for m in models if _kind_of(m) == kind]
        if len(models) == 1:
            field = models[0].model_fields.get(part)
            if field is None:
                return None
            annotation = field.annotation
        elif typing.get_origin(_strip(annotation)) is dict:
            annotation = typing.get_args(_strip(annotation))[1]
        else:
            return None
        node = node.get(part) if isinstance(node, dict) else None
    models = _models_in(annotation)
    if len(models) > 1:
        kind = node.get("kind") if isinstance(node, dict) else None
        models = [m for m in models if _kind_of(m) == kind]
    return list(models[0].model_fields) if len(models) == 1 else None


def _strip(annotation: Any) -> Any:
    """The type inside Annotated[...] and Optional[...]."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _strip(args[0])
    return annotation


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _models_in(a)]
    return []


def _kind_of(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    args = typing.get_args(field.annotation) if field is not None else ()
    return args[0] if len(args) == 1 else None
