"""One small registry of named entries (models, datasets, mechanisms, clipping functions, …), timm-style.

A :class:`Registry` maps names to entries of one kind, in registration order::

    CLIP_FNS = Registry("clip_fn")

    @CLIP_FNS.register("flat")           # a decorator …
    def flat_clip(norms, clip_bound): ...

    CLIP_FNS.register("auto_s", auto_s)  # … or a call

    CLIP_FNS.get("flat")                 # the entry
    CLIP_FNS.get("flot")                 # ValueError: clip_fn must be one of flat, auto_s; got 'flot'
    list(CLIP_FNS), "flat" in CLIP_FNS   # names, membership (as for a dict)

The ``kind`` is the name of the field the user sets (``clip_fn``, ``norm_estimator``, ``model``),
so the error of an unknown name reads as a message about that field. Registering a second entry
under a taken name is refused. Open-ended families (every timm model, ``timm:<name>``) register a
factory under a prefix: ``get("timm:vit_x")`` is the factory bound to ``"vit_x"``.

An entry can be **lazy** (as transformers' auto mappings are): ``register_lazy("sgd",
"dptune.trainables.engine.optimizers:sgd")`` names the entry by a ``"module:attr"`` string (optionally
with arguments to bind), imported on first :meth:`get`. So a registry's names are known without
importing what implements them: ``dptune --help`` lists the optimizers without loading torch.

Standard library only: every dptune package (``privacy`` included, which has no torch) imports it.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, TypeVar, overload

from .errors import UserError


T = TypeVar("T")


@dataclass(frozen=True)
class Lazy:
    """An entry imported on first use: ``module:attr``, with ``args``/``kwargs`` bound (a partial)."""

    target: str
    args: tuple = ()
    kwargs: tuple = ()

    def resolve(self) -> object:
        module, sep, attr = self.target.partition(":")
        if not sep or not attr:
            raise ValueError(f"a lazy entry is 'module:attr'; got {self.target!r}")
        value = getattr(importlib.import_module(module), attr)
        return functools.partial(value, *self.args, **dict(self.kwargs)) if self.args or self.kwargs else value


class UnknownName(UserError, KeyError):
    """A name that is not registered. A UserError (a user mistake, reported in one line) and a
    KeyError (so ``registry[name]`` behaves as it does for a dict)."""

    __str__ = ValueError.__str__  # KeyError's would quote the message


class Registry(Generic[T]):
    """Named entries of one ``kind``, in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._families: dict[str, Callable[..., object]] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name, entry=None):
        """Register ``entry`` under ``name`` and return it; without ``entry``, a decorator that does.
        A name already taken by another entry is refused (registering the same entry again is not
        an error: a module may be imported twice)."""
        if entry is None:
            return functools.partial(self.register, name)
        _refuse_taken(self.kind, name, self._entries.get(name), entry)
        self._entries[name] = entry
        return entry

    def register_lazy(self, name: str, target: str, *args: object, **kwargs: object) -> None:
        """Register ``"module:attr"`` under ``name``, imported (and bound to ``args``/``kwargs``)
        the first time :meth:`get` asks for it."""
        self.register(name, Lazy(target, args, tuple(sorted(kwargs.items()))))

    def register_family_lazy(self, prefix: str, target: str) -> None:
        """:meth:`register_family` with the factory given as ``"module:attr"``, imported on first use."""
        self.register_family(prefix, Lazy(target))

    def register_family(self, prefix: str, factory: Callable[..., T] | None = None):
        """Register ``factory(rest, …)`` for every name ``prefix:<rest>`` (decorator without ``factory``)."""
        if factory is None:
            return functools.partial(self.register_family, prefix)
        if ":" in prefix:
            raise ValueError(f"{self.kind} family prefix must not contain ':'; got {prefix!r}")
        _refuse_taken(f"{self.kind} family", prefix, self._families.get(prefix), factory)
        self._families[prefix] = factory
        return factory

    def get(self, name: str) -> T:
        """The entry of ``name`` (a family member is its factory bound to the rest of the name);
        an unknown name raises :class:`UnknownName` listing the registered ones."""
        if isinstance(name, str):
            if name in self._entries:
                entry = self._entries[name]
                if isinstance(entry, Lazy):
                    entry = self._entries[name] = entry.resolve()
                return entry
            prefix, sep, rest = name.partition(":")
            if sep and rest and prefix in self._families:
                factory = self._families[prefix]
                if isinstance(factory, Lazy):
                    factory = self._families[prefix] = factory.resolve()
                return functools.partial(factory, rest)  # type: ignore[return-value]
        raise UnknownName(f"{self.kind} must be one of {', '.join(self.choices())}; got {name!r}")

    def names(self) -> tuple[str, ...]:
        """The registered names (families not included), in registration order."""
        return tuple(self._entries)

    def families(self) -> tuple[str, ...]:
        """The registered family prefixes."""
        return tuple(self._families)

    def choices(self) -> tuple[str, ...]:
        """What a user may give: every name, then ``prefix:<name>`` for every family."""
        return self.names() + tuple(f"{p}:<name>" for p in self._families)

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, entry) pairs, lazy entries imported."""
        return iter(tuple((name, self.get(name)) for name in self._entries))

    def copy(self) -> "Registry[T]":
        """An independent registry with the same entries (e.g. for a test that registers more)."""
        other: Registry[T] = Registry(self.kind)
        other._entries, other._families = dict(self._entries), dict(self._families)
        return other

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        """Whether :meth:`get` finds ``name`` (a family member included)."""
        if not isinstance(name, str):
            return False
        prefix, sep, rest = name.partition(":")
        return name in self._entries or bool(sep and rest and prefix in self._families)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.choices())})"


def _refuse_taken(kind: str, name: str, old: object, new: object) -> None:
    if old is not None and old is not new and old != new:
        raise ValueError(f"{kind} {name!r} is already registered (to {_describe(old)})")


def _describe(entry: object) -> str:
    if isinstance(entry, Lazy):
        return entry.target
    fn = entry.func if isinstance(entry, functools.partial) else entry
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


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
        raise UserError(f"{kind} {name!r} does not take option(s) {', '.join(unknown)}"
                         + (f" ({why})" if why else "") + f"; it takes: {', '.join(allowed) or 'none'}")
