"""Private selection end to end (issue 13) on real Ray and the real trainer (digits): K trials
exactly, each releasing one noisy validation score and no test accuracy; the best noisy score's
trial released with the cell's total ε and its test accuracy, measured once after selection."""
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
import torch

from dptune.analysis.report import build_report
from dptune.errors import UserError
from dptune.platform.sweep.catalog import trainables_catalog
from dptune.platform.views.export import export_release
from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.store.query import run_query
from dptune.platform.sweep.selection_release import release_selections
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import run_sweep
from dptune.search_spaces import load_spec, plan_sweep
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import train

SPEC = {"axes": {"epsilon": 3, "backbone": {"name": "mlp", "hidden": 16}, "dataset": "digits", "epochs": 2},
        "clip_bound": [0.5, 5], "batch_size": [128, 256], "pruning": {"min_steps": 5, "plateau_tol": 1.0},
        "learning_rate": {"reference": 1.0, "reference_batch_size": 128, "multipliers": [1]},
        "search": {"algorithm": "random", "seed": 1},
        "selection": {"mode": "private", "distribution": "geometric", "mean_trials": 3, "score_noise": 0.05,
                      "validation_fraction": 0.15},
        "trial": {"device": "cpu"}}


def counted_accuracy(result) -> dict:
    """Test and validation accuracy of a trial's final checkpoint: its model rebuilt and every
    example of each split predicted one by one."""
    from dptune.platform.sweep.trial_config import train_config
    from dptune.platform.sweep.tune_adapter import checkpoint_state
    from dptune.trainables.training import Trainer

    state = checkpoint_state(result.checkpoint)["trainer"]
    trainer = Trainer(train_config({**result.config, "randomness": "reproducible"}))   # the same split and model
    trainer.model.load_state_dict(state["model"], strict=False)
    trainer.model.eval()
    out = {}
    for name, split in (("test", trainer.data.test), ("validation", trainer.data.validation)):
        with torch.no_grad():
            hits = [int(trainer.model(split[i][0][None]).argmax(-1)) == int(split[i][1]) for i in range(len(split))]
        out[name] = sum(hits) / len(hits)
    return out


