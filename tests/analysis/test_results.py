"""Heatmap data, optima, fixed-setting cost and per-class norms from synthetic stores with known answers."""
import base64
import io
import itertools
import math
import re

import numpy as np
import pytest
from matplotlib import image as mpimg

from dptune.analysis.gradnorms import class_norms
from dptune.analysis.report import build_report, write_heatmaps
from dptune.analysis.results import Sweep
from dptune.platform.store.results_store import ResultsStore
from headless_browser import NO_BROWSER, chromium, run_headless

CS, BS, LRS = (0.1, 1.0, 10.0), (32, 128, 512), (0.5, 1.0, 2.0)
#: The planted optimum of each ε cell: (C, B, η). Different per cell, so a fixed setting has a cost.
OPTIMA = {1.0: (10.0, 128, 2.0), 8.0: (0.1, 512, 0.5)}
#: Accuracy lost per unit of log-distance: unequal, so the best fixed setting is unique.
SLOPES = {1.0: 0.06, 8.0: 0.03}
TRAP = (1.0, 32, 1.0)  # one seed beats every optimum, the mean does not
N_TRAIN = 1437


def planted_accuracy(eps: float, c: float, b: int, lr: float) -> float:
    """Peaks at OPTIMA[eps] (0.9) and falls with the log-distance from it."""
    c0, b0, lr0 = OPTIMA[eps]
    d = abs(math.log10(c / c0)) + abs(math.log2(b / b0)) / 2 + abs(math.log2(lr / lr0)) / 2
    return 0.9 - SLOPES[eps] * d


def trial(trial_id: str, **fields) -> dict:
    row = {"trial_id": trial_id, "experiment": "synthetic", "status": "finished", "error": None, "cell": None,
           "backbone": "mlp", "dataset": "digits", "model": "mlp", "epsilon": 1.0, "delta": None, "epochs": 2,
           "clip_bound": 1.0, "batch_size": 128, "learning_rate": 1.0, "optimizer": None, "seed": 0,
           "private": True, "noise_multiplier": 1.0, "sample_rate": None, "steps": None, "noise_sqrt_steps": None,
           "epsilon_spent": None, "accuracy": 0.5, "loss": 1.0, "clipped_fraction": 0.5, "train_time_s": 1.0,
           "epoch": 2, "per_class_accuracy": [0.5, 0.5]}
    row.update(fields)
    b = row["batch_size"]
    if row["sample_rate"] is None and row["status"] == "finished":
        row["sample_rate"], row["steps"] = b / N_TRAIN, math.ceil(row["epochs"] * N_TRAIN / b)
    return row


def histogram(peak_bin: int, count: int) -> list[int]:
    h = [0] * 32
    h[peak_bin] = count
    return h


