"""`invoke deploy --platform dynamo`: a Dynamo 1.6.1 DynamoGraphDeployment for a `--runtime pytorch` build, checked
offline against the v1beta1 CRD schema, its CEL rules and the core PodTemplateSpec; broken documents are refused."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.errors import DeployError
from pipeline.core.spec import PlannedTraffic, ServingTarget, resolve_spec
from pipeline.ops.deploy import dynamo
from pipeline.ops.deploy.dynamo_validate import dgd_errors, schema_document, validate_dgd
from pipeline.stages.package.llmapi_options import llm_api_options
from tests.support.k8s import PIPELINE_IMAGE

REPO = Path(__file__).resolve().parents[3]
API = dynamo.RELEASES["1.6.1"].api_version
CASES = {  # name -> (deploy flags, spec overrides)
    "agg": ({"mode": "agg", "router": "round-robin"}, {}),
    "agg+kv": ({"mode": "agg", "router": "kv"}, {}),
    "disagg": ({"mode": "disagg", "router": "round-robin"}, {}),
    "disagg+kv": ({"mode": "disagg", "router": "kv"}, {}),
    "multinode": ({"mode": "disagg", "router": "kv"}, {"tp": "8", "pp": "2", "nodes": "2"}),
}


def _spec(model, replicas=None, **over):
    spec = resolve_spec(model=model, precision="fp8", runtime="pytorch", **over)
    if replicas is None:
        return spec
    target = ServingTarget(replicas=replicas, ttft_ms=500.0, tpot_ms=40.0,
                           traffic=PlannedTraffic(input_len=2048, output_len=256, prefix_share=0.5))
    return spec.model_copy(update={"serving_target": target})


def _render(tmp_path, spec, name="x", **flags):
    out = tmp_path / name
    summary = deploy_command(spec, platform="dynamo", pipeline_image=PIPELINE_IMAGE, release_volume="releases",
                             output=str(out), **flags)
    objects = list(yaml.safe_load_all((out / "dynamo.yaml").read_text()))
    return summary, out, {o["kind"]: o for o in objects}


def _components(dgd):
    return {c["name"]: c for c in dgd["spec"]["components"]}


def _main(component):
    return next(c for c in component["podTemplate"]["spec"]["containers"] if c["name"] == "main")


@pytest.mark.parametrize("model", ["llama-8b", "llama-70b"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_mode_renders_a_schema_valid_graph(tmp_path, model, case):
    flags, over = CASES[case]
    spec = _spec(model, replicas=3, **over)
    summary, out, by_kind = _render(tmp_path, spec, **flags)
    dgd = by_kind["DynamoGraphDeployment"]
    assert dgd["apiVersion"] == API and dgd_errors(dgd, api_version=API) == []
    assert summary["kind"] == "DynamoGraphDeployment"
    comps = _components(dgd)
    roles = ["agg"] if flags["mode"] == "agg" else ["prefill", "decode"]
    workers = ["TRTLLMWorker"] if flags["mode"] == "agg" else ["prefill", "decode"]
    assert sorted(comps) == sorted(["Frontend", *workers])
    assert comps["Frontend"]["type"] == "frontend" and comps["Frontend"]["replicas"] == 1
    front = _main(comps["Frontend"])["args"]
    assert front[front.index("--router-mode") + 1] == flags["router"]
    assert not set(front) & set(dynamo.RELEASES["1.6.1"].removed_next)
    config = by_kind["ConfigMap"]["data"]
    for role, name in zip(roles, workers):
        c = comps[name]
        assert c["type"] == ("worker" if role == "agg" else role)
        assert c["replicas"] == 3  # the spec's serving_target
        p = spec.parallelism
        nodes = int(over.get("nodes", 1))
        assert c.get("multinode") == ({"nodeCount": nodes} if nodes > 1 else None)
        main = _main(c)
        assert main["resources"]["limits"]["nvidia.com/gpu"] == str(p.tp * p.pp // nodes)
        args = main["args"]
        assert args[args.index("--extra-engine-args") + 1] == f"/config/{dynamo.options_file(role)}"
        assert ("--disaggregation-mode" in args) == (role != "agg")
        kv_events = flags["router"] == "kv" and role != "decode"
        assert ("--publish-kv-events" in args) == kv_events
        options = yaml.safe_load(config[dynamo.options_file(role)])
        assert "1.3.0rc29" in config[dynamo.options_file(role)].splitlines()[0]
        built = llm_api_options(spec, draft_dir=None).as_dict()
        assert {k: options[k] for k in built if k != "kv_cache_config"} == \
            {k: v for k, v in built.items() if k != "kv_cache_config"}
        assert options["kv_cache_config"]["enable_block_reuse"] is True
        assert ("event_buffer_max_size" in options["kv_cache_config"]) == kv_events
        assert ("cache_transceiver_config" in options) == (role != "agg")
        init = c["podTemplate"]["spec"]["initContainers"][0]
        assert init["image"] == PIPELINE_IMAGE and init["command"] == ["/bin/sh", "/config/fetch-verify.sh"]
    assert "pipeline.ops.deploy.serve_inputs" in config["fetch-verify.sh"]
    monitoring = {o["kind"]: o for o in yaml.safe_load_all((out / "monitoring.yaml").read_text())}
    endpoint = monitoring["PodMonitor"]["spec"]["podMetricsEndpoints"][0]
    assert (endpoint["port"], endpoint["path"]) == (dynamo.SYSTEM_PORT_NAME, "/metrics")
    selector = monitoring["PodMonitor"]["spec"]["selector"]["matchLabels"]
    for name in workers:
        assert selector.items() <= _components(dgd)[name]["podTemplate"]["metadata"]["labels"].items()
    assert "PrometheusRule" in monitoring
    side = json.loads((out / "dynamo.json").read_text())
    assert side["worker_gpus"] == 3 * len(roles) * spec.parallelism.world_size
    assert (summary["replicas"], summary["gpus"]) == (3 * len(roles), side["worker_gpus"])
    assert comps["Frontend"]["podTemplate"]["spec"].get("tolerations") is None  # a CPU pod


def test_cli_renders_the_documented_command_and_refuses_with_exit_2(tmp_path):
    base = [sys.executable, "-m", "invoke", "deploy", "--platform", "dynamo", "--model", "llama-70b", "--precision",
            "fp8", "--tp", "4", "--pipeline-image", PIPELINE_IMAGE, "--release-volume", "releases"]
    env = dict(os.environ, PIPELINE_ROOT=str(tmp_path))

    def run(*extra):
        return subprocess.run([*base, *extra], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)

    ok = run("--runtime", "pytorch", "--mode", "disagg", "--router", "kv", "--output", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: ") and "DynamoGraphDeployment" in ok.stdout
    refusals = {"--runtime engine": (["--output", str(tmp_path / "e")], "PyTorch backend only"),
                "--no-kv-reuse": (["--runtime", "pytorch", "--no-kv-reuse", "--output", str(tmp_path / "r")],
                                  "block reuse off"),
                "version": (["--runtime", "pytorch", "--dynamo-version", "1.7.0", "--output", str(tmp_path / "v")],
                            "Dynamo 1.6.1 only")}
    for what, (extra, text) in refusals.items():
        bad = run(*extra)
        assert bad.returncode == 2 and text in bad.stderr, (what, bad.stderr)
        assert bad.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in bad.stderr
    assert not (tmp_path / "e").exists() and not (tmp_path / "r").exists()


def test_round_robin_keeps_a_builds_reuse_off_but_kv_routing_refuses_it(tmp_path):
    off = _spec("llama-8b", enable_kv_cache_reuse="false")
    _, _, by_kind = _render(tmp_path, off, router="round-robin")
    assert "enable_block_reuse: false" in by_kind["ConfigMap"]["data"]["llm-api-agg.yaml"]
    with pytest.raises(DeployError, match="--no-kv-reuse"):
        _render(tmp_path, off, name="kv", router="kv")


def test_disagg_worker_options_without_cache_transfer_are_refused():
    spec = _spec("llama-8b")
    for role in ("prefill", "decode"):
        options = dynamo.worker_options(spec, role, "kv" if role == "prefill" else "round-robin", "x")
        assert options["cache_transceiver_config"] == {"backend": "DEFAULT"}
        del options["cache_transceiver_config"]
        with pytest.raises(DeployError, match="no cache_transceiver_config"):
            dynamo.check_worker_options(options, role, "round-robin")
    prefill = dynamo.worker_options(spec, "prefill", "kv", "x")
    del prefill["kv_cache_config"]["event_buffer_max_size"]
    with pytest.raises(DeployError, match="event_buffer_max_size"):
        dynamo.check_worker_options(prefill, "prefill", "kv")


def test_engine_and_other_platform_requests_are_refused(tmp_path):
    with pytest.raises(DeployError, match="PyTorch backend only"):
        _render(tmp_path, resolve_spec(model="llama-8b", precision="fp8"))
    with pytest.raises(DeployError, match="Dynamo options"):
        deploy_command(_spec("llama-8b"), platform="k8s", mode="disagg", pipeline_image=PIPELINE_IMAGE,
                       release_volume="releases", output=str(tmp_path / "k"))
    with pytest.raises(DeployError, match="--pipeline-image"):
        deploy_command(_spec("llama-8b"), platform="dynamo", release_volume="releases", output=str(tmp_path / "p"))
    with pytest.raises(DeployError, match="--dynamo-version"):
        dynamo.release_for("1.7.0")
    with pytest.raises(DeployError, match="--matrix builds on --platform k8s or slurm"):
        deploy_command(None, platform="dynamo", matrix="llama-8b:fp8", pipeline_image=PIPELINE_IMAGE,
                       output=str(tmp_path / "m"))


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    _, _, by_kind = _render(tmp_path_factory.mktemp("good"), _spec("llama-8b"), mode="disagg")
    return by_kind["DynamoGraphDeployment"]


def _broken(dgd, change):
    doc = copy.deepcopy(dgd)
    change(doc)
    return doc


def _dup(doc):  # a second component named like the first but for case
    doc["spec"]["components"].append({**copy.deepcopy(doc["spec"]["components"][1]), "name": "PREFILL"})


def _podspec(doc):
    return doc["spec"]["components"][1]["podTemplate"]["spec"]


BROKEN = {
    "wrong apiVersion": (lambda d: d.update(apiVersion="nvidia.com/v1alpha1"), "apiVersion/kind"),
    "wrong kind": (lambda d: d.update(kind="DynamoComponentDeployment"), "apiVersion/kind"),
    "duplicate component name": (_dup, "unique case-insensitively"),
    "missing component name": (lambda d: d["spec"]["components"][1].pop("name"), "'name' is a required property"),
    "unknown component type": (lambda d: d["spec"]["components"][1].update(type="router"), "is not one of"),
    "negative replicas": (lambda d: d["spec"]["components"][1].update(replicas=-1), "less than the minimum"),
    "one-node multinode": (lambda d: d["spec"]["components"][1].update(multinode={"nodeCount": 1}),
                           "less than the minimum"),
    "multinode without nodeCount": (lambda d: d["spec"]["components"][1].update(multinode={}),
                                    "'nodeCount' is a required property"),
    "unknown field": (lambda d: d["spec"]["components"][1].update(replica=2), "Additional properties"),
    "bad component name": (lambda d: d["spec"]["components"][1].update(name="pre_fill"), "does not match"),
    "two epp components": (lambda d: [c.update(type="epp") for c in d["spec"]["components"][1:]],
                           "at most one component may have type epp"),
    "eppConfig on a worker": (lambda d: d["spec"]["components"][1].update(eppConfig={}), "eppConfig may only"),
    "minAvailable above replicas": (lambda d: d["spec"]["components"][1].update(replicas=1, minAvailable=2),
                                    "minAvailable must be less"),
    "restart on create": (lambda d: d["spec"].update(restart={"id": "1"}), "spec.restart"),
    "no main container": (lambda d: _podspec(d)["containers"][0].update(name="server"), "named 'main'"),
    "container without name": (lambda d: _podspec(d)["containers"][0].pop("name"), "PodTemplate"),
    "pod field misspelt": (lambda d: _podspec(d).update(initContainer=[]), "PodTemplate"),
    "too many components": (lambda d: d["spec"]["components"].extend(
        {**copy.deepcopy(d["spec"]["components"][1]), "name": f"w{i}"} for i in range(25)), "is too long"),
    "runtime version not MAJOR.MINOR.PATCH": (lambda d: d["spec"]["components"][1].update(
        runtimeVersionOverride="v1.6"), "does not match"),
    "bad backend": (lambda d: d["spec"].update(backendFramework="tensorrt"), "is not one of"),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_each_broken_document_is_rejected(good, what):
    change, message = BROKEN[what]
    assert dgd_errors(good, api_version=API) == []
    pinned = _broken(good, lambda d: d["spec"]["components"][1].update(runtimeVersionOverride="1.6.1"))
    assert dgd_errors(pinned, api_version=API) == []
    broken = _broken(good, change)
    errors = dgd_errors(broken, api_version=API)
    assert errors and any(message in e for e in errors), errors
    with pytest.raises(DeployError, match="fails the Dynamo CRD checks"):
        validate_dgd(broken, api_version=API)


def test_schema_names_its_source_and_the_version_table_points_at_it():
    doc = schema_document()
    row = dynamo.RELEASES[dynamo.DEFAULT_VERSION]
    assert (doc["apiVersion"], doc["kind"], doc["dynamo_version"]) == (row.api_version, "DynamoGraphDeployment",
                                                                       row.version)
    assert all(len(c) == 40 for c in doc["commits"].values()) and "tag_verified" in doc
    rules = json.dumps(doc["openAPIV3Schema"]["properties"]["spec"])
    assert "lowerAscii" in rules and "type == 'epp'" in rules  # the CEL rules restated in dynamo_validate


def test_kubernetes_scheduling_flags_reach_every_component(tmp_path):
    _, _, by_kind = _render(tmp_path, _spec("llama-8b"), mode="disagg", node_selector=["pool=inference"],
                            nccl_env=["NCCL_IB_HCA=mlx5"], namespace="serving")
    dgd = by_kind["DynamoGraphDeployment"]
    assert dgd["metadata"]["namespace"] == by_kind["ConfigMap"]["metadata"]["namespace"] == "serving"
    for name, c in _components(dgd).items():
        pod = c["podTemplate"]["spec"]
        assert pod["nodeSelector"] == {"pool": "inference"}, name
        assert ("tolerations" in pod) == (name != "Frontend")
        env = {e["name"]: e.get("value") for e in _main(c).get("env", [])}
        assert (env.get("NCCL_IB_HCA") == "mlx5") == (name != "Frontend")


def test_the_hit_ratio_alert_expects_the_graphs_router(tmp_path):
    spec = _spec("llama-8b", replicas=4)
    traffic = spec.serving_target.traffic.model_copy(update={"shared_prefixes": 500, "requests_per_prefix": 6})
    spec = spec.model_copy(update={"serving_target": spec.serving_target.model_copy(update={"traffic": traffic})})
    floors = {}
    for router in ("kv", "round-robin"):
        _, out, _ = _render(tmp_path, spec, name=router, router=router)
        rules = next(o for o in yaml.safe_load_all((out / "monitoring.yaml").read_text())
                     if o["kind"] == "PrometheusRule")
        alert = next(r for g in rules["spec"]["groups"] for r in g["rules"]
                     if r.get("alert") == "PrefixCacheHitRatioLow")
        assert f"behind {router} routing" in alert["annotations"]["description"]
        floors[router] = float(alert["expr"].rsplit("<", 1)[1].split()[0])
    assert floors["round-robin"] < floors["kv"] <= 0.5


def test_a_planned_disaggregated_unit_reaches_the_graph(tmp_path):
    from pipeline.core.spec import DisaggTarget

    spec = _spec("llama-70b", replicas=3, tp=2, max_batch_size=44)
    unit = DisaggTarget(prefill_workers=2, prefill_tp=1, decode_workers=1)
    spec = spec.model_copy(update={"serving_target": spec.serving_target.model_copy(update={"disagg": unit})})
    summary, out, objects = _render(tmp_path, spec)  # no --mode: the plan's
    comps = _components(objects[dynamo.DGD_KIND])
    assert (comps["prefill"]["replicas"], comps["decode"]["replicas"]) == (6, 3)
    options = {role: yaml.safe_load(objects["ConfigMap"]["data"][dynamo.options_file(role)])
               for role in ("prefill", "decode")}
    assert (options["prefill"]["tensor_parallel_size"], options["decode"]["tensor_parallel_size"]) == (1, 2)
    limits = {role: _main(comps[role])["resources"]["limits"] for role in ("prefill", "decode")}
    assert (limits["prefill"]["nvidia.com/gpu"], limits["decode"]["nvidia.com/gpu"]) == ("1", "2")
    requested = {role: _main(comps[role])["resources"]["requests"] for role in ("prefill", "decode")}
    assert int(requested["prefill"]["cpu"]) < int(requested["decode"]["cpu"])  # one rank's pod, not two
    side = json.loads((out / "dynamo.json").read_text())
    assert side["worker_tp"] == {"prefill": 1, "decode": 2} and side["worker_gpus"] == 6 * 1 + 3 * 2
    assert (summary["replicas"], summary["gpus"]) == (9, 12)
    for flags, text in (({"mode": "agg"}, "--mode agg: the spec plans disaggregated serving"),):
        with pytest.raises(DeployError, match=text):
            _render(tmp_path, spec, name="agg", **flags)
    with pytest.raises(DeployError, match="deploy it with --platform dynamo"):
        deploy_command(spec, platform="k8s", pipeline_image=PIPELINE_IMAGE, release_volume="releases",
                       output=str(tmp_path / "k8s"))
    assert not (tmp_path / "agg").exists() and not (tmp_path / "k8s").exists()


@pytest.mark.parametrize("mode", ["agg", "disagg"])
@pytest.mark.parametrize("speculation", [
    dict(model="llama3.3-70b", draft="auto", speculative_decoding="eagle3", tp=4),
    dict(model="llama-70b", draft="llama-1b", speculative_decoding="draft-target", tp=4),
])
def test_a_speculative_build_names_its_draft_at_the_link_fetch_verify_makes(tmp_path, mode, speculation):
    spec = resolve_spec(precision="fp8", runtime="pytorch", **speculation)
    _, _, objects = _render(tmp_path, spec, name="spec", mode=mode)
    config = objects["ConfigMap"]["data"]
    for role in (("agg",) if mode == "agg" else ("prefill", "decode")):
        draft = yaml.safe_load(config[dynamo.options_file(role)])["speculative_config"]
        name = objects[dynamo.DGD_KIND]["metadata"]["name"]
        assert draft["speculative_model_dir"] == f"/work/serve/{name}.draft"
        assert draft["decoding_type"] == ("Eagle" if spec.speculation_mode == "eagle3" else "DraftTarget")
    assert "pipeline.ops.deploy.serve_inputs" in config["fetch-verify.sh"]
