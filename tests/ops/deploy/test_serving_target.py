"""Plan -> spec -> deploy keeps the numbers: the replicas `plan --slo --rate` paid for are the replicas `deploy`
renders (Kubernetes, Slurm), `--replicas` overrides them, and the alerts watch the spec's SLO and traffic."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import yaml

from pipeline.cli.commands import deploy_command, plan_command
from pipeline.cli.flags import spec_from_flags
from pipeline.core.errors import SpecError
from pipeline.core.spec import resolve_spec
from pipeline.ops.monitoring.rules import COST, watch_plan
from pipeline.planning.planner import plan_capacity
from tests.support.k8s import PIPELINE_IMAGE

URL = "https://releases.example.invalid/r.tar"


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """`plan --slo --ttft-ms 500 --tpot-ms 40 --rate 20 --write-spec s.yaml` (llama-70b fp8 tp 4: a quick search)
    and the JSON it printed."""
    path = tmp_path_factory.mktemp("plan") / "s.yaml"
    spec = spec_from_flags({"model": "llama-70b", "gpu": "h100-sxm", "precision": "fp8", "tp": "4"})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        plan_command(spec, slo=True, ttft_ms="500", tpot_ms="40", rate="20", input_len="2048", output_len="512",
                     write_spec=str(path), json_=True)
    return path, json.loads(out.getvalue())


def _deploy(tmp_path, spec, platform="k8s", **kw):
    out = tmp_path / platform
    where = ({"release_url": URL, "pipeline_image": PIPELINE_IMAGE} if platform == "k8s"
             else {"release_volume": "/shared/releases"})
    summary = deploy_command(spec, platform=platform, output=str(out), **where, **kw)
    return summary, out


def _workload(out):
    objects = list(yaml.safe_load_all((out / "serving.yaml").read_text()))
    return next(o for o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet"))


def _alerts(out):
    docs = list(yaml.safe_load_all((out / "monitoring.yaml").read_text()))
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


def test_the_written_spec_records_replicas_slo_traffic_and_estimate(planned):
    path, result = planned
    pick, target = result["pick"], yaml.safe_load(path.read_text())["serving_target"]
    assert pick["replicas"] > 1 and target["replicas"] == pick["replicas"]
    assert (target["ttft_ms"], target["tpot_ms"]) == (500, 40)
    assert target["traffic"] == {"input_len": 2048, "output_len": 512, "prefix_share": 0.0, "acceptance": 0.7,
                                 "rate": 20.0}
    assert target["estimate"]["tokens_per_s"] == pick["tokens_per_s"]
    assert target["estimate"]["cost_per_1m_output_tokens_usd"] == pytest.approx(
        pick["cost_per_1m_output_tokens_usd"], rel=1e-5)
    spec = spec_from_flags({"spec": str(path)})  # the loader and every check rule accept it
    assert spec.serving_target.replicas == pick["replicas"]
    assert spec.identity() == spec.model_copy(update={"serving_target": None}).identity()  # no artifact changes


def test_deploy_renders_the_replicas_the_plan_paid_for(planned, tmp_path):
    path, result = planned
    summary, out = _deploy(tmp_path, spec_from_flags({"spec": str(path)}))
    deployment = _workload(out)
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == result["pick"]["replicas"]
    assert summary["replicas"] == result["pick"]["replicas"]


def test_replicas_flag_overrides_and_is_validated(planned, tmp_path):
    path, _ = planned
    spec = spec_from_flags({"spec": str(path)})
    _, out = _deploy(tmp_path, spec, replicas="7")
    assert _workload(out)["spec"]["replicas"] == 7
    for bad in ("0", "-1", "2.5", "nan", "x"):
        with pytest.raises(SpecError, match="--replicas"):
            _deploy(tmp_path / bad, spec, replicas=bad)
    assert not (tmp_path / "0").exists()


def test_leader_worker_set_gets_the_replicas(tmp_path):
    spec = resolve_spec(model="llama-405b", precision="bf16")  # two nodes per copy
    _, out = _deploy(tmp_path, spec, replicas="3")
    lws = _workload(out)
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["replicas"] == 3
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2


def test_slurm_renders_one_job_per_replica(planned, tmp_path):
    path, result = planned
    n = result["pick"]["replicas"]
    summary, out = _deploy(tmp_path, spec_from_flags({"spec": str(path)}), platform="slurm")
    script = (out / "serve.sbatch").read_text()
    assert f"#SBATCH --array=0-{n - 1}\n" in script and "logs/%x-%A_%a.out" in script
    assert "#SBATCH --exclusive\n" in script  # replicas share no node: the server's ports are fixed
    assert 'prometheus-targets-"$SLURM_ARRAY_TASK_ID".json' in script  # one scrape target file per replica
    scrape = yaml.safe_load((out / "prometheus-scrape.yml").read_text())
    assert scrape["scrape_configs"][0]["file_sd_configs"][0]["files"] == [str(out / "prometheus-targets-*.json")]
    rules = yaml.safe_load((out / "prometheus-rules.yml").read_text())
    cost = next(r for g in rules["groups"] for r in g["rules"] if r.get("record") == COST)
    assert cost["labels"]["gpus"] == str(n * summary["world_size"])  # every replica's GPUs are paid


def test_alert_thresholds_follow_the_specs_slo_and_traffic(planned, tmp_path):
    path, result = planned
    spec = spec_from_flags({"spec": str(path)})
    _, out = _deploy(tmp_path, spec)
    alerts = _alerts(out)
    assert alerts["QueueTimeHigh"]["expr"].endswith("> 500000")  # the SLO's TTFT, in µs
    planned_cost = result["pick"]["cost_per_1m_output_tokens_usd"]
    assert f"> {planned_cost * 2:.6g} and" in alerts["CostPerTokenAbovePlan"]["expr"]
    share = spec.model_copy(update={"serving_target": spec.serving_target.model_copy(update={
        "ttft_ms": 300.0, "traffic": spec.serving_target.traffic.model_copy(update={"prefix_share": 0.8})})})
    w = watch_plan(share, deployment="d", gpus=4)
    assert (w.queue_ms_max, w.hit_ratio_min) == (300.0, 0.8)


def test_a_spec_without_the_section_renders_as_before(tmp_path):
    spec = resolve_spec(model="llama-70b", precision="fp8", tp=4)
    assert "serving_target" not in spec.model_dump()
    summary, out = _deploy(tmp_path, spec)
    assert _workload(out)["spec"]["replicas"] == 1 and summary["replicas"] == 1
    plan = plan_capacity(spec)  # 1024 + 256 tokens: the planner's defaults
    alerts = _alerts(out)
    assert alerts["QueueTimeHigh"]["expr"].endswith(f"> {max(1.0, round(plan.ttft_ms_estimate, 1)) * 1000:g}")
    assert f"> {plan.cost_per_1m_output_tokens_usd * 2:.6g} and" in alerts["CostPerTokenAbovePlan"]["expr"]
    _, slurm = _deploy(tmp_path, spec, platform="slurm")
    script = (slurm / "serve.sbatch").read_text()
    assert "--array" not in script and "targets=" + str(slurm / "prometheus-targets.json") in script


def test_a_release_keeps_the_replicas_its_spec_was_planned_for(planned, tmp_path):
    from pipeline.ops.deploy.source import from_release

    spec = spec_from_flags({"spec": str(planned[0])})
    rel = tmp_path / "rel"
    rel.mkdir()
    (rel / "release.json").write_text(json.dumps({"name": "r-v1", "spec": spec.model_dump(mode="json")}))
    assert from_release(rel).spec.serving_target == spec.serving_target
    summary, out = _deploy(tmp_path, None, release=str(rel))
    assert _workload(out)["spec"]["replicas"] == summary["replicas"] == planned[1]["pick"]["replicas"]
