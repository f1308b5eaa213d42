"""The calibrate stage: source model -> ModelOpt PTQ -> quality gate -> engines/<build-id>/checkpoint (+ manifest).

Output layout: `engines/<model>-<precision>-<hash12>/checkpoint/` with TensorRT-LLM's `config.json`,
`rank{i}.safetensors` (i < tp*pp), `tokenizer/` and `manifest.json`. The hash is the stage key over exactly the
inputs that change the checkpoint: source revision, recipe, calibration-sample fingerprint, tp/pp, toolchain.
For runtime pytorch the output is `engines/<build-id>/hf_checkpoint/`: ModelOpt's unified Hugging Face export
(`hf_quant_config.json`, unsharded, tokenizer files at the root), with the same gate and round-trip check.
What ModelOpt, transformers and torch print while building goes to `engines/<build-id>/calibrate.log` (`log_file`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pipeline.core.architectures import FAMILIES
from pipeline.core.artifacts import atomic_dir, file_table, read_config_json, read_manifest, stage_key, stage_lock
from pipeline.core.errors import CalibrationError, QualityGateFailed
from pipeline.core.layout import runtime_checkpoint_dir
from pipeline.core.manifests import (
    CalibrationRecord,
    CheckpointManifest,
    RecipeRecord,
    RoundtripCheck,
    RoundtripSkipped,
    StageResult,
)
from pipeline.core.registry import ModelEntry
from pipeline.core.runtimes import CheckpointFormat, checkpoint_format, runtime_of
from pipeline.core.safetensors_file import check_safetensors_dir
from pipeline.core.spec import BuildSpec
from pipeline.core.stage_log import progress, stage_log
from pipeline.core.tokenizer import identity
from pipeline.core.trtllm_rules import KV_QUANT_ALGO, TRTLLM_DTYPE, compute_dtype
from pipeline.core.upstream import Upstream
from pipeline.stages.calibrate import data, quality, recipes
from pipeline.stages.calibrate.formats import copy_tokenizer, exporter
from pipeline.stages.calibrate.checkpoint import LOADABLE_ARCHITECTURES as SUPPORTED_ARCHITECTURES
from pipeline.stages.download.stage import DownloadResult, download_model, source_id
from pipeline.stages.stage import BuildOptions, BuildOutputs, RefLocated, StageOutcome, outcome

STAGE_VERSION = 1
EVAL_SAMPLES = 16  # held-out sequences for the quality gate
EVAL_MAX_SEQ_LEN = 256
EVAL_MAX_LOGITS = 1 << 26  # cap on stored reference log-probs (tokens x vocab floats)
ROUNDTRIP_SAMPLES = 2
ROUNDTRIP_MAX_PARAMS = 8_000_000_000  # above this the float32 CPU copy of the round-trip check is skipped
AWQ_DEFAULT_CALIB_CAP = 32  # TensorRT-LLM's quantize script caps AWQ calibration at 32 samples
Role = Literal["target", "draft"]


CheckpointResult = StageResult[CheckpointManifest]


@dataclass(frozen=True)
class _Plan:
    role: str
    entry: ModelEntry
    precision: str
    kv: str
    awq_block_size: int
    tp: int
    pp: int
    calib_size: int
    calib_seq_len: int
    batch_size: int
    seed: int
    threshold: float
    enforce: bool
    export_dtype: str
    runtime: str = "engine"

    @property
    def checkpoint(self) -> CheckpointFormat:
        """The export format of the plan's runtime."""
        return checkpoint_format(self.runtime)


