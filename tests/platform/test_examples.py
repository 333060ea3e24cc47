"""Every example spec validates against this build and plans offline (issue 12, item 5)."""
from pathlib import Path

import pytest

from dptune.platform import spec_sections  # noqa: F401  (registers the platform's sections)
from dptune.platform.catalog import trainables_catalog
from dptune.search_spaces import load_spec, plan_sweep

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path):
    load_spec(path, trainables_catalog())


@pytest.mark.parametrize("name", ["bert_lora_text.yaml", "wrn16_4_scratch.yaml", "minilm_bbc_cpu.yaml"])
def test_example_plans_offline(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = next(p for p in EXAMPLES if p.name == name)
    plan = plan_sweep(load_spec(path, trainables_catalog()), trainables_catalog(), strict=False)
    assert plan.num_trials > 0 and not plan.empty_cells
    if name == "minilm_bbc_cpu.yaml":   # CPU-sized: a few dozen short trials, two backbones that differ by weights,
        assert plan.num_trials <= 40 and len({c.cell.backbone for c in plan}) == 2   # η searched (issue 33)
        assert len(plan.space.learning_rate.multipliers) >= 3
        assert {c.cell.backbone.label for c in plan} == {"all-MiniLM-L6-v2[lora_rank=8,peft=lora]",
                                                         "all-MiniLM-L6-v2[lora_rank=8,peft=lora,weights=random]"}


def test_dptune_plan_sizes_a_dataset_with_options(tmp_path, monkeypatch, capsys):
    """``dptune plan`` (its catalog snapshot) sizes a dataset given with options, cold and warm."""
    import io

    from dptune.cli import main
    from dptune.trainables.data import load_dataset

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
