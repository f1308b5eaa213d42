"""`invoke deploy --platform k8s`: LeaderWorkerSet across nodes, Deployment on one, strict offline validation."""

import copy
import io
import json
import tarfile

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError
from pipeline.core.spec import resolve_spec
from pipeline.ops.deploy.validate import validate_object, validate_objects
from tests.support.k8s import PIPELINE_IMAGE

URL = "https://releases.example.invalid/llama.tar.gz"


def _deploy(tmp_path, precision, **kw):
    spec = resolve_spec(model="llama-405b", precision=precision)
    out = tmp_path / precision
    summary = deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                             release_url=URL, output=str(out), **kw)
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
    assert server["readinessProbe"]["exec"]["command"] == ["/bin/sh", "/config/ready.sh"]  # the leader serves
    assert server["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    worker = tmpl["workerTemplate"]["spec"]["containers"][0]
    assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(worker)
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
        deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, output=str(tmp_path / "d"))
    with pytest.raises(DeployError, match="DNS-1123"):
        deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                       release_url=URL, name="Bad_Name", output=str(tmp_path / "d"))
    with pytest.raises(DeployError, match="DNS-1123"):
        deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                       release_url=URL, name="llama\n", output=str(tmp_path / "d"))
    assert not (tmp_path / "d").exists() and list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(tmp_path):
    spec = resolve_spec(model="llama-405b", precision="fp8")
    deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=URL, output=str(tmp_path / "d"))
    with pytest.raises(DeployError, match="--force"):
        deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=URL, output=str(tmp_path / "d"))
    deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                   release_volume="releases", output=str(tmp_path / "d"), force=True)
    text = (tmp_path / "d" / "serving.yaml").read_text()
    assert "claimName: releases" in text and URL not in text


def test_build_matrix_indexed_job_takes_the_token_from_a_secret(tmp_path):
    deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                   matrix="llama-8b:fp8,llama-8b:int4_awq:2", output=str(tmp_path / "m"))
    job = [o for o in yaml.safe_load_all((tmp_path / "m" / "build-matrix.yaml").read_text()) if o["kind"] == "Job"][0]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    token = [e for e in env if e["name"] == "HF_TOKEN"][0]
    assert "value" not in token and token["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
    cm = [o for o in yaml.safe_load_all((tmp_path / "m" / "build-matrix.yaml").read_text())
          if o["kind"] == "ConfigMap"][0]
    assert "--model llama-8b --precision int4_awq --tp 2" in cm["data"]["build-cell.sh"]


def test_build_matrix_pods_request_the_cells_host_resources(tmp_path):
    """CPU and memory of the hungriest cell (the calibration estimate the Slurm matrix's --mem/--cpus-per-task use)."""
    from pipeline.ops.deploy import platforms, render
    from pipeline.ops.deploy.k8s import quantity
    from pipeline.ops.deploy.slurm import MATRIX_TIME

    matrix = "llama-8b:fp8,llama-70b:fp8:4"
    deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE, matrix=matrix, output=str(tmp_path / "m"))
    job = [o for o in yaml.safe_load_all((tmp_path / "m" / "build-matrix.yaml").read_text()) if o["kind"] == "Job"][0]
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    cells = render.matrix_cells(matrix, {})
    memory = platforms.matrix_mem_bytes(cells)
    assert memory > platforms.matrix_mem_bytes(cells[:1])  # the 70B cell decides
    assert resources["requests"] == {"cpu": str(platforms.matrix_cpus(cells, MATRIX_TIME)), "memory": quantity(memory)}
    assert resources["limits"]["nvidia.com/gpu"] == "4" and "memory" in resources["limits"]


def test_deploy_from_release_uses_its_spec_and_toolchain(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    doc = {"format": 1, "name": "llama-70b-fp8-abc-v1.0.0", "spec": spec.model_dump(mode="json"),
           "toolchain": {"engine": {"tensorrt_llm": "1.1.0"}}, "files": {}}
    rel = tmp_path / "rel"
    rel.mkdir()
    (rel / "release.json").write_text(json.dumps(doc))
    summary = deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                             release=str(rel), release_url=URL, output=str(tmp_path / "d"))
    assert (summary["tp"], summary["nodes"], summary["release_file"]) == (4, 1, "llama-70b-fp8-abc-v1.0.0.tar")
    assert summary["image"] == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    doc["toolchain"]["engine"]["tensorrt_llm"] = "0.9.0"
    (rel / "release.json").write_text(json.dumps(doc))
    with pytest.raises(DeployError, match="no NGC tritonserver image is known for TensorRT-LLM 0.9.0.*--image"):
        deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                       release=str(rel), release_url=URL, output=str(tmp_path / "e"))


