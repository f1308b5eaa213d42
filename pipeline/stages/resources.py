"""What a build needs from its host, per stage, from the registry's architecture numbers and the spec. No I/O.

Disk (bytes each stage writes; a stage output already current in the caches needs nothing):

    download   cache volume   parameters x 2 bytes (Hub Llama checkpoints are stored in bf16) + tokenizer + configs
    calibrate  root volume    the TensorRT-LLM checkpoint of this TP x PP shard set: quantized linear weights
                              (bf16/fp16 2 B, fp8/int8_sq 1 B, int4/w4a8 AWQ 0.5 B per parameter, plus AWQ group
                              scales, 2 B per block) + 16-bit embeddings, lm_head (its own tensor even when tied)
                              and norms (embeddings sharded over TP, norms replicated per TP rank) + tokenizer;
                              runtime pytorch: the same weights as one unsharded HF checkpoint
    compile    root volume    the engines hold the same quantized weights (+ ENGINE_RANK_OVERHEAD per rank); nothing
                              for runtime pytorch (no compile stage)
    package    root volume    the repository: its model code and configs + two tokenizer copies
    release    root volume    the tarball, at most what it packs (engines or checkpoints, repository)

GPU memory to calibrate (the calibrate stage on CUDA: weights loaded in the export dtype, 2 B per parameter,
`device_map="auto"` across the visible GPUs):

    weights         parameters x 2 B
    export copy     runtime engine: none (ModelOpt's TensorRT-LLM exporter runs on the model in place);
                    runtime pytorch: parameters x 8 B when the round trip runs (the HF export works on two
                    float32 copies: the reference the gate compares against and the one the exporter packs),
                    else parameters x 2 B (one copy in the export dtype for the exporter to pack)
    round trip      parameters x 2 B more when the stage's CPU round-trip check runs (<= 8 B parameters): the
                    exported copy is cast to float32 in place
    activations     calib_batch_size x calib_seq_len tokens x the live tensors of one decoder layer (16-bit
                    residual, norm, q/k/v, attention output, MLP gate/up/product) + float32 logits
    ModelOpt        2 x the largest linear weight (the AWQ search's scaled and quantized copies; SmoothQuant and
                    max calibration need less) + 5 % of the weights for quantizer state and allocator
                    fragmentation + 1 GiB CUDA context per GPU

Host RAM, GPU or not: the process (torch + transformers + ModelOpt, PROCESS_BASE_BYTES), one checkpoint rank (the
exporter's, then the round trip's read), the quality gate's float32 reference log-probs and evaluation logits, and the
round trip's float32 re-load (lm_head its own tensor) when it runs. Calibrating on CPU (no visible GPU) adds the
model in float32 (the stage loads in float32 on CPU) and the export copy above, float32 activations and ModelOpt's
state.
Measured on a 506 M-parameter llama-1b-shaped model (benchmarks/calibrate_memory.py): peak RSS 7.68 GiB, estimate
7.82 GiB.

Host RAM to serve, per node (`serving_host_bytes`, Slurm's `--mem`): each GPU rank reads its share of the released
weights (engines, or the checkpoint for runtime pytorch: release bytes / world size) into host memory while it loads,
beside SERVE_RANK_BASE_BYTES of process (CUDA context, TensorRT-LLM runtime, MPI; rank 0 also Triton and the Python
tokenizer models). The CPU reference server is one process: the release's checkpoint read, the model in its
reference dtype (float32; float64 for generated tiny models) and PROCESS_BASE_BYTES.

CPU calibration time (an estimate, said as such): 2 FLOPs per parameter per token over the calibration tokens
(AWQ: AWQ_PASSES over its capped sample) and the quality/round-trip evaluations, at CPU_FLOPS_PER_CORE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.core.runtimes import runtime_of
from pipeline.core.errors import SpecError
from pipeline.core.gpus import GIB
from pipeline.core.registry import Architecture, ModelEntry
from pipeline.core.spec import BuildSpec
from pipeline.stages.calibrate.recipes import AWQ
from pipeline.stages.calibrate.stage import (
    AWQ_DEFAULT_CALIB_CAP,
    EVAL_MAX_LOGITS,
    EVAL_MAX_SEQ_LEN,
    EVAL_SAMPLES,
    ROUNDTRIP_MAX_PARAMS,
)

STORED_BYTES = 2  # Hub Llama 3.x safetensors are bf16
LINEAR_FILE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8_sq": 1.0, "int4_awq": 0.5, "w4a8_awq": 0.5}
SCALE_BYTES = 2  # AWQ group scales, one per block of input features, 16-bit
CONFIG_BYTES = 64 * 1024  # config.json, generation_config.json, index, manifest.json
ENGINE_RANK_OVERHEAD = 64 * 1024**2  # serialized kernels/tactics per rank (estimate; engines are not built here)
# Tokenizer files per tokenizer family when no download is there to measure (Llama 3: tokenizer.json 9.09 MB,
# tokenizer_config.json 55 KB on the Hub); unknown families get the largest.
TOKENIZER_BYTES = {"llama3": 9_200_000, "tiny-bpe-v1": 60_000}  # tiny-bpe-v1: pipeline.stages.download.tinymodel's files
DEFAULT_TOKENIZER_BYTES = 10_000_000

MODELOPT_OVERHEAD = 0.05
EXPORT_COPY_BYTES_PER_PARAM = {"engine": 0, "pytorch": 8, "pytorch-large": 2}  # see "export copy" above
CUDA_CONTEXT_BYTES = GIB
SERVE_RANK_BASE_BYTES = 4 * GIB  # one serving rank's process beside its weights (see "Host RAM to serve")
PROCESS_BASE_BYTES = GIB  # torch + transformers + ModelOpt imported (tiny-llama's whole stage peaks at 0.53 GB RSS)
# awq_lite (ModelOpt's INT4/W4A8 AWQ configs): a caching pass, then a search pass that runs each linear layer
# unquantized and once per candidate alpha in 0..1 step 0.1 (11): 13 linear passes over the calibration tokens.
AWQ_PASSES = 13
# float32 calibration throughput per core: 19.8 GFLOP/s measured by benchmarks/cpu_calibration_rate.py (ModelOpt FP8
# calibration of a llama-1b-shaped model, 512 tokens, one AMD EPYC core with AVX2; fake quantization costs about
# as much as the plain forward). CPUs with AVX-512 or more memory bandwidth per core finish sooner.
CPU_FLOPS_PER_CORE = 20e9

Volume = Literal["cache", "root"]
STAGE_VOLUME: dict[str, Volume] = {"download": "cache", "calibrate": "root", "compile": "root", "package": "root",
                                   "release": "root"}
BUILD_STAGES = ("download", "calibrate", "compile", "package")


class StageDisk(BaseModel):
    """Disk one stage writes for one role (target or draft), on one volume; 0 needed when already present."""

    model_config = ConfigDict(frozen=True)

    stage: str
    role: str
    volume: Volume
    bytes: int
    present: bool = False

    @property
    def needed(self) -> int:
        return 0 if self.present else self.bytes


class CalibrationMemory(BaseModel):
    """Memory to calibrate one model, on GPUs and on the host, with the terms it is made of."""

    model_config = ConfigDict(frozen=True)

    role: str
    params: int
    gpu_bytes: int  # total over the visible GPUs (CUDA path)
    gpu_terms: dict[str, int]
    host_bytes_with_gpu: int  # host RAM alongside a GPU calibration
    cpu_ram_bytes: int  # host RAM to calibrate on CPU
    cpu_seconds_per_core: float  # CPU time estimate x cores (divide by the host's cores)
    present: bool = False


class ResourcePlan(BaseModel):
    """A build's disk per stage and role, and its calibration memory."""

    disk: list[StageDisk]
    calibration: list[CalibrationMemory]
    cpu_flops_per_core: float = CPU_FLOPS_PER_CORE

    def stage_bytes(self, stage: str, *, needed: bool = True) -> int:
        return sum(d.needed if needed else d.bytes for d in self.disk if d.stage == stage)

    def as_dict(self) -> dict:
        """The `resources` section of `plan --json` (keys documented in the README)."""
        stages = []
        for stage in (*BUILD_STAGES, "release"):
            rows = [d for d in self.disk if d.stage == stage]
            if rows:
                stages.append({"stage": stage, "volume": rows[0].volume, "bytes": sum(d.bytes for d in rows),
                               "needed_bytes": sum(d.needed for d in rows),
                               "roles": {d.role: d.bytes for d in rows}})
        calib = [{"role": c.role, "params": c.params, "present": c.present, "gpu_bytes": c.gpu_bytes,
                  "gpu_terms_bytes": dict(c.gpu_terms), "host_bytes_with_gpu": c.host_bytes_with_gpu,
                  "cpu_ram_bytes": c.cpu_ram_bytes, "cpu_core_hours": round(c.cpu_seconds_per_core / 3600, 3)}
                 for c in self.calibration]
        return {"disk": stages, "calibration": calib, "cpu_flops_per_core": self.cpu_flops_per_core}