def gradnorm_rows(peak_bin: int, epochs: int = 2, count: int = 10) -> list[dict]:
    return [{"epoch": e, "label": y, "count": count, "clipped_fraction": 0.1 * (y + 1),
             "histogram": histogram(peak_bin + y, count), "norm_q10": 1.0, "norm_q25": 1.0, "norm_q50": 1.0,
             "norm_q75": 1.0, "norm_q90": 1.0} for e in range(1, epochs + 1) for y in (0, 1)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Every (C, B, η) of two ε cells in two seeds (±0.01 around the planted accuracy), plus traps:
    an errored trial and a non-private row that both report higher accuracy than any optimum."""
    s = ResultsStore(str(tmp_path_factory.mktemp("synthetic") / "store"))
    k = 0
    for eps, c, b, lr, seed in itertools.product(OPTIMA, CS, BS, LRS, (0, 1)):
        acc = planted_accuracy(eps, c, b, lr) + (0.01 if seed == 0 else -0.01)
        if (c, b, lr) == TRAP:
            acc = 0.97 if seed == 0 else 0.40
        k += 1
        best = (c, b, lr) == OPTIMA[eps]
        s.write_trial(trial(f"t{k}", epsilon=eps, clip_bound=c, batch_size=b, learning_rate=lr, seed=seed,
                            accuracy=acc), gradnorms=gradnorm_rows(14 if best else 22))
    s.write_trial(trial("err", epsilon=1.0, clip_bound=0.1, batch_size=32, learning_rate=0.5, status="error",
                        error="TrialDiverged: loss became nan", accuracy=0.999))
    s.write_trial(trial("nonprivate", epsilon=math.inf, private=False, accuracy=0.99, learning_rate=0.1))
    return s


def test_heatmap_data_picks_the_planted_optimum(store):
    sweep = Sweep.from_store(store)
    table = sweep.heatmap_table()
    assert set(table["cell_name"]) == {"digits · mlp · ε=1 · 2 epochs", "digits · mlp · ε=8 · 2 epochs"}
    for eps, (c0, b0, lr0) in OPTIMA.items():
        cell = table[table["cell_name"] == f"digits · mlp · ε={eps:g} · 2 epochs"]
        assert len(cell) == len(CS) * len(BS)  # one entry per (C, B), η maximised out
        best = cell.loc[cell["accuracy"].idxmax()]
        assert (best["clip_bound"], best["batch_size"], best["learning_rate"]) == (c0, b0, lr0)
        assert best["accuracy"] == pytest.approx(0.9) and best["seeds"] == 2
        for _, r in cell.iterrows():  # every (C, B): the best η and the seed mean
            if (r["clip_bound"], r["batch_size"]) == TRAP[:2]:
                continue
            accs = {lr: planted_accuracy(eps, r["clip_bound"], int(r["batch_size"]), lr) for lr in LRS}
            assert r["learning_rate"] == max(accs, key=accs.get)
            assert r["accuracy"] == pytest.approx(max(accs.values()))
    optima = sweep.optima().set_index("cell_name")
    assert optima.loc["digits · mlp · ε=1 · 2 epochs", ["clip_bound", "batch_size", "learning_rate"]].tolist() \
        == list(OPTIMA[1.0])
    baseline = optima.loc["digits · mlp · ε=∞ (non-private) · 2 epochs"]
    assert not baseline["private"] and baseline["accuracy"] == pytest.approx(0.99)
    assert math.isnan(baseline["clip_bound"])
    errored = table[(table["clip_bound"] == 0.1) & (table["batch_size"] == 32)
                    & (table["cell_name"] == "digits · mlp · ε=1 · 2 epochs")]
    assert errored["errored"].item() == 1 and errored["accuracy"].item() < 0.9


def test_fixed_setting_cost_is_the_gap_to_each_optimum(store):
    setting, cost = Sweep.from_store(store).fixed_setting_cost()
    best_over_lr = {(eps, c, b): max(planted_accuracy(eps, c, b, lr) for lr in LRS)
                    for eps, c, b in itertools.product(OPTIMA, CS, BS) if (c, b) != TRAP[:2]}
    expected = max({(c, b) for _, c, b in best_over_lr},
                   key=lambda cb: np.mean([best_over_lr[(eps, *cb)] for eps in OPTIMA]))
    assert setting == expected
    for eps in OPTIMA:
        row = cost[cost["cell_name"] == f"digits · mlp · ε={eps:g} · 2 epochs"].iloc[0]
        assert row["cost"] == pytest.approx(0.9 - best_over_lr[(eps, *setting)])
    assert setting == OPTIMA[1.0][:2]  # the steeper cell's optimum wins on average ...
    assert cost["cost"].max() > 0.05  # ... and costs the other cell accuracy: no setting is best in both
    _, forced = Sweep.from_store(store).fixed_setting_cost(0.1, 512)
    forced = forced.set_index("cell_name")["cost"]
    assert forced["digits · mlp · ε=8 · 2 epochs"] == pytest.approx(0.0)
    assert forced["digits · mlp · ε=1 · 2 epochs"] == pytest.approx(0.9 - best_over_lr[(1.0, 0.1, 512)])
    with pytest.raises(ValueError, match="not run"):
        Sweep.from_store(store).fixed_setting_cost(3.0, 128)
    assert Sweep.from_store(store).fixed_setting_pool() == (len(CS) * len(BS),) * 2   # every (C, B) in both cells


def test_class_norms_pool_the_optimum_trials_only(store):
    norms = class_norms(Sweep.from_store(store), store.table("gradnorms"))
    assert set(norms["cell_name"]) == {"digits · mlp · ε=1 · 2 epochs", "digits · mlp · ε=8 · 2 epochs"}
    for _, r in norms.iterrows():
        assert r["count"] == 2 * 2 * 10  # two seeds × two epochs × 10 examples
        assert np.flatnonzero(r["histogram"]).tolist() == [14 + r["label"]]  # not the other trials' bin 22
        assert r["clipped_fraction"] == pytest.approx(0.1 * (r["label"] + 1))
        assert 10 ** (-4 + (14 + r["label"]) / 4) <= r["q50"] <= 10 ** (-4 + (15 + r["label"]) / 4)


def decoded_images(page: str) -> list[np.ndarray]:
    import io

    return [mpimg.imread(io.BytesIO(base64.b64decode(b)), format="png")
            for b in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_awkward_store_single_c_and_b_all_errored_and_nonprivate(tmp_path):
    """One C and one B; a cell whose trials all errored; a non-private cell; no sample rates."""
    s = ResultsStore(str(tmp_path / "store"))
    s.write_trial(trial("a", epsilon=2.0, clip_bound=1.0, batch_size=64, accuracy=0.7))
    s.write_trial(trial("b", epsilon=2.0, clip_bound=1.0, batch_size=64, learning_rate=2.0, accuracy=0.8))
    s.write_trial(trial("c", epsilon=4.0, status="error", error="boom", accuracy=None))
    s.write_trial(trial("d", epsilon=math.inf, private=False, accuracy=0.95))
    page = build_report(s, noise_batch_sizes=[128])
    assert all(name in page for name in ("digits · mlp · ε=2 · 2 epochs", "digits · mlp · ε=4 · 2 epochs",
                                         "digits · mlp · ε=∞ (non-private) · 2 epochs"))
    images = decoded_images(page)
    assert len(images) >= 3 and all(img.ndim == 3 and img.shape[0] > 100 for img in images)
    assert "NOT differentially private" in page and "boom" in page
    paths = write_heatmaps(s, tmp_path / "figures")
    assert {p.suffix for p in paths} >= {".png", ".svg", ".csv"} and all(p.exists() for p in paths)


def test_report_rejects_an_unknown_axis(store):
    with pytest.raises(ValueError, match="--across must be one of"):
        build_report(store, across="colour")


def test_heatmap_writes_the_optimums_eta_rounded(tmp_path):
    """η = η_ref·√(B/B_ref) is irrational: the star's label shows two significant digits."""
    from dptune.analysis.figures import heatmap_figure

    s = ResultsStore(str(tmp_path / "store"))
    lr = 1 / math.sqrt(2)  # 0.7071067…
    for k, (c, b) in enumerate(itertools.product((0.1, 1.0), (32, 64))):
        s.write_trial(trial(f"t{k}", clip_bound=c, batch_size=b, learning_rate=lr, accuracy=0.5 + 0.1 * k))
    sweep = Sweep.from_store(s)
    table = sweep.heatmap_table()
    cells = table[["cell_name"]].drop_duplicates()
    fig = heatmap_figure(table, cells, "digits")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(t.endswith("η=0.71") for t in texts), texts
    assert not any("0.707107" in t for t in texts)


def test_no_fixed_setting_chart_when_no_setting_was_run_in_every_cell(tmp_path):
    """Each ε cell kept its own batch sizes (as the plateau rule prunes them): no (C, B) was run in
    both, so there is no fixed setting to compare; the chart is left out with a line saying why."""
    store = ResultsStore(str(tmp_path / "store"))
    for eps, batches in ((1.0, (32, 128)), (8.0, (512,))):
        for b in batches:
            store.write_trial(trial(f"e{eps:g}-b{b}", epsilon=eps, batch_size=b, accuracy=0.5 + b / 2000))
    with pytest.raises(ValueError, match="no \\(C, B\\) was run in all 2 private cells"):
        Sweep.from_store(store).fixed_setting_cost()
    printed = io.StringIO()
    paths = write_heatmaps(store, tmp_path / "out", out=printed)
    assert not any("fixed_setting_cost" in p.name for p in paths)
    assert not list((tmp_path / "out").glob("fixed_setting_cost*"))
    assert "no chart of the cost of a fixed setting: no (C, B) was run in all 2 private cells" in printed.getvalue()
    assert "no chart of the cost of a fixed setting" in build_report(store)
    # one shared setting, beaten on average by one run in a single cell: the shared one is chosen
    store.write_trial(trial("e8-b128", epsilon=8.0, batch_size=128, accuracy=0.3))
    setting, cost = Sweep.from_store(store).fixed_setting_cost()
    assert setting == (1.0, 128) and cost["fixed_accuracy"].notna().all()
    # and the closing lines say what it was chosen from: by hand, B = 128 alone ran in both cells
    assert Sweep.from_store(store).fixed_setting_pool() == (1, 3)
    printed = io.StringIO()
    write_heatmaps(store, tmp_path / "again", out=printed)
    assert ("the fixed setting is the best of the 1 (C, B) with a result (or stopped by multi-fidelity) in every "
            "cell; the other 2 errored or were not run in some cell") in printed.getvalue()


def test_heatmaps_of_a_facet_share_one_colour_scale_and_no_label_overlaps_another_panel(store):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from dptune.analysis.figures import heatmap_figure

    sweep = Sweep.from_store(store)
    table = sweep.heatmap_table()
    facet, cells = next(sweep.facets("epsilon"))
    fig = heatmap_figure(table, cells, facet)
    panels = [ax for ax in fig.axes if ax.collections and ax.get_label() != "<colorbar>"]
    assert len(panels) == 2 and len(fig.axes) == 3            # two cells, one colour bar
    shown = table[table["cell_name"].isin(cells["cell_name"])]["accuracy"].dropna()
    for ax in panels:   # the same accuracy is the same colour in every panel
        assert ax.collections[0].get_clim() == pytest.approx((shown.min(), shown.max()))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)

    def labels(ax):
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels()]
        return [t.get_window_extent(renderer) for t in texts if t.get_visible() and t.get_text()]

    boxes = {k: labels(ax) for k, ax in enumerate(fig.axes)}
    for k, m in itertools.combinations(boxes, 2):
        for a in boxes[k]:
            assert not any(a.overlaps(b) for b in boxes[m]), (k, m)


