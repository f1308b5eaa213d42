"""NVIDIA AIConfigurator as a second opinion on `plan`: installed in its own venv, run as a subprocess, its
`cli estimate` report parsed.

AIConfigurator needs Python >= 3.11 and numpy >= 2.1 (ours pins numpy < 2), so it never shares our environment:
the first use creates `<cache>/aiconfigurator-venv` and pip-installs `AIC_REQUIREMENT` there.
`PIPELINE_AICONFIGURATOR=/path/to/aiconfigurator` uses an existing install instead.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from pipeline.core.errors import HostError, RunError, SpecError
from pipeline.core.tool_venv import VenvTool
from pipeline.core.table import format_table
from pipeline.planning import slo_search
from pipeline.planning.planner import CapacityPlan
from pipeline.planning.slo_search import Candidate

if TYPE_CHECKING:
    from pipeline.core.spec import BuildSpec

AIC_REQUIREMENT = "aiconfigurator==0.12.*"
AIC_ENV = "PIPELINE_AICONFIGURATOR"
VENV_NAME = "aiconfigurator-venv"
RUN_TIMEOUT_S = 300
OUTPUT_CAP = 1 << 20  # bytes of a report we read

# Our registry names / GPU names / precisions -> AIConfigurator's (its bundled model configs and system databases).
MODEL_PATHS = {"llama-70b": "meta-llama/Meta-Llama-3.1-70B", "llama-8b": "meta-llama/Meta-Llama-3.1-8B"}
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "h100-pcie": "h100_pcie", "a100": "a100_sxm",
           "l40s": "l40s"}
GEMM_MODES = {"bf16": "bfloat16", "fp8": "fp8_static", "int8_sq": "sq", "int4_awq": "int4_wo"}
KV_MODES = {"bf16": "bfloat16", "fp8": "fp8", "int8": "int8"}


class AicCase(BaseModel):
    """One `aiconfigurator cli estimate` point: aggregated (continuous batching) serving on one TP group."""

    model_path: str
    system: str
    tp: int
    isl: int
    osl: int
    batch: int
    gemm: str
    kv: str
    prefix: int = 0  # prompt tokens already in the KV cache (prefix reuse)

    def argv(self, exe: str) -> list[str]:
        fmha = "fp8" if self.kv == "fp8" else "bfloat16"
        argv = [exe, "cli", "estimate", "--model-path", self.model_path, "--system", self.system,
                "--backend", "trtllm", "--tp-size", str(self.tp), "--isl", str(self.isl), "--osl", str(self.osl),
                "--batch-size", str(self.batch), "--gemm-quant-mode", self.gemm, "--kvcache-quant-mode", self.kv,
                "--fmha-quant-mode", fmha]
        return argv + (["--prefix", str(self.prefix)] if self.prefix else [])


class AicResult(BaseModel):
    """What AIConfigurator said: an estimate, out of memory, or no data for the case (with its reason)."""

    status: Literal["ok", "oom", "no_data"]
    reason: str = ""
    backend_version: str | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    memory_gb: float | None = None
    kv_capacity_exceeded: bool = False  # fits in memory, but the batch's KV exceeds the pool (requests queue)


@dataclass(frozen=True)
class Workload:
    """The load an estimate is for: prompt and output lengths, the batch, prompt tokens already in the KV cache."""

    isl: int
    osl: int
    batch: int
    prefix: int = 0


def case_for(*, model: str, gpu: str, precision: str, kv: str, tp: int, load: Workload) -> AicCase | AicResult:
    """The AIConfigurator case for a plan under `load`, or a no-data result naming what it lacks."""
    missing = [f"{what} {value!r}" for what, value, table in (
        ("model", model, MODEL_PATHS), ("GPU", gpu, SYSTEMS), ("precision", precision, GEMM_MODES),
        ("KV cache dtype", kv, KV_MODES)) if value not in table]
    if missing:
        return AicResult(status="no_data", reason=f"AIConfigurator has no data for {', '.join(missing)}")
    if load.batch < 1:
        return AicResult(status="no_data", reason="no batch fits, nothing to estimate")
    return AicCase(model_path=MODEL_PATHS[model], system=SYSTEMS[gpu], tp=tp, isl=load.isl, osl=load.osl,
                   batch=load.batch, gemm=GEMM_MODES[precision], kv=KV_MODES[kv], prefix=load.prefix)


_FIELDS = {"ttft_ms": r"TTFT:\s+([\d,.]+) ms", "tpot_ms": r"TPOT:\s+([\d,.]+) ms",
           "tokens_per_s": r"tokens/s:\s+([\d,.]+)", "tokens_per_s_per_gpu": r"tokens/s/gpu:\s+([\d,.]+)",
           "memory_gb": r"Memory \(GPU\):\s+([\d,.]+) GB"}


def parse_report(stdout: str, stderr: str, returncode: int) -> AicResult:
    """Parse `cli estimate` output: its "Performance Estimate" block, an OOM error or a missing-data error."""
    if returncode == 0 and "Performance Estimate" in stdout:
        values = {}
        for key, pattern in _FIELDS.items():
            m = re.search(pattern, stdout)
            if m is None:
                raise RunError(f"aiconfigurator: its report has no {key} line; is it {AIC_REQUIREMENT}?")
            values[key] = float(m.group(1).replace(",", ""))
        version = re.search(r"Backend:\s+\S+ \(([^)]+)\)", stdout)
        return AicResult(status="ok", backend_version=version.group(1) if version else None,
                         kv_capacity_exceeded="exceeds estimated KV cache capacity" in stdout + stderr, **values)
    text = stderr + stdout
    if re.search(r"\bOOM\b", text):
        return AicResult(status="oom", reason="out of GPU memory at this batch")
    m = re.search(r"perf database error: ([^\n;]+)", text) or re.search(r"(not supported[^\n]*)", text)
    if m:
        return AicResult(status="no_data", reason=re.sub(r" at /\S+", "", m.group(1)).strip())
    last = [line for line in text.strip().splitlines() if line.strip()][-1:] or ["no output"]
    raise RunError(f"aiconfigurator failed (exit {returncode}): {last[0].strip()[:300]}")


TOOL = VenvTool(requirement=AIC_REQUIREMENT, executable="aiconfigurator", env=AIC_ENV, venv_name=VENV_NAME)


def ensure_installed(*, quiet: bool = False) -> str:
    """The aiconfigurator executable: $PIPELINE_AICONFIGURATOR, else the cache venv's (created on first use)."""
    return TOOL.ensure(quiet=quiet)