def _plan(spec: BuildSpec, role: Role) -> _Plan:
    q = spec.quantization
    precision: str
    if role == "target":
        entry, precision = spec.model, q.precision
    elif role == "draft":
        if spec.quantized_draft is None:
            why = ("its EAGLE-3 head is served as downloaded, in its own dtype" if spec.draft_model is not None
                   else "pass --draft NAME")
            raise CalibrationError(f"role='draft' but the spec has no draft model to calibrate; {why}")
        entry, precision = spec.quantized_draft, spec.draft_precision
    else:
        raise CalibrationError(f"role={role!r}: use 'target' or 'draft'")
    sharded = checkpoint_format(spec.runtime).sharded
    size = q.calib_size or entry.calibration.calib_size
    if precision in recipes.AWQ and q.calib_size is None:
        size = min(size, AWQ_DEFAULT_CALIB_CAP)
    return _Plan(
        role=role,
        entry=entry,
        precision=precision,
        kv=q.kv,
        awq_block_size=q.awq_block_size,
        # the draft engine has its own TP and no PP (speculation.draft_tp; pipeline/stages/compile/engine_plan.py); a
        # Hugging Face export (runtime pytorch) is never sharded: the PyTorch backend shards it at load
        tp=spec.draft_tp if role == "draft" and sharded else spec.parallelism.tp if sharded else 1,
        pp=spec.parallelism.pp if sharded and role == "target" else 1,
        calib_size=size,
        calib_seq_len=q.calib_seq_len or entry.calibration.calib_seq_len,
        batch_size=q.calib_batch_size,
        seed=q.calib_seed,
        threshold=q.max_ppl_delta_pct or entry.calibration.max_ppl_delta_pct,
        enforce=q.quality_gate,
        # the precision's compute dtype (W4A8-AWQ: float16, as upstream's `quantize.py --dtype float16`)
        export_dtype=TRTLLM_DTYPE[compute_dtype(precision)],
        runtime=spec.runtime,
    )


