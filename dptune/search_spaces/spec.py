"""The sweep spec: a YAML mapping of named sections, each validated by a registered parser.

A component that owns part of the spec registers its sections here (``register_section``) and,
for rules that span sections, a check (``register_check``); the search-space sections live in
``search_spaces.search_sections`` and the platform adds its own (resources, storage, …) without touching
this file. Unknown sections, unknown keys inside a section and bad values are errors that name
the field and what is allowed; every section is validated, and all errors are reported together,
before anything expensive runs.

Names of datasets and backbones, dataset sizes and the trainer's option values come from the
caller in a :class:`Catalog` (``search_spaces`` must not import ``trainables``).
"""
from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import yaml

from ..errors import NotFound, UserError
from ..registry import Registry


class SpecError(UserError):
    """A sweep spec is invalid; the message names every bad field and what is allowed."""


@dataclass(frozen=True)
class Catalog:
    """What the running code supports, handed to the spec parsers by the caller (CLI, platform).

    ``dataset_size(name, **options)`` returns the training-set size N of a registered dataset
    (q = B/N and T = ⌈E·N/B⌉ depend on it, so it must be the size the trainer will see; the
    dataset's axis options, e.g. ``data_dir``, are passed when set). ``check_trial_option(name,
    value)`` returns a trial option's value if the trainer's own rule for that option accepts it and
    otherwise raises a ValueError with ``option`` and ``allowed`` attributes (the trainer's
    ``OptionError``; an option the trainer does not have is refused the same way); None: trial
    options are not checked. ``check_backbone(name, options)`` / ``check_dataset(name, options)``
    raise a one-line ValueError naming an option the model or dataset builder does not take (None:
    not checked). ``task_of(name)`` is a registered dataset's task (``classification`` or
    ``generation``; None: every dataset is a classification); ``check_pairing(backbone, options,
    dataset)`` raises a one-line ValueError when the backbone cannot learn the dataset's task.
    ``packable``: the backbones packed trials can batch (``search.pack``).
    """

    datasets: Collection[str]
    backbones: Collection[str]
    dataset_size: Callable[..., int]
    check_trial_option: Callable[[str, Any], Any] | None = None
    check_backbone: Callable[[str, dict], None] | None = None
    check_dataset: Callable[[str, dict], None] | None = None
    task_of: Callable[[str], str] | None = None
    check_pairing: Callable[[str, dict, str], None] | None = None
    #: backbones whose layers a pack can batch (packed trials); empty: none
    packable: Collection[str] = ()


Parser = Callable[[Any, Catalog], Any]
Check = Callable[["Spec", Catalog], None]


@dataclass(frozen=True)
class Section:
    """One top-level key of the spec: its parser, whether it is required, and its default."""

    name: str
    parse: Parser
    required: bool
    default: Any
    summary: str


SECTIONS: Registry[Section] = Registry("spec section")
#: Rules spanning sections, by qualified function name, run in registration order.
CHECKS: Registry[Check] = Registry("spec check")


def register_section(name: str, *, required: bool = False, default: Any = None,
                     summary: str = "") -> Callable[[Parser], Parser]:
    """Register ``parse(value, catalog) -> parsed`` for the top-level key ``name``.

    A missing optional section is parsed from ``default`` (so defaults are validated too).
    Parsers raise ``SpecError`` (use the helpers below: they name the field).
    """
    def decorate(parse: Parser) -> Parser:
        SECTIONS.register(name, Section(name, parse, required, default, summary))
        return parse

    return decorate


def register_check(check: Check) -> Check:
    """Register a rule spanning sections; it runs after every section parsed without error."""
    return CHECKS.register(f"{check.__module__}.{check.__qualname__}", check)


@dataclass(frozen=True)
class Spec(Mapping[str, Any]):
    """A validated spec: section name → parsed value (every registered section is present)."""

    sections: Mapping[str, Any]
    source: str | None = None

    def __getitem__(self, name: str) -> Any:
        return self.sections[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.sections)

    def __len__(self) -> int:
        return len(self.sections)


