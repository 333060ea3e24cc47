"""Issue 27: a sweep's trials as runs in real trackers (MLflow on SQLite, W&B offline, TensorBoard
event files), read back with each tracker's own reader; the spec's ``tracking`` section checked
before anything runs."""
import re
import struct

import pytest
import ray

from dptune.platform.sweep import trackers
from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.sweep.driver import run_sweep
from dptune.search_spaces import SpecError, load_spec
from dptune.platform.sweep.catalog import trainables_catalog
from sweep_plans import digits_spec, plan_of

EPOCHS = 2
#: the parameters issue 27 asks every run to carry, as trial-config keys
PARAMETERS = ("cell", "clip_bound", "batch_size", "learning_rate", "noise_multiplier", "sample_rate", "steps",
              "norm_estimator", "denoise")
METRICS = ("test_accuracy", "test_loss", "epsilon_spent", "clipped_fraction")


def tracked_sweep(spec: dict, experiment: str, folder) -> tuple:
    """Run ``spec`` on a local Ray of two CPUs with its trackers: (outcome, run settings)."""
    catalog = trainables_catalog()
    parsed = load_spec(spec, catalog)
    settings = RunSettings(experiment=experiment, storage=str(folder), max_failures=0, tracking=parsed["tracking"],
                           resources=parsed["resources"])
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    try:
        return run_sweep(plan_of(spec, catalog), settings), settings
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One small sweep (2 trials, 2 epochs) with all three trackers on."""
    spec = digits_spec(epsilon=[4.0], batch_size=[300], clip_bound=[0.5, 2.0], epochs=EPOCHS,
                       model_options={"hidden": 16},
                       tracking={"mlflow": {"experiment": "digits-tracked"}, "wandb": {"project": "dptune-test"},
                                 "tensorboard": True})
    outcome, settings = tracked_sweep(spec, "tracked", tmp_path_factory.mktemp("tracked"))
    assert outcome.finished == 2
    return settings.paths.root


def test_mlflow_holds_one_run_per_trial_with_parameters_and_epoch_metrics(tracked):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tracked}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["digits-tracked"])
    assert len(runs) == 2
    assert sorted(runs["params.clip_bound"].astype(float)) == [0.5, 2.0]
    for key in PARAMETERS:
        assert runs[f"params.{key}"].notna().all(), key
    assert (runs["params.cell"].str.startswith("digits/")).all()
    assert (runs["tags.dptune.non_private_metrics"].str.contains("clipped_fraction")).all()
    client = mlflow.tracking.MlflowClient()
    for run_id in runs.run_id:
        for metric in METRICS:
            history = client.get_metric_history(run_id, metric)
            assert len(history) == EPOCHS, metric
        eps = [m.value for m in sorted(client.get_metric_history(run_id, "epsilon_spent"), key=lambda m: m.step)]
        assert eps[0] < eps[1] <= 4.0


def test_an_mlflow_file_store_the_spec_names_is_honoured(tmp_path, monkeypatch):
    """Issue 33, item 6: ``tracking_uri: file:///…/mlruns`` (MLflow 3 refuses file stores unless
    MLFLOW_ALLOW_FILE_STORE is true) gets its runs there; a user who set the variable to false is told
    so in one line when the spec is read."""
    import mlflow

    monkeypatch.setenv(trackers.ALLOW_FILE_STORE, "unset below")   # recorded, so the test leaves it as it was
    monkeypatch.delenv(trackers.ALLOW_FILE_STORE)
    uri = f"file://{tmp_path}/mlruns"
    parsed = trackers.parse_tracking({"mlflow": {"tracking_uri": uri, "experiment": "filed"}}, None)
    (callback,) = trackers.tracker_callbacks(parsed, "filed", str(tmp_path))
    callback.setup()                                      # Ray's callback creates the experiment here
    assert mlflow.tracking.MlflowClient(uri).get_experiment_by_name("filed") is not None
    assert (tmp_path / "mlruns").is_dir()
    monkeypatch.setenv(trackers.ALLOW_FILE_STORE, "false")
    with pytest.raises(SpecError, match=r"tracking.mlflow.tracking_uri: file://.* is an MLflow file store, and "
                                        r"MLFLOW_ALLOW_FILE_STORE=false refuses it"):
        trackers.parse_tracking({"mlflow": {"tracking_uri": uri}}, None)
    assert not trackers._file_store("sqlite:///x.db") and trackers._file_store("./mlruns")


def _finished_wandb_records(path):
    """The records of a W&B run file, which must be whole when the sweep returns: its exit record
    written (dptune's logging actor waits for W&B's service process to flush the run; without that
    wait, Ray killed the actor first and the file was left empty or without its history)."""
    records = _wandb_records(path)
    assert any(r.WhichOneof("record_type") == "exit" for r in records), f"W&B run file not finished: {path}"
    return records


def _wandb_records(path):
    """The protobuf records of a W&B run file (LevelDB log format: 32 KiB blocks of records with a
    7-byte header crc32/length/type; W&B's own header is 7 bytes), parsed with wandb's protobuf."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, offset, block = [], b"", 7, 32768
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a header is padding
            offset += block - offset % block
            continue
        length, kind = struct.unpack("<HB", data[offset + 4:offset + 7])
        chunk = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # a full record, or the last part of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_runs_hold_the_same_fields(tracked):
    import json
    from pathlib import Path

    runs = sorted(Path(tracked, "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2
    for path in runs:
        records = _finished_wandb_records(path)
        config = {}
        history = []
        for record in records:
            kind = record.WhichOneof("record_type")
            if kind == "run":
                config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
                assert "non-private" in record.run.notes
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        for key in PARAMETERS:
            assert key in config, key
        epochs = [h for h in history if "test_accuracy" in h]
        assert len(epochs) == EPOCHS and all(all(m in h for m in METRICS) for h in epochs)


def test_tensorboard_event_files_have_one_series_per_metric(tracked):
    from pathlib import Path

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(tracked).glob("*/events.out.tfevents.*"))
    assert len(files) == 2
    for path in files:
        events = EventAccumulator(str(path.parent))
        events.Reload()
        tags = events.Tags()["scalars"]
        for metric in METRICS:
            series = [t for t in tags if t.endswith(f"/{metric}")]
            assert len(series) == 1, (metric, tags)
            assert len(events.Scalars(series[0])) == EPOCHS


@pytest.mark.parametrize("section,message", [
    ({"mlfow": {}}, "tracking.mlfow: unknown key 'mlfow' (did you mean 'mlflow'?)"),
    ({"wandb": {"mode": "offline"}}, "tracking.wandb.project: required"),
    ({"wandb": {"project": "p", "mode": "cloud"}}, "tracking.wandb.mode: must be one of offline, online"),
    ({"tensorboard": "yes"}, "tracking.tensorboard: must be true or false"),
    ({"mlflow": {"tracking_uri": 3}}, "tracking.mlflow.tracking_uri: must be a non-empty string"),
])
def test_bad_tracking_sections_are_refused_with_the_field(section, message):
    spec = digits_spec(epsilon=[4.0], batch_size=[300], tracking=section)
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(spec, trainables_catalog())


def test_a_tracker_not_installed_is_refused_before_anything_runs(monkeypatch):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    spec = digits_spec(epsilon=[4.0], batch_size=[300], tracking={"wandb": {"project": "p"}})
    with pytest.raises(SpecError, match=r"tracking\.wandb: wandb not installed; pip install 'dptune\[tracking\]'"):
        load_spec(spec, trainables_catalog())


def test_each_member_of_a_pack_is_a_run_of_its_own(tmp_path):
    """Issue 36: a pack of two (η × 1 and × 4, one Ray Tune trial) is two MLflow runs, two TensorBoard
    runs and two W&B runs, each with its member's parameters and its own epochs, ending at its row's values."""
    from pathlib import Path

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dptune.platform.store.results_store import ResultsStore

    spec = digits_spec(epsilon=[4.0], batch_size=[64], multipliers=[1.0, 4.0], epochs=EPOCHS, model_options={"hidden": 16},
                       search={"pack": "on"}, tracking={"mlflow": {"experiment": "packed"}, "tensorboard": True,
                                                        "wandb": {"project": "dptune-test"}},
                       resources={"max_concurrent": 1})   # one slot: the two in one pack, not split over two
    outcome, settings = tracked_sweep(spec, "packed", tmp_path)
    assert len(outcome.results) == 1 and outcome.finished == 2
    rows = ResultsStore(settings.paths.store).table("trials").set_index("trial_id")
    assert rows.index.str.fullmatch(r".+-m[01]").all() and rows.learning_rate.nunique() == 2

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{settings.paths.root}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["packed"]).set_index("tags.mlflow.runName")
    assert sorted(runs.index) == sorted(rows.index)
    client = mlflow.tracking.MlflowClient()
    for trial_id, row in rows.iterrows():
        run = runs.loc[trial_id]
        assert float(run["params.learning_rate"]) == row.learning_rate
        history = sorted(client.get_metric_history(run.run_id, "test_accuracy"), key=lambda m: m.step)
        assert len(history) == EPOCHS and history[-1].value == pytest.approx(row.accuracy)

    folders = sorted({path.parent for path in Path(settings.paths.root).glob("*/member-*/events.out.tfevents.*")})
    assert [f.name for f in folders] == ["member-0", "member-1"]
    finals = set()
    for folder in folders:
        events = EventAccumulator(str(folder))
        events.Reload()
        (series,) = [t for t in events.Tags()["scalars"] if t.endswith("/test_accuracy")]
        points = events.Scalars(series)
        assert len(points) == EPOCHS
        finals.add(round(points[-1].value, 5))
    assert finals == {round(a, 5) for a in rows.accuracy}

    import json

    rates = []
    for path in sorted(Path(settings.paths.root, "wandb").glob("offline-run-*/run-*.wandb")):
        config, epochs = {}, 0
        for record in _finished_wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind in ("run", "config"):
                items = record.run.config.update if kind == "run" else record.config.update
                config.update({i.key: json.loads(i.value_json) for i in items})
            elif kind == "history":
                epochs += any((i.key or "/".join(i.nested_key)) == "test_accuracy" for i in record.history.item)
        rates.append(config["learning_rate"])
        assert epochs == EPOCHS
    assert sorted(rates) == sorted(rows.learning_rate)