def test_reference_build_is_not_deployed(tmp_path):
    spec = resolve_spec(model="tiny-llama", precision="fp8", target="reference")
    with pytest.raises(DeployError, match="--target reference"):
        deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_url=URL, output=str(tmp_path / "d"))
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
    summary = deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                             release=str(tarball), release_volume="rel", output=str(tmp_path / "d"))
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
        deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                       release=str(tmp_path / "junk.tar.gz"), release_volume="rel",
                       output=str(tmp_path / "e"))


def _pods(objects):
    """Every pod template's spec in `objects` (Deployment, LeaderWorkerSet leader and worker)."""
    for o in objects:
        if o["kind"] == "Deployment":
            yield o["spec"]["template"]["spec"]
        elif o["kind"] == "LeaderWorkerSet":
            tmpl = o["spec"]["leaderWorkerTemplate"]
            yield tmpl["leaderTemplate"]["spec"]
            yield tmpl["workerTemplate"]["spec"]


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_work_volume_is_sized_from_the_release(tmp_path, precision):
    from pipeline.core.gpus import GIB
    from pipeline.ops.deploy.k8s import WORK_HEADROOM, quantity, work_bytes
    from pipeline.stages.resources import plan_resources

    summary, by_kind, objects = _deploy(tmp_path, precision)
    spec = resolve_spec(model="llama-405b", precision=precision, tp=summary["tp"], pp=summary["pp"],
                        nodes=summary["nodes"])
    release = plan_resources(spec).stage_bytes("release", needed=False)
    size = quantity(work_bytes(spec, download=True))
    # the tarball and its unpacked copy, both on the node
    assert 2 * release + WORK_HEADROOM <= int(size.removesuffix("Gi")) * GIB <= 2.2 * release + WORK_HEADROOM + GIB
    pods = list(_pods(objects))
    assert len(pods) == (2 if precision == "bf16" else 1)
    for pod in pods:
        (work,) = [v for v in pod["volumes"] if v["name"] == "work"]
        assert work["emptyDir"] == {"sizeLimit": size}
        for c in (*pod["initContainers"], *pod["containers"]):
            assert c["resources"]["requests"]["ephemeral-storage"] == size
            assert c["resources"]["limits"]["ephemeral-storage"] == size
    validate_objects(objects)


def test_release_on_a_volume_needs_only_the_unpacked_copy_on_the_node(tmp_path):
    spec = resolve_spec(model="llama-405b", precision="fp8")
    url = deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                         release_url=URL, output=str(tmp_path / "u"), json_=True)
    vol = deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                         release_volume="releases", output=str(tmp_path / "v"))
    assert url["tp"] == vol["tp"]
    sizes = []
    for d in ("u", "v"):
        objects = list(yaml.safe_load_all((tmp_path / d / "serving.yaml").read_text()))
        (pod,) = _pods(objects)
        (work,) = [v for v in pod["volumes"] if v["name"] == "work"]
        sizes.append(int(work["emptyDir"]["sizeLimit"].removesuffix("Gi")))
    assert 1.8 < sizes[0] / sizes[1] < 2.0  # a downloaded tarball doubles it (headroom aside)


