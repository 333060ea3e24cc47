"""The packages depend on each other one way, and no package imports itself in a circle.

``privacy`` is the root; the trial schema (``schema``) uses only it; ``trainables`` and
``search_spaces`` use both and not each other; only
``platform`` touches Ray, and inside it ``platform.store`` (the files of an experiment) uses neither
the sweep nor the views, the sweep (``platform.sweep``) not the views; ``analysis`` reads the store
and uses ``privacy`` and the search spaces' pure rules. Checked on the source (every import statement, also those inside functions
and under ``TYPE_CHECKING``) and, for what an import really pulls in, in a fresh interpreter.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import dptune

ROOT = Path(dptune.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved; ``from X import y`` gives
    ``X.y`` too, when ``X.y`` is a module of dptune)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names.add(module)
            for a in node.names:
                sub = f"{module}.{a.name}"
                if sub.startswith("dptune.") and (ROOT.parent / Path(*sub.split("."))).with_suffix(".py").exists():
                    names.add(sub)
    return names


def package_files(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    return files


def within(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# package → what none of its files may import (third-party top-level names or dptune modules)
FORBIDDEN = {
    "privacy": {"torch", "ray", "dptune.trainables", "dptune.search_spaces", "dptune.platform",
                "dptune.analysis", "dptune.cli"},
    "schema": {"torch", "ray", "dptune.trainables", "dptune.search_spaces", "dptune.platform", "dptune.analysis",
               "dptune.cli"},
    "search_spaces": {"ray", "dptune.trainables", "dptune.platform", "dptune.analysis", "dptune.cli"},
    "analysis": {"ray", "torch", "dptune.trainables", "dptune.cli"},
    # inside the platform: the store only reads and writes an experiment's files; the sweep runs on
    # Ray and writes the store; the views (status, export, audit) read both, and neither reads them
    "platform/store": {"ray", "torch", "dptune.trainables", "dptune.search_spaces", "dptune.platform.sweep",
                       "dptune.platform.views", "dptune.analysis", "dptune.cli"},
    "platform/sweep": {"dptune.platform.views", "dptune.analysis", "dptune.cli"},
    # inside the trainables: the engine knows neither models nor data; models and data do not know each
    # other (what both need — checkpoints and tokenizers — is trainables/checkpoints.py)
    "trainables/engine": {"dptune.trainables.models", "dptune.trainables.data"},
    "trainables/models": {"dptune.trainables.data"},
    "trainables/data": {"dptune.trainables.models"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_its_layer_allows(package):
    bad = [(path.relative_to(ROOT).as_posix(), name) for path in package_files(package) for name in imports(path)
           if within(name, FORBIDDEN[package])]
    assert not bad, f"dptune.{package} imports across its layer: {bad}"


def test_analysis_uses_only_privacy_the_store_reader_and_pure_search_space_rules():
    allowed = {"dptune.privacy", "dptune.schema", "dptune.search_spaces", "dptune.platform.store.results_store", "dptune.platform.store.layout",
               "dptune.analysis", "dptune.errors", "dptune.registry"}   # the last two: standard library only
    bad = [(path.name, name) for path in package_files("analysis") for name in imports(path)
           if name.startswith("dptune") and not within(name, allowed)]
    assert not bad, bad


def cycles(package: str) -> list[list[str]]:
    """Import cycles among the modules of one package (the package's ``__init__`` left out: it
    imports its modules by design)."""
    prefix = f"dptune.{package}"
    graph = {module_name(p): {n for n in imports(p) if within(n, {prefix}) and n != prefix}
             for p in package_files(package) if p.name != "__init__.py"}
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


@pytest.mark.parametrize("package", ["privacy", "schema", "trainables", "search_spaces", "platform", "analysis"])
def test_no_import_cycles_inside_the_package(package):
    assert cycles(package) == []


def test_the_cycle_check_sees_a_cycle(tmp_path, monkeypatch):
    """The check itself can fail: two modules importing each other (inside functions) are found."""
    fake = tmp_path / "dptune"
    (fake / "pkg").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "pkg" / "__init__.py").write_text("from . import a, b\n")
    (fake / "pkg" / "a.py").write_text("def f():\n    from .b import g\n")
    (fake / "pkg" / "b.py").write_text("from . import a\n")
    monkeypatch.setitem(globals(), "ROOT", fake)
    assert cycles("pkg") == [["dptune.pkg.a", "dptune.pkg.b", "dptune.pkg.a"]]


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_planning_loads_neither_ray_nor_torch_nor_the_trainables():
    loaded = loaded_after("import dptune.search_spaces")
    assert {"ray", "torch", "dptune.trainables", "dptune.platform"}.isdisjoint(loaded), \
        sorted(m for m in loaded if m.split(".")[0] in {"ray", "torch"} or m.startswith(("dptune.trainables",
                                                                                          "dptune.platform")))


def test_accounting_loads_no_torch():
    loaded = loaded_after("import dptune.privacy, dptune.privacy.schedule")
    assert "torch" not in loaded and "ray" not in loaded


def test_the_noise_curves_of_the_analysis_load_no_ray():
    loaded = loaded_after("import dptune.analysis.cumulative_noise")
    assert "ray" not in loaded and not any(m.startswith("dptune.trainables") for m in loaded)


def private_imports(root: Path) -> list[tuple[str, str, str]]:
    """(file, module, name) of every ``from <dptune module> import _name``: a module reaching for
    another module's private helper (a name imported under a private alias is not one)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("dptune")):
                found += [(path.relative_to(root).as_posix(), "." * node.level + (node.module or ""), a.name)
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_helper(tmp_path):
    """Issue 49: a helper two modules share is public in one of them (or in a module of its own)."""
    assert private_imports(ROOT) == []
    (tmp_path / "a.py").write_text("from .b import _helper, public\nfrom .c import d as _d\n")   # the check can fail
    assert private_imports(tmp_path) == [("a.py", ".b", "_helper")]