@pytest.mark.skipif(chromium() is None, reason=NO_BROWSER)
def test_the_summary_table_fits_a_1300_pixel_page(tmp_path):
    """Issue 33, item 7: the report's summary table of a sweep like the default (two ε × two epoch
    budgets, nine η over three B, reproducible randomness) fits the page at a 1,300-pixel window — its
    width, measured by headless Chromium, no wider than the box that holds it (no sideways scrolling)."""
    s = ResultsStore(str(tmp_path / "store"))
    k = 0
    for eps, epochs, c, b, m, seed in itertools.product((1.0, 8.0), (1, 16), CS, BS, (0.125, 0.5, 2.0), (0, 1)):
        k += 1
        s.write_trial(trial(f"t{k}", epsilon=eps, epochs=epochs, clip_bound=c, batch_size=b,
                            learning_rate=2 * math.sqrt(b / 128) * m, seed=seed, randomness="reproducible",
                            accuracy=0.5 + 0.01 * seed))
    page = tmp_path / "report.html"
    measure = ("<script>window.addEventListener('load', () => { const t = document.querySelector('#summary + div table');"
               "document.title = Math.round(t.getBoundingClientRect().width) + ' ' + t.parentElement.clientWidth; });"
               "</script></body>")
    page.write_text(build_report(s).replace("</body>", measure))
    dom = run_headless(tmp_path, page, "--window-size=1300,2000", "--virtual-time-budget=3000", "--dump-dom").stdout
    width, room = map(int, re.search(r"<title>(\d+) (\d+)</title>", dom).groups())
    assert 600 < width <= room


