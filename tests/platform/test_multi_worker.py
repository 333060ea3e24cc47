"""Multi-worker trials on real Ray (Ray Train, gloo on CPU): W = 2 gives the one-worker result, the
noise is added once, a pack on two workers trains each member as on one, and a sweep mixing W = 1
and W = 2 trials stores every row once.

Each Ray Train run costs seconds to start on a small machine, so the equivalence cases share one run.
"""
from __future__ import annotations

import math
import sys
import threading
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import ray
import torch
from torch.utils.data import TensorDataset

from dptune.platform.sweep import tune_adapter
from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.sweep.spec_sections import Resources
from dptune.platform.sweep.driver import run_sweep
from dptune.platform.sweep.trial_config import train_config
from faulting import await_pause, faulted_env, resume_from_pause
from sweep_plans import digits_spec, plan_of
from dptune.platform.store.results_store import ResultsStore
from dptune.trainables.config import TrainConfig
from dptune.trainables.data.catalog import load_dataset
from dptune.trainables.engine.distributed import shard_bounds
from dptune.trainables.engine.dp_engine import DPEngine
from dptune.trainables.engine.sampling import PoissonSampler
from dptune.trainables.pack_training import PackTrainer
from dptune.trainables.training import Trainer

STEPS = 12
SIGMA, BATCH = 2.0, 10.0
#: Trainer cases compared between W = 1 and W = 2: exact and Hutchinson norms, with and without
#: micro-batches, and the non-private baseline (mean loss over the global realised batch).
CASES = [{}, {"max_physical_batch_size": 3}, {"norm_estimator": "hutchinson", "sketch_k": 4},
         {"norm_estimator": "hutchinson", "sketch_k": 4, "max_physical_batch_size": 3}, {"epsilon": math.inf}]
#: The members of the pack trained on W = 1 and W = 2 (C, η and σ differ).
PACK_MEMBERS = [{"clip_bound": 0.5}, {"clip_bound": 2.0, "learning_rate": 0.2, "noise_multiplier": 2.0},
                {"clip_bound": 0.1, "learning_rate": 1.0, "noise_multiplier": 0.5}]


