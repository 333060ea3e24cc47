"""`dptune plan SPEC`: tables per cell on the example spec; bad specs are one-line errors."""
import io
from pathlib import Path

from dptune.cli import EXIT_OK, EXIT_USAGE, main
from dptune.platform.sweep.catalog import trainables_catalog
from dptune.search_spaces import batch_plan, load_spec, plan_sweep

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_small.yaml"


def test_plan_prints_a_table_per_cell_and_the_totals():
    buf = io.StringIO()
    assert main(["plan", str(EXAMPLE), "--quiet"], out=buf) == EXIT_OK
    text = buf.getvalue()
    assert text.count("\ncell ") == 4 and "cell 4/4" in text
    assert text.count("B         q        T         σ       σ√T  kept/reason") == 4
    for reason in ("off_plateau", "min_steps", "kept *"):
        assert reason in text
    assert "Nothing was launched." in text
    catalog = trainables_catalog()
    plan = plan_sweep(load_spec(EXAMPLE, catalog), catalog, workers=1)
    assert f"total: {plan.num_trials} trials" in text
    # the ε = 1, B = 64 row shows the σ and σ√T of batch_plan (digits: N = 1437, E = 5)
    row = batch_plan(1.0, 1e-5, 1437, 5, [64]).iloc[0]
    line = next(ln for ln in text.splitlines() if ln.split()[:1] == ["64"])
    fields = line.split()
    assert fields[:5] == ["64", f"{64 / 1437:.4g}", str(row.steps), f"{row.noise_multiplier:.4f}",
                          f"{row.noise_sqrt_steps:.2f}"]


def test_plan_without_a_spec_plans_the_embedded_default():
    """Issue 33, item 7: `dptune plan` plans what `dptune sweep` runs when given no SPEC."""
    from dptune.platform.store.layout import DEFAULT_SPEC

    buf = io.StringIO()
    assert main(["plan", "--quiet"], out=buf) == EXIT_OK
    text = buf.getvalue()
    assert text.startswith(f"Sweep plan for {DEFAULT_SPEC}:")
    catalog = trainables_catalog()
    assert f"total: {plan_sweep(load_spec(DEFAULT_SPEC, catalog), catalog, workers=1).num_trials} trials" in text


def test_a_bad_spec_is_a_one_line_error_and_calibrates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("min_steps: 20", "min_step: 20"))
    assert main(["plan", str(bad), "--quiet"], out=io.StringIO()) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "pruning.min_step: unknown key 'min_step' (did you mean 'min_steps'?)" in err
    assert not (tmp_path / "cache" / "accounting.sqlite").exists()  # (the catalog snapshot may be there)


def test_format_plan_marks_declared_sizes_unsearched_and_empty_cells(catalog, toy_spec):
    from dptune.search_spaces import format_plan

    spec = load_spec(toy_spec(axes={"epsilon": [1, 4], "backbone": "mlp", "dataset": ["toy", "big"], "epochs": 2},
                              batch_size=[10, 20, 40], dataset_sizes={"big": 30},
                              pruning={"min_steps": 2, "plateau_tol": 10.0, "max_batch_sizes": 1}), catalog)
    text = format_plan(plan_sweep(spec, catalog, workers=1, strict=False))
    assert "dataset=big (N=30, declared; not registered: planning only)" in text
    assert "kept *" in text and "kept, not searched" in text and "exceeds_dataset" in text
    assert "note: a sweep would refuse this: dataset(s) big are not registered (their sizes were declared" in text
    assert "→ 9 trials (3 C × 1 B × 3 η × 1 seed)" in text


def test_the_default_specs_comment_says_how_many_trials_it_runs():
    import re

    from dptune.platform.sweep import spec_sections  # noqa: F401  (the platform's sections)

    default = Path(__file__).parents[2] / "dptune" / "platform" / "specs" / "default.yaml"
    said = int(re.search(r"(\d+) short trials", default.read_text()).group(1))
    catalog = trainables_catalog()
    assert plan_sweep(load_spec(default, catalog), catalog, workers=1).num_trials == said