class SizeInputs(BaseModel):
    """What the caller measured on disk: which outputs are present, and real sizes where a download exists."""

    present: frozenset[tuple[str, str]] = frozenset()  # (stage, role) already current and not forced
    tokenizer_bytes: dict[str, int] = Field(default_factory=dict)  # role -> tokenizer files in its download
    repo_code_bytes: int = 0  # the repository's model code and config templates (package files)


def download_bytes(entry: ModelEntry, tokenizer: int) -> int:
    return entry.architecture.total_params * STORED_BYTES + tokenizer + CONFIG_BYTES


def linear_weight_bytes(arch: Architecture, precision: str, *, awq_block: int = 128) -> float:
    linear = arch.linear_params * LINEAR_FILE_BYTES[precision]
    if precision in AWQ:
        linear += arch.linear_params / awq_block * SCALE_BYTES
    return linear


def checkpoint_bytes(arch: Architecture, precision: str, *, tp: int, pp: int, awq_block: int = 128) -> int:
    """The rank files of one TP x PP shard set (all ranks together)."""
    norms = arch.norm_params * tp  # replicated on every TP rank; layers are split over PP
    # ModelOpt exports Llama's lm_head as its own tensor even when tied to the embedding (share_embedding_table false)
    sixteen_bit = (2 * arch.vocab_size * arch.hidden_size + norms) * 2
    return int(linear_weight_bytes(arch, precision, awq_block=awq_block) + sixteen_bit) + CONFIG_BYTES * tp * pp