def test_gpu_deployment_recreates_instead_of_surging(tmp_path):
    _, by_kind, objects = _deploy(tmp_path, "fp8")
    dep = by_kind["Deployment"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    server = dep["spec"]["template"]["spec"]["containers"][0]
    assert server["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"  # probes unchanged
    broken = copy.deepcopy(dep)
    broken["spec"]["strategy"] = {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}, "surge": 0}
    with pytest.raises(DeployError, match="fails the Kubernetes 1.31 schema"):
        validate_object(broken)


# Exact inputs `kubectl apply` or the container runtime would reject, and the flag each error must name.
BAD_K8S_OPTIONS = [
    ({"namespace": "Inference"}, "--namespace 'Inference': not a DNS-1123 label"),
    ({"namespace": "team_a"}, "--namespace 'team_a': not a DNS-1123 label"),
    ({"namespace": "-prod"}, "--namespace '-prod': not a DNS-1123 label"),
    ({"namespace": "a" * 64}, "--namespace 'a{64}': not a DNS-1123 label"),
    ({"namespace": "prod\n"}, "--namespace 'prod\\\\n': not a DNS-1123 label"),
    ({"release_url": None, "release_volume": "Releases_PVC"}, "--release-volume 'Releases_PVC': not a DNS-1123"),
    ({"release_url": None, "release_volume": "pvc/../etc"}, r"--release-volume 'pvc/\.\./etc': not a DNS-1123"),
    ({"release_url": None, "release_volume": "a..b"}, r"--release-volume 'a\.\.b': not a DNS-1123 subdomain"),
    ({"image": "nvcr.io/NVIDIA/tritonserver:26.04-trtllm-python-py3"}, "--image 'nvcr.io/NVIDIA/.*not an image"),
    ({"image": "nvcr.io/nvidia/tritonserver:26.04 ; rm -rf /"}, "--image .*not an image reference"),
    ({"image": "nvcr.io#nvidia/tritonserver:26.04-trtllm-python-py3"}, "--image 'nvcr.io#nvidia.*not an image"),
    ({"image": "nvcr.io/nvidia/tritonserver:26.04:latest", "pipeline_image": "ours:1"}, "--image .*not an image"),
    ({"pipeline_image": "trtllm pipeline:0.1.0"}, "--pipeline-image 'trtllm pipeline:0.1.0': not an image"),
    ({"pipeline_image": "trtllm-pipeline:"}, "--pipeline-image 'trtllm-pipeline:': not an image reference"),
    ({"pipeline_image": "trtllm-pipeline@sha256:abc"}, "--pipeline-image .*not an image reference"),
]


@pytest.mark.parametrize(("options", "message"), BAD_K8S_OPTIONS)
def test_names_kubernetes_would_reject_are_refused_naming_the_flag(tmp_path, options, message):
    spec = resolve_spec(model="llama-405b", precision="fp8")
    kw = {"release_url": URL, "pipeline_image": PIPELINE_IMAGE, **options}
    with pytest.raises(DeployError, match=message) as err:
        deploy_command(spec, platform="k8s", output=str(tmp_path / "d"), **kw)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert not (tmp_path / "d").exists()


def test_names_kubernetes_accepts_pass(tmp_path):
    spec = resolve_spec(model="llama-405b", precision="fp8")
    digest = "sha256:" + "0123456789abcdef" * 4
    deploy_command(spec, platform="k8s", release_volume="model-releases.v2", namespace="inference-prod",
                   image=f"registry.example.com:5000/team/triton_server__x:26.04-trtllm@{digest}",
                   pipeline_image=f"localhost:5000/trtllm-pipeline@{digest}", output=str(tmp_path / "d"))
    objects = list(yaml.safe_load_all((tmp_path / "d" / "serving.yaml").read_text()))
    assert {o["metadata"]["namespace"] for o in objects} == {"inference-prod"}
    (pod,) = _pods(objects)
    assert pod["initContainers"][0]["image"] == f"localhost:5000/trtllm-pipeline@{digest}"


def test_matrix_output_and_secret_names_are_checked(tmp_path):
    from pipeline.ops.deploy import render

    with pytest.raises(DeployError, match="--matrix-output 'Build PVC': not a DNS-1123 subdomain"):
        deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE,
                       matrix="llama-8b:fp8", matrix_output="Build PVC",
                       output=str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()
    cells = render.matrix_cells("llama-8b:fp8", {"target": "trtllm"})
    opts = render.DeployOptions(platform="k8s", name="m", hf_secret="HF_TOKEN", pipeline_image=PIPELINE_IMAGE)
    with pytest.raises(DeployError, match="^hf_secret 'HF_TOKEN': not a DNS-1123 subdomain"):
        render.render_matrix(opts, cells, tmp_path / "m", "trtllm-build-output")


def test_default_images_are_the_ngc_one_and_ours(tmp_path):
    _, by_kind, _ = _deploy(tmp_path, "fp8")
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["image"] == PIPELINE_IMAGE
    assert pod["containers"][0]["image"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"


@pytest.mark.parametrize("matrix", [None, "llama-8b:fp8"])
def test_a_pipeline_image_without_a_registry_must_be_given(tmp_path, matrix):
    from pipeline.ops.deploy.images import DEFAULT_PIPELINE_IMAGE

    spec = resolve_spec(model="llama-8b", precision="fp8")
    with pytest.raises(DeployError, match=f"pipeline image '{DEFAULT_PIPELINE_IMAGE}'.* names no registry; build "
                       r"and push it .*then pass --pipeline-image REGISTRY/trtllm-pipeline:TAG") as err:
        deploy_command(spec, platform="k8s", release_volume="releases", matrix=matrix, output=str(tmp_path / "d"))
    assert err.value.exit_code == 2 and not (tmp_path / "d").exists()
    # one the user names is theirs to have pushed (or preloaded): a bare name pulls from Docker Hub
    deploy_command(spec, platform="k8s", release_volume="releases", matrix=matrix, pipeline_image="ours:1",
                   output=str(tmp_path / "d"))


@pytest.mark.parametrize(("image", "host"), [
    ("trtllm-pipeline:0.1.0", None), ("team/trtllm-pipeline:1", None),
    ("registry.example.com/p:1", "registry.example.com"),
    ("localhost/p:1", "localhost"), ("host:5000/p", "host:5000"), ("nvcr.io/nvidia/tritonserver:26.04", "nvcr.io"),
])
def test_registry_host_follows_the_reference_grammar(image, host):
    from pipeline.ops.deploy.names import registry_host

    assert registry_host(image) == host


def test_cli_bad_namespace_is_one_line_exit_2(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PIPELINE_ROOT=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "invoke", "deploy", "--platform", "k8s", "--model", "llama-405b",
                        "--precision", "fp8", "--release-volume", "releases", "--namespace", "Prod",
                        "--pipeline-image", PIPELINE_IMAGE],
                       cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("error: --namespace 'Prod': not a DNS-1123 label (1-63 lowercase "
                                                 "letters, digits and '-', starting and ending with a letter or "
                                                 "digit); e.g. inference")
    assert "Traceback" not in r.stderr and not (tmp_path / "deploy").exists()


@pytest.mark.parametrize("precision", ["fp8", "bf16"])  # Deployment, LeaderWorkerSet leader
def test_engine_readiness_runs_the_stub_check_and_triton_ready(tmp_path, precision):
    from pipeline.ops.deploy.stub_watch import STUB_WATCH

    _, by_kind, _ = _deploy(tmp_path, precision)
    server = next(_pods(list(by_kind.values())))["containers"][0]  # the Deployment's pod or the LWS leader
    ready = server["readinessProbe"]
    assert ready == {"exec": {"command": ["/bin/sh", "/config/ready.sh"]}, "periodSeconds": 5,
                     "failureThreshold": 2, "timeoutSeconds": 5}
    assert ready["timeoutSeconds"] <= ready["periodSeconds"]
    assert server["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"  # loading: Triton's own endpoint
    assert server["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    script = by_kind["ConfigMap"]["data"]["ready.sh"]
    assert STUB_WATCH in script and script.index("\nstubs_ready\n") < script.index("\nexec curl ")
    assert script.rstrip().endswith("--output /dev/null http://127.0.0.1:8000/v2/health/ready")
    assert "serve_watched 8000 " in by_kind["ConfigMap"]["data"]["rank.sh"]  # the watchdog that writes the record


def test_trtllm_serve_readiness_stays_on_its_health_route(tmp_path):
    _, by_kind, _ = _deploy(tmp_path, "fp8", serve_mode="trtllm-serve")
    (pod,) = _pods(list(by_kind.values()))
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "ready.sh" not in by_kind["ConfigMap"]["data"]


def test_gpu_pods_tolerate_the_gpu_taint_and_require_the_spec_gpu_product(tmp_path):
    _, _, objects = _deploy(tmp_path, "bf16", node_selector=["pool=inference"],
                            toleration=["dedicated=llm:NoSchedule", "maintenance:NoExecute"])
    for pod in _pods(objects):  # leader and worker alike
        assert pod["nodeSelector"] == {"pool": "inference"}
        assert pod["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
            {"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}]
        (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert term == {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                              "values": ["NVIDIA-H100-80GB-HBM3"]}]}
    validate_objects(objects)


@pytest.mark.parametrize(("kw", "values"), [({"gpu_product_label": "NVIDIA-H100-80GB-HBM3-SHARED"},
                                              ["NVIDIA-H100-80GB-HBM3-SHARED"]), ({"no_gpu_affinity": True}, None)])
def test_gpu_product_affinity_is_overridable(tmp_path, kw, values):
    _, by_kind, objects = _deploy(tmp_path, "fp8", **kw)
    (pod,) = _pods(objects)
    got = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    assert (got["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] if got else None) == values
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    validate_objects(objects)


def test_every_gpu_has_its_feature_discovery_product_name():
    from pipeline.core.gpus import GPUS
    from pipeline.ops.deploy.names import label_value
    from pipeline.ops.deploy.scheduling import GPU_PRODUCTS

    assert set(GPU_PRODUCTS) == set(GPUS)
    for products in GPU_PRODUCTS.values():
        assert products and all(label_value(p, "x") and p.startswith("NVIDIA-") and " " not in p for p in products)


def test_matrix_pods_get_gpu_scheduling_only_with_gpus(tmp_path):
    def pod(matrix, target, out):
        deploy_command(None, platform="k8s", pipeline_image=PIPELINE_IMAGE, matrix=matrix, matrix_target=target,
                       node_selector=["pool=build"], output=str(tmp_path / out))
        objects = list(yaml.safe_load_all((tmp_path / out / "build-matrix.yaml").read_text()))
        validate_objects(objects)
        return next(o for o in objects if o["kind"] == "Job")["spec"]["template"]["spec"]

    cpu = pod("tiny-llama:fp8", "reference", "cpu")  # the CPU reference target
    assert cpu["nodeSelector"] == {"pool": "build"} and not {"tolerations", "affinity"} & set(cpu)
    gpu = pod("llama-8b:fp8", "trtllm", "gpu")
    assert gpu["nodeSelector"] == {"pool": "build"} and gpu["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert gpu["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["values"] == ["NVIDIA-H100-80GB-HBM3"]


# llama-405b FP8: one node, 8 ranks; BF16: two nodes of 8 ranks, each holding half the engines.
@pytest.mark.parametrize(("precision", "memory_gi"), [("fp8", 409), ("bf16", 405)])
def test_serving_containers_request_host_cpu_and_memory_from_the_plan(tmp_path, precision, memory_gi):
    from pipeline.core.gpus import GIB
    from pipeline.ops.deploy.scheduling import MEMORY_LIMIT_FACTOR, RANK_HOST_BYTES, SERVER_HOST_BYTES
    from pipeline.stages.resources import plan_resources

    summary, _, objects = _deploy(tmp_path, precision)
    spec = resolve_spec(model="llama-405b", precision=precision, tp=summary["tp"], pp=summary["pp"],
                        nodes=summary["nodes"])
    engines = plan_resources(spec).stage_bytes("compile", needed=False)
    want = -(-engines // summary["nodes"]) + 8 * RANK_HOST_BYTES + SERVER_HOST_BYTES
    assert -(-want // GIB) == memory_gi
    for pod in _pods(objects):  # the LeaderWorkerSet's workers run ranks too
        server = pod["containers"][0]["resources"]
        assert server["requests"]["cpu"] == "18" and "cpu" not in server["limits"]  # 8 ranks x 2 + 2
        assert server["requests"]["memory"] == f"{memory_gi}Gi"
        assert server["limits"]["memory"] == f"{-(-int(want * MEMORY_LIMIT_FACTOR) // GIB)}Gi"
        assert "memory" not in pod["initContainers"][0]["resources"]["requests"]
    validate_objects(objects)


def test_rdma_resources_and_nccl_env_reach_every_serving_container(tmp_path):
    _, by_kind, objects = _deploy(tmp_path, "bf16", rdma_resource=["rdma/rdma_shared_device_a=1"],
                                  nccl_env=["NCCL_IB_HCA=mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME=eth0"])
    pods = list(_pods(objects))
    assert len(pods) == 2
    for pod in pods:
        server = pod["containers"][0]
        r = server["resources"]
        assert r["requests"]["rdma/rdma_shared_device_a"] == r["limits"]["rdma/rdma_shared_device_a"] == "1"
        env = {e["name"]: e.get("value") for e in server["env"]}
        assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert server["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        assert "rdma/rdma_shared_device_a" not in pod["initContainers"][0]["resources"]["limits"]
    validate_objects(objects)
    _, _, plain = _deploy(tmp_path / "plain", "bf16")
    assert all("securityContext" not in p["containers"][0] for p in _pods(plain))


BAD_SCHEDULING = [
    ({"node_selector": ["pool"]}, "--node-selector 'pool': expected KEY=VALUE"),
    ({"node_selector": ["bad key=x"]}, "--node-selector 'bad key': not a label key"),
    ({"node_selector": ["pool=a b"]}, "--node-selector 'a b': not a label value"),
    ({"toleration": ["dedicated=llm"]}, "--toleration 'dedicated=llm': expected KEY\\[=VALUE\\]:EFFECT"),
    ({"toleration": ["dedicated:Sometimes"]}, "--toleration 'dedicated:Sometimes': expected"),
    ({"gpu_product_label": "NVIDIA H100"}, "--gpu-product-label 'NVIDIA H100': not a label value"),
    ({"gpu_product_label": "NVIDIA-H100-PCIe", "no_gpu_affinity": True}, "give one of them"),
    ({"rdma_resource": ["rdma_ib=1"]}, "--rdma-resource 'rdma_ib=1': give a device plugin's domain/name"),
    ({"rdma_resource": ["nvidia.com/gpu=1"]}, "--rdma-resource 'nvidia.com/gpu=1': give"),
    ({"rdma_resource": ["rdma/ib=0"]}, "--rdma-resource 'rdma/ib=0': COUNT must be a whole number >= 1"),
    ({"nccl_env": ["LD_PRELOAD=/x.so"]}, "--nccl-env 'LD_PRELOAD=/x.so': KEY must be an NCCL variable"),
    ({"nccl_env": ["NCCL_DEBUG=INFO\nx"]}, "--nccl-env NCCL_DEBUG: the value holds control characters"),
]


@pytest.mark.parametrize(("options", "message"), BAD_SCHEDULING)
def test_bad_scheduling_options_are_refused_naming_the_flag(tmp_path, options, message):
    spec = resolve_spec(model="llama-405b", precision="fp8")
    with pytest.raises(DeployError, match=message) as err:
        deploy_command(spec, platform="k8s", release_url=URL, pipeline_image=PIPELINE_IMAGE,
                       output=str(tmp_path / "d"), **options)
    assert err.value.exit_code == 2 and not (tmp_path / "d").exists()


def test_kubernetes_scheduling_options_are_refused_on_slurm(tmp_path):
    spec = resolve_spec(model="llama-8b", precision="fp8")
    with pytest.raises(DeployError, match="--node-selector, --nccl-env: Kubernetes options; drop them or use "
                       "--platform k8s"):
        deploy_command(spec, platform="slurm", release_volume="/shared/r", node_selector=["a=b"],
                       nccl_env=["NCCL_DEBUG=INFO"], output=str(tmp_path / "d"))


def test_default_names_tell_variants_apart_within_the_length_limit():
    from pipeline.ops.deploy.render import NAME_RE, default_name

    names = {default_name(resolve_spec(model="llama-70b", precision="fp8", **kw))
             for kw in ({"tp": 4}, {"tp": 4, "draft": "llama-1b"}, {"tp": 8}, {"tp": 4, "pp": 2, "nodes": 2})}
    assert names == {"llama-70b-fp8-tp4", "llama-70b-fp8-tp4-draft", "llama-70b-fp8-tp8", "llama-70b-fp8-tp4-pp2"}
    long = resolve_spec(model="llama-70b", precision="int4_awq", tp=4, pp=2, nodes=2, draft="llama-1b")
    long = long.model_copy(update={"model": long.model.model_copy(
        update={"name": "hf:" + "a-very-long-organisation/" + "model-name" * 5})})
    name = default_name(long)
    assert len(name) <= 40 and NAME_RE.fullmatch(name) and name.endswith("-int4-awq-tp4-pp2-draft")
