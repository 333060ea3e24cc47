"""Start-up (issue 17): help, query and a warm plan import none of the heavy modules.

Each command runs in a fresh interpreter that prints, at exit, which of torch, transformers, ray,
scipy and matplotlib are in its ``sys.modules`` (a test of imports, not of time).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    from dptune.platform.store import ResultsStore

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
    assert "torch" in cold_heavy and "scipy" in cold_heavy  # the cold plan needed both: the check can fail
    warm, heavy = run_cli("plan", str(spec), "--quiet", "--workers", "1", env=env)
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert warm.stdout == cold.stdout  # the same plan, from the caches
    assert heavy == [], f"a warm `dptune plan` imported {heavy}"


def test_snapshot_catalog_matches_the_real_one(tmp_path, monkeypatch):
    """What a warm plan validates against is what the trainables register."""
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path))
    from dptune.platform.catalog import trainables_catalog
    from dptune.platform.plan_catalog import planning_catalog

    real, cold = trainables_catalog(), planning_catalog()
    warm = planning_catalog()  # read back from the file the first call wrote
    assert len(list(Path(tmp_path).glob("catalog-*.json"))) == 1
    for snap in (cold, warm):
        assert sorted(snap.datasets) == sorted(real.datasets)
        assert sorted(snap.backbones) == sorted(real.backbones)
        assert "timm:vit_small_patch16_224" in snap.backbones and "nope:x" not in snap.backbones
        assert {k: list(v) for k, v in snap.options.items()} == {k: list(v) for k, v in real.options.items()}
        assert tuple(snap.train_fields) == tuple(real.train_fields)
    assert warm.dataset_size("digits") == real.dataset_size("digits")
    assert planning_catalog().dataset_size.sizes == {"digits": real.dataset_size("digits")}  # saved


def test_torch_free_names_equal_the_registries():
    from dptune.trainables import names
    from dptune.trainables.clip_factors import CLIP_FNS
    from dptune.trainables.denoise import DEFAULT_KAPPA
    from dptune.trainables.engine import DENOISERS, NORM_ENGINES
    from dptune.trainables.finetuning import PEFT_METHODS
    from dptune.trainables.optimizers import OPTIMIZERS
    from dptune.privacy import NORM_ESTIMATORS

    assert names.OPTIMIZER_NAMES == tuple(OPTIMIZERS)
    assert names.CLIP_FN_NAMES == tuple(CLIP_FNS)
    assert names.NORM_ENGINE_NAMES == tuple(NORM_ENGINES)
    assert set(NORM_ENGINES) == set(NORM_ESTIMATORS)  # every engine has an accountant
    assert names.DENOISER_NAMES == tuple(DENOISERS)
    assert names.PEFT_METHOD_NAMES == tuple(PEFT_METHODS)
    assert names.DEFAULT_KAPPA == DEFAULT_KAPPA
