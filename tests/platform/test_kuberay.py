"""Issue 27: the KubeRay manifests in deploy/kuberay/ checked field by field against the RayCluster
and RayJob specifications of KubeRay v1.7.0 (ray-operator/apis/ray/v1/raycluster_types.go and
rayjob_types.go, read in ray-project/kuberay; the checks below are written from those Go types, no
file of KubeRay is copied), every pod template in them with a real Kubernetes schema validator
(kubernetes-validate, strict), their images and Ray version against the project's Ray, and the
RayJob's entrypoint against dptune's own command line."""
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from dptune.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kuberay"
KUBERAY = "v1.7.0"
INT32 = (-2**31, 2**31 - 1)

# Field name -> type of the spec structs of KubeRay v1.7.0 that the manifests may use. "int32",
# "str", "bool", "float", "map[str]str", "pod" (a PodTemplateSpec), or a nested dict (a struct), or a
# one-item list of it (a slice of structs). Fields not listed here are not used by the manifests.
WORKER_GROUP = {"suspend": "bool", "groupName": "str", "replicas": "int32", "minReplicas": "int32",
                "maxReplicas": "int32", "idleTimeoutSeconds": "int32", "resources": "map[str]str",
                "labels": "map[str]str", "rayStartParams": "map[str]str", "template": "pod", "numOfHosts": "int32"}
HEAD_GROUP = {"template": "pod", "enableIngress": "bool", "resources": "map[str]str", "labels": "map[str]str",
              "rayStartParams": "map[str]str", "serviceType": "str"}
RAY_CLUSTER_SPEC = {"suspend": "bool", "managedBy": "str", "headServiceAnnotations": "map[str]str",
                    "enableInTreeAutoscaling": "bool", "headGroupSpec": HEAD_GROUP, "rayVersion": "str",
                    "workerGroupSpecs": [WORKER_GROUP]}
RAY_JOB_SPEC = {"activeDeadlineSeconds": "int32", "backoffLimit": "int32", "rayClusterSpec": RAY_CLUSTER_SPEC,
                "submitterPodTemplate": "pod", "metadata": "map[str]str", "clusterSelector": "map[str]str",
                "managedBy": "str", "entrypoint": "str", "runtimeEnvYAML": "str", "jobId": "str",
                "submissionMode": "str", "entrypointResources": "str", "entrypointNumCpus": "float",
                "entrypointNumGpus": "float", "ttlSecondsAfterFinished": "int32",
                "preRunningDeadlineSeconds": "int32", "shutdownAfterJobFinishes": "bool", "suspend": "bool"}
#: Required (no omitempty) fields of the same structs.
REQUIRED = {id(HEAD_GROUP): ("template", "rayStartParams"), id(WORKER_GROUP): ("groupName", "rayStartParams", "template"),
            id(RAY_CLUSTER_SPEC): ("headGroupSpec",)}
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
CONTAINER = {"name", "image", "resources", "envFrom", "ports", "env", "command", "args", "volumeMounts"}


def check(value, schema, path: str) -> None:
    """``value`` has only the fields of ``schema``, each of its type, and every required one."""
    if isinstance(schema, list):
        assert isinstance(value, list) and value, f"{path}: must be a non-empty list"
        for i, item in enumerate(value):
            check(item, schema[0], f"{path}[{i}]")
        return
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{path}: must be a mapping"
        unknown = set(value) - set(schema)
        assert not unknown, f"{path}: fields not in KubeRay {KUBERAY}: {sorted(unknown)}"
        for name in REQUIRED.get(id(schema), ()):
            assert name in value, f"{path}.{name}: required by KubeRay {KUBERAY}"
        for name, item in value.items():
            check(item, schema[name], f"{path}.{name}")
        return
    if schema == "int32":
        assert isinstance(value, int) and not isinstance(value, bool) and INT32[0] <= value <= INT32[1], path
    elif schema == "str":
        assert isinstance(value, str), path
    elif schema == "bool":
        assert isinstance(value, bool), path
    elif schema == "float":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), path
    elif schema == "map[str]str":
        assert isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()), \
            f"{path}: a map of strings to strings (quote numbers)"
    elif schema == "pod":
        containers = value["spec"]["containers"]
        assert containers and all(set(c) <= CONTAINER and c["name"] and c["image"] for c in containers), path
    else:
        raise AssertionError(f"unknown type {schema}")


def manifests() -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(DEPLOY.glob("*.yaml"))}


def cluster_specs() -> list[tuple[str, dict]]:
    docs = manifests()
    return [("raycluster.yaml", docs["raycluster.yaml"]["spec"]),
            ("rayjob.yaml", docs["rayjob.yaml"]["spec"]["rayClusterSpec"])]


def test_manifests_are_a_raycluster_and_a_rayjob_of_ray_io_v1():
    docs = manifests()
    assert {(d["apiVersion"], d["kind"]) for d in docs.values()} == {("ray.io/v1", "RayCluster"), ("ray.io/v1", "RayJob")}
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"]) for d in docs.values())


def test_raycluster_spec_fields_and_types():
    check(manifests()["raycluster.yaml"]["spec"], RAY_CLUSTER_SPEC, "RayCluster.spec")


