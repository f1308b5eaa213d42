"""Every flag of every task in one table (`OPTIONS`: name -> type, choices, range, help), which tasks take which
(`TASK_FLAGS`), and the parsing of the strings invoke hands over into typed values (`parse_flags`).

A key `task.flag` overrides the plain `flag` entry for that task. The spec flags (`SPEC_FLAGS`) pass through as
strings: `spec_from_flags` hands them to the spec's pydantic validators.
"""

from __future__ import annotations

import functools
import math
import re
import select
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from pipeline.core.errors import (
    BenchError,
    BuildError,
    DeployError,
    PipelineError,
    SpecError,
    io_error,
    os_error_in,
)
from pipeline.core.registry import MAX_DRAFT_LEN
from pipeline.core.spec import (
    AUTO,
    MAX_NODES,
    MAX_RATE,
    MAX_REPLICAS,
    MAX_REQUEST_TOKENS,
    MAX_SLO_MS,
    SECTIONS,
    BuildSpec,
)

MAX_SECONDS = 86_400.0  # a timeout or a time budget: a day
MAX_SEED = 2**32 - 1
MAX_PORT = 65_535
MAX_BENCH_REQUESTS = 100_000  # pipeline.serving.bench.MAX_REQUESTS
MAX_BENCH_RATE = 1e6  # pipeline.serving.bench.MAX_REQUEST_RATE
PROGRAM = "invoke"  # the program the user ran; pipeline.cli.console.PipelineProgram.run sets it
STAGES = ("check", "download", "calibrate", "compile", "package")  # pipeline.stages.build.STAGES
NOT_A_STAGE = "{flag} {value!r} is not a stage; stages: {choices}"  # as pipeline.stages.build.stage_range says
SERVE_MODES = ("triton", "trtllm-serve")  # pipeline.ops.deploy.runtime.SERVE_MODES
MPI_TYPES = ("pmix", "pmix_v3", "pmix_v4", "pmix_v5", "pmi2", "cray_shasta", "none")  # pipeline.ops.deploy.slurm


@dataclass(frozen=True)
class Option:
    """One flag: `kind` is str, int, float, bool (a switch) or list (repeatable strings); numbers must lie within
    `minimum`..`maximum` (every number has a finite bound); a value outside `choices` raises `error` with the
    line `refusal` (a format string of `flag`, `value` and `choices`; default: the choices to use)."""

    help: str
    kind: type = str
    minimum: float = 1
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    refusal: str = "{flag} {value!r}: use one of {choices}"
    error: type[PipelineError] = SpecError
    default: Any = None
    field: str | None = None  # a spec flag: its `resolve_spec` override (values stay strings)


def _spec_field(field: str) -> tuple[str, Any]:
    classes: tuple[type[BaseModel], ...] = (BuildSpec, *SECTIONS.values())
    for cls in classes:
        if field in cls.model_fields:
            info = cls.model_fields[field]
            return info.description or field, info.annotation
    raise KeyError(field)