def run_offline(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run it offline (no network: it reads its bundled model configs and databases)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise RunError(f"aiconfigurator took over {timeout_s:.0f} s; rerun, or drop --estimator") from exc
    except OSError as exc:
        raise HostError(f"cannot run {argv[0]}: {exc.strerror}; reinstall (delete it) or set {AIC_ENV}") from exc


def run_case(case: AicCase, exe: str, *, timeout_s: float = RUN_TIMEOUT_S) -> AicResult:
    """Run one estimate."""
    done = run_offline(case.argv(exe), timeout_s)
    return parse_report(done.stdout[:OUTPUT_CAP], done.stderr[-OUTPUT_CAP:], done.returncode)


class SecondOpinion(BaseModel):
    """AIConfigurator's estimate for the planned case next to ours."""

    command: str | None  # the exact command run (None when the case is outside its data)
    result: AicResult
    note: str = ""


def second_opinion(plan: CapacityPlan, *, tokens_per_block: int) -> SecondOpinion:
    """Run AIConfigurator on the plan's case: its model, GPU, precision, TP, lengths, batch and prefix reuse (the
    fleet's with replicas, as the estimate)."""
    reused = int(plan.estimate_hit_ratio * plan.input_len) // tokens_per_block * tokens_per_block
    case = case_for(model=plan.model, gpu=plan.gpu, precision=plan.precision, kv=plan.kv_cache, tp=plan.tp,
                    load=Workload(plan.input_len, plan.output_len, plan.decode_batch, prefix=reused))
    note = ""
    if plan.speculation_active:
        note = "AIConfigurator does not model draft-target speculation: its numbers are without the draft"
    if plan.pp > 1:
        note = (note + "; " if note else "") + "pipeline parallelism is not passed: its numbers are for pp=1"
    if isinstance(case, AicResult):
        return SecondOpinion(command=None, result=case, note=note)
    exe = ensure_installed()
    return SecondOpinion(command=" ".join(case.argv("aiconfigurator")), result=run_case(case, exe), note=note)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_side_by_side(plan: CapacityPlan, other: SecondOpinion) -> str:
    """Ours next to AIConfigurator's for the same case, or one line saying why it has none."""
    r = other.result
    head = f"AIConfigurator ({AIC_REQUIREMENT}, TensorRT-LLM {r.backend_version or '?'} database)"
    if r.status == "no_data":
        return f"aiconfigurator: no estimate: {r.reason}"
    verdict = {"ok": "fits", "oom": "OUT OF MEMORY"}[r.status]
    if r.status == "ok" and r.kv_capacity_exceeded:
        verdict = "fits, but the batch's KV exceeds its pool (requests queue)"
    ours = "fits" if plan.fits and plan.decode_batch > 0 else "does not fit"
    rows = [("", "plan (estimate)", head),
            (f"batch {plan.decode_batch} @ {plan.input_len}+{plan.output_len}", ours, verdict),
            ("TTFT ms", f"{plan.ttft_ms_estimate:,.1f}", _num(r.ttft_ms, ",.1f")),
            ("TPOT ms", f"{plan.tpot_ms_estimate:.2f}", _num(r.tpot_ms, ".2f")),
            ("output tok/s", f"{plan.output_tokens_per_s_estimate:,.0f}", _num(r.tokens_per_s, ",.0f"))]
    lines = [format_table(rows)]
    lines += [f"command: {other.command}"] + ([f"note: {other.note}"] if other.note else [])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Its configuration search (`cli default`, aggregated serving) beside `plan --slo`'s.

class AicSearch(BaseModel):
    """One `aiconfigurator cli default` run: the best configuration for an SLO, aggregated serving only (`agg`) or
    aggregated and disaggregated compared (`auto`, pipeline.planning.aiconfigurator_modes)."""

    model_path: str
    system: str
    total_gpus: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    serving_mode: Literal["agg", "auto"] = "agg"

    def argv(self, exe: str) -> list[str]:
        return [exe, "cli", "default", "--model-path", self.model_path, "--system", self.system, "--backend",
                "trtllm", "--serving-mode", self.serving_mode, "--total-gpus", str(self.total_gpus), "--isl",
                str(self.isl), "--osl", str(self.osl), "--ttft", f"{self.ttft_ms:g}", "--tpot", f"{self.tpot_ms:g}",
                "--top-n", "5", "--no-color"]


class AicPick(BaseModel):
    """The configuration its search ranks first (by tokens/s/gpu) among those meeting the SLO."""

    tp: int
    pp: int
    batch: int
    replicas: int
    tokens_per_s_per_gpu: float
    ttft_ms: float
    tpot_ms: float


def top_row(stdout: str, title: str) -> dict[str, str] | None:
    """Rank 1 of the first table after `title` in a `cli default` report, by its header's names (None: no row)."""
    table = stdout.partition(title)[2] if title else stdout
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.strip().startswith("|")]
    return dict(zip(rows[0], rows[1])) if len(rows) >= 2 else None