@pytest.fixture
def local_ray():
    ray.init(address="local", num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    yield
    ray.shutdown()


def config(**options) -> TrainConfig:
    options = {"epsilon": 2.0, "noise_multiplier": 1.0, "learning_rate": 0.5, "epochs": 1, **options}
    return TrainConfig(dataset="digits", model="mlp", batch_size=4, momentum=0.9, model_options={"hidden": 8}, device="cpu", seed=3, **options)


def digits64():
    splits = load_dataset("digits", seed=3)
    as64 = lambda d: TensorDataset(d.tensors[0].double(), d.tensors[1])  # noqa: E731
    return replace(splits, train=as64(splits.train), test=as64(splits.test))


def train_steps(trainer: Trainer) -> dict[str, torch.Tensor]:
    for _ in range(STEPS):
        trainer.train_step()
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def trained_pack(workers=None) -> tuple[dict[str, torch.Tensor], list[list[dict]]]:
    """A pack of :data:`PACK_MEMBERS` trained to its end (24 steps in its one epoch, float64 data): its packed
    weights and each member's history."""
    pack = PackTrainer([config(**m, epochs=2 * STEPS * 4 / 1437) for m in PACK_MEMBERS], digits64(), workers=workers)
    histories = pack.fit()
    return {n: p.detach().clone() for n, p in pack.model.named_parameters()}, histories


def noise_engine(all_reduce=None) -> DPEngine:
    """An engine on a 100×100 layer whose clipped sums are zero (an empty batch): ĝ is its noise alone."""
    layer = torch.nn.Linear(100, 100, bias=False).double()
    return DPEngine(layer, torch.nn.CrossEntropyLoss(reduction="none"), clip_bound=1.0, noise_multiplier=SIGMA,
                    expected_batch_size=BATCH, generator=torch.Generator().manual_seed(11), all_reduce=all_reduce)


def empty_gradient(engine: DPEngine) -> torch.Tensor:
    engine.private_gradient(torch.zeros(0, 100, dtype=torch.float64), torch.zeros(0, dtype=torch.long))
    return engine.model.weight.grad.clone()


def test_two_workers_equal_one_and_add_the_noise_once(local_ray, tmp_path):
    from ray.train import ScalingConfig, RunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = tmp_path / "two_workers.pt"
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test file

    def per_worker(loop_config: dict) -> None:  # a closure: Ray pickles it by value
        import torch.distributed as dist
        from dptune.trainables.engine.distributed import ProcessGroupWorkers

        torch.set_num_threads(1)
        torch.set_default_dtype(torch.float64)
        workers = ProcessGroupWorkers()
        params = [train_steps(Trainer(config(**case), digits64(), workers=workers)) for case in CASES]
        pack = trained_pack(workers)
        noise = empty_gradient(noise_engine(all_reduce=workers.sum))
        noises = [torch.zeros_like(noise) for _ in range(workers.size)]
        dist.all_gather(noises, noise)
        if workers.rank == 0:
            torch.save({"params": params, "noises": noises, "pack": pack}, loop_config["out"])

    TorchTrainer(per_worker, train_loop_config={"out": str(out)}, torch_config=TorchConfig(backend="gloo"),
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(storage_path=str(tmp_path / "train"), name="equivalence")).fit()
    two = torch.load(out)

    # W = 1 with the same seeds (float64): the same parameters after STEPS steps; a pack trained to its
    # end on two workers (each member's clipped sums all-reduced, its noise drawn once) has each
    # member's weights and epoch statistics (the norms of both shards) of the pack on one
    torch.set_default_dtype(torch.float64)
    try:
        for case, params in zip(CASES, two["params"]):
            one = train_steps(Trainer(config(**case), digits64()))
            for name, p in one.items():
                assert torch.allclose(params[name], p, rtol=1e-6, atol=1e-12), (case, name)
        pack_weights, pack_histories = trained_pack()
    finally:
        torch.set_default_dtype(torch.float32)
    two_weights, two_histories = two["pack"]
    for name, p in pack_weights.items():
        assert torch.allclose(two_weights[name], p, rtol=1e-6, atol=1e-12), name
    for one_history, two_history in zip(pack_histories, two_histories, strict=True):
        assert len(two_history) == len(one_history) == 1
        for one_epoch, two_epoch in zip(one_history, two_history):
            assert two_epoch["clipped_fraction"] == one_epoch["clipped_fraction"]
            counts = lambda e: {y: s["count"] for y, s in e["nonprivate_gradnorms"].items()}  # noqa: E731
            assert counts(two_epoch) == counts(one_epoch)   # every example's norm, gathered from both shards
            assert two_epoch["test_accuracy"] == pytest.approx(one_epoch["test_accuracy"])
    first = next(iter(pack_weights.values()))   # [K, …]: the members trained apart (each its own C, η, σ)
    assert all(not torch.allclose(first[i], first[j]) for i in range(len(first)) for j in range(i))
    # ... including steps where one worker's shard of the global Poisson batch was empty
    sampler, n = PoissonSampler(1437, 4 / 1437, seed=3), 1437
    shard_sizes = []
    for _ in range(STEPS):
        idx = sampler.sample()
        shard_sizes += [int(((idx >= lo) & (idx < hi)).sum()) for lo, hi in (shard_bounds(n, r, 2) for r in range(2))]
    assert 0 in shard_sizes and max(shard_sizes) > 0

    # noise added once: zero clipped sums leave ĝ = σCξ/(BC), std σ/B per coordinate (not σ√W/B),
    # the same on both workers and equal to the one-worker draw
    noise_0, noise_1 = two["noises"]
    assert torch.equal(noise_0, noise_1)
    assert torch.equal(noise_0, empty_gradient(noise_engine()))
    assert float(noise_0.std()) == pytest.approx(SIGMA / BATCH, rel=0.05)  # σ√2/B is 41 % away
    assert abs(float(noise_0.mean())) < 4 * SIGMA / BATCH / 100


def kill_a_worker_at_the_first_checkpoint(faults: Path, killed: list, sweep: threading.Thread) -> None:
    """Wait until rank 0 of the two-worker trial paused after its first checkpoint (a fault point:
    the group is certainly mid-trial), SIGKILL one Train worker process, then let it go on."""
    await_pause(faults, "train_checkpointed@1", alive=sweep.is_alive)
    for proc in psutil.process_iter(["cmdline"]):
        if any("RayTrainWorker" in part for part in proc.info["cmdline"] or []):
            proc.kill()
            killed.append(proc.pid)
            break
    resume_from_pause(faults, "train_checkpointed@1")   # the restarted group passes the point at once


def test_sweep_mixing_one_and_two_worker_trials_with_a_killed_worker(tmp_path, monkeypatch):
    """Two trials, B = 32 on one worker and B = 64 on two (workers_from_batch_size = 64). One of the
    two workers is killed after the first epoch's checkpoint: the group restarts from it
    (FailureConfig) and the trial ends with the weights of an uninterrupted one-worker run. Each
    trial is stored once, finished, with each epoch once. Its own Ray, started with the fault point
    in its environment, so the trial's processes see it."""
    faults = tmp_path / "faults"
    for name, value in faulted_env("train_checkpointed@1=pause", faults).items():
        monkeypatch.setenv(name, value)   # Ray's processes inherit it
    plan = plan_of(digits_spec(epsilon=4.0, batch_size=[32, 64], epochs=4, model_options={"hidden": 16},
                               trial={"device": "cpu"}))
    settings = RunSettings(experiment="mixed", storage=str(tmp_path), max_failures=1,
                           resources=Resources(workers_from_batch_size=64, workers=2))
    killed: list[int] = []
    outcome = []
    ray.init(address="local", num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    try:
        sweep = threading.Thread(target=lambda: outcome.append(run_sweep(plan, settings)))
        killer = threading.Thread(target=kill_a_worker_at_the_first_checkpoint, args=(faults, killed, sweep),
                                  daemon=True)
        sweep.start()
        killer.start()
        sweep.join()
        killer.join()
    finally:
        ray.shutdown()
    results = outcome[0].results
    assert killed and all(r.error is None for r in results)
    store = ResultsStore(settings.paths.store)
    rows = store.table("trials")
    assert sorted(rows.batch_size) == [32, 64] and rows.trial_id.is_unique and (rows.status == "finished").all()
    epochs = store.table("epochs").merge(rows[["trial_id", "batch_size"]], on="trial_id")
    assert sorted(epochs[epochs.batch_size == 64].epoch) == [1, 2, 3, 4]
    assert sorted(epochs[epochs.batch_size == 32].epoch) == [1, 2, 3, 4]

    on_two = next(r for r in results if r.config["batch_size"] == 64)
    state = tune_adapter.checkpoint_state(on_two.checkpoint)
    assert state["trainer"]["workers"] == 2 and state["trainer"]["epoch"] == 4
    one = Trainer(train_config(on_two.config))
    while not one.done:
        one.run_epoch()
    for name, p in one.trainable_state().items():
        assert torch.allclose(state["trainer"]["model"][name], p, rtol=1e-4, atol=1e-6), name
    assert on_two.metrics["test_accuracy"] == pytest.approx(float(rows[rows.batch_size == 64].accuracy.iloc[0]))
    assert math.isfinite(on_two.metrics["epsilon_spent"])


def test_resources_section_names_the_bad_field():
    from dptune.platform.sweep.spec_sections import parse_resources
    from dptune.search_spaces.spec import SpecError

    parsed = parse_resources({"workers": 2, "gpu": 1, "cpu": 4, "workers_from_batch_size": 4096}, None)
    assert (parsed.workers, parsed.gpu, parsed.cpu, parsed.workers_from_batch_size) == (2, 1.0, 4.0, 4096)
    assert parse_resources({}, None).workers == 1
    for bad, field in (({"workers": 0}, "resources.workers"), ({"workers": 1.5}, "resources.workers"),
                       ({"workers": 2, "gpu": 0.5}, "resources.gpu"),
                       ({"workers_from_batch_size": 0}, "resources.workers_from_batch_size"),
                       ({"worker": 2}, "resources")):
        with pytest.raises(SpecError, match=field):
            parse_resources(bad, None)


def test_resources_pick_w_and_the_placement_per_trial():
    from dptune.trainables.training import check_workers

    spec = Resources(workers=4, cpu=2, gpu=1, workers_from_batch_size=1024)
    small, large = {"batch_size": 512, "model": "cnn"}, {"batch_size": 1024, "model": "cnn"}
    assert spec.workers_for(small) == 1 and spec.workers_for(large) == 4
    assert spec.placement(small).bundles == [{"CPU": 2, "GPU": 1}]
    assert spec.placement(large).bundles[0].get("CPU", 0) == 0 and "GPU" not in spec.placement(large).bundles[0]
    assert Resources(workers=2).workers_for(small) == 2
    assert spec.workers_for({"pack": [small, {**small, "clip_bound": 2.0}]}) == 1   # a pack: its members' B
    assert spec.workers_for({"pack": [large, {**large, "clip_bound": 2.0}]}) == 4
    check_workers({"workers": 4}, 4)
    with pytest.raises(ValueError, match="written on 4 worker.*not on 2: set resources.workers to 4"):
        check_workers({"workers": 4}, 2)


def test_multi_worker_sweeps_bound_the_trials_tune_starts(local_ray):
    from dptune.platform.sweep.launcher import max_concurrent

    assert max_concurrent(RunSettings(resources=Resources(workers=1))) is None  # one-worker trials reserve their own resources
    assert max_concurrent(RunSettings(resources=Resources(max_concurrent=5, workers=2))) == 5
    assert max_concurrent(RunSettings(resources=Resources(workers=2, cpu=1))) == 3  # num_cpus=3 of this module's Ray
    assert max_concurrent(RunSettings(resources=Resources(workers=2, cpu=2))) == 1
    assert max_concurrent(RunSettings(resources=Resources(workers=2, cpu=1, gpu=1))) == 1  # no GPU: at least one


def test_a_pack_on_two_workers_in_a_sweep_stops_members_and_trains_each_as_alone(tmp_path):
    """A sweep on two workers per trial packs a cell's four configurations (one trial on a Ray Train
    group of two); ASHA stops members one by one (rank 0 reads the stops, both workers retire them):
    each member is stored once with its own status, and a member that finished has, in the pack's
    checkpoint (written on two workers), the weights of its configuration trained alone on one."""
    from dptune.trainables.engine.packing import load_member

    spec = digits_spec(epsilon=[4.0], batch_size=[128], multipliers=[0.5, 2.0, 8.0, 32.0], epochs=3,
                       model_options={"hidden": 16}, trial={"device": "cpu"},
                       search={"pack": "on", "scheduler": {"name": "asha", "grace_steps": 10, "reduction_factor": 2}})
    settings = RunSettings(experiment="packed", storage=str(tmp_path), max_failures=0,
                           resources=Resources(workers=2, max_concurrent=1))
    ray.init(address="local", num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    try:
        outcome = run_sweep(plan_of(spec), settings)
    finally:
        ray.shutdown()
    (pack,) = outcome.results
    assert outcome.errored == 0 and len(pack.config["pack"]) == 4
    rows = ResultsStore(settings.paths.store).table("trials")
    assert rows.trial_id.is_unique and len(rows) == 4 and set(rows.status) == {"finished", "stopped"}
    state = tune_adapter.checkpoint_state(pack.checkpoint)["pack"]
    assert state["workers"] == 2
    finished = [int(t.rsplit("-m", 1)[1]) for t in rows[rows.status == "finished"].trial_id]
    for k in finished:
        alone = Trainer(train_config(pack.config["pack"][k]))
        alone.fit()
        packed = PackTrainer([train_config(c) for c in pack.config["pack"]])
        packed.model.load_state_dict(state["model"], strict=False)
        load_member(packed.model, packed.lead.model, k)
        # float32 sums of two shards in another order, grown over 34 steps by η up to 8× (measured: at
        # most 4e-5 on weights of size 1.3); a shard's sums left out or noise added twice differ by O(0.1)
        for name, p in alone.trainable_state().items():
            torch.testing.assert_close(packed.lead.model.state_dict()[name], p, rtol=1e-3, atol=1e-4, msg=(k, name))
