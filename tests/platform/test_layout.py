"""The one storage layout: ExperimentPaths from (storage, name), from a root, from a --store argument;
and no other module of dptune rebuilds it."""
import ast
import os
import types
from pathlib import Path

import pyarrow.fs as pafs
import pytest

import dptune
from dptune.platform.store import layout
from dptune.platform.store.layout import (DEFAULT_EXPERIMENT, DEFAULT_STORAGE, REMOTE_ANALYSIS, ExperimentPaths, absolute,
                                    is_uri)
from dptune.platform.store.results_store import ResultsStore


def test_local_experiment_paths():
    paths = ExperimentPaths.of("/data/results/", "exp1")
    assert paths == ExperimentPaths("/data/results/exp1")
    assert (paths.root, paths.store, paths.analysis, paths.settings) == (
        "/data/results/exp1", "/data/results/exp1/store", "/data/results/exp1/analysis",
        "/data/results/exp1/dptune_settings.json")
    assert paths.name == "exp1" and not paths.is_uri and paths.figures == paths.analysis
    fs, root = paths.filesystem()
    assert isinstance(fs, pafs.LocalFileSystem) and root == "/data/results/exp1"


def test_relative_paths_become_absolute_for_ray(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = ExperimentPaths.of("./results", "exp").absolute()
    assert paths.root == str(tmp_path / "results" / "exp")
    assert paths.store == str(tmp_path / "results" / "exp" / "store")
    assert ExperimentPaths.of("results", "exp").figures == str(tmp_path / "results" / "exp" / "analysis")
    assert absolute("~/x") == os.path.join(os.path.expanduser("~"), "x")


@pytest.mark.parametrize("storage", ["s3://bucket/prefix", "s3://bucket/prefix/", "gs://bucket/prefix"])
def test_uri_experiment_paths(storage, monkeypatch):
    paths = ExperimentPaths.of(storage, "exp")
    scheme = storage.split("://")[0]
    assert paths.root == f"{scheme}://bucket/prefix/exp" and paths.store == f"{scheme}://bucket/prefix/exp/store"
    assert paths.analysis == f"{scheme}://bucket/prefix/exp/analysis" and paths.name == "exp"
    assert paths.is_uri and is_uri(storage) and absolute(storage) == storage
    assert paths.absolute() == paths  # a URI is never made a local path
    assert paths.figures == REMOTE_ANALYSIS  # figures are written with local file APIs
    seen = []
    fake = types.SimpleNamespace(FileSystem=types.SimpleNamespace(
        from_uri=lambda uri: seen.append(uri) or ("remote-fs", uri.split("://", 1)[1])))
    monkeypatch.setattr(layout, "pafs", fake)
    assert paths.filesystem() == ("remote-fs", "bucket/prefix/exp") and seen == [paths.root]


def test_file_uri_uses_the_local_filesystem(tmp_path):
    fs, root = ExperimentPaths.of(f"file://{tmp_path}", "exp").filesystem()
    assert isinstance(fs, pafs.LocalFileSystem) and root == f"{tmp_path}/exp"


def test_the_defaults_are_the_documented_ones():
    from dptune.platform.sweep.launcher import RunSettings
    from dptune.platform.store.query import DEFAULT_STORE

    assert DEFAULT_STORAGE == "./dptune-results" and DEFAULT_EXPERIMENT == "default"
    assert DEFAULT_STORE == "./dptune-results/default/store"
    settings = RunSettings(experiment="e", storage="/r")
    assert settings.paths == ExperimentPaths("/r/e") and RunSettings().storage == DEFAULT_STORAGE


@pytest.fixture
def experiment(tmp_path):
    ResultsStore(str(tmp_path / "exp" / "store"))
    return tmp_path / "exp"


def test_store_argument_as_an_experiment_root_or_a_store_folder(experiment):
    expected = ExperimentPaths(str(experiment))
    assert ExperimentPaths.find(str(experiment)) == expected
    assert ExperimentPaths.find(str(experiment) + "/") == expected
    assert ExperimentPaths.find(str(experiment / "store")) == expected
    assert ExperimentPaths.find(f"file://{experiment}").store == f"file://{experiment}/store"


def test_store_argument_as_a_store_folder_of_another_name(tmp_path):
    ResultsStore(str(tmp_path / "mine"))
    paths = ExperimentPaths.find(str(tmp_path / "mine"))
    assert paths.store == str(tmp_path / "mine") and paths.root == str(tmp_path)
    assert paths.figures == str(tmp_path / "analysis")  # beside the store, as before


def test_store_argument_that_holds_no_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results store at .*run `dptune sweep` first"):
        ExperimentPaths.find(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no results store"):
        ExperimentPaths.find(str(tmp_path))


def test_a_remote_store_argument_is_taken_as_given(monkeypatch):
    fake_fs = types.SimpleNamespace(get_file_info=lambda p: types.SimpleNamespace(type=pafs.FileType.NotFound))
    monkeypatch.setattr(layout, "filesystem", lambda path: (fake_fs, path))
    paths = ExperimentPaths.find("s3://bucket/results/exp/store")
    assert paths.store == "s3://bucket/results/exp/store" and paths.root == "s3://bucket/results/exp"


# -- nothing outside layout.py rebuilds the layout ------------------------------------------------------------

PACKAGE = Path(dptune.__file__).parent
LAYOUT = PACKAGE / "platform" / "store" / "layout.py"
#: String constants that belong to the layout: a URI test, the default storage, the folder names.
FORBIDDEN = ("://", "dptune-results", "dptune-analysis", "dptune_settings.json", "store", "analysis")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def layout_literals(source: str) -> list[str]:
    """The string constants of ``source`` (docstrings aside) that rebuild the storage layout."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            if (text in FORBIDDEN or "dptune-results" in text or "dptune-analysis" in text
                    or text.rstrip("/").endswith(("/store", "/analysis"))):
                found.append(text)
    return found


def test_the_scan_catches_the_old_copies():
    assert layout_literals('if "://" in path: pass') == ["://"]
    assert layout_literals('x = "./dptune-results"') == ["./dptune-results"]
    assert layout_literals('x = f"{root}/store"\ny = os.path.join(p, "store")') == ["/store", "store"]
    assert layout_literals('"""Docs may name ./dptune-results/default/store."""') == []


def test_no_module_but_layout_rebuilds_the_storage_layout():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != LAYOUT:
            found = layout_literals(path.read_text())
            if found:
                offenders[str(path.relative_to(PACKAGE))] = found
    assert not offenders, f"use dptune.platform.store.layout instead: {offenders}"
