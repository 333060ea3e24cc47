"""Fixtures of the platform tests: ``s3``, a real S3 server (SeaweedFS on 127.0.0.1; see s3_server.py),
``local_ray``, a local Ray (2 CPUs, no dashboard) per test module, and ``rigged_ray``, the same that
ships tests/platform/rigged.py to its workers by value."""
import pytest
import ray
from ray import cloudpickle

import rigged
from s3_server import s3  # noqa: F401  (pytest finds fixtures in a conftest's namespace)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def rigged_ray():
    cloudpickle.register_pickle_by_value(rigged)
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    yield
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(rigged)