def toolchain() -> dict[str, str]:
    """Versions that change the exported checkpoint (read from package metadata, no imports)."""
    out = {"python": platform.python_version()}
    for dist, key in (("torch", "torch"), ("nvidia-modelopt", "modelopt"), ("transformers", "transformers")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = "absent"
    return out


def _resolve_source(entry: ModelEntry, source: DownloadResult | str | Path | None) -> tuple[Path, str]:
    """(local HF dir, source revision id): the download stage's result (fetched when None; its recorded id), or a
    given directory (the id its download manifest records, else its outside identity: `Upstream.of_dir`)."""
    res = download_model(entry) if source is None else source
    if isinstance(res, StageResult):
        return Path(res.path), res.manifest.sha
    src = Path(res)
    if not (src / "config.json").is_file():
        raise CalibrationError(f"source {src} has no config.json; pass a Hugging Face model directory")
    return src, source_id(read_manifest(src)) or Upstream.of_dir(src).key


def check_family(spec: BuildSpec) -> None:
    """Refuse, before any download, a model whose family this stage cannot round-trip: its checkpoint loaders
    (`checkpoint.py`, `hf_checkpoint.py`) and the reference backend rebuild dense decoders only.

    Raises:
        CalibrationError: naming the family and what does work for it (plan, check, compile --dry-run).
    """
    for entry in (spec.model, spec.quantized_draft):
        if entry is None:
            continue
        fam = FAMILIES[entry.architecture.family]
        if fam.hf_architecture not in SUPPORTED_ARCHITECTURES:
            raise CalibrationError(
                f"{entry.name}: {fam.hf_architecture} is planned and checked (`invoke plan`, `check`, `compile "
                f"--dry-run`), but this pipeline's calibrate round trip and reference backend load "
                f"{', '.join(SUPPORTED_ARCHITECTURES)} only; calibrate it with ModelOpt outside the pipeline"
            )


def _check_architecture(src: Path, entry: ModelEntry) -> dict[str, Any]:
    path = src / "config.json"
    cfg = read_config_json(path, CalibrationError, missing=f"{path} is gone; re-download (invoke download --force)",
                           fix="re-download (invoke download --force)")
    archs = cfg.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise CalibrationError(
            f"{entry.name}: architecture {archs or cfg.get('model_type')} is not supported by this stage; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    a = entry.architecture
    for key, want in (
        ("hidden_size", a.hidden_size),
        ("num_hidden_layers", a.num_layers),
        ("vocab_size", a.vocab_size),
        ("num_key_value_heads", a.num_kv_heads),
    ):
        if key in cfg and cfg[key] != want:
            raise CalibrationError(
                f"{entry.name}: source config {key}={cfg[key]} differs from the registry's {want}; "
                "fix the registry entry (your own via --models-file) or the source"
            )
    return cfg


def _gate_from_manifest(manifest: CheckpointManifest, plan: _Plan) -> None:
    q = manifest.quality
    if plan.enforce and not q.ppl_delta_pct <= plan.threshold:
        raise QualityGateFailed(
            f"quality gate failed for {plan.entry.name} {plan.precision}: the existing checkpoint's held-out "
            f"perplexity {q.ppl_base:.4f} -> {q.ppl_quant:.4f} ({q.ppl_delta_pct:+.3f} % > {plan.threshold:g} %); "
            "raise --max-ppl-delta or pass --no-quality-gate",
            expected=plan.threshold, actual=q.ppl_delta_pct,
        )


def run_calibrate(
    spec: BuildSpec,
    *,
    role: Role = "target",
    force: bool = False,
    source: DownloadResult | str | Path | None = None,
    verify: bool = False,
) -> CheckpointResult:
    """Quantize (ModelOpt PTQ), gate on held-out quality, export a TP/PP-sharded TensorRT-LLM checkpoint (or, for
    runtime pytorch, a unified Hugging Face checkpoint).

    Args:
        spec: a validated build spec.
        role: "target" (spec.model at its precision) or "draft" (spec.draft_model at spec.draft_precision).
        force: rebuild even when the existing output's key matches.
        source: the download stage's result for the role's model, or a local HF model directory; default:
            `download_model(entry)`. Finding an existing build is `pipeline.stages.build.locate_outputs` (build refs).
        verify: re-hash every file of a current checkpoint (default: sizes and mtimes, hashing what changed).

    Returns:
        The checkpoint at engines/<build-id>/checkpoint (hf_checkpoint for runtime pytorch); status "cached" when
        it was current and intact.

    Raises:
        CalibrationError: bad calibration data, unsupported architecture, failed quality gate, export or
            round-trip mismatch. Nothing is left under the final output name on failure.
        IntegrityError: the current checkpoint differs from its manifest (re-run with `--force calibrate`).
    """
    plan = _plan(spec, role)
    check_family(spec)  # before any download
    texts, calib_source = data.load_texts(spec.quantization.calib_data)  # bad data fails before any download
    src, source_sha = _resolve_source(plan.entry, source)
    _check_architecture(src, plan.entry)
    fix = f"re-fetch the model (`invoke download --model {plan.entry.name} --verify`)"
    check_safetensors_dir(src, fix=fix)
    encode = data.tokenizer_fn(src, fix=fix)
    calib = data.pack(texts, encode, size=plan.calib_size, seq_len=plan.calib_seq_len, seed=plan.seed,
                      source=calib_source)
    factors = _factors(plan, source_sha, calib.fingerprint)
    key = stage_key(factors)
    build_id = f"{plan.entry.name}-{plan.precision}-{key[:12]}"
    final = runtime_checkpoint_dir(build_id, plan.runtime)
    if (hit := _cached(final, key, plan, force=force, verify=verify)) is not None:
        return hit
    with stage_lock(final):
        if (hit := _cached(final, key, plan, force=force, verify=verify)) is not None:
            return hit
        title = f"calibrate {plan.entry.name} {plan.precision} ({role}) -> {final}"
        with atomic_dir(final) as tmp, stage_log(log_file(final), title=title):
            fields = _build(plan, src, calib, texts, encode, tmp)
            manifest = CheckpointManifest(
                **fields,
                key=key,
                build_id=build_id,
                factors=factors,
                role=role,
                model={**factors["model"], "revision": plan.entry.revision, "source_dir": str(src)},
                tokenizer=identity(plan.checkpoint.tokenizer_dir(tmp)),
                argv=[str(a) for a in sys.argv],
                files=file_table(tmp),
            )
            manifest.write(tmp)
    return CheckpointResult(final, manifest, "built")


def log_file(checkpoint_dir: Path) -> Path:
    """The calibrate log of a checkpoint (library output of its last build): beside it, in its build directory."""
    return Path(checkpoint_dir).parent / "calibrate.log"


def _factors(plan: _Plan, source_sha: str, calibration: str) -> dict[str, Any]:
    """Everything the checkpoint depends on (hashed into the stage key and the build id)."""
    return {
        "stage": "calibrate",
        "version": STAGE_VERSION,
        "model": {"name": plan.entry.name, "repo_id": plan.entry.repo_id, "sha": source_sha},
        "recipe": {
            "precision": plan.precision,
            "kv_cache": plan.kv,
            "export_dtype": plan.export_dtype,
            "awq_block_size": plan.awq_block_size if plan.precision in recipes.AWQ else None,
            "calib_batch_size": plan.batch_size,
        },
        "calibration": calibration,
        "parallelism": {"tp": plan.tp, "pp": plan.pp},
        "toolchain": toolchain(),
        # a runtime-pytorch export differs in format; the engine runtime's keys (and build ids) stay as they were
        **plan.checkpoint.key_factors,
    }


def _cached(final: Path, key: str, plan: _Plan, *, force: bool, verify: bool) -> CheckpointResult | None:
    """The current, intact checkpoint at `final` (its quality gate re-checked), else None."""
    m = None if force else CheckpointManifest.current(final, key, verify=verify)
    if m is None:
        return None
    _gate_from_manifest(m, plan)
    return CheckpointResult(final, m, "cached")


def _roundtrip(plan: _Plan, cfg, exported, ckpt: Path, samples: list[list[int]], device) -> RoundtripCheck:
    """Re-load the checkpoint on CPU (float32) and compare it with the exported fake-quant model in float32.

    The KV-cache quantizers are switched off on the reference: the loaded model keeps its KV cache unquantized.
    A Hugging Face export is read by `load_hf_checkpoint` (transformers has no loader for ModelOpt's format).
    """

    loaded = exporter(plan.checkpoint).load(ckpt)
    exported.float()  # the exported copy is not used afterwards; compare both in float32
    tier = plan.checkpoint.export_tier if plan.checkpoint.export_tier and cfg is not None else \
        "awq" if plan.precision in recipes.AWQ else "exact"
    if cfg is not None and KV_QUANT_ALGO[plan.kv]:
        import modelopt.torch.quantization as mtq

        with mtq.set_quantizer_by_cfg_context(exported, recipes.KV_QUANTIZERS_OFF):
            return quality.roundtrip(loaded, exported, samples, device, tier=tier)
    return quality.roundtrip(loaded, exported, samples, device, tier=tier)


def _peak_memory(device) -> dict[str, int]:
    import torch

    out = {"host_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device.type == "cuda":
        out["cuda_max_allocated_bytes"] = int(
            sum(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count()))
        )
    return out


@contextlib.contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    t = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - t


def _load_model(plan: _Plan, src: Path):
    """The HF model in full precision on CPU, or in the export dtype across the visible GPUs; and its device."""
    import torch
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    load_kwargs: dict[str, Any] = {"dtype": getattr(torch, plan.export_dtype) if cuda else torch.float32}
    if cuda:
        load_kwargs["device_map"] = "auto" if torch.cuda.device_count() > 1 else "cuda"
    model = AutoModelForCausalLM.from_pretrained(str(src), **load_kwargs).eval()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        model.to(device)
    return model, device


def _quantize(model, cfg: dict[str, Any], plan: _Plan, calib: data.TokenSet, device) -> None:
    """ModelOpt PTQ in place: calibrate `model` on the calibration set in batches of `plan.batch_size`."""
    import modelopt.torch.quantization as mtq
    import torch

    batches = [calib.samples[i : i + plan.batch_size] for i in range(0, len(calib.samples), plan.batch_size)]

    def forward_loop(m) -> None:
        with torch.no_grad():
            for b in progress(batches, desc=f"calibrate {plan.entry.name} {plan.precision}", unit="batch"):
                m(torch.tensor(b, dtype=torch.long, device=device))

    mtq.quantize(model, cfg, forward_loop)


def _checked_roundtrip(plan: _Plan, cfg, model, exported, tmp: Path, samples, device, *,
                      what: str) -> RoundtripCheck | RoundtripSkipped:
    """Re-load the export on CPU and compare it with the quantized model (skipped for very large models)."""
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > ROUNDTRIP_MAX_PARAMS:
        return RoundtripSkipped(skipped=f"{n_params / 1e9:.1f} B parameters: a float32 CPU copy is too large")
    rt = _roundtrip(plan, cfg, exported, tmp, samples, device)
    if not rt.passed:
        raise CalibrationError(
            f"round-trip check failed for {what}: the exported checkpoint re-loaded on CPU differs from the "
            f"quantized model (max relative logit error {rt.max_rel_logit_err:.3g}, top-1 agreement "
            f"{rt.top1_agreement:.3f}, perplexity differs {rt.ppl_rel_diff_pct:.3g} %); the export or "
            "sharding is broken: re-run with --force or report it"
        )
    return rt


def _build(plan: _Plan, src: Path, calib: data.TokenSet, texts: list[str], encode, tmp: Path) -> dict[str, Any]:
    """Load, measure the reference, quantize, export, gate on quality, round-trip; return the manifest fields."""

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    with _timed(timings, "load_s"):
        model, device = _load_model(plan, src)

    heldout = _heldout(plan, texts, encode, model.config.vocab_size)
    with _timed(timings, "reference_s"):
        ref = quality.reference_logprobs(model, heldout.samples, device)

    cfg = recipes.quant_config(plan.precision, plan.kv, awq_block_size=plan.awq_block_size)
    with _timed(timings, "calibrate_s"):
        if cfg is not None:
            _quantize(model, cfg, plan, calib, device)

    quant_algo, kv_algo = recipes.expected_algos(plan.precision, plan.kv)
    with _timed(timings, "export_s"):
        exported, ckpt_fields = _export(plan, model, tmp, quant_algo, kv_algo)

    with _timed(timings, "quality_s"):
        report = quality.compare(exported, heldout.samples, ref, device, threshold_pct=plan.threshold,
                                 enforced=plan.enforce, heldout_fingerprint=heldout.fingerprint)
    what = f"{plan.entry.name} {plan.precision}/KV {plan.kv}"
    quality.gate(report, what=what)

    with _timed(timings, "roundtrip_s"):
        rt = _checked_roundtrip(plan, cfg, model, exported, tmp, heldout.samples[:ROUNDTRIP_SAMPLES], device,
                                what=what)
    tok_files = copy_tokenizer(plan.checkpoint, src, tmp)
    timings["total_s"] = time.perf_counter() - t0
    return {
        "recipe": _recipe_record(plan, quant_algo, kv_algo),
        "calibration": _calibration_record(plan, calib),
        "parallelism": {"tp": plan.tp, "pp": plan.pp, "world_size": plan.tp * plan.pp},
        "checkpoint": {**ckpt_fields, "tokenizer_files": tok_files},
        "quality": report,
        "roundtrip": rt,
        "toolchain": toolchain(),
        "device": _device_fields(device),
        "timings": timings,
        "peak_memory": _peak_memory(device),
    }


def _export(plan: _Plan, model, tmp: Path, quant_algo: str | None, kv_algo: str | None) -> tuple[Any, dict]:
    """Export for the plan's runtime (TensorRT-LLM checkpoint, or unified HF checkpoint for pytorch) and check it;
    return the fake-quant model the export corresponds to and the manifest's `checkpoint` fields."""
    exact = sum(p.numel() for p in model.parameters()) <= ROUNDTRIP_MAX_PARAMS
    return exporter(plan.checkpoint).export(model, tmp, tp=plan.tp, pp=plan.pp, dtype=plan.export_dtype,
                                            exact=exact, quant_algo=quant_algo, kv_algo=kv_algo)


def _heldout(plan: _Plan, texts: list[str], encode, vocab_size: int) -> data.TokenSet:
    """The held-out evaluation samples, capped so their reference logits stay within EVAL_MAX_LOGITS."""
    eval_len = min(plan.calib_seq_len, EVAL_MAX_SEQ_LEN)
    eval_n = max(1, min(EVAL_SAMPLES, EVAL_MAX_LOGITS // (eval_len * vocab_size)))
    return data.pack(data.heldout_texts(texts), encode, size=eval_n, seq_len=eval_len, seed=0, source="heldout")


def _recipe_record(plan: _Plan, quant_algo: str | None, kv_algo: str | None) -> RecipeRecord:
    return RecipeRecord(
        precision=plan.precision,
        kv_cache=plan.kv,
        modelopt_config=recipes.recipe_name(plan.precision, plan.kv),
        quant_algo=quant_algo,
        kv_cache_quant_algo=kv_algo,
        export_dtype=plan.export_dtype,
        awq_block_size=plan.awq_block_size if plan.precision in recipes.AWQ else None,
    )


def _calibration_record(plan: _Plan, calib: data.TokenSet) -> CalibrationRecord:
    return CalibrationRecord(
        source=calib.source,
        fingerprint=calib.fingerprint,
        samples=len(calib.samples),
        requested_samples=plan.calib_size,
        seq_len=plan.calib_seq_len,
        tokens=calib.tokens,
        batch_size=plan.batch_size,
        seed=plan.seed,
    )


def _device_fields(device) -> dict[str, Any]:
    import torch

    cuda = device.type == "cuda"
    return {
        "type": device.type,
        "name": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "count": torch.cuda.device_count() if cuda else os.cpu_count(),
    }


def uncalibrated_head(spec: BuildSpec) -> str | None:
    """What calibrate says of a draft it leaves alone: an EAGLE-3 head is not quantized (TensorRT-LLM 1.2.1 loads
    its weights in the head's own dtype and gives its layer the target's KV-cache dtype); None otherwise."""
    head = spec.draft_model if spec.quantized_draft is None else None
    if head is None:
        return None
    return f"EAGLE-3 head {head.name} served as downloaded, in its own dtype (not calibrated)"


class CalibrateStage(RefLocated):
    """The calibrate stage of a build (`run_calibrate` for the target and the draft); it names the build's layout."""

    name = "calibrate"
    error = CalibrationError
    absent = ("no current target checkpoint for {model} {precision} with these inputs (none recorded for this spec); "
              "run `invoke build` (or `invoke calibrate`) first")

    def doing(self, spec: BuildSpec) -> str:
        q = spec.quantization
        return f"{q.precision} / KV {q.kv} quantization, quality gate, {runtime_of(spec).checkpoint.export_label}"

    def locate(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions) -> None:
        super().locate(spec, outputs, options)
        outputs.set_layout(spec)

    def run(self, spec: BuildSpec, outputs: BuildOutputs, options: BuildOptions, *, force: bool) -> StageOutcome:
        outputs.checkpoint = run_calibrate(spec, role="target", source=outputs.download, force=force,
                                           verify=options.verify)
        if spec.quantized_draft is not None:
            outputs.draft_checkpoint = run_calibrate(spec, role="draft", source=outputs.draft_download, force=force,
                                                     verify=options.verify)
        outputs.set_layout(spec)
        results = {"target": outputs.checkpoint, "draft": outputs.draft_checkpoint}
        detail = " ".join(f"{role} ppl Δ {r.manifest.quality.ppl_delta_pct:+.2f}%" for role, r in results.items() if r)
        head = uncalibrated_head(spec)
        if head:
            detail += f"; {head}"
        logs = [str(log_file(r.path)) for r in results.values() if r and r.built]
        if logs:
            detail += f"; library output: {', '.join(logs)}"
        return outcome("calibrate", results, detail)


CALIBRATE = CalibrateStage()
