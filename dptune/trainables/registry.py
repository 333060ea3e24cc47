"""Lookups shared by the model and dataset registries: ``family:name`` entries and option checks."""
from __future__ import annotations

import functools
import inspect
from typing import Callable


def lookup(name: str, named: dict[str, Callable], families: dict[str, Callable]) -> Callable | None:
    """``named[name]``, or the family entry of ``prefix:rest`` bound to ``rest``; None if neither."""
    if name in named:
        return named[name]
    prefix, sep, rest = name.partition(":")
    return functools.partial(families[prefix], rest) if sep and rest and prefix in families else None


def check_options(kind: str, name: str, fn: Callable, options: dict, *, implicit: tuple[str, ...] = (),
                  why: str = "") -> None:
    """Refuse options that ``fn`` does not take, naming those it does (a typo must not be silently
    ignored). ``implicit`` are arguments the caller always passes; they are not listed. ``why``
    says where the options came from, when not from the user."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(options) - set(params))
    if unknown:
        allowed = sorted(n for n, p in params.items()
                         if n not in implicit and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        raise ValueError(f"{kind} {name!r} does not take option(s) {', '.join(unknown)}"
                         + (f" ({why})" if why else "") + f"; it takes: {', '.join(allowed) or 'none'}")
