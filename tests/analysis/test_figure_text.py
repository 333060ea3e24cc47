"""Issue 50: every figure the report draws keeps its text inside its canvas, for one cell and for
four. Read with matplotlib's own tight bounding boxes against the canvas, on the figures exactly as
the report renders them (a title cut at the edge, as the one-cell report's were, fails)."""
import math

import numpy as np
import pytest
import torch

from dptune.analysis import figures
from dptune.analysis.report import build_report
from dptune.platform.store.records import gradnorm_rows
from dptune.platform.store.results_store import ResultsStore
from dptune.trainables.engine.norm_stats import class_norm_statistics

N = 4000   # the training set's size the rows' q and T stand for


def store_of(tmp_path, epsilons: tuple[float, ...], epochs: tuple[int, ...]) -> ResultsStore:
    """A store of finished trials (three C, two B, two η, three seeds) in each (ε, epochs) cell of a
    long-named dataset, with per-class gradient-norm statistics."""
    store = ResultsStore(str(tmp_path / "store"))
    rng = np.random.default_rng(0)
    for eps in epsilons:
        for epochs_ in epochs:
            for c in (0.1, 1.0, 10.0):
                for b in (64, 256):
                    for lr in (0.5, 2.0):
                        for seed in range(3):
                            steps = math.ceil(epochs_ * N / b)
                            norms = torch.tensor(rng.lognormal(0, 1, 200))
                            labels = torch.tensor(rng.integers(0, 10, 200))
                            history = [{"epoch": epochs_, "nonprivate_gradnorms":
                                        class_norm_statistics(norms, labels, c, histogram=True)}]
                            acc = float(rng.uniform(0.3, 0.9))
                            store.write_trial(
                                {"trial_id": f"{eps}-{epochs_}-{c}-{b}-{lr}-{seed}", "experiment": "fig",
                                 "status": "finished", "cell": f"mnist5k/cnn/E={epochs_}/eps={eps}",
                                 "dataset": "mnist5k_with_a_long_name[max_length=64]", "backbone": "cnn[width=32]",
                                 "model": "cnn", "epsilon": eps, "delta": 1e-5, "epochs": float(epochs_),
                                 "clip_bound": c, "batch_size": b, "learning_rate": lr, "seed": seed, "private": True,
                                 "noise_multiplier": 1.0, "sample_rate": b / N, "steps": steps,
                                 "noise_sqrt_steps": math.sqrt(steps), "epsilon_spent": eps, "accuracy": acc,
                                 "test_accuracy": acc, "metric": "test_accuracy", "metric_mode": "max",
                                 "clipped_fraction": 0.5, "epoch": epochs_},
                                [{"epoch": epochs_, "accuracy": acc}], gradnorm_rows(history))
    return store


@pytest.mark.parametrize("epsilons,epochs", [((2.0,), (5,)), ((1.0, 8.0), (1, 16))], ids=["one cell", "four cells"])
def test_every_text_of_every_report_figure_lies_inside_its_canvas(tmp_path, monkeypatch, epsilons, epochs):
    drawn = []
    render = figures.png_base64

    def capture(fig, dpi: int = 110) -> str:
        out = render(fig, dpi)
        drawn.append((fig, dpi))
        return out

    monkeypatch.setattr(figures, "png_base64", capture)
    build_report(store_of(tmp_path, epsilons, epochs))
    assert len(drawn) >= 4   # heatmaps, the fixed-setting cost, noise curves, gradient norms, retention
    for fig, dpi in drawn:
        runs_off = figures.outside(fig, dpi)
        assert not runs_off, [text[:60] for text, *_ in runs_off]


def test_without_the_fit_a_long_title_runs_off_a_one_cell_figure():
    """The check can fail: the one-cell heatmap's title, drawn as it was before, runs off its canvas."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.5, 4))
    fig.subplots()
    fig.suptitle("mnist5k · cnn · 5 epochs: best accuracy over η for each (C, B), across ε; the optimum "
                 "starred (its η written); dashed ≡ not distinguishable from it")
    assert figures.outside(fig, 110)
    figures.fit_text(fig, 110)
    assert not figures.outside(fig, 110)
