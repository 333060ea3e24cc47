"""cluster.yaml passes Ray's own autoscaler validation; a broken copy fails it."""
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER = Path(__file__).resolve().parents[2] / "cluster.yaml"


def test_cluster_yaml_is_valid():
    config = prepare_config(yaml.safe_load(CLUSTER.read_text()))
    validate_config(config)
    gpu_types = [t for t in config["available_node_types"].values() if t["resources"].get("GPU")]
    assert gpu_types and config["available_node_types"][config["head_node_type"]]["resources"].get("GPU", 0) == 0


@pytest.mark.parametrize("breakage, error, message", [
    ("head_node_type", ValueError, "`head_node_type` must be one of `available_node_types`"),
    ("unknown_key", jsonschema.ValidationError,
     r"Additional properties are not allowed \('max_wrokers' was unexpected\)"),
])
def test_broken_copy_fails(breakage, error, message):
    config = yaml.safe_load(CLUSTER.read_text())
    if breakage == "head_node_type":
        config["head_node_type"] = "no_such_node_type"
    else:
        config["max_wrokers"] = 3
    with pytest.raises(error, match=message):
        validate_config(prepare_config(config))