def engine_bytes(arch: Architecture, precision: str, *, tp: int, pp: int, awq_block: int = 128) -> int:
    return checkpoint_bytes(arch, precision, tp=tp, pp=pp, awq_block=awq_block) + ENGINE_RANK_OVERHEAD * tp * pp


def _activation_bytes(arch: Architecture, tokens: int) -> int:
    """Live tensors of one decoder layer's forward (16-bit) for `tokens`, plus their float32 logits."""
    h, kv = arch.hidden_size, arch.num_kv_heads * arch.head_dim
    per_token = (4 * h + h + 2 * kv + 3 * arch.intermediate_size) * 2 + arch.vocab_size * 4
    return tokens * per_token


def _largest_linear(arch: Architecture) -> int:
    h = arch.hidden_size
    return max(h * arch.intermediate_size, h * (arch.num_heads + 2 * arch.num_kv_heads) * arch.head_dim)


def _eval_shape(arch: Architecture, calib_seq_len: int) -> tuple[int, int]:
    """(held-out samples, their length) of the stage's quality gate (its EVAL_* caps)."""
    length = min(calib_seq_len, EVAL_MAX_SEQ_LEN)
    return max(1, min(EVAL_SAMPLES, EVAL_MAX_LOGITS // (length * arch.vocab_size))), length


def _host_bytes(arch: Architecture, rank: int, eval_tokens: int, *, cpu: bool, roundtrip: bool,
                calib_tokens: int, export_copy: int) -> int:
    """Host RAM: the process, one checkpoint rank, the float32 reference log-probs and evaluation logits (stored,
    one batch, its log-softmax), the round trip's float32 re-load (lm_head separate), and on CPU the float32 model,
    the export copy, activations and ModelOpt state."""
    exported_params = arch.linear_params + 2 * arch.vocab_size * arch.hidden_size + arch.norm_params
    total = PROCESS_BASE_BYTES + rank + 3 * eval_tokens * arch.vocab_size * 4
    total += exported_params * 4 if roundtrip else 0
    if cpu:
        total += arch.total_params * 4 + export_copy + 2 * _activation_bytes(arch, calib_tokens)
        total += int(MODELOPT_OVERHEAD * arch.total_params * 4)
    return total


def calibration_memory(spec: BuildSpec, role: str, *, present: bool = False) -> CalibrationMemory:
    """GPU and host memory to calibrate `role` (see the module docstring for the terms)."""
    entry = spec.model if role == "target" else spec.quantized_draft
    if entry is None:
        raise SpecError(f"calibration_memory: role={role!r}, but the spec has no draft model to calibrate")
    precision = spec.quantization.precision if role == "target" else spec.draft_precision
    arch, q = entry.architecture, spec.quantization
    params = arch.total_params
    roundtrip = params <= ROUNDTRIP_MAX_PARAMS
    tokens = q.calib_batch_size * spec.calib_seq_len
    weights = params * 2
    copy_kind = runtime_of(spec).checkpoint.export_copy_kind(roundtrip=roundtrip)
    export_copy = params * EXPORT_COPY_BYTES_PER_PARAM[copy_kind]
    terms = {
        "weights": weights,
        "export_copy": export_copy,
        "roundtrip_float32": weights if roundtrip else 0,
        "activations": _activation_bytes(arch, tokens),
        "modelopt": int(2 * _largest_linear(arch) * 2 + MODELOPT_OVERHEAD * weights),
        "cuda_context": CUDA_CONTEXT_BYTES,
    }
    tp, pp = (spec.draft_tp, 1) if role == "draft" else (spec.parallelism.tp, spec.parallelism.pp)
    rank = checkpoint_bytes(arch, precision, tp=tp, pp=pp) // (tp * pp)
    eval_n, eval_len = _eval_shape(arch, spec.calib_seq_len)
    host: dict[str, Any] = dict(rank=rank, eval_tokens=eval_n * eval_len, roundtrip=roundtrip, calib_tokens=tokens,
                                export_copy=export_copy)
    samples = spec.calib_size
    if precision in AWQ and q.calib_size is None:
        samples = min(samples, AWQ_DEFAULT_CALIB_CAP)
    passes = AWQ_PASSES if precision in AWQ else 1
    flops = 2 * params * (samples * spec.calib_seq_len * passes + eval_n * eval_len * (3 if roundtrip else 2))
    return CalibrationMemory(role=role, params=params, gpu_bytes=sum(terms.values()), gpu_terms=terms,
                             host_bytes_with_gpu=_host_bytes(arch, **host, cpu=False),
                             cpu_ram_bytes=_host_bytes(arch, **host, cpu=True),
                             cpu_seconds_per_core=flops / CPU_FLOPS_PER_CORE, present=present)


def _roles(spec: BuildSpec) -> list[tuple[str, ModelEntry, str, int, int]]:
    """(role, entry, precision, tp, pp) of the target and the draft."""
    out: list[tuple[str, ModelEntry, str, int, int]] = [
        ("target", spec.model, spec.quantization.precision, spec.parallelism.tp, spec.parallelism.pp)]
    if spec.draft_model is not None:
        out.append(("draft", spec.draft_model, spec.draft_precision, spec.draft_tp, 1))
    return out


def _tokenizer(entry: ModelEntry, role: str, measured: Mapping[str, int]) -> int:
    if role in measured:
        return measured[role]
    return TOKENIZER_BYTES.get(entry.tokenizer_family, DEFAULT_TOKENIZER_BYTES)


def plan_resources(spec: BuildSpec, inputs: SizeInputs | None = None) -> ResourcePlan:
    """Disk per stage and role, and calibration memory, for `spec`; outputs in `inputs.present` need nothing."""
    inputs = inputs or SizeInputs()
    have = inputs.present
    block = spec.quantization.awq_block_size
    disk: list[StageDisk] = []
    backend = runtime_of(spec)
    engines = backend.compiles
    carried = 0  # an EAGLE-3 head: served as downloaded, carried into the repository (no checkpoint, no engine)
    for role, entry, precision, tp, pp in _roles(spec):
        tok = _tokenizer(entry, role, inputs.tokenizer_bytes)
        arch = entry.architecture
        if role == "draft" and spec.quantized_draft is None:
            carried = download_bytes(entry, 0)
            disk.append(StageDisk(stage="download", role=role, volume="cache", bytes=carried,
                                  present=("download", role) in have))
            continue
        if not backend.checkpoint.sharded:
            tp = pp = 1  # the HF export is unsharded: the PyTorch backend shards it at load
        ckpt = checkpoint_bytes(arch, precision, tp=tp, pp=pp, awq_block=block) + tok
        disk.append(StageDisk(stage="download", role=role, volume="cache", bytes=download_bytes(entry, tok),
                              present=("download", role) in have))
        disk.append(StageDisk(stage="calibrate", role=role, volume="root", bytes=ckpt,
                              present=("calibrate", role) in have))
        if engines:
            disk.append(StageDisk(stage="compile", role=role, volume="root",
                                  bytes=engine_bytes(arch, precision, tp=tp, pp=pp, awq_block=block),
                                  present=("compile", role) in have))
    tok = _tokenizer(spec.model, "target", inputs.tokenizer_bytes)
    repo = inputs.repo_code_bytes + 2 * tok + CONFIG_BYTES + carried
    disk.append(StageDisk(stage="package", role="target", volume="root", bytes=repo,
                          present=("package", "target") in have))
    packed = "compile" if engines else "calibrate"
    release = repo + sum(d.bytes for d in disk if d.stage == packed)
    disk.append(StageDisk(stage="release", role="target", volume="root", bytes=release))
    calib = [calibration_memory(spec, role, present=("calibrate", role) in have) for role, *_ in _roles(spec)
             if role == "target" or spec.quantized_draft is not None]
    return ResourcePlan(disk=disk, calibration=calib)


def serving_host_bytes(spec: BuildSpec, *, ranks_per_node: int, world_size: int) -> int:
    """Host RAM one serving node needs (see "Host RAM to serve" above)."""
    release = plan_resources(spec).stage_bytes("release", needed=False)
    if not runtime_of(spec).gpu:
        dtype_bytes = 8 if spec.model.source == "generated" else 4
        return release + spec.model.architecture.total_params * dtype_bytes + PROCESS_BASE_BYTES
    return ranks_per_node * (release // world_size + SERVE_RANK_BASE_BYTES)
