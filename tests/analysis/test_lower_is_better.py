"""A sweep that selects on a lower-is-better metric (a language model's test NLL): a planted table
whose smallest NLL must win in the optima, the heatmap (its star and its table), optima.csv, the
fixed-setting cost, the error bars and `dptune status`' best; the largest NLL is a trap. Stored as a
sweep writes it now (the NLL in ``test_nll``, its signed ``score``, no ``accuracy``) and as a store
written before the signed score kept it (the NLL in ``accuracy``): both read alike."""
import itertools
import math

import pandas as pd
import pytest

from dptune.analysis.figures import fixed_cost_figure, heatmap_figure
from dptune.analysis.report import build_report, write_heatmaps
from dptune.analysis.results import Sweep
from dptune.analysis.uncertainty import with_error_bars
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.views.status import best_setting
from test_results import trial

CS, BS, LRS = (0.1, 1.0, 10.0), (32, 128), (1e-3, 1e-2)
#: The planted optimum (smallest NLL) of each ε cell, and the worst setting (largest NLL).
OPTIMA = {2.0: (1.0, 128, 1e-2), 9.0: (0.1, 32, 1e-3)}
WORST = (10.0, 32, 1e-3)


def planted_nll(eps: float, c: float, b: int, lr: float) -> float:
    """2.0 at OPTIMA[eps], rising with the log-distance from it; the WORST setting is far above."""
    if (c, b, lr) == WORST:
        return 9.0
    c0, b0, lr0 = OPTIMA[eps]
    return 2.0 + 0.1 * (abs(math.log10(c / c0)) + abs(math.log2(b / b0)) + abs(math.log10(lr / lr0)))


@pytest.fixture(scope="module", params=["signed score", "before the score"])
def store(tmp_path_factory, request):
    s = ResultsStore(str(tmp_path_factory.mktemp("nll") / "store"))
    for k, (eps, c, b, lr, seed) in enumerate(itertools.product(OPTIMA, CS, BS, LRS, (0, 1, 2))):
        nll = planted_nll(eps, c, b, lr) + 0.002 * (seed - 1)
        stored = ({"accuracy": None, "test_nll": nll, "score": -nll} if request.param == "signed score"
                  else {"accuracy": nll})
        s.write_trial(trial(f"t{k}", dataset="bbc_headlines", backbone="smollm2-135m", model="smollm2-135m",
                            epsilon=eps, clip_bound=c, batch_size=b, learning_rate=lr, seed=seed,
                            metric="test_nll", metric_mode="min", **stored))
    return s


def cell(eps: float) -> str:
    return f"bbc_headlines · smollm2-135m · ε={eps:g} · 2 epochs"


def test_the_smallest_nll_is_each_cells_optimum_in_the_tables_and_optima_csv(store, tmp_path):
    sweep = Sweep.from_store(store)
    assert sweep.metric_label == "test NLL (lower is better)"
    optima = sweep.optima().set_index("cell_name")
    table = sweep.heatmap_table()
    for eps, best in OPTIMA.items():
        assert optima.loc[cell(eps), ["clip_bound", "batch_size", "learning_rate"]].tolist() == list(best)
        assert optima.loc[cell(eps), "value"] == pytest.approx(2.0) and math.isnan(optima.loc[cell(eps), "accuracy"])
        for _, r in table[table["cell_name"] == cell(eps)].iterrows():   # the best η per (C, B): the smaller NLL
            nlls = {lr: planted_nll(eps, r["clip_bound"], int(r["batch_size"]), lr) for lr in LRS}
            assert r["learning_rate"] == min(nlls, key=nlls.get)
            assert r["value"] == pytest.approx(min(nlls.values()))
    write_heatmaps(store, tmp_path)
    written = pd.read_csv(tmp_path / "optima.csv").set_index("cell_name")
    for eps, best in OPTIMA.items():
        assert written.loc[cell(eps), ["clip_bound", "batch_size", "learning_rate"]].tolist() == list(best)
    summary = sweep.summary().set_index("cell")
    assert summary.loc[cell(2.0), "best value"] == pytest.approx(2.0 - 0.002)   # the best single run


def test_the_heatmap_stars_the_smallest_nll_on_a_reversed_colour_scale(store):
    sweep = Sweep.from_store(store)
    table = sweep.heatmap_table()
    cells = sweep.cells()
    fig = heatmap_figure(table, cells[cells["cell_name"] == cell(2.0)], "bbc", metric=sweep.metric_label,
                         lower_is_better=sweep.lower_is_better)
    stars = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_text().startswith("★")]
    assert stars == ["★ 2.000\nη=0.01"]
    mesh = fig.axes[0].collections[0]
    assert mesh.cmap.name == "viridis_r"
    assert "test NLL (lower is better)" in fig._suptitle.get_text()


def test_the_fixed_setting_cost_is_how_much_higher_its_nll_is(store):
    setting, cost = Sweep.from_store(store).fixed_setting_cost(1.0, 128)
    cost = cost.set_index("cell_name")["cost"]
    assert cost[cell(2.0)] == pytest.approx(0.0)
    expected = min(planted_nll(9.0, 1.0, 128, lr) for lr in LRS) - 2.0
    assert expected > 0 and cost[cell(9.0)] == pytest.approx(expected)
    sweep = Sweep.from_store(store)
    _, frame = sweep.fixed_setting_cost(1.0, 128)
    fig = fixed_cost_figure(frame, (1.0, 128), metric=sweep.metric_label, lower_is_better=True)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert f"+{expected:.3f}" in texts and "optimal" in texts
    assert fig.axes[0].get_xlabel() == "test NLL (lower is better)" and fig.axes[0].get_xlim()[1] > 2.0


def test_error_bars_and_status_pick_the_smallest_nll(store):
    sweep = Sweep.from_store(store)
    heatmap, optima, _ = with_error_bars(sweep, sweep.heatmap_table(), sweep.optima())
    optima = optima.set_index("cell_name")
    for eps in OPTIMA:
        low, high = optima.loc[cell(eps), ["value_low", "value_high"]]
        assert low < 2.0 < high and high - low < 0.05
        assert optima.loc[cell(eps), "indistinguishable"] == 1   # every other setting is ≥ 0.1 nats worse
    trials = store.table("trials")
    assert best_setting(trials[trials["epsilon"] == 2.0]).startswith("2.000 (C=1, B=128, η=0.01; 3 seeds)")


def test_the_report_names_the_metric_in_its_tables(store):
    html = build_report(store)
    for header in ("best test NLL", "median test NLL", "test NLL (lower is better)"):
        assert f'<th class="num">{header}</th>' in html
    assert "accuracy" not in html.lower()