def test_rayjob_spec_fields_and_types():
    spec = manifests()["rayjob.yaml"]["spec"]
    check(spec, RAY_JOB_SPEC, "RayJob.spec")
    assert spec["submissionMode"] in SUBMISSION_MODES
    assert isinstance(yaml.safe_load(spec["runtimeEnvYAML"]), dict)
    assert spec["shutdownAfterJobFinishes"] is True   # the cluster goes when the sweep ends


@pytest.mark.parametrize("name,spec", cluster_specs())
def test_cpu_head_and_gpu_worker_groups(name, spec):
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"   # the driver's node runs no trial
    assert all("nvidia.com/gpu" not in c["resources"].get("limits", {}) for c in head["template"]["spec"]["containers"])
    groups = spec["workerGroupSpecs"]
    assert len({g["groupName"] for g in groups}) == len(groups)
    for group in groups:
        assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
        (container,) = group["template"]["spec"]["containers"]
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert group["rayStartParams"]["num-gpus"] == str(gpus)   # Ray sees what the pod got
    assert any(g["groupName"] == "gpu-fractional" and int(g["rayStartParams"]["num-gpus"]) > 1 for g in groups)


def test_images_and_ray_version_agree_with_the_projects_ray():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ray = next(Requirement(r) for r in project if Requirement(r).name == "ray")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^FROM rayproject/ray:(\S+)-py(\d+)(-gpu)?$", dockerfile, re.M)
    pinned = re.search(r'"ray\[default\]==([\d.]+)"', dockerfile)
    assert base and pinned and base.group(1) == pinned.group(1)
    version = base.group(1)
    assert ray.specifier.contains(version), f"Ray {version} of the image is outside the project's {ray}"
    images = []
    for name, spec in cluster_specs():
        assert spec["rayVersion"] == version, name
        pods = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
        images += [c["image"] for pod in pods for c in pod["spec"]["containers"]]
    images += [c["image"] for c in manifests()["rayjob.yaml"]["spec"]["submitterPodTemplate"]["spec"]["containers"]]
    tag = f"{version}-py{base.group(2)}{base.group(3) or ''}"
    assert images and all(image.endswith(f"/dptune:{tag}") for image in images), images


def test_the_rayjob_entrypoint_is_a_command_dptune_accepts():
    argv = shlex.split(manifests()["rayjob.yaml"]["spec"]["entrypoint"])
    assert argv[0] == "dptune"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "sweep" and args.address == "auto" and args.storage.startswith("s3://")
    assert (ROOT / args.spec).is_file()


@pytest.mark.parametrize("breakage,message", [
    (lambda s: s.update(workerGroupSpec=s.pop("workerGroupSpecs")), "fields not in KubeRay"),
    (lambda s: s["workerGroupSpecs"][0]["rayStartParams"].update({"num-gpus": 1}), "map of strings"),
    (lambda s: s["workerGroupSpecs"][0].update(maxReplicas=2**31), "maxReplicas"),
    (lambda s: s["headGroupSpec"].pop("rayStartParams"), "rayStartParams: required"),
    (lambda s: s.update(enableInTreeAutoscaling="true"), "enableInTreeAutoscaling"),
])
def test_a_broken_copy_fails_the_checks(breakage, message):
    spec = manifests()["raycluster.yaml"]["spec"]
    breakage(spec)
    with pytest.raises(AssertionError, match=re.escape(message)):
        check(spec, RAY_CLUSTER_SPEC, "RayCluster.spec")


#: Kubernetes release whose published schemas (bundled in kubernetes-validate) check the pods.
KUBERNETES = "1.33"


def pod_templates() -> list[tuple[str, dict]]:
    """Every pod template of the manifests: the head's and each worker group's, and the RayJob's
    submitter."""
    pods = []
    for name, spec in cluster_specs():
        pods.append((f"{name}: head", spec["headGroupSpec"]["template"]))
        pods += [(f"{name}: {g['groupName']}", g["template"]) for g in spec["workerGroupSpecs"]]
    pods.append(("rayjob.yaml: submitter", manifests()["rayjob.yaml"]["spec"]["submitterPodTemplate"]))
    return pods


def validate_pod(template: dict) -> None:
    """Validate a pod template with a real Kubernetes schema validator (kubernetes-validate, strict:
    an unknown field is an error): as the ``template`` of a core/v1 PodTemplate, the one Kubernetes
    kind that is a bare PodTemplateSpec. RayCluster and RayJob are custom resources, whose schemas
    the validator does not ship: their own fields are checked above, from KubeRay's Go types."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "pod"},
                                  "template": template}, KUBERNETES, strict=True)


@pytest.mark.parametrize("name,template", pod_templates(), ids=[n for n, _ in pod_templates()])
def test_every_pod_template_is_a_valid_kubernetes_pod(name, template):
    validate_pod(template)


@pytest.mark.parametrize("breakage", [
    lambda pod: pod["spec"]["containers"][0].update(imagePullPolcy="Always"),          # a misspelled field
    lambda pod: pod["spec"]["containers"][0].update(ports=[{"containerPort": "8265"}]),  # a string port
    lambda pod: pod["spec"].pop("containers"),                                          # a pod without containers
])
def test_the_validator_refuses_a_broken_pod(breakage):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    template = pod_templates()[0][1]
    breakage(template)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_pod(template)
