"""The plan a sweep ran is saved beside its store, keyed as the store's cells, for `dptune report`."""
from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.store.layout import ExperimentPaths
from dptune.platform.sweep.driver import _save_plan
from dptune.search_spaces import Catalog, batch_plan, load_spec, plan_sweep
from sweep_plans import levers_off

N, EPOCHS, CANDIDATES = 200, 2, [5, 10, 20, 40, 80]


def test_the_saved_plan_holds_the_spec_rules_and_every_cell_batch_size(tmp_path):
    catalog = Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: N)
    spec = {"axes": {"epsilon": [1, 4], "backbone": "mlp", "dataset": "toy", "epochs": EPOCHS},
            "clip_bound": [1.0], "batch_size": CANDIDATES, "learning_rate": {"reference": 1.0, "reference_batch_size": 20},
            "pruning": {"min_steps": 8, "plateau_tol": 0.3}, "search": levers_off({"algorithm": "grid"})}
    plan = plan_sweep(load_spec(spec, catalog), catalog, workers=1)
    settings = RunSettings(experiment="saved", storage=str(tmp_path))
    settings.paths.create()
    _save_plan(plan, settings)
    saved = ExperimentPaths(str(tmp_path / "saved")).saved_plan()
    assert saved["pruning"] == {"min_steps": 8, "plateau_tol": 0.3, "max_batch_sizes": None}
    assert set(saved["cells"]) == {t["cell"] for t in plan.trials()}   # the store's cell column
    for key, cell in saved["cells"].items():
        epsilon = float(key.rsplit("eps=", 1)[1])
        expected = batch_plan(epsilon, 1e-5, N, EPOCHS, CANDIDATES, min_steps=8, plateau_tol=0.3)
        assert cell["dataset_size"] == N and cell["batch_sizes"] == CANDIDATES
        assert cell["kept"] == expected.loc[expected["kept"], "batch_size"].tolist() and cell["kept"]
        assert set(cell["searched"]) <= set(cell["kept"])
    assert ExperimentPaths(str(tmp_path / "other")).saved_plan() is None
