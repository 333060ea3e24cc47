"""The JSON Schema of the trial options, derived from :class:`~.trial.TrainConfig`'s declarations.

Editors that read JSON Schema (VS Code's YAML extension, JetBrains IDEs) complete and check a
spec's ``trial`` section from it as it is typed; ``dptune schema`` prints the whole spec's schema
(:mod:`dptune.search_spaces.spec_schema`). The spec's own parser stays the authority: its one-line
errors name the field's path and what is allowed.
"""
from __future__ import annotations

import dataclasses
import typing

from .trial import FIELDS, TrainConfig, names

_TYPES = {float: "number", int: "integer", str: "string", bool: "boolean", list: "array", dict: "object"}


def option_schema(name: str) -> dict:
    """One field's JSON Schema: its type (or its registry's names), default and help text."""
    f = FIELDS[name]
    hint = typing.get_type_hints(TrainConfig)[name]
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
    meta = f.metadata
    choices = meta["choices"]
    if meta["many"]:
        value: dict = {"type": "array", "items": {"enum": list(choices)}}
    elif choices is not None:
        value = {"enum": list(choices)}
    else:
        value = {"type": _TYPES[kinds[0]]}
    if meta["optional"]:
        value = {"anyOf": [value, {"type": "null"}]}
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    value = {**value, "description": meta["help"], "default": default}
    if meta["searched"]:   # a list of values is a search dimension
        return {"anyOf": [value, {"type": "array", "items": value, "minItems": 1}], "description": meta["help"]}
    return value


def trial_section_schema() -> dict:
    """The spec's ``trial`` section: every trial option, nothing else."""
    return {"type": "object", "additionalProperties": False,
            "properties": {name: option_schema(name) for name in names(spec="trial")}}