def test_optima_on_the_grids_edge_are_flagged(store, tmp_path):
    """Each planted optimum sits on the edge of the grid in some axes; the flags name exactly
    those, by brute force over the planted grid, and the optimum's closing line says so."""
    optima = Sweep.from_store(store).optima().set_index("cell_name")
    for eps, setting in OPTIMA.items():
        expected = []
        for label, value, grid in zip(("B", "C", "η"), (setting[1], setting[0], setting[2]), (BS, CS, LRS)):
            if value == max(grid):
                expected.append(f"{label} the largest of {len(grid)} tried")
            elif value == min(grid):
                expected.append(f"{label} the smallest of {len(grid)} tried")
        assert optima.loc[f"digits · mlp · ε={eps:g} · 2 epochs", "grid_edge"] == "; ".join(expected)
    assert optima.loc["digits · mlp · ε=∞ (non-private) · 2 epochs", "grid_edge"] == ""   # one setting: no grid
    out = io.StringIO()
    write_heatmaps(store, tmp_path / "figs", out=out)
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("digits · mlp · ε=1 · 2 epochs"))
    assert "on the edge of the grid searched (C the largest of 3 tried; η the largest of 3 tried)" in line


def test_a_diverged_larger_eta_brackets_the_optimum(tmp_path):
    """η = 2 is the best finished η, but η = 4 was tried and diverged: not on the edge. Remove the
    diverged trial and η = 2 is the largest tried."""
    rows = [trial(f"t{k}", learning_rate=lr, accuracy=acc, clip_bound=c)
            for k, (c, lr, acc) in enumerate([(0.5, 1.0, 0.6), (0.5, 2.0, 0.7), (1.0, 1.0, 0.5), (1.0, 2.0, 0.55),
                                              (2.0, 1.0, 0.5), (2.0, 2.0, 0.52)])]
    diverged = trial("div", learning_rate=4.0, clip_bound=0.5, status="error", error="loss became nan", accuracy=None)
    with_div = ResultsStore(str(tmp_path / "a"))
    for row in rows + [diverged]:
        with_div.write_trial(row)
    without = ResultsStore(str(tmp_path / "b"))
    for row in rows:
        without.write_trial(row)
    assert Sweep.from_store(with_div).optima()["grid_edge"].tolist() == ["C the smallest of 3 tried"]
    assert Sweep.from_store(without).optima()["grid_edge"].tolist() == ["C the smallest of 3 tried; η the largest of 2 tried"]
