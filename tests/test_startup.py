"""Start-up (issue 17): help, query and a warm plan import none of the heavy modules.

Each command runs in a fresh interpreter that prints, at exit, which of torch, transformers, ray,
scipy and matplotlib are in its ``sys.modules`` (a test of imports, not of time).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "ray", "scipy", "matplotlib")
COMMANDS = ("train", "plan", "sweep", "resume", "query", "compact", "heatmap", "report", "optimal-clip")

CHILD = """
import atexit, json, sys
def loaded():
    tops = {m.split('.')[0] for m in sys.modules}
    print('LOADED ' + json.dumps(sorted(tops & set(%r))), file=sys.stderr)
atexit.register(loaded)
from dptune.cli import main
sys.exit(main(sys.argv[1:]))
""" % (HEAVY,)

TINY_SPEC = """
axes: {epsilon: [2], delta: 1.0e-5, backbone: [cnn], dataset: [digits], epochs: [1]}
clip_bound: [1]
batch_size: [32, 64]
learning_rate: {reference: 1.0, reference_batch_size: 64}
pruning: {min_steps: 5}
search: {scheduler: none, proxy: off, transfer: off}
"""


def run_cli(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    line = [l for l in proc.stderr.splitlines() if l.startswith("LOADED ")]
    assert line, proc.stderr[-2000:]
    return proc, json.loads(line[-1][len("LOADED "):])


@pytest.mark.parametrize("args", [("--help",), *[(c, "--help") for c in COMMANDS]], ids=" ".join)
def test_help_imports_nothing_heavy(args):
    proc, heavy = run_cli(*args)
    assert proc.returncode == 0 and "usage: dptune" in proc.stdout
    assert heavy == [], f"`dptune {' '.join(args)}` imported {heavy}"


def test_query_imports_nothing_heavy(tmp_path):
    from dptune.platform.store.results_store import ResultsStore

    ResultsStore(str(tmp_path / "store")).write_trial({"trial_id": "t1", "accuracy": 0.5})
    proc, heavy = run_cli("query", "SELECT count(*) AS n, max(accuracy) AS acc FROM trials",
                          "--store", str(tmp_path / "store"), "--format", "csv")
    assert proc.returncode == 0 and proc.stdout.split() == ["n,acc", "1,0.5"], proc.stderr[-2000:]
    assert heavy == [], f"`dptune query` imported {heavy}"


def test_warm_plan_imports_nothing_heavy(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC)
    env = {"DPTUNE_CACHE_DIR": str(tmp_path / "cache")}
    cold, cold_heavy = run_cli("plan", str(spec), "--quiet", "--workers", "1", env=env)
    assert cold.returncode == 0, cold.stderr[-2000:]
    assert "scipy" in cold_heavy  # the cold plan calibrated σ: the check can fail
    warm, heavy = run_cli("plan", str(spec), "--quiet", "--workers", "1", env=env)
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert warm.stdout == cold.stdout  # the same plan, from the caches
    assert heavy == [], f"a warm `dptune plan` imported {heavy}"


def test_every_lazy_registry_entry_resolves_to_its_implementation():
    """The names the CLI and the spec validate against (no torch) are importable entries: each
    lazy ``module:attr`` resolves to a callable, every norm estimator has an accountant, and the
    embedded datasets' sizes counted from their files are the sizes their loaders build."""
    from dptune.privacy import NORM_ESTIMATORS
    from dptune.trainables import registries
    from dptune.trainables.data.catalog import load_dataset

    for registry in (registries.OPTIMIZERS, registries.CLIP_FNS, registries.NORM_ENGINES, registries.DENOISERS,
                     registries.DENOISE_SCOPES, registries.DIAGNOSTICS, registries.MODELS, registries.INPUT_SPECS,
                     registries.DATASETS, registries.TRAIN_SIZES):
        for name, entry in registry.items():
            assert callable(entry), (registry.kind, name)
    assert callable(registries.MODELS.get("timm:vit_small_patch16_224")) and "nope:x" not in registries.MODELS
    assert set(registries.NORM_ENGINES) == set(NORM_ESTIMATORS)
    for name in registries.EMBEDDED_FILES:
        assert registries.TRAIN_SIZES.get(name)() == len(load_dataset(name).train)


def test_the_sweep_driver_loads_no_torch_before_its_trials():
    """The driver plans, calibrates and starts Ray before any trial: what it imports for that (the
    sweep, its searcher, store callback and trial function) must not load torch, which only the
    trials' processes need (and the driver's store callback, once it reads a first checkpoint)."""
    proc = subprocess.run([sys.executable, "-c", "import sys, dptune.platform.sweep.driver; "
                           "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'timm'}))"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


TRIAL = """
import json, sys
from dptune.schema import TrainConfig
from dptune.trainables.training import Trainer
Trainer(TrainConfig(dataset="mnist5k", model="cnn", batch_size=64, epochs=1, clip_bound=1.0, learning_rate=1.0,
                    epsilon=1.0, seed=0, device="cpu"))
print("LOADED " + json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {"sklearn", "scipy", "transformers"})))
"""


def test_a_warm_trial_on_data_without_sklearn_imports_neither_sklearn_nor_scipy(tmp_path):
    """A trial process's start (each of a sweep's trial workers, and again whenever Ray Tune evicts
    an idle one): building the trainer of an MNIST trial whose σ and ε curve are cached imports
    neither sklearn (≈ 1 s of each start, imported by the HF data module for its stratified splits)
    nor scipy (the accountant's PRV code)."""
    env = {**os.environ, "DPTUNE_CACHE_DIR": str(tmp_path / "cache")}
    loaded = []
    for _ in range(2):   # cold: σ is calibrated (the check can fail); warm: read from the cache
        proc = subprocess.run([sys.executable, "-c", TRIAL], capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        loaded.append(json.loads(proc.stdout.split("LOADED ")[-1]))
    assert "scipy" in loaded[0] and loaded[1] == [], loaded
