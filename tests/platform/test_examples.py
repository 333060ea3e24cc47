"""Every example spec validates against this build and plans offline, and plans what its YAML
says (issue 12, item 5; issue 34): cells, C, B, η and seeds read from the YAML here, independently."""
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from dptune.platform.sweep import spec_sections  # noqa: F401  (registers the platform's sections)
from dptune.platform.sweep.catalog import trainables_catalog
from dptune.search_spaces import load_spec, plan_sweep
from dptune.search_spaces.search_sections import SEARCHED_OPTIONS

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path):
    load_spec(path, trainables_catalog())


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def _sub_cells(trial: dict) -> set:
    """The distinct combinations of the searched trial options (a list of values is searched); the
    denoiser's settings mean nothing without a denoiser, so those combinations are one."""
    searched = {k: v for k, v in trial.items() if isinstance(v, list) and k in SEARCHED_OPTIONS}
    combos = set()
    for values in itertools.product(*searched.values()):
        combo = dict(zip(searched, values))
        if combo.get("denoise", trial.get("denoise")) is None:
            combo = {k: v for k, v in combo.items() if not k.startswith("denoise_")}
        combos.add(tuple(sorted(combo.items())))
    return combos


def _clip_grid(value) -> list[float]:
    if isinstance(value, dict):   # {min, max, num}: log-spaced
        return list(np.geomspace(value["min"], value["max"], value["num"]))
    return [float(c) for c in _listed(value)]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_plans_offline_what_its_yaml_says(path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = path.name
    raw = yaml.safe_load(path.read_text())
    plan = plan_sweep(load_spec(path, trainables_catalog()), trainables_catalog(), strict=False)
    assert plan.num_trials > 0 and not plan.empty_cells
    axes = raw["axes"]
    expected_cells = math.prod(len(_listed(axes.get(k, 1e-5 if k == "delta" else None)))
                               for k in ("epsilon", "delta", "backbone", "dataset", "epochs"))
    assert len(plan.cells) == expected_cells * len(_sub_cells(raw.get("trial", {})))
    assert {float(c.cell.epsilon) for c in plan} == {float(e) for e in _listed(axes["epsilon"])}
    clips, batches = _clip_grid(raw["clip_bound"]), [int(b) for b in _listed(raw["batch_size"])]
    lr = raw["learning_rate"]
    etas = {m: lr["reference"] * m for m in lr.get("multipliers", [1])}
    seeds = set(_listed(raw.get("seeds", [0])))
    drawn_later = raw.get("search", {}).get("algorithm") == "optuna" or raw.get("selection", {}).get("mode") == "private"
    trials = [] if drawn_later else plan.trials()   # Optuna proposes, private selection draws K, as the sweep runs
    for t in trials:
        full_b = t.get("full_batch_size") or t["batch_size"]   # a proxy run stands for a full-scale B
        assert full_b in batches and t["seed"] in seeds, t
        assert any(math.isclose(t["clip_bound"], c, rel_tol=1e-9) for c in clips), t
        assert any(math.isclose(t["learning_rate"], eta * math.sqrt(full_b / lr["reference_batch_size"]),
                                rel_tol=1e-9) for eta in etas.values()), t
    for cell in plan:   # every cell searches some of the spec's batch sizes
        assert cell.searched_batch_sizes and set(cell.searched_batch_sizes) <= set(batches)
    if name == "minilm_bbc_cpu.yaml":   # CPU-sized: a few dozen short trials, two backbones that differ by weights,
        assert plan.num_trials <= 40 and len({c.cell.backbone for c in plan}) == 2   # η searched (issue 33)
        assert len(plan.space.learning_rate.multipliers) >= 3
        assert {c.cell.backbone.label for c in plan} == {"all-MiniLM-L6-v2[lora_rank=8,peft=lora]",
                                                         "all-MiniLM-L6-v2[lora_rank=8,peft=lora,weights=random]"}
    if name in ("smollm2_headlines_cpu.yaml", "llama_long_context_gpu.yaml"):   # language models (issue 35)
        assert (plan.metric, plan.mode) == ("test_nll", "min")
        assert all(t["metric"] == "test_nll" for t in trials)
    if name == "smollm2_headlines_cpu.yaml":   # CPU-sized: a dozen four-step trials of the embedded LM, η searched
        assert len(plan.space.learning_rate.multipliers) >= 3
        assert plan.num_trials <= 12 and {int(r["steps"]) for c in plan for r in c.rows if r["kept"]} == {4}
        assert {c.cell.backbone.name for c in plan} == {"smollm2-135m"} and {c.cell.epsilon for c in plan} == {2, 8}
    if name == "llama_long_context_gpu.yaml":   # exact against Hutchinson (k = 32), 4,096-token contexts
        assert {t["norm_estimator"] for t in trials} == {"exact", "hutchinson"}
        assert {t["sketch_k"] for t in trials if t["norm_estimator"] == "hutchinson"} == {32}
        assert all(dict(c.cell.dataset.options)["max_length"] == 4096 for c in plan)


def test_dptune_plan_sizes_a_dataset_with_options(tmp_path, monkeypatch, capsys):
    """``dptune plan`` (its catalog snapshot) sizes a dataset given with options, cold and warm."""
    import io

    from dptune.cli import main
    from dptune.trainables.data.catalog import load_dataset

    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path / "cache"))
    path = next(p for p in EXAMPLES if p.name == "minilm_bbc_cpu.yaml")
    n = len(load_dataset("bbc_news", max_length=8).train)
    for _ in range(2):
        out = io.StringIO()
        assert main(["plan", str(path), "--quiet", "--workers", "1"], out=out) == 0
        assert f"dataset=bbc_news[max_length=16] (N={n:,})" in out.getvalue()


def test_dptune_plan_refuses_a_bad_backbone_option(tmp_path, monkeypatch, capsys):
    """The plan's catalog snapshot checks axis options with the real builders (one line, before any
    calibration)."""
    import io

    import yaml

    from dptune.cli import main

    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path / "cache"))
    spec = yaml.safe_load(next(p for p in EXAMPLES if p.name == "minilm_bbc_cpu.yaml").read_text())
    spec["axes"]["backbone"][0]["peft"] = "film"            # lora_rank without LoRA
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    for _ in range(2):                                      # cold, then from the snapshot
        assert main(["plan", str(bad), "--quiet"], out=io.StringIO()) != 0
        err = capsys.readouterr().err
        assert "axes.backbone[0]: model 'all-MiniLM-L6-v2': option(s) lora_rank apply only with peft: lora" in err
        assert err.count("\n") == 1
