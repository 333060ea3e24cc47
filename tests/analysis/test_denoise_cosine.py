"""Issue 18: the denoise_cosine diagnostic from real training runs, through a real results store,
into the report's cosine table and figure (labelled NOT differentially private)."""
import math

import numpy as np
import pytest

from dptune.analysis.denoise_cosine import COSINE_COLUMNS, cosine_curves
from dptune.analysis.report import analyse, build_report
from dptune.analysis.results import Sweep
from dptune.platform.store.records import epoch_rows, trial_row
from dptune.platform.store.results_store import ResultsStore
from dptune.trainables.config import TrainConfig
from dptune.trainables.engine.denoise import COSINE_METRICS
from dptune.trainables.training import train


def run(**options) -> tuple[dict, list[dict]]:
    cfg = {"dataset": "digits", "model": "mlp", "epsilon": 8.0, "noise_multiplier": 0.8, "batch_size": 512,
           "epochs": 2.0, "learning_rate": 1.0, "clip_bound": 1.0, "device": "cpu",
           "model_options": {"hidden": 32, "depth": 1}, **options}
    return cfg, train(TrainConfig(**cfg), progress=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = ResultsStore(str(tmp_path_factory.mktemp("cosine") / "store"))
    histories = {}
    for i, options in enumerate([{"seed": 0, "diagnostics": ["denoise_cosine"]},
                                 {"seed": 1, "diagnostics": ["denoise_cosine"]},
                                 {"seed": 0, "denoise": "rmt", "diagnostics": ["denoise_cosine"]},
                                 {"seed": 0, "clip_bound": 2.0}]):   # no diagnostic
        cfg, history = run(**options)
        last = {**history[-1], "history": history}
        s.write_trial(trial_row(f"t{i}", cfg, last, status="finished"), epoch_rows(history))
        histories[f"t{i}"] = history
    return s, histories


def test_curves_are_the_per_epoch_means_of_the_trials_that_ran_it(store):
    s, histories = store
    sweep = Sweep.from_store(s)
    curves = cosine_curves(sweep, s.table("epochs"))
    assert set(COSINE_COLUMNS) == set(COSINE_METRICS)
    cells = sweep.trials.set_index("trial_id")["cell_name"]
    plain_cell, rmt_cell = cells["t0"], cells["t2"]
    assert cells["t1"] == plain_cell and rmt_cell != plain_cell
    assert "denoise=none" in plain_cell and "denoise=rmt" in rmt_cell   # NULL named by what it means
    assert set(curves["cell_name"]) == {plain_cell, rmt_cell}   # t3 ran no diagnostic: no rows of its own
    for epoch in (1, 2):
        row = curves[(curves["cell_name"] == plain_cell) & (curves["epoch"] == epoch)].iloc[0]
        assert row["trials"] == 2
        for column in COSINE_COLUMNS:
            values = [histories[t][epoch - 1][column] for t in ("t0", "t1")]
            expected = np.nanmean(values) if not all(math.isnan(v) for v in values) else math.nan
            assert row[column] == pytest.approx(expected, nan_ok=True), column
        rmt = curves[(curves["cell_name"] == rmt_cell) & (curves["epoch"] == epoch)].iloc[0]
        assert rmt["nonprivate_cos_denoised"] == pytest.approx(histories["t2"][epoch - 1]["nonprivate_cos_denoised"])


def test_report_has_the_section_only_with_the_diagnostic(store, tmp_path):
    s, _ = store
    page = build_report(s)
    assert "id='denoise'" in page and "RMT denoising: cosine to the signal" in page
    section = page[page.index("id='denoise'"):page.index("id='errors'")]
    assert "NOT differentially private" in section and "data:image/png;base64," in section
    bare = ResultsStore(str(tmp_path / "bare"))
    cfg, history = run(seed=0)
    bare.write_trial(trial_row("p", cfg, {**history[-1], "history": history},
                               status="finished"), epoch_rows(history))
    assert analyse(bare, noise=False).cosines.empty
    assert "id='denoise'" not in build_report(bare)
