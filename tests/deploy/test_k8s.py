"""`invoke deploy --platform k8s`: LeaderWorkerSet across nodes, Deployment on one, strict offline validation."""

import copy
import io
import json
import tarfile

import pytest
import yaml

from pipeline.commands import deploy_command
from pipeline.deploy.validate import validate_object, validate_objects
from pipeline.errors import DeployError
from pipeline.spec import resolve_spec

URL = "https://releases.example.invalid/llama.tar.gz"


def _deploy(tmp_path, precision, **kw):
    spec = resolve_spec(model="llama-405b", precision=precision)
    out = tmp_path / precision
    summary = deploy_command(spec, platform="k8s", release_url=URL, output=str(out), **kw)
    objects = list(yaml.safe_load_all((out / "serving.yaml").read_text()))
    return summary, {o["kind"]: o for o in objects}, objects


def test_bf16_is_a_leader_worker_set_of_two_nodes(tmp_path):
    summary, by_kind, objects = _deploy(tmp_path, "bf16")
    assert (summary["tp"], summary["pp"], summary["world_size"], summary["nodes"]) == (8, 2, 16, 2)
    lws = by_kind["LeaderWorkerSet"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 2 and tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = tmpl["leaderTemplate"]["spec"]
    server = leader["containers"][0]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "8"
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["WORLD_SIZE"] == "16" and env["RANKS_PER_NODE"] == "8"
    assert server["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert server["image"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    init = leader["initContainers"][0]
    assert init["command"][-1].endswith("fetch-verify.sh")
    assert {e["name"]: e.get("value") for e in init["env"]}["RELEASE_URL"] == URL
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in leader["volumes"])  # /dev/shm
    assert {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service"} <= set(by_kind)
    assert {p["port"] for p in by_kind["Service"]["spec"]["ports"]} == {8000, 8001, 8002}
    assert by_kind["Service"]["spec"]["selector"]["role"] == "leader"
    scripts = by_kind["ConfigMap"]["data"]
    assert "mpirun" in scripts["launch-leader.sh"] and "verify" in scripts["fetch-verify.sh"]
    validate_objects(objects)


def test_fp8_is_a_single_node_deployment_at_tp8(tmp_path):
    summary, by_kind, objects = _deploy(tmp_path, "fp8")
    assert (summary["tp"], summary["pp"], summary["nodes"]) == (8, 1, 1)
    assert "LeaderWorkerSet" not in by_kind and "Role" not in by_kind
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["containers"][0]["command"][:4] == ["mpirun", "--allow-run-as-root", "-np", "8"]
    validate_objects(objects)


def _mutations(lws):
    unknown = copy.deepcopy(lws)
    unknown["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    wrong_type = copy.deepcopy(lws)
    wrong_type["spec"]["leaderWorkerTemplate"]["size"] = "two"
    bad_enum = copy.deepcopy(lws)
    bad_enum["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    deep_unknown = copy.deepcopy(lws)
    deep_unknown["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["gpus"] = 8
    return [unknown, wrong_type, bad_enum, deep_unknown]


def test_mutated_leader_worker_set_fails(tmp_path):
    _, by_kind, _ = _deploy(tmp_path, "bf16")
    for bad in _mutations(by_kind["LeaderWorkerSet"]):
        with pytest.raises(DeployError, match="LeaderWorkerSet .* fails the leaderworkerset.x-k8s.io/v1 CRD schema"):
            validate_object(bad)


def test_mutated_core_objects_fail(tmp_path):
    _, by_kind, _ = _deploy(tmp_path, "fp8")
    unknown = copy.deepcopy(by_kind["Deployment"])
    unknown["spec"]["template"]["spec"]["containers"][0]["gpuCount"] = 8
    wrong_type = copy.deepcopy(by_kind["Service"])
    wrong_type["spec"]["ports"][0]["port"] = "eight-thousand"
    for bad in (unknown, wrong_type):
        with pytest.raises(DeployError, match="fails the Kubernetes 1.31 schema"):
            validate_object(bad)


def test_unknown_kind_is_refused_not_skipped():
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(DeployError, match="no schema for example.com/v1 Widget"):
        validate_object(obj)


def test_nothing_written_when_options_are_bad(tmp_path):
    spec = resolve_spec(model="llama-405b", precision="fp8")
    with pytest.raises(DeployError, match="--release-url URL"):
        deploy_command(spec, platform="k8s", output=str(tmp_path / "d"))
    with pytest.raises(DeployError, match="DNS-1123"):
        deploy_command(spec, platform="k8s", release_url=URL, name="Bad_Name", output=str(tmp_path / "d"))
    assert not (tmp_path / "d").exists() and list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(tmp_path):
    spec = resolve_spec(model="llama-405b", precision="fp8")
    deploy_command(spec, platform="k8s", release_url=URL, output=str(tmp_path / "d"))
    with pytest.raises(DeployError, match="--force"):
        deploy_command(spec, platform="k8s", release_url=URL, output=str(tmp_path / "d"))
    deploy_command(spec, platform="k8s", release_volume="releases", output=str(tmp_path / "d"), force=True)
    text = (tmp_path / "d" / "serving.yaml").read_text()
    assert "claimName: releases" in text and URL not in text


def test_build_matrix_indexed_job_takes_the_token_from_a_secret(tmp_path):
    deploy_command(None, platform="k8s", matrix="llama-8b:fp8,llama-8b:int4_awq:2", output=str(tmp_path / "m"))
    job = [o for o in yaml.safe_load_all((tmp_path / "m" / "build-matrix.yaml").read_text()) if o["kind"] == "Job"][0]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    token = [e for e in env if e["name"] == "HF_TOKEN"][0]
    assert "value" not in token and token["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
    cm = [o for o in yaml.safe_load_all((tmp_path / "m" / "build-matrix.yaml").read_text())
          if o["kind"] == "ConfigMap"][0]
    assert "--model llama-8b --precision int4_awq --tp 2" in cm["data"]["build-cell.sh"]


def test_deploy_from_release_uses_its_spec_and_toolchain(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    doc = {"format": 1, "name": "llama-70b-fp8-abc-v1.0.0", "spec": spec.model_dump(mode="json"),
           "toolchain": {"engine": {"tensorrt_llm": "1.1.0"}}, "files": {}}
    rel = tmp_path / "rel"
    rel.mkdir()
    (rel / "release.json").write_text(json.dumps(doc))
    summary = deploy_command(None, platform="k8s", release=str(rel), release_url=URL, output=str(tmp_path / "d"))
    assert (summary["tp"], summary["nodes"], summary["release_file"]) == (4, 1, "llama-70b-fp8-abc-v1.0.0.tar")
    assert summary["image"] == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    doc["toolchain"]["engine"]["tensorrt_llm"] = "0.9.0"
    (rel / "release.json").write_text(json.dumps(doc))
    with pytest.raises(DeployError, match="no NGC tritonserver image is known for TensorRT-LLM 0.9.0.*--image"):
        deploy_command(None, platform="k8s", release=str(rel), release_url=URL, output=str(tmp_path / "e"))


def test_reference_build_is_not_deployed(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    with pytest.raises(DeployError, match="--target reference"):
        deploy_command(spec, platform="k8s", release_url=URL, output=str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()


def test_deploy_from_release_tarball_pins_its_sha256(tmp_path):
    spec = resolve_spec(model="llama-405b", precision="bf16", tp=8, pp=2, nodes=2)
    name = "llama-405b-bf16-abc-v2.0.0"
    doc = json.dumps({"format": 1, "name": name, "spec": spec.model_dump(mode="json"),
                      "toolchain": {"engine": {"tensorrt_llm": "1.2.1"}}, "files": {}}).encode()
    tarball = tmp_path / f"{name}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        info = tarfile.TarInfo(f"{name}/release.json")
        info.size = len(doc)
        tar.addfile(info, io.BytesIO(doc))
    digest = "ab" * 32
    (tmp_path / f"{name}.tar.gz.sha256").write_text(f"{digest}  {name}.tar.gz\n")
    summary = deploy_command(None, platform="k8s", release=str(tarball), release_volume="rel", output=str(tmp_path / "d"))
    assert (summary["kind"], summary["nodes"], summary["world_size"], summary["sha256"]) == (
        "LeaderWorkerSet", 2, 16, digest)
    lws = [o for o in yaml.safe_load_all((tmp_path / "d" / "serving.yaml").read_text())
           if o["kind"] == "LeaderWorkerSet"][0]
    init = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["initContainers"][0]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["RELEASE_SHA256"] == digest and env["RELEASE_FILE"] == f"{name}.tar.gz"
    assert env["RELEASE_DIR"] == "/releases"
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(DeployError, match="not a readable release tarball"):
        deploy_command(None, platform="k8s", release=str(tmp_path / "junk.tar.gz"), release_volume="rel",
                       output=str(tmp_path / "e"))
