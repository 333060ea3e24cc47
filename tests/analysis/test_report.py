"""`dptune report`, `dptune heatmap` and `dptune optimal-clip` on a small real sweep (local Ray)."""
import base64
import io
import json
import math
from html.parser import HTMLParser

import numpy as np
import pytest
import ray
from PIL import Image

from dptune.analysis import optimal_clip
from dptune.cli import main
from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import run_sweep
from headless_browser import NO_BROWSER, chromium, run_headless
from sweep_plans import digits_spec, plan_of

pytestmark = pytest.mark.slow

EPSILONS = (2.0, 8.0)
CELLS = [f"digits · mlp[hidden=32] · ε={eps:g} · 1 epoch" for eps in EPSILONS]
CELLS.append("digits · mlp[hidden=32] · ε=∞ (non-private) · 1 epoch")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two ε cells × two C at one B, the non-private baseline (ε = inf, one C), each at η = 1 and at
    η = 10³⁸, which diverges."""
    root = tmp_path_factory.mktemp("report")
    plan = plan_of(digits_spec(epsilon=[*EPSILONS, math.inf], clip_bound=(0.5, 20.0), batch_size=200,
                               multipliers=(1.0, 1e38), model_options={"hidden": 32}))
    settings = RunSettings(experiment="small", storage=str(root), max_failures=0, verbose=0)
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level="ERROR")
    try:
        run_sweep(plan, settings)
    finally:
        ray.shutdown()
    return settings


class Page(HTMLParser):
    """The tables (as lists of rows of cell texts, by preceding h2 id) and img sources of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[str] = []
        self.section = ""
        self.row: list[str] | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "h2":
            self.section = attrs.get("id", "")
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "table":
            self.tables.setdefault(self.section, [])
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.row is not None:
            self.row.append("".join(self.cell).strip())
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.tables[self.section].append(self.row)
            self.row = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    code = main(["report", "--store", sweep.paths.root, "--out", str(out), "--noise-batch-sizes", "100"],
                out=io.StringIO())
    assert code == 0
    return out / "report.html"


def test_report_images_decode_and_tables_list_every_cell(report):
    page = Page()
    page.feed(report.read_text(encoding="utf-8"))
    # heatmaps, fixed-setting cost, noise curves, gradient norms, retention
    assert len(page.images) >= 5
    for src in page.images:
        assert src.startswith("data:image/png;base64,")  # self-contained: nothing to fetch
        img = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        img.load()
        assert img.width > 300 and img.height > 150
        assert len(np.unique(np.asarray(img.convert("L")))) > 20  # a drawing, not a flat image
    for section in ("summary", "optima"):
        _, *rows = page.tables[section]
        assert sorted(r[0] for r in rows) == sorted(CELLS)
    optima = {r[0]: dict(zip(page.tables["optima"][0], r)) for r in page.tables["optima"][1:]}
    assert optima[CELLS[-1]]["C"] == "— (no clipping)"
    assert optima[CELLS[0]]["C"] in ("0.5", "20") and optima[CELLS[0]]["B"] == "200"
    _, *errors = page.tables["errors"]
    assert len(errors) == 5 and all("1e+38" in row and "loss became" in row[-1] for row in errors)
    text = report.read_text(encoding="utf-8")
    assert "NOT differentially private" in text and "<script" not in text


def test_heatmap_command_writes_png_and_svg_per_facet(sweep, tmp_path):
    buf = io.StringIO()
    assert main(["heatmap", "--store", sweep.paths.root, "--out", str(tmp_path)], out=buf) == 0
    files = {p.name for p in tmp_path.iterdir()}
    assert {"heatmap_digits_mlp_hidden=32_1ep.png", "heatmap_digits_mlp_hidden=32_1ep.svg", "fixed_setting_cost.png",
            "heatmap.csv", "optima.csv"} <= files
    text = buf.getvalue()
    assert all(cell in text for cell in CELLS)
    assert main(["heatmap", "--store", sweep.paths.root, "--out", str(tmp_path), "--across", "nope"]) == 2


