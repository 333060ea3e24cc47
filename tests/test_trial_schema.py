"""The trial schema is the one declaration of a trial: a new option declared there (and nowhere else)
reaches the spec, the ``dptune train`` flags, the store, the trackers' parameters and the analysis.

The test copies the package, adds one field to ``TrainConfig`` in the copy and runs every consumer
in a fresh interpreter on that copy: a consumer that keeps its own list of option names misses it.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dptune
from dptune.analysis.results import OPTION_COLUMNS
from dptune.platform.store.records import AXES, STORED_FIELDS
from dptune.schema import FIELDS, METRICS, names
from dptune.search_spaces.search_sections import SEARCHED_OPTIONS, TRIAL_OPTIONS

ANCHOR = '    weight_decay: float = option('
MADE_UP = ('    made_up_gain: float = option(0.5, "a made-up option", rule=above(0, finite=True), '
           'spec=("trial",), searched=True, cell=True)\n')

CHECKS = textwrap.dedent('''
    import json, subprocess, sys
    import dptune
    assert dptune.__file__.startswith(sys.argv[1]), dptune.__file__

    # the spec: accepted with its rule, refused with its path and what is allowed, searched as a list
    from dptune.schema import check_option
    from dptune.search_spaces import Catalog, SpecError, load_spec, plan_sweep
    catalog = Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: 200,
                      check_trial_option=check_option)
    def spec(trial):
        return {"axes": {"epsilon": [2], "backbone": ["mlp"], "dataset": ["toy"], "epochs": [1]},
                "clip_bound": [1], "batch_size": [20], "learning_rate": {"reference": 1.0, "reference_batch_size": 20},
                "pruning": {"min_steps": 1, "plateau_tol": 10.0},
                "search": {"scheduler": "none", "proxy": "off", "transfer": "off"}, "trial": trial}
    plan = plan_sweep(load_spec(spec({"made_up_gain": 0.25}), catalog), catalog)
    configs = plan.trials()
    assert configs and all(t["made_up_gain"] == 0.25 for t in configs), configs
    try:
        load_spec(spec({"made_up_gain": -1}), catalog)
        raise AssertionError("a bad value was accepted")
    except SpecError as e:
        assert "trial.made_up_gain" in str(e) and "> 0" in str(e), e
    searched = plan_sweep(load_spec(spec({"made_up_gain": [0.25, 2.0]}), catalog), catalog)
    assert sorted({t["made_up_gain"] for t in searched.trials()}) == [0.25, 2.0]

    # the dptune train flags
    help_text = subprocess.run([sys.executable, "-m", "dptune", "train", "--help"], capture_output=True, text=True,
                               check=True).stdout
    assert "--made-up-gain" in help_text and "a made-up option" in help_text, help_text

    # the store's trials row and the trackers' parameters (defaults filled in)
    from dptune.platform.store.records import trial_row
    from dptune.platform.sweep.trackers import _parameters
    config = {**configs[0], "made_up_gain": 0.25}
    rows = [trial_row("a", config, {"test_accuracy": 0.5}, status="finished"),
            trial_row("b", {**config, "made_up_gain": 2.0}, {"test_accuracy": 0.6}, status="finished")]
    assert [r["made_up_gain"] for r in rows] == [0.25, 2.0]
    assert _parameters({k: v for k, v in config.items() if k != "made_up_gain"})["made_up_gain"] == 0.5

    # the analysis: trials that differ in it are different cells, named by it
    import pandas as pd
    from dptune.analysis.results import Sweep
    sweep = Sweep.from_frame(pd.DataFrame(rows))
    assert "made_up_gain" in sweep.cell_columns, sweep.cell_columns
    assert sweep.trials["cell_name"].nunique() == 2
    print("ok")
''')


def test_a_new_option_declared_once_reaches_every_consumer(tmp_path):
    copy = tmp_path / "dptune"
    shutil.copytree(Path(dptune.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    schema = copy / "schema" / "trial.py"
    text = schema.read_text()
    assert text.count(ANCHOR) == 1
    schema.write_text(text.replace(ANCHOR, MADE_UP + ANCHOR))
    out = subprocess.run([sys.executable, "-c", CHECKS, str(copy)], capture_output=True, text=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin",
                                            "HOME": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_the_lists_of_each_consumer_are_the_schemas():
    """weight_decay (a trial option) drifted out of the store's and the analysis' lists once."""
    assert set(TRIAL_OPTIONS) >= {"weight_decay", "optimizer", "norm_estimator"}
    assert "weight_decay" in STORED_FIELDS and "weight_decay" in OPTION_COLUMNS
    assert set(SEARCHED_OPTIONS) <= set(TRIAL_OPTIONS)
    assert AXES == ("dataset", "model", "epsilon", "delta", "epochs")
    assert names(role="hyperparameter") == ("clip_bound", "batch_size", "learning_rate")
    # every field has a role; a cell-splitting field is a stored column
    assert all(f.metadata["role"] for f in FIELDS.values())
    assert set(OPTION_COLUMNS) <= set(AXES + STORED_FIELDS)


def test_every_metric_has_a_direction_and_the_store_names_it():
    from dptune.platform.store.records import trial_row

    assert {m.mode for m in METRICS.values()} <= {"max", "min"}
    row = trial_row("t", {"metric": "validation_accuracy", "epsilon": 1.0}, {"validation_accuracy": 0.7,
                                                                           "validation_loss": 0.9}, status="finished")
    assert (row["metric"], row["metric_mode"], row["accuracy"], row["loss"]) == ("validation_accuracy", "max", 0.7, 0.9)


def _spec_schema() -> dict:
    from dptune.platform.sweep import spec_sections  # noqa: F401  (the platform's sections)
    from dptune.search_spaces.spec_schema import spec_json_schema

    return spec_json_schema()


def test_every_shipped_spec_is_valid_under_the_published_json_schema():
    """Checked by the jsonschema library (an independent validator), on every example and the default."""
    import jsonschema
    import yaml

    from dptune.platform.store.layout import DEFAULT_SPEC

    validator = jsonschema.Draft202012Validator(_spec_schema())
    jsonschema.Draft202012Validator.check_schema(validator.schema)
    specs = sorted((Path(dptune.__file__).parents[1] / "examples").glob("*.yaml")) + [Path(DEFAULT_SPEC)]
    assert len(specs) > 5
    for path in specs:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, (path.name, errors)


def test_the_json_schema_flags_what_the_spec_parser_refuses():
    import jsonschema

    validator = jsonschema.Draft202012Validator(_spec_schema())
    base = {"axes": {"epsilon": [1]}, "clip_bound": [1], "batch_size": [64], "learning_rate": {"reference": 1}}
    bad = [{**base, "trial": {"optimiser": "adam"}},              # a misspelt option
           {**base, "trial": {"optimizer": "lbfgs"}},             # a name no registry has
           {**base, "trial": {"denoise_kappa": "high"}},          # a number expected
           {**base, "trail": {}},                                 # a misspelt section
           {k: v for k, v in base.items() if k != "axes"}]        # a required section missing
    for spec in bad:
        assert not validator.is_valid(spec), spec
    assert validator.is_valid({**base, "trial": {"optimizer": "adam", "denoise": [None, "rmt"], "sketch_k": 32}})


def test_c_b_and_eta_are_named_through_the_schema():
    """Outside ``dptune/schema`` no string literal names C, B or η: code reads them as
    ``schema.CLIP_BOUND``, ``BATCH_SIZE`` and ``LEARNING_RATE`` (the hyperparameters' own field names).
    The one other use is the engine's step statistic ``"batch_size"``: a step's realised batch, not the field."""
    import io
    import tokenize

    from dptune.schema import BATCH_SIZE, CLIP_BOUND, HYPERPARAMETERS, LEARNING_RATE

    assert (CLIP_BOUND, BATCH_SIZE, LEARNING_RATE) == HYPERPARAMETERS == ("clip_bound", "batch_size", "learning_rate")
    assert all(name in FIELDS for name in HYPERPARAMETERS)
    root = Path(dptune.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "schema":
            continue
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.STRING and token.string[1:-1] in HYPERPARAMETERS and token.string[0] in "'\"":
                found.append(f"{path.relative_to(root)}:{token.start[0]}: {token.line.strip()}")
    assert [f for f in found if not f.startswith("trainables/engine/dp_engine.py")] == [], "\n".join(found)
    assert len(found) == 2   # the step statistic, a pack's and a single model's
