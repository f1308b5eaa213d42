"""The graph `deploy --platform dynamo` renders, run on the real NVIDIA Dynamo 1.6.1 (its frontend and KV router) with
`dynamo.mocker` workers as local processes (`pipeline.serving.dynamo_local`), driven by the project's own bench
through the OpenAI route: KV routing keeps each shared prefix on one worker, round-robin splits it.

The workload: 3 system prompts of 1024 tokens (32 KV blocks) shared by 30 requests in turn, each with a short own
suffix, on 4 workers of 200 KV blocks, so nothing is evicted. At concurrency 1, KV routing misses each prefix once
(3 cold requests), round-robin once per prefix and worker (12); at concurrency 8 the router also weighs load (5
misses measured, every time). Needs Dynamo's venv (`scripts/setup.sh` installs
.venv-dynamo; `PIPELINE_DYNAMO_PYTHON` names another); skips only where that install is impossible (its runtime wheel
is for Linux x86-64).
"""

import json
import platform
import time
from pathlib import Path

import pytest
import yaml

from pipeline.cli.commands import deploy_command
from pipeline.core.spec import PlannedTraffic, ServingTarget, resolve_spec
from pipeline.serving import bench
from pipeline.serving.dynamo_local import LocalGraph, dynamo_python
from tests.support.k8s import PIPELINE_IMAGE

SUPPORTED = platform.system() == "Linux" and platform.machine() == "x86_64"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SUPPORTED, reason="NVIDIA Dynamo 1.6.1's runtime wheel is for Linux x86-64 only: its "
                                             "install is impossible here"),
]
GROUPS, WORKERS, REQUESTS, PREFIX_TOKENS, VOCAB, KV_BLOCKS = 3, 4, 30, 1024, 2048, 200
DISAGG_REQUESTS = 100  # the 1 prefill + 1 decode pair must complete every one of them