def metavar(annotation: Any) -> str | None:
    """How help shows a value of this type: INT, FLOAT, a|b|c for choices, STRING, BOOL."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        kinds = [metavar(a) for a in args if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else None
    return {int: "INT", float: "FLOAT", str: "STRING", bool: "BOOL"}.get(annotation)


def _spec(field: str, help: str | None = None) -> Option:
    text, annotation = _spec_field(field)
    kind = metavar(annotation)
    choices = tuple(kind.split("|")) if kind and "|" in kind else ()
    if field == "precision":
        choices += (AUTO,)  # `auto`: resolve_spec's request, never held
    kinds: dict[str | None, type] = {"INT": int, "FLOAT": float, "BOOL": bool}
    return Option(help or text, kinds.get(kind, str) if not choices else str, choices=choices, field=field)


def _switch(help: str) -> Option:
    return Option(help, bool, default=False)


def _count(help: str, maximum: float, *, minimum: float = 1, kind: type = int, default: Any = None) -> Option:
    return Option(help, kind, minimum, maximum, default=default)


def _share(help: str, *, default: float | None = None) -> Option:
    return Option(help, float, 0.0, 1.0, default=default)


_SPEC_OPTIONS: dict[str, Option] = {
    "model": Option("registry model name (llama-70b, qwen2.5-7b, qwen3-8b, mistral-7b, mixtral-8x7b, tiny-llama, "
                    "...) or hf:ORG/NAME[@REVISION] (numbers from that Hub repo's config.json)", field="model"),
    **{name: _spec(name) for name in ("precision", "kv_cache", "tp", "pp", "moe_ep", "gpu", "gpu_count", "nodes",
                                      "gpus_per_node", "draft", "speculative_decoding", "draft_len",
                                      "max_matching_ngram_size", "draft_precision", "draft_tp",
                                      "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block",
                                      "calib_data", "calib_size", "calib_seq_len", "decoupled")},
    "draft_max_batch": _spec("draft_max_batch_size"),
    "max_batch": _spec("max_batch_size"),
    "max_ppl_delta": _spec("max_ppl_delta_pct"),
    "mem_fraction": _spec("kv_cache_free_gpu_mem_fraction"),
    "gpu_price": _spec("gpu_price_per_hour"),
    "target": Option("serving target: trtllm (GPU, TensorRT-LLM) or reference (CPU PyTorch backend)",
                     choices=("trtllm", "reference"), field="target"),
    "runtime": Option("TensorRT-LLM runtime: engine (trtllm-build engines) or pytorch (quantized HF checkpoint on the "
                      "PyTorch backend / LLM API)", choices=("engine", "pytorch"), field="runtime"),
    "spec": Option("YAML file with a whole spec; flags override it"),
    "models_file": Option("extra model registry YAML (entries override the packaged ones)"),
    "no_kv_reuse": _switch("disable KV-cache reuse (prefix caching)"),
    "no_chunked_context": _switch("disable chunked context"),
    "no_quality_gate": _switch("record but do not enforce the calibration quality gate"),
    "no_multiple_profiles": _switch("build a single TensorRT optimization profile"),
    "tp_across_nodes": _switch("allow a TP group to span nodes (all-reduce over the network; slow)"),
}
SPEC_FLAGS: tuple[str, ...] = tuple(_SPEC_OPTIONS)  # every task that takes a build spec takes exactly these
_SPEC_SWITCHES = {  # switch -> the spec field it sets, and to what
    "no_kv_reuse": ("enable_kv_cache_reuse", False), "no_chunked_context": ("enable_chunked_context", False),
    "no_quality_gate": ("quality_gate", False), "no_multiple_profiles": ("multiple_profiles", False),
    "tp_across_nodes": ("tp_across_nodes", True),
}

OPTIONS: dict[str, Option] = {
    **_SPEC_OPTIONS,
    # shared by several tasks
    "json": _switch("print the result as JSON on stdout"),
    "force": _switch("redo the work even when its output is current"),
    "skip_host_check": _switch("validate the spec only (e.g. for another host); the host line is not printed"),
    "revision": Option("branch, tag or commit overriding the registry's (target model only)"),
    "update": _switch("re-resolve the branch/tag to its current commit instead of the locked one (models.lock.json)"),
    "offline": _switch("no network: reuse a previous download, fail clearly when there is none"),
    "endpoint": Option("Hub URL (default: HF_ENDPOINT or https://huggingface.co); the token comes from "
                       "HF_TOKEN/hf auth login"),
    "checkpoint_dir": Option("target TensorRT-LLM checkpoint dir (default: the calibrate stage's "
                             "engines/<build-id>/checkpoint)"),
    "draft_checkpoint_dir": Option("draft checkpoint dir (default: the calibrate stage's draft checkpoint)"),
    "engine_dir": Option("point tensorrt_llm at this engine dir"),
    "draft_engine_dir": Option("point tensorrt_llm_draft at this engine dir"),
    "repo": Option("model repository to serve (default: the spec's repo under triton_repo/; --model is then needed)"),
    "output": Option("directory to write into"),
    "ready_timeout": _count("seconds to wait for readiness (default 300)", MAX_SECONDS, minimum=0.1, kind=float,
                            default=300.0),
    "max_tokens": _count("output tokens per request (default 24)", MAX_REQUEST_TOKENS, default=24),
    "http_url": Option("HTTP address of a running server (127.0.0.1:PORT); with --grpc-url no server is started"),
    # check / build
    "build.skip_host_check": _switch("do not compare GPU memory, RAM and disk with what the stages need (unusual "
                                     "setups)"),
    "until": Option("last stage to run", choices=STAGES, error=BuildError, refusal=NOT_A_STAGE),
    "from": Option("first stage to run; earlier stages must already be current (they are located, not run)",
                   choices=STAGES, error=BuildError, refusal=NOT_A_STAGE),
    "build.force": Option("rebuild this stage and every stage after it even when current", choices=STAGES,
                          error=BuildError, refusal=NOT_A_STAGE),
    "build.json": _switch("print the build report as JSON on stdout (progress stays on stderr)"),
    "build.offline": _switch("download: use only the local cache"),
    "build.update": _switch("download: re-resolve a branch revision to its newest commit"),
    "verify_download": _switch("download: re-hash every cached file"),
    "verify": _switch("re-hash every stage output (sha256), not only sizes and mtimes, before reusing it"),
    "build.revision": Option("download: model revision (branch, tag or commit) overriding the registry's"),
    "build.endpoint": Option("download: Hugging Face Hub endpoint URL"),
    "download.verify": _switch("re-hash every file against the Hub's oids (corrupt files are fetched again)"),
    # plan
    "input_len": _count("prompt tokens per request for capacity/throughput (default min(1024, max_input_len))",
                        MAX_REQUEST_TOKENS),
    "output_len": _count("output tokens per request (default 256)", MAX_REQUEST_TOKENS),
    "compare": _switch("a table over precisions (bf16/fp8/int4_awq/w4a8_awq), TP sizes and speculation none/draft-"
                       "target/ngram (where the runtime runs it) for this model and GPU, with speculation's speed-up, prefix reuse's prefill saving and estimated $ per "
                       "1M tokens"),
    "acceptance": _share("acceptance rate per drafted token of the spec's speculation mode, 0..1 (default: the "
                         "mode's, 0.7 draft-target, 0.27 ngram; `bench` measures it)"),
    "prefix_hit": _share("prefix-cache hit ratio for the estimate, 0..1 (default 0)"),
    "serving_mode": Option("--slo: auto (default: aggregated replicas and disaggregated prefill/decode units are "
                           "both searched; --write-spec writes the cheaper) or agg (aggregated replicas only, for "
                           "--platform k8s/slurm)", choices=("auto", "agg")),
    "plan.router": Option("with the spec's serving_target replicas (or --slo's): the router in front of them, "
                          "round-robin (default: k8s Services, Slurm) or kv (Dynamo's KV-aware router); the estimate "
                          "takes the fleet's prefix-hit ratio under it", choices=("round-robin", "kv")),
    "shared_prefixes": _count("distinct shared prefixes in the traffic, for the fleet's prefix-hit ratio (default 1, "
                              "bench's shared-prefix workload)", 10_000_000),
    "prefix_requests": _count("requests that reuse each shared prefix over its life, e.g. a chat session's turns "
                              "(default: unbounded)", 10_000_000),
    "estimator": Option("also run NVIDIA AIConfigurator 0.12 on the same case (installed into its own venv under the "
                        "pipeline cache on first use) and print both estimates side by side; with --slo, its own "
                        "aggregated-vs-disaggregated search (`cli default`) beside ours at the pick's precision",
                        choices=("aiconfigurator",), refusal="{flag} {value!r}: the only second estimator is "
                        "'aiconfigurator'; drop the flag for the built-in estimate alone"),
    "slo": _switch("search precision x TP x PP x max batch x draft/K (x runtime) for the cheapest configuration "
                   "meeting --ttft-ms and --tpot-ms at this traffic; print it, the Pareto front and why the others "
                   "lose (exit 2 naming the nearest miss when none meets the SLO), then the cheapest disaggregated "
                   "unit (prefill + decode workers) and which serves the SLO cheaper. Flags the spec sets "
                   "(--precision, --tp, ...) stay fixed"),
    "ttft_ms": _count("--slo: time to first token to meet, ms", MAX_SLO_MS, minimum=1e-9, kind=float),
    "tpot_ms": _count("--slo: time per output token to meet, ms", MAX_SLO_MS, minimum=1e-9, kind=float),
    "prefix_share": _share("--slo: share of each prompt a cached prefix covers, 0..1 (default: --bench-report's hit "
                           "ratio, else --prefix-hit, else 0)"),
    "rate": _count("--slo: requests per second to serve (replicas are provisioned for it); default: fully loaded",
                   MAX_RATE, minimum=1e-9, kind=float),
    "bench_report": Option("--slo: the `bench --json-file` report whose acceptance_rate and prefix_cache_hit_ratio "
                           "feed the search (--acceptance and --prefix-share win); its model (and precision, when "
                           "--precision is given) must be the spec's"),
    "accept_foreign_bench_report": _switch("--slo: take a --bench-report of another (or an unnamed) model or "
                                           "precision"),
    "write_spec": Option("--slo: write the pick as a spec YAML that `build --spec` and `check --spec` take"),
    "precision_search": Option("--slo: a `--precision auto` build's precision_search.json: only the precisions that "
                               "passed its quality gate are searched (default: the newest such record of this model "
                               "and GPU under engines/, else bf16/fp8/int4_awq/w4a8_awq)"),
    # calibrate / compile / package
    "calibrate.force": _switch("rebuild even when the checkpoint for these inputs exists"),
    "dry_run": _switch("print the trtllm-build plan (argv, expected outputs, GPU memory) and exit; works on any "
                       "machine"),
    "compile.force": _switch("rebuild even when the engine manifest's key is current"),
    "package.output": Option("parent directory of the repository (default triton_repo/); the repo is "
                             "<output>/<build-id>[-reference]"),
    "package.engine_dir": Option("trtllm: target engine dir (default: the compile stage's engines/<build-id>/engine)"),
    "package.draft_engine_dir": Option("trtllm: draft engine dir (default: <engine-dir>/../draft_engine)"),
    "package.checkpoint_dir": Option("reference or runtime pytorch: target checkpoint dir (default: the calibrate "
                                     "stage's engines/<build-id>/checkpoint, or hf_checkpoint for runtime pytorch)"),
    "package.draft_checkpoint_dir": Option("reference or runtime pytorch: draft checkpoint dir (default: the "
                                           "calibrate stage's)"),
    "tokenizer_dir": Option("tokenizer files to copy into the repo (default: the checkpoint's tokenizer/)"),
    "draft_tokenizer_dir": Option("trtllm: the draft's tokenizer, for a draft engine built outside the pipeline"),
    "package.force": _switch("rewrite the repository even when its manifest key is current"),
    # release / verify / install-repo
    "release.output": Option("directory for the tarball: any directory, absolute or relative to the output tree "
                             "(default releases/)"),
    "version": Option("release version: letters, digits and . _ + - (default: the pipeline's version)"),
    "path": Option("release .tar (or an earlier .tar.gz), unpacked release dir, or Triton model repository"),
    "skip_host": _switch("check hashes only, not the host's TensorRT-LLM/TensorRT/GPU against the engines"),
    "sha256": Option("the tarball's expected sha256 (e.g. pinned by deploy), checked in the same read as its "
                     "members"),
    "install_repo.repo": Option("model repository to install (e.g. triton_repo/<build-id>)"),
    "dest": Option("write the installed repository here instead of editing --repo in place (must not exist)"),
    # serve / smoke
    "mode": Option("triton (default) or trtllm-serve", choices=SERVE_MODES),
    "host": Option("address to bind (default 127.0.0.1; 0.0.0.0: every interface)"),
    "print_only": _switch("print the launch command(s) and env and run nothing, needing no download (triton: from the "
                          "spec alone, or --repo; trtllm-serve: a finished build gets its options YAML written so the "
                          "command runs as printed, without one <build-id> stands in the paths)"),
    "http_port": _count("HTTP port (default 8000 + --port-offset)", MAX_PORT),
    "grpc_port": _count("gRPC port (default 8001 + --port-offset)", MAX_PORT),
    "metrics_port": _count("metrics port (default 8002 + --port-offset)", MAX_PORT),
    "port_offset": _count("shift the three default ports by N (e.g. 100: 8100/8101/8102)", MAX_PORT - 8002,
                          minimum=0, default=0),
    "serve.engine_dir": Option("serve tensorrt_llm from this engine dir (the repository itself is not changed)"),
    "serve.draft_engine_dir": Option("serve tensorrt_llm_draft from this engine dir"),
    "grpc_url": Option("gRPC address of a running server (127.0.0.1:PORT)"),
    "prompt": Option("prompt text"),
    "num_draft_tokens": _count("draft tokens per step for the BLS route (default: the repo's K)", MAX_DRAFT_LEN),
    # bench
    "url": Option("gRPC address of a running Triton server (127.0.0.1:PORT), or an OpenAI-compatible server's "
                  "(http://127.0.0.1:PORT: Dynamo's frontend, trtllm-serve); default: start tritonserver on the build's "
                  "repo"),
    "metrics_url": Option("metrics URL (http://127.0.0.1:PORT/metrics: Triton's, Dynamo's frontend's) for the "
                          "prefix-cache hit ratio"),
    "bench.repo": Option("model repository to serve (default: the build's Triton repo)"),
    "model_name": Option("model to call (default: tensorrt_llm_bls when served, else ensemble)"),
    "concurrency": Option("concurrency levels, repeatable or comma-separated (default 1,2,4)", list),
    "requests": _count("requests per concurrency level (default 8)", MAX_BENCH_REQUESTS, default=8),
    "bench.max_tokens": _count("output tokens per request, where the dataset gives none (default 32)",
                               MAX_REQUEST_TOKENS, default=32),
    "no_stream": _switch("send non-streaming requests (TTFT not measurable)"),
    "budget": _count("seconds per concurrency level before no new requests are sent (default 60)", MAX_SECONDS,
                     minimum=0.1, kind=float, default=60.0),
    "bench.json": _switch("print the report as JSON on stdout (server and progress lines go to stderr)"),
    "json_file": Option("also write the report as JSON to this file (checked writable before the run; written "
                        "atomically)"),
    "plot": Option("write a PNG of throughput and TTFT against concurrency to this file (needs matplotlib: .[dev])"),
    "shared_prefix_tokens": _count("shared-prefix workload: this many prompt tokens common to a share of the "
                                   "requests (each with a distinct suffix); default 0: the fixed prompt set",
                                   MAX_REQUEST_TOKENS, minimum=0, default=0),
    "shared_prefix_share": _share("share of the requests that reuse the shared prefix, 0..1 (default 1)",
                                  default=1.0),
    "speculation": Option("server (the route's default draft length), off (num_draft_tokens 0), or both (each level "
                          "twice: the crossover in the plot); default server", choices=("server", "off", "both"),
                          error=BenchError, refusal="{flag} {value!r}: expected server, off or both"),
    "dataset": Option('prompts as JSONL (one object a line) or one JSON array (ShareGPT as published, streamed): '
                      'objects {"prompt": ..., "output_len": N} (output_len optional) or the ShareGPT layout '
                      '{"conversations": [{"from": "human", ...}, {"from": "gpt", ...}]}; every level replays one '
                      'seeded sample of --requests'),
    "request_rate": _count("Poisson arrivals per second in each level (the concurrency level caps requests in "
                           "flight); default: closed loop, each client sends its next request at once",
                           MAX_BENCH_RATE, minimum=0.001, kind=float),
    "seed": _count("seed of the dataset sample and the Poisson arrival times (default 0)", MAX_SEED, minimum=0,
                   default=0),
    "bench.http_url": Option("HTTP address of the server at --url (127.0.0.1:PORT), for --second-opinion aiperf"),
    "second_opinion": Option("also run NVIDIA AIPerf 0.13 on the same requests, concurrency and request rate (a "
                             "streaming ensemble or BLS) and print both tools' figures side by side",
                             choices=("aiperf",), error=BenchError,
                             refusal="{flag} {value!r}: the only second opinion is 'aiperf'; drop the flag for ours "
                             "alone"),
    # deploy
    "platform": Option("k8s (Deployment, or LeaderWorkerSet across nodes), slurm (sbatch) or dynamo (NVIDIA Dynamo "
                       "DynamoGraphDeployment, runtime pytorch)", choices=("k8s", "slurm", "dynamo"),
                       error=DeployError, refusal="{flag} {value!r}: choose k8s, slurm or dynamo"),
    "deploy.mode": Option("dynamo: agg (default; Frontend + aggregated workers) or disagg (prefill + decode workers)",
                          choices=("agg", "disagg"), error=DeployError),
    "router": Option("dynamo: the Frontend's router, kv (default; KV-aware, workers publish KV events) or round-robin",
                     choices=("kv", "round-robin"), error=DeployError),
    "dynamo_version": Option("dynamo: the Dynamo release to render for (default 1.6.1, the only one supported)"),
    "release": Option("release tarball or unpacked release (its spec, toolchain and sha256); default: the spec flags"),
    "deploy.output": Option("directory to write (default <output tree>/deploy/<platform>/<name>); replaced only with "
                            "--force"),
    "name": Option("deployment name, DNS-1123 (default <model>-<precision>)"),
    "namespace": Option("Kubernetes namespace (default default)"),
    "release_url": Option("http(s) URL the nodes fetch the release tarball from (no user:password@ in it)"),
    "release_secret": Option("k8s: Secret whose key `header` (e.g. 'Authorization: Bearer ...') the fetch sends "
                             "with --release-url; Slurm: export RELEASE_AUTH_HEADER before sbatch instead"),
    "release_volume": Option("where the nodes find the tarball instead: a PVC name (k8s) or a shared directory "
                             "(slurm)"),
    "image": Option("server image (default: the NGC tritonserver image of the release's TensorRT-LLM)"),
    "pipeline_image": Option("image with this pipeline (runs `verify` and the build matrix; default derived)"),
    "pipeline_cmd": Option("how the scripts call the pipeline (default: invoke -r /opt/trtllm-pipeline)"),
    "partition": Option("Slurm partition"),
    "account": Option("Slurm account to charge (#SBATCH --account)"),
    "qos": Option("Slurm quality of service (#SBATCH --qos)"),
    "constraint": Option("Slurm node features, e.g. 'h100&ib' (#SBATCH --constraint)"),
    "time": Option("Slurm time limit, e.g. 2-00:00:00 (serving default: none, the partition's limit; matrix: "
                   "04:00:00)"),
    "no_container": _switch("Slurm: run on the hosts instead of srun --container-image (pyxis)"),
    "max_nodes": _count("most nodes the placement may use when tp/pp are not given (default 16)", MAX_NODES),
    "matrix": Option("build matrix instead of serving: MODEL:PRECISION[:TP],... (Indexed Job / job array)"),
    "matrix_target": Option("target of every matrix cell: trtllm (default) or reference",
                            choices=("trtllm", "reference"), error=DeployError),
    "matrix_output": Option("where the matrix writes (k8s: a PVC name; slurm: a shared directory)"),
    "deploy.force": _switch("replace an existing output directory"),
    "serve_mode": Option("what serves an engine release: triton (default, tritonserver) or trtllm-serve (OpenAI "
                         "/v1/chat/completions, --backend tensorrt; no draft); runtime pytorch: trtllm-serve",
                         choices=SERVE_MODES, error=DeployError),
    "replicas": _count("serving replicas, >= 1: Deployment/LeaderWorkerSet replicas, a Slurm job array, Dynamo "
                       "workers per role (default: the "
                       "spec's serving_target.replicas, written by `plan --slo --write-spec`, else 1)", MAX_REPLICAS),
    "release_version": Option("the `release --version` of the spec's release the nodes fetch (default: the "
                              "pipeline's version); a --release-volume directory on this host must hold that file"),
    "exclusive": _switch("Slurm: whole nodes (#SBATCH --exclusive); default: only the placement's GPUs per node"),
    "mpi": Option("Slurm: srun --mpi of the serving ranks (default pmix)", choices=MPI_TYPES, error=DeployError,
                  refusal="{flag} {value!r}: use one of {choices} (Slurm's srun --mpi types)"),
    "keep_work": _switch("Slurm: leave the node-local work directory (the unpacked release) when the job ends"),
    "node_selector": Option("k8s: KEY=VALUE node label every pod requires (repeatable)", list),
    "toleration": Option("k8s: KEY[=VALUE]:EFFECT taint GPU pods tolerate besides nvidia.com/gpu:NoSchedule "
                         "(repeatable)", list),
    "gpu_product_label": Option("k8s: nvidia.com/gpu.product value GPU pods require (default: the spec GPU's, as GPU "
                                "feature discovery writes it, e.g. NVIDIA-H100-80GB-HBM3)"),
    "no_gpu_affinity": _switch("k8s: no nvidia.com/gpu.product node affinity"),
    "rdma_resource": Option("k8s: NAME=COUNT extended resource each serving pod requests, e.g. "
                            "rdma/rdma_shared_device_a=1 (repeatable)", list),
    "nccl_env": Option("k8s: NCCL environment of the serving containers, e.g. NCCL_IB_HCA=mlx5 (repeatable)", list),
    "monitoring_label": Option("k8s: KEY=VALUE label of the PrometheusRule, PodMonitor and dashboard ConfigMap, "
                               "repeatable (e.g. release=kube-prometheus-stack, for the operator's selectors)", list),
    "prefix_cache_alert": _switch("alert on a low prefix-cache hit ratio although the spec's serving_target declares "
                                  "no shared prefix (with one, the alert is on at its prefix share)"),
}

# Each task's own flags (the spec flags come on top for tasks that take a spec: pipeline.cli.console.TASKS).
TASK_FLAGS: dict[str, tuple[str, ...]] = {
    "check": ("skip_host_check",),
    "plan": ("input_len", "output_len", "json", "compare", "acceptance", "prefix_hit", "estimator", "slo", "ttft_ms",
             "tpot_ms", "prefix_share", "rate", "bench_report", "write_spec", "precision_search",
             "accept_foreign_bench_report", "router", "shared_prefixes", "prefix_requests", "serving_mode"),
    "download": ("revision", "update", "offline", "verify", "endpoint"),
    "calibrate": ("force",),
    "compile": ("dry_run", "checkpoint_dir", "draft_checkpoint_dir", "force", "json"),
    "package": ("output", "engine_dir", "draft_engine_dir", "checkpoint_dir", "draft_checkpoint_dir", "tokenizer_dir",
                "draft_tokenizer_dir", "force"),
    "build": ("until", "from", "force", "json", "offline", "update", "verify_download", "verify", "revision",
              "endpoint", "skip_host_check"),
    "release": ("output", "version", "json"),
    "verify": ("path", "skip_host", "sha256", "json"),
    "install_repo": ("repo", "dest", "engine_dir", "draft_engine_dir"),
    "serve": ("mode", "host", "print_only", "repo", "http_port", "grpc_port", "metrics_port", "port_offset",
              "ready_timeout", "engine_dir", "draft_engine_dir"),
    "smoke": ("repo", "http_url", "grpc_url", "prompt", "max_tokens", "num_draft_tokens", "ready_timeout"),
    "bench": ("url", "metrics_url", "repo", "model_name", "concurrency", "requests", "max_tokens", "no_stream",
              "budget", "json", "json_file", "plot", "shared_prefix_tokens", "shared_prefix_share", "speculation",
              "dataset", "request_rate", "seed", "http_url", "second_opinion"),
    "deploy": ("platform", "release", "output", "name", "namespace", "release_url", "release_volume",
               "release_secret", "image", "pipeline_image", "pipeline_cmd", "partition", "account", "qos",
               "constraint", "time", "no_container", "max_nodes", "matrix", "matrix_target", "matrix_output", "force",
               "json", "serve_mode", "replicas", "release_version", "exclusive", "mpi", "keep_work", "node_selector",
               "toleration", "gpu_product_label", "no_gpu_affinity", "rdma_resource", "nccl_env", "monitoring_label",
               "prefix_cache_alert", "mode", "router", "dynamo_version"),
}


def option(task: str, name: str) -> Option:
    """The table's entry for `name` in `task` (a `task.name` entry wins over the plain one)."""
    return OPTIONS.get(f"{task}.{name}") or OPTIONS[name]


