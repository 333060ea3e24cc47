"""`dptune sweep --address`: the σ a plan lacks are calibrated as Ray tasks on the cluster, not in
the driver's processes, and are the σ a lone calibration gives."""
import math

import pytest
import ray

from dptune.platform.sweep.ray_tasks import RayTasks
from dptune.privacy import calibrate_noise, epsilon_spent
from dptune.privacy.cache import clear_memory
from dptune.search_spaces import NoiseRequest, calibrate_many, noise_table


@pytest.fixture
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    yield
    ray.shutdown()


def test_calibrations_run_as_ray_tasks(local_ray, monkeypatch):
    requests = [NoiseRequest(eps, 1e-5, q, math.ceil(2 / q)) for eps in (1.37, 2.71) for q in (0.05, 0.2)]
    monkeypatch.setenv("DPTUNE_CACHE_DIR", "off")   # the driver finds nothing cached …
    clear_memory()

    def not_here(*args, **kwargs):
        raise AssertionError("calibrated in the driver's process")

    monkeypatch.setattr(noise_table, "calibrate_noise_series", not_here)   # … and cannot compute
    sigmas = calibrate_many(requests, workers=1, executor=RayTasks())   # workers=1 alone: in this process
    monkeypatch.undo()
    monkeypatch.setenv("DPTUNE_CACHE_DIR", "off")
    assert set(sigmas) == set(requests)
    for r in requests:   # a series is warm-started: a lone calibration's σ within its 0.1% tolerance
        assert math.isclose(sigmas[r], calibrate_noise(r.epsilon, r.delta, r.sample_rate, r.steps), rel_tol=1e-3)
        assert epsilon_spent(sigmas[r], r.delta, r.sample_rate, r.steps) <= r.epsilon
    clear_memory()


def test_ray_tasks_need_a_connected_ray():
    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="start_ray"):
        RayTasks()