def _word_model(out: Path) -> Path:
    """A tokenizer-only model directory (the mocker reads no weights): a word-level vocabulary, so that every token
    the mocker generates decodes to a word and streams as its own event."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>", "Request", *(f"w{i}" for i in range(VOCAB - 4))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    out.mkdir(parents=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 8192, "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
        "max_position_embeddings": 8192, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "intermediate_size": 128, "bos_token_id": 1, "eos_token_id": 2}))
    return out


def _dataset(path: Path) -> Path:
    prefixes = [" ".join(f"w{(g * 997 + j) % (VOCAB - 8) + 4}" for j in range(PREFIX_TOKENS)) for g in range(GROUPS)]
    path.write_text("".join(json.dumps({"prompt": f"{prefixes[i % GROUPS]} Request w{i}", "output_len": 8}) + "\n"
                            for i in range(REQUESTS)))
    return path


def _graph(tmp_path: Path, mode: str, router: str, replicas: int) -> dict:
    """The DynamoGraphDeployment `deploy --platform dynamo` renders for a --runtime pytorch spec."""
    spec = resolve_spec(model="llama-8b", precision="fp8", runtime="pytorch")
    target = ServingTarget(replicas=replicas, ttft_ms=500.0, tpot_ms=40.0,
                           traffic=PlannedTraffic(input_len=1024, output_len=8, prefix_share=0.9))
    out = tmp_path / f"deploy-{mode}-{router}-{replicas}"
    if not out.exists():
        deploy_command(spec.model_copy(update={"serving_target": target}), platform="dynamo", mode=mode,
                       router=router, pipeline_image=PIPELINE_IMAGE, release_volume="releases", output=str(out))
    docs = yaml.safe_load_all((out / "dynamo.yaml").read_text())
    return next(d for d in docs if d["kind"] == "DynamoGraphDeployment")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    exe = dynamo_python()
    assert exe is not None, "no Dynamo install: run scripts/setup.sh (it installs .venv-dynamo on Linux x86-64)"
    tmp = tmp_path_factory.mktemp("fleet")
    return tmp, _word_model(tmp / "model"), _dataset(tmp / "prompts.jsonl")


def _bench(fleet, mode: str, router: str, concurrency: int, *, replicas: int = WORKERS, requests: int = REQUESTS
           ) -> tuple[bench.BenchReport, dict]:
    """The bench report of one level through the graph's frontend, and the frontend's metrics after it."""
    tmp, model, data = fleet
    dgd = _graph(tmp, mode, router, replicas)
    run = tmp / f"run-{mode}-{router}-{concurrency}"
    with LocalGraph(dgd, model, run, kv_blocks=KV_BLOCKS) as graph:
        before = bench.scrape_metrics(f"{graph.url}/metrics")
        report = bench.run_bench(
            bench.ServerUrls(graph.url, f"{graph.url}/metrics"),
            bench.WorkloadOptions(concurrency=(concurrency,), requests_per_level=requests, max_tokens=8,
                                  dataset=str(data)),
            sweep=bench.SweepOptions(warmup=False, level_budget_s=60.0, request_timeout_s=30.0),
            tokenizer_dir=str(model))
        after = bench.scrape_metrics(f"{graph.url}/metrics")
    assert graph.procs and graph.alive() == [], "a Dynamo process outlived its graph"
    assert before is not None and after is not None
    from_metrics = bench.metrics_hit_ratio(bench.dynamo_token_counters(before), bench.dynamo_token_counters(after))
    assert from_metrics == pytest.approx(report.prefix_cache_hit_ratio, abs=0.01)  # the frontend's own counters
    return report, after


def test_frontend_and_workers_come_from_the_rendered_graph(fleet):
    tmp, model, _ = fleet
    from pipeline.serving.dynamo_local import frontend_argv, mocker_argv

    comps = {c["name"]: c for c in _graph(tmp, "agg", "kv", WORKERS)["spec"]["components"]}
    front = frontend_argv(comps["Frontend"], 18000)
    assert front[:2] == ["-m", "dynamo.frontend"] and front[front.index("--router-mode") + 1] == "kv"
    assert "--router-kv-events" in front and front[front.index("--http-port") + 1] == "18000"
    assert front[front.index("--http-host") + 1] == "127.0.0.1"
    worker = mocker_argv(comps["TRTLLMWorker"], model, 200)
    rendered = comps["TRTLLMWorker"]["podTemplate"]["spec"]["containers"][0]["args"]
    assert worker[worker.index("--model-name") + 1] == rendered[rendered.index("--served-model-name") + 1]
    assert worker[worker.index("--engine-type") + 1] == "trtllm"


def test_kv_routing_keeps_shared_prefixes_that_round_robin_splits(fleet):
    t0 = time.monotonic()
    hit = {(router, c): _bench(fleet, "agg", router, c)[0] for router in ("kv", "round-robin") for c in (1, 8)}
    for (router, c), report in hit.items():
        lv = report.levels[0]
        assert lv.errors == 0 and lv.requests == REQUESTS, (router, c, report.notes)
        assert report.prefix_cache_source == "per-request outputs"
        assert lv.ttft_ms_p50 is not None and lv.tpot_ms_p50 is not None and lv.output_tokens == 8 * REQUESTS
        print(f"fleet prefix-hit ratio, {router} routing at concurrency {c}: {lv.prefix_cache_hit_ratio}")
    ratio = {k: r.levels[0].prefix_cache_hit_ratio for k, r in hit.items()}
    assert ratio[("kv", 1)] >= 0.85
    assert ratio[("kv", 1)] >= ratio[("round-robin", 1)] + 0.10
    assert ratio[("kv", 8)] >= ratio[("round-robin", 8)] + 0.10
    assert time.monotonic() - t0 < 60


def test_disaggregated_prefill_decode_pair_completes_every_request(fleet):
    report, metrics = _bench(fleet, "disagg", "kv", 4, replicas=1, requests=DISAGG_REQUESTS)
    assert report.levels[0].requests == DISAGG_REQUESTS and report.failed == 0
    assert report.levels[0].output_tokens == 8 * DISAGG_REQUESTS
    routed = {dict(labels).get("phase"): v for (name, labels), v in metrics.items() if name == bench.DYNAMO_PROMPT}
    assert routed.get("prefill", 0) > 0  # the prompts went to the prefill worker, then to the decode worker