def flag_text(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + "...(long)"


def parse_value(opt: Option, name: str, value: Any) -> Any:
    """`value` as `opt` says (invoke hands over strings; a library caller may pass numbers): None or "" gives the
    default; a number that is not finite or outside its range, or a value outside the choices, raises `opt.error`
    with one line naming the flag."""
    if opt.kind is bool:
        return bool(value)
    if opt.kind is list:
        return [value] if isinstance(value, str) else list(value or ())
    if value is None or value == "":
        return opt.default
    flag = flag_text(name)
    if opt.choices and opt.field is None:
        if value not in opt.choices:
            raise opt.error(opt.refusal.format(flag=flag, value=value, choices=", ".join(opt.choices)))
        return value
    if opt.kind not in (int, float) or opt.field is not None:
        return value
    return _number(opt, flag, value)


def _number(opt: Option, flag: str, value: Any) -> int | float:
    what = "an integer" if opt.kind is int else "a number"
    try:
        number = opt.kind(value)
    except (TypeError, ValueError, OverflowError):  # int() refuses over 4,300 digits with a ValueError
        raise opt.error(f"{flag}={_shown(value)}: expected {what} >= {opt.minimum:g}") from None
    if not math.isfinite(number):  # NaN passes every comparison, inf every minimum
        raise opt.error(f"{flag}={_shown(value)}: expected a finite number >= {opt.minimum:g}")
    if number < opt.minimum:
        raise opt.error(f"{flag}={number}: must be >= {opt.minimum:g}")
    if number > opt.maximum:
        most = f"{opt.maximum:g}" if isinstance(opt.maximum, float) else opt.maximum
        shown = _shown(value) if len(str(number)) > 40 else number
        raise opt.error(f"{flag}={shown}: must be within {opt.minimum:g}..{most}")
    return number


def parse_flags(task: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every flag of `task` (not the spec flags) typed from `given` (keys as invoke passes them: `from_` is `from`);
    a flag not given gets its default. An unknown key is a caller's bug (TypeError)."""
    own = TASK_FLAGS[task]
    values = {key.rstrip("_"): value for key, value in given.items()}
    if unknown := sorted(set(values) - set(own)):
        raise TypeError(f"{task}: unknown flag(s) {', '.join(unknown)}")
    return {name: parse_value(option(task, name), name, values.get(name)) for name in own}


def spec_from_flags(values: Mapping[str, Any]) -> BuildSpec:
    """Resolve a validated `BuildSpec` from the spec flags' values, unset engine limits chosen by the memory model
    (`pipeline.planning.limits_choice`)."""
    from pipeline.stages.check import resolve_checked_spec

    overrides = {o.field: values.get(name) for name, o in _SPEC_OPTIONS.items() if o.field}
    for name, (field, value) in _SPEC_SWITCHES.items():
        if values.get(name):
            overrides[field] = value
    return resolve_checked_spec(spec_file=values.get("spec"), models_file=values.get("models_file"), **overrides)


def task_name(name: str) -> str:
    return name.replace("_", "-")


def for_program(text: str) -> str:
    """A library message for the user: the commands it names as `invoke TASK ...` (the library's convention) with
    the program the user ran."""
    return text if PROGRAM == "invoke" else text.replace("`invoke ", f"`{PROGRAM} ")


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (`plan | head` after head exits)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no fileno (captured), or no poll on this platform
        return False


def exit_on_error(fn: Callable) -> Callable:
    """Map `PipelineError` to one line on stderr and its exit code (`pipeline.core.errors` documents them), and an
    `OSError` (disk full, file too large, permission; also as reported by native libraries such as safetensors) to
    one line and exit 5; never a traceback for these. A `BrokenPipeError` of a closed stdout passes through to the
    program (`pipeline.cli.console`), which exits quietly."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PipelineError as exc:
            print(f"error: {for_program(str(exc))}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
        except Exception as exc:
            if isinstance(exc, BrokenPipeError) and stdout_closed():
                raise
            if (os_exc := os_error_in(exc)) is None:
                raise  # a bug: keep the traceback
            err = io_error(os_exc, f"`{PROGRAM} {task_name(wrapper.__name__)}`")
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(err.exit_code) from None

    return wrapper


def sentence_first(doc: str) -> str:
    """`doc` with its whole first sentence on its first line (`--list` shows that line)."""
    head, sep, rest = doc.partition("\n\n")
    joined = " ".join(line.strip() for line in head.splitlines())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", joined)
    sentence, tail = (joined[:end.start() + 1], joined[end.end():]) if end else (joined, "")
    return "\n".join(x for x in (sentence, tail) if x) + sep + rest


def value_name(opt: Option) -> str | None:
    """How help shows a flag's value: INT, FLOAT, a|b|c, STRING; None for a switch."""
    if opt.kind is bool and opt.field is None:
        return None
    if opt.choices:
        return "|".join(opt.choices)
    return {int: "INT", float: "FLOAT", bool: "BOOL"}.get(opt.kind, "STRING")