def read_spec_file(path: str | os.PathLike) -> Mapping[str, Any]:
    """Read a YAML spec file into a mapping (errors name the file)."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"spec file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); a sweep "
                        "spec is a YAML text file") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(yaml_error_message(path, text, exc)) from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to read (lists or mappings inside each other thousands of "
                        "levels deep); a sweep spec is a few levels deep") from None
    if not isinstance(raw, Mapping):
        raise SpecError(f"{path}: a sweep spec must be a mapping of sections; got {type(raw).__name__}")
    return raw


def spec_path(value: Any, *, hub_id: bool = False) -> Any:
    """A path in a spec, read against the folder dptune runs in: absolute, ``~`` expanded, so that a
    trial (whose working folder is Ray's) and a resumed sweep read the same file as ``dptune plan``
    did. URIs stay as they are; so does, where a hub id may stand (``hub_id``), a value that is neither
    written as a path (./, ../, ~, /) nor an existing file or folder."""
    if not isinstance(value, str) or not value or len(urlparse(value).scheme) > 1:   # a URI (not C:\\)
        return value
    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return expanded
    if hub_id and not (value.startswith(".") or os.path.exists(expanded)):
        return value
    return os.path.abspath(expanded)


def yaml_error_message(path: str | os.PathLike, text: str, exc: yaml.YAMLError) -> str:
    """``file:line:column: not valid YAML: <problem>``, then the offending line with a caret under
    the column (and the line where the unclosed construct began, when that is another line);
    PyYAML's own text names ``"<unicode string>"`` and runs over several lines."""
    problem_mark, context_mark = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    mark = problem_mark or context_mark
    reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return f"{path}: not valid YAML: {reason}"
    lines = text.splitlines()

    def shown(m) -> str:
        line = lines[m.line] if m.line < len(lines) else ""
        return f"\n  {m.line + 1:>4} | {line}\n       | {' ' * m.column}^"

    message = f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {reason}"
    context = getattr(exc, "context", None)
    if context and problem_mark and context_mark and context_mark.line != problem_mark.line:
        message += f" ({context} that starts on line {context_mark.line + 1})" + shown(context_mark)
    return message + shown(mark)


def load_spec(source: str | os.PathLike | Mapping[str, Any], catalog: Catalog) -> Spec:
    """Validate a spec (a YAML file path or an already-read mapping) against the registered
    sections and checks; raise one ``SpecError`` listing every problem found."""
    name = None if isinstance(source, Mapping) else str(source)
    raw = source if isinstance(source, Mapping) else read_spec_file(source)
    errors = []
    unknown = [key for key in raw if key not in SECTIONS]
    for key in unknown:
        errors.append(unknown_key_message(str(key), key, SECTIONS, noun="section"))
    parsed: dict[str, Any] = {}
    for _, section in SECTIONS.items():
        if section.name not in raw and section.required:
            errors.append(f"{section.name}: required section is missing ({section.summary})")
            continue
        value = raw.get(section.name, section.default)
        try:
            parsed[section.name] = section.parse(value, catalog)
        except SpecError as exc:
            errors.append(str(exc))
    spec = Spec(parsed, name)
    if not errors:
        for _, check in CHECKS.items():
            try:
                check(spec, catalog)
            except SpecError as exc:
                errors.append(str(exc))
    if errors:
        where = f"{name}: " if name else ""
        raise SpecError(where + "; ".join(errors))
    return spec


# --- value helpers: each names the field (a dotted path) in its error ---------------------------

def unknown_key_message(path: str, key: object, allowed: Collection[str], noun: str = "key") -> str:
    """``path: unknown key 'x' (did you mean 'y'?); allowed: …``."""
    close = difflib.get_close_matches(str(key), [str(a) for a in allowed], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{path}: unknown {noun} {str(key)!r}{hint}; allowed: {', '.join(sorted(map(str, allowed)))}"


def mapping(value: Any, path: str, allowed: Collection[str]) -> Mapping[str, Any]:
    """A mapping whose keys are all in ``allowed``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{path}: must be a mapping with keys {', '.join(sorted(allowed))}; "
                        f"got {type(value).__name__} {value!r}")
    for key in value:
        if key not in allowed:
            raise SpecError(unknown_key_message(f"{path}.{key}", key, allowed))
    return value


def number(value: Any, path: str, *, gt: float | None = None, ge: float | None = None,
           lt: float | None = None) -> float:
    """A finite number (numeric strings such as ``1e-5``, which YAML 1.1 reads as text, too)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"{path}: must be a finite number{_bounds(gt, ge, lt)}; got {value!r}")
    if (gt is not None and not value > gt) or (ge is not None and not value >= ge) or \
            (lt is not None and not value < lt):
        raise SpecError(f"{path}: must be a finite number{_bounds(gt, ge, lt)}; got {value!r}")
    return float(value)


def integer(value: Any, path: str, *, ge: int | None = None) -> int:
    """A whole number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if not (isinstance(value, float) and value.is_integer()):
            raise SpecError(f"{path}: must be a whole number{_bounds(None, ge, None)}; got {value!r}")
    if ge is not None and value < ge:
        raise SpecError(f"{path}: must be a whole number{_bounds(None, ge, None)}; got {value!r}")
    return int(value)


def one_or_many(value: Any, path: str, item: Callable[[Any, str], Any]) -> tuple:
    """A scalar or a non-empty list of distinct items, each parsed by ``item(value, path[i])``."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or value is None:
        raise SpecError(f"{path}: must be a value or a non-empty list; got {value!r}")
    parsed = tuple(item(v, f"{path}[{i}]" if isinstance(value, (list, tuple)) else path)
                   for i, v in enumerate(values))
    seen = set()
    for v in parsed:
        key = repr(v)
        if key in seen:
            raise SpecError(f"{path}: duplicate value {v!r}")
        seen.add(key)
    return parsed


def choice(value: Any, path: str, allowed: Sequence[object]) -> Any:
    """One of ``allowed`` (``None`` shows as null)."""
    if value not in allowed:
        shown = ", ".join("null" if a is None else str(a) for a in allowed)
        raise SpecError(f"{path}: must be one of {shown}; got {value!r}")
    return value


def _bounds(gt: float | None, ge: float | None, lt: float | None) -> str:
    parts = [f"> {gt:g}" if gt is not None else "", f">= {ge:g}" if ge is not None else "",
             f"< {lt:g}" if lt is not None else ""]
    text = " and ".join(p for p in parts if p)
    return f" {text}" if text else ""