def test_optimal_clip_at_a_checkpoint(sweep, tmp_path):
    trials = ResultsStore(sweep.paths.store).query(
        "SELECT trial_id, clip_bound FROM trials WHERE status = 'finished' AND epsilon = 2 ORDER BY clip_bound")
    trial_id = trials.trial_id[0]
    buf = io.StringIO()
    grads_file = tmp_path / "grads.npz"
    assert main(["optimal-clip", sweep.paths.root, "--trial", trial_id, "--out", str(tmp_path),
                 "--save-grads", str(grads_file)], out=buf) == 0
    text = buf.getvalue()
    assert text.startswith("NON-PRIVATE DIAGNOSTIC")
    record = json.loads((tmp_path / "optimal_clip.json").read_text())
    saved = np.load(grads_file)
    assert saved["grads"].shape[0] == 200 == record["n"]  # one expected batch B of the trial
    assert record["nonprivate"] and record["given"]["clip_bound"] == 0.5
    assert record["c_star"] == pytest.approx(optimal_clip(saved["grads"], float(saved["noise_multiplier"])))
    assert record["optimal"]["mse"] <= record["given"]["mse"]
    assert (tmp_path / "optimal_clip.png").stat().st_size > 10_000
    buf = io.StringIO()
    assert main(["optimal-clip", "--grads", str(grads_file), "--sigma", "0"], out=buf) == 0
    assert "σ = 0;" in buf.getvalue()


@pytest.mark.skipif(chromium() is None, reason=NO_BROWSER)
def test_headless_browser_screenshot_is_not_blank(report, tmp_path):
    shot = tmp_path / "shot.png"
    run_headless(tmp_path, report, "--hide-scrollbars", "--window-size=1400,4000", f"--screenshot={shot}")
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    background = np.median(pixels.reshape(-1, 3), axis=0)
    drawn = np.abs(pixels - background).sum(axis=2) > 30
    assert drawn.mean() > 0.08  # text, tables and figures cover the page (text alone: about 4%)
    hsv = np.asarray(Image.open(shot).convert("HSV")).astype(int)
    colourful = (hsv[..., 1] > 100) & (hsv[..., 2] > 60)
    assert colourful.mean() > 0.02  # the figures were decoded and drawn (without them: about 0.2%)
    rows = drawn.mean(axis=1)
    assert (rows[:600] > 0).mean() > 0.3 and (rows[1500:] > 0).mean() > 0.3  # top and lower parts rendered


def test_csv_writes_whole_numbers_as_whole_numbers(tmp_path):
    import pandas as pd

    from dptune.analysis.report import write_csv

    frame = pd.DataFrame({"batch_size": [64.0, 128.0], "seeds": [1.0, None], "clip_bound": [0.1, 10.0],
                          "accuracy": [0.5, 0.75], "name": ["a", "b"]})
    write_csv(frame, tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text().splitlines() == [
        "batch_size,seeds,clip_bound,accuracy,name", "64,1,0.1,0.5,a", "128,,10.0,0.75,b"]


def test_notebook_api_gives_tables_and_figures(sweep):
    """`dptune.open_store`: the trials, epochs and gradient-norm tables as DataFrames, each cell's
    optimum equal to the best finished trial found here with pandas, and the figures as matplotlib
    figures, one per facet."""
    import dptune
    from matplotlib.figure import Figure

    results = dptune.open_store(sweep.paths.root)
    trials = results.trials
    assert len(trials) == 10 and set(trials.status) == {"finished", "error"}
    assert set(results.epochs.trial_id) <= set(trials.trial_id)
    assert "label" in results.nonprivate_gradnorms
    finished = trials[trials.status == "finished"]
    best = finished.groupby("cell").accuracy.max()
    optima = results.optima.set_index("cell_name")
    for cell_name in CELLS:
        cell = trials[trials.status == "finished"].loc[lambda t: t.cell.str.contains(
            "eps=inf" if "∞" in cell_name else f"eps={cell_name.split('ε=')[1].split(' ')[0]}")].cell.iloc[0]
        assert optima.loc[cell_name, "accuracy"] == pytest.approx(best[cell])
    heatmaps = results.heatmaps()
    assert list(heatmaps) == ["digits · mlp[hidden=32] · 1 epoch"]
    assert all(isinstance(f, Figure) and f.axes for f in heatmaps.values())
    assert all(isinstance(f, Figure) for f in results.noise_curves().values()) and results.noise_curves()
    assert all(isinstance(d, Figure) and isinstance(r, Figure) for d, r in results.nonprivate_gradnorm_figures().values())
    count = results.sql("SELECT count(*) AS n FROM trials WHERE status = 'finished'")
    assert int(count.n.iloc[0]) == len(finished)
