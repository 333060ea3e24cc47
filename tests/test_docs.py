"""Docs a reader of the repo can follow: code, tests, benchmarks and example specs cite papers by
title and docs/architecture.md (not notes outside the repo), and docs/architecture.md names every
subpackage of dptune."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import dptune

PACKAGE = Path(dptune.__file__).parent
REPO = PACKAGE.parent
ARCHITECTURE = REPO / "docs" / "architecture.md"

#: References a reader of the repo cannot follow: numbered source papers ("paper 000"), the
#: seeds they came from, and the design notes outside the repo.
UNRESOLVABLE = re.compile(r"\b(?i:papers?|seeds?) ?0\d\d\b|\bDESIGN\b")


def unresolvable_references(text: str) -> list[str]:
    """The lines of ``text`` that cite something outside the repo, numbered."""
    return [f"{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if UNRESOLVABLE.search(line)]


def subpackages() -> list[str]:
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


@pytest.mark.parametrize("text", ['"""(paper 000, Thm 5.2)"""', "# DESIGN.md: the default",
                                  '"""DESIGN "RMT denoising" step by step"""', "see Paper 002", "seed 000"])
def test_the_scan_sees_an_unresolvable_reference(text):
    assert unresolvable_references(text)


@pytest.mark.parametrize("text", ['"""C* of "On optimal hyperparameters for DP deep transfer learning", Thm 5.2."""',
                                  "design = 3  # a design matrix", "seed = 0", "(paper 2023)"])
def test_the_scan_leaves_ordinary_text_alone(text):
    assert not unresolvable_references(text)


def sources() -> list[Path]:
    """dptune's modules, the tests (this file aside: it holds examples), benchmarks and example specs."""
    files = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py"),
             *(REPO / "examples").rglob("*.yaml")]
    return sorted(p for p in files if p.resolve() != Path(__file__).resolve())


def test_sources_cite_papers_by_title_and_the_repo_docs():
    files = sources()
    assert PACKAGE / "trainables" / "engine" / "dp_engine.py" in files
    found = {path.relative_to(REPO).as_posix(): refs for path in files
             if (refs := unresolvable_references(path.read_text(encoding="utf-8")))}
    assert not found, ("cite the paper's title or docs/architecture.md (section name) instead:\n"
                       + "\n".join(f"{f}:{r}" for f, refs in found.items() for r in refs))


def test_architecture_doc_names_every_subpackage():
    assert ARCHITECTURE.is_file(), "docs/architecture.md is missing"
    text = ARCHITECTURE.read_text(encoding="utf-8")
    packages = subpackages()
    assert {"privacy", "trainables", "search_spaces", "platform", "analysis"} <= set(packages)
    missing = [p for p in packages if not re.search(rf"\b{p}/", text)]
    assert not missing, f"docs/architecture.md does not describe dptune/{', dptune/'.join(missing)}"


def test_architecture_doc_names_only_modules_that_exist():
    """Every ``package/module.py`` the doc names (not under tests/) is a file of dptune, so a rename
    must update the doc."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w/])((?:privacy|trainables|search_spaces|platform|analysis)/\w+\.py)\b", text))
    assert named, "the doc names no modules"
    missing = sorted(n for n in named if not (PACKAGE / n).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


#: A Sphinx cross-reference in a docstring: ``:mod:`.x```, ``:class:`~dptune.y.Z```, …
CROSS_REFERENCE = re.compile(r":(?:mod|class|func|meth|data|attr):`~?(\.*)([A-Za-z_][\w.]*)`")


def _module_file(path: Path) -> Path | None:
    """The file of the module or package at ``path`` (without its suffix), if there is one."""
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def dangling_references(source: Path) -> list[str]:
    """The cross-references of a module that name no module of dptune, or a name its module does
    not define: resolved as Python resolves an import (relative ones from the module's package),
    the longest prefix that is a module, then at most one name defined in it."""
    found = []
    for match in CROSS_REFERENCE.finditer(source.read_text()):
        dots, parts = match.group(1), match.group(2).split(".")
        if dots:
            base = source.parent
            for _ in range(len(dots) - 1):
                base = base.parent
        elif parts[0] == "dptune":
            base, parts = REPO / "dptune", parts[1:]
            if not parts:
                continue
        else:
            continue   # a name of another library
        # the longest prefix that is a module (the package itself when none is), then the rest
        prefixes = [(parts[:i], _module_file(base.joinpath(*parts[:i]))) for i in range(len(parts), 0, -1)]
        named, module = next(((head, m) for head, m in prefixes if m is not None), ([], _module_file(base)))
        rest = parts[len(named):]
        defined = module is not None and (not rest or re.search(
            rf"^\s*(?:def|class) {rest[0]}\b|^{rest[0]}\s*[:=]|[\"']{rest[0]}[\"']", module.read_text(), re.M))
        if not defined:
            found.append(match.group(0))
    return found


def test_the_reference_scan_finds_a_stale_one(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text("class Engine:\n    pass\n")
    (pkg / "user.py").write_text('"""See :mod:`.engine`, :class:`~.engine.Engine`, :mod:`.gone`, :class:`.engine.Old`."""\n')
    assert dangling_references(pkg / "user.py") == [":mod:`.gone`", ":class:`.engine.Old`"]


def test_docstring_cross_references_name_what_exists():
    """A module moved or renamed leaves no docstring pointing at its old place."""
    found = {str(p.relative_to(PACKAGE)): refs for p in sorted(PACKAGE.rglob("*.py")) if (refs := dangling_references(p))}
    assert not found, found