def parse_search_report(stdout: str) -> AicPick:
    """Rank 1 of the "agg Top Configurations" table of `cli default` (its TPOT from "Overall Best Configuration").

    Raises:
        RunError: the report has no such table or row (no configuration met the SLO, or another version's layout).
    """
    first = top_row(stdout, "agg Top Configurations")
    if first is None:
        raise RunError("aiconfigurator: its search report has no agg configuration (none met the SLO?)")
    parallel = re.fullmatch(r"tp(\d+)pp(\d+)", first.get("parallel", ""))
    tpot = re.search(r"Overall Best Configuration:.*?TPOT:\s+([\d,.]+)\s*ms", stdout, re.S)
    if parallel is None or tpot is None or not {"tokens/s/gpu", "TTFT", "bs", "replicas"} <= set(first):
        raise RunError(f"aiconfigurator: cannot read its search report's best row; is it {AIC_REQUIREMENT}?")
    return AicPick(tp=int(parallel.group(1)), pp=int(parallel.group(2)), batch=int(first["bs"]),
                   replicas=int(first["replicas"]), tokens_per_s_per_gpu=float(first["tokens/s/gpu"]),
                   ttft_ms=float(first["TTFT"]), tpot_ms=float(tpot.group(1).replace(",", "")))


def run_search(search: AicSearch, exe: str, *, timeout_s: float = 2 * RUN_TIMEOUT_S) -> tuple[str, AicPick]:
    """Run its search; the report's text and its pick."""
    done = run_offline(search.argv(exe), timeout_s)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RunError(f"aiconfigurator search failed (exit {done.returncode}): {last[0][:300]}")
    return done.stdout[:OUTPUT_CAP], parse_search_report(done.stdout[:OUTPUT_CAP])


# Its search reads the quantization from the model path's checkpoint: none for the base checkpoints of MODEL_PATHS.
SEARCH_PRECISION = "bf16"


def pick_in_its_space(search: AicSearch, *, model: str, gpu: str, check: Callable[..., BuildSpec]) -> Candidate:
    """`plan --slo`'s pick within its search space: its precision, no draft, no prefix reuse, its GPUs.

    Raises:
        SpecError: no configuration meets the SLO by our estimate.
    """
    spec = check(model=model, gpu=gpu, precision=SEARCH_PRECISION, gpu_count=search.total_gpus)
    found = slo_search.search(spec, slo_search.Slo(search.ttft_ms, search.tpot_ms),
                              slo_search.Traffic(search.isl, search.osl), check=check, speculation=False)
    if found.pick is None:
        raise SpecError(f"plan --slo: nothing meets {search.ttft_ms:g}/{search.tpot_ms:g} ms for {model}; nearest "
                        f"miss: {found.nearest_miss}")
    return found.pick


def pick_case(pick: Candidate, *, model: str, gpu: str, isl: int, osl: int) -> AicCase:
    """The `cli estimate` case of a `plan --slo` pick (pp is not passed: its estimate is for pp=1)."""
    case = case_for(model=model, gpu=gpu, precision=pick.precision, kv=pick.kv_cache, tp=pick.tp,
                    load=Workload(isl, osl, pick.max_batch))
    if isinstance(case, AicResult):
        raise SpecError(f"aiconfigurator: {case.reason}")
    return case