@pytest.mark.slow
def test_a_private_selection_sweep_releases_one_tested_trial_of_k(tmp_path):
    plan = plan_sweep(load_spec(SPEC, trainables_catalog()), trainables_catalog(), workers=1, draw=True)
    (cell,) = plan.cells
    k = len(cell.draws)   # a secret draw (the law of K is tested in tests/search_spaces)
    settings = RunSettings(experiment="private", storage=str(tmp_path / "run"), max_failures=0, verbose=0)
    out = io.StringIO()
    keys = tmp_path / "keys"
    keys.mkdir()

    def record_secrets() -> None:   # in each Ray worker: keep a copy of every trial's secret, for the check below
        import os
        import secrets

        import dptune.trainables.training as training

        def recorded() -> bytes:
            key = secrets.token_bytes(32)
            (keys / f"{os.getpid()}-{secrets.token_hex(4)}").write_bytes(key)
            return key
        training.new_secret = recorded

    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR",
             runtime_env={"worker_process_setup_hook": record_secrets})
    logs = Path(ray._private.worker._global_node.get_session_dir_path())   # Ray's logs and state of this session
    try:
        results = run_sweep(plan, settings, out=out).results
    finally:
        ray.shutdown()
    # every trial drew its own secret, and none is in any byte the sweep wrote: store, checkpoints,
    # Ray's experiment state, the worker logs, the output
    secret = [p.read_bytes() for p in keys.iterdir()]
    assert len(secret) == len(set(secret)) >= k
    written = b"".join(p.read_bytes() for root in (tmp_path / "run", logs) for p in root.rglob("*")
                       if p.is_file() and not p.is_socket()) + out.getvalue().encode()
    assert not any(s in written or s.hex().encode() in written for s in secret)
    # the store holds every noisy score and K: only its owner may read the experiment
    assert (tmp_path / "run" / "private").stat().st_mode & 0o777 == 0o700
    store = ResultsStore(settings.paths.store)
    rows = store.table("trials")
    assert len(rows) == k and set(rows.status) == {"finished"} and set(rows.selection_k) == {k}
    assert sorted(rows.selection_draw) == list(range(k))
    assert (rows.total_epsilon <= 3).all() and (rows.trial_epsilon < rows.total_epsilon).all()
    # no trial looked at the test data or stored a raw validation accuracy; the searcher saw the noisy score
    chosen = rows[rows.selected.astype(bool)]
    assert len(chosen) == 1
    others = rows[~rows.selected.astype(bool)]
    assert others.test_accuracy.isna().all() and rows.validation_accuracy.isna().all()
    assert (rows.accuracy == rows.selection_score).all()
    best = chosen.iloc[0]
    assert best.selection_score == rows.selection_score.max()
    epochs = store.table("epochs")
    assert epochs[epochs.epoch == 1].accuracy.isna().all()    # nothing evaluated before the end
    # the released test accuracy is that of the selected trial's final model, counted here example by example;
    # its score is that model's validation accuracy plus secret noise (std 0.05: it cannot be regenerated)
    selected = next(r for r in results if r.config["selection_draw"] == int(best.selection_draw))
    assert selected.config["randomness"] == "secure"
    accuracy = counted_accuracy(selected)
    assert best.test_accuracy == pytest.approx(accuracy["test"], abs=1e-12)
    assert 0 < abs(best.selection_score - accuracy["validation"]) < 0.25
    assert f"K={k}" in out.getvalue() and f"test accuracy {best.test_accuracy:.4f}" in out.getvalue()
    # dptune query shows the per-cell release
    frame = run_query(settings.paths.store, "SELECT cell, selection_k, trial_epsilon, total_epsilon, trial_id, "
                      "test_accuracy FROM trials WHERE selected", out=io.StringIO())
    assert len(frame) == 1 and frame.selection_k[0] == k and frame.test_accuracy[0] == best.test_accuracy
    # the report shows the release per cell
    page = build_report(store)
    assert "Private selection: the released model per cell" in page and f"{best.test_accuracy:.3f}" in page
    # dptune export writes the release alone: the selected model's weights, its configuration, the total ε
    from safetensors.torch import load_file

    from dptune.cli import main
    from dptune.platform.sweep.tune_adapter import checkpoint_state

    assert main(["export", settings.paths.root, "--out", str(tmp_path / "release")], out=io.StringIO()) == 0
    (folder,) = (tmp_path / "release").iterdir()
    weights = load_file(folder / "model.safetensors")
    final = checkpoint_state(selected.checkpoint)["trainer"]["model"]
    assert weights.keys() == final.keys() and all(torch.equal(weights[k], final[k]) for k in final)
    record = json.loads((folder / "release.json").read_text())
    assert record["privacy"]["epsilon"] == best.total_epsilon and record["privacy"]["randomness"] == "secure"
    assert record["test_accuracy"] == best.test_accuracy and record["configuration"]["clip_bound"] == best.clip_bound
    assert "selection_k" not in json.dumps(record) and "selection_draw" not in json.dumps(record)
    for other in others.trial_id:   # none when the secret K is 1 (test_export checks the refusal itself)
        with pytest.raises(UserError, match="was not selected"):
            export_release(settings.paths.root, str(tmp_path / "other"), trial_id=other)
    # releasing again (dptune resume) touches nothing: the test data is used once
    again = [SimpleNamespace(config=cell.draw_config(i), checkpoint=None, metrics={}) for i in range(k)]
    assert release_selections(again, settings.paths, out=io.StringIO()) == []


def test_a_private_selection_trial_looks_at_validation_once_and_never_at_test():
    cfg = TrainConfig(dataset="digits", model="mlp", epsilon=3.0, epochs=2, batch_size=256, learning_rate=1.0,
                      model_options={"hidden": 8}, validation_fraction=0.15, score_noise=0.05, seed=7, split_seed=0,
                      device="cpu")
    history = train(cfg, progress=False)
    evaluated = {"accuracy", "test_accuracy", "validation_accuracy", "loss", "test_loss", "validation_loss",
                 "selection_score"}
    assert [set(h) & evaluated for h in history] == [set(), {"selection_score"}]
    plain = train(TrainConfig.from_dict({**cfg.to_dict(), "score_noise": None}), progress=False)[-1]
    assert history[-1]["selection_score"] != plain["validation_accuracy"]
    assert abs(history[-1]["selection_score"] - plain["validation_accuracy"]) < 0.25   # noise std 0.05
    for bad in ({"validation_fraction": 0.0}, {"epsilon": float("inf")}, {"score_noise": 0.0}):
        with pytest.raises(ValueError, match="score_noise must be None"):
            TrainConfig.from_dict({**cfg.to_dict(), **bad}).validate()
