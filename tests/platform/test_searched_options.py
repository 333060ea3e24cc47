"""Issue 18: the sweep's searcher over sub-cells of searched trial options (``trial: {denoise: [null, rmt]}``)."""
import itertools

from ray.tune.search import Searcher

from dptune.trainables.config import check_option
from dptune.platform.sweep.searcher import SweepSearcher, chained
from dptune.search_spaces import Catalog, load_spec, plan_sweep
from sweep_plans import levers_off

CATALOG = Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: 200,
                  check_trial_option=check_option)


def plan(trial: dict):
    spec = {"axes": {"epsilon": [1, 4], "backbone": "mlp", "dataset": "toy", "epochs": 2},
            "clip_bound": [0.1, 1, 10], "batch_size": [10, 20],
            "learning_rate": {"reference": 1.0, "reference_batch_size": 20, "multipliers": [1]},
            "pruning": {"min_steps": 5, "plateau_tol": 10.0}, "trial": trial, "search": levers_off()}
    return plan_sweep(load_spec(spec, CATALOG), CATALOG, workers=1)


def test_the_grid_searcher_hands_out_every_sub_cell_trial_with_its_options():
    p = plan({"denoise": [None, "rmt"], "clip_fn": ["flat", "auto_s"]})
    searcher = SweepSearcher(p, metric="accuracy", clip_equivalence=False)
    handed = []
    while (config := searcher.suggest(f"t{len(handed)}")) != Searcher.FINISHED:
        trial = config
        handed.append(trial)
        searcher.on_trial_complete(f"t{len(handed) - 1}", {"accuracy": 0.5})
    assert handed == p.trials()
    # brute force: every (ε, denoise, clip_fn) once; auto_s runs one C, flat the three
    combos = {(t["epsilon"], t.get("denoise"), t["clip_fn"]) for t in handed}
    assert combos == set(itertools.product([1.0, 4.0], [None, "rmt"], ["flat", "auto_s"]))
    for eps, denoise, clip_fn in combos:
        cs = {t["clip_bound"] for t in handed
              if (t["epsilon"], t.get("denoise"), t["clip_fn"]) == (eps, denoise, clip_fn)}
        assert len(cs) == (1 if clip_fn == "auto_s" else 3)


def test_clip_equivalence_and_warm_start_neighbours_stay_within_a_sub_cell():
    p = plan({"denoise": [None, "rmt"], "clip_fn": ["flat", "auto_s"]})
    searcher = SweepSearcher(p, metric="accuracy")
    cells = [c.cell for c in p.cells]
    for i, c in enumerate(cells):
        expected = [j for j, o in enumerate(cells) if j != i and o.options == c.options]   # the other ε, same options
        assert searcher.neighbours(i) == expected
        assert chained(p, i) == (dict(c.options)["clip_fn"] == "flat")
