"""NVIDIA AIPerf as a second opinion on `bench`: the same requests at the same concurrency (and request rate) sent
by AIPerf to the same server, its TTFT, TPOT and tok/s printed beside ours.

AIPerf pins its own dependencies, so it runs from its own venv (`<cache>/aiperf-venv`, created on first use;
`PIPELINE_AIPERF=/path/to/aiperf` uses an existing install). It has no Triton endpoint type: its `template`
endpoint posts a Jinja payload (`PAYLOAD_TEMPLATE`) to Triton's HTTP `/v2/models/<m>/generate_stream` and reads
`text_output` from each server-sent event, so it drives a streaming route with a `text_input` tensor (the ensemble,
a streaming BLS), not the LLM-API model. Each level's requests are written as its `single_turn` JSONL
(`{"text", "output_length"}`, replayed in order) and its `profile_export_aiperf.json` is read back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from pipeline.core.errors import BenchError, RunError
from pipeline.core.table import format_table
from pipeline.core.tool_venv import VenvTool

if TYPE_CHECKING:
    from pipeline.serving.bench import BenchReport, LevelPlan

AIPERF = VenvTool(requirement="aiperf==0.13.*", executable="aiperf", env="PIPELINE_AIPERF", venv_name="aiperf-venv")
EXPORT_FILE = "profile_export_aiperf.json"
STARTUP_S = 120.0  # its services start in ~10 s on 2 busy cores; a level may take this much beyond its own budget
OUTPUT_TAIL = 300  # characters of a failed run's error line we quote

# The request our bench sends on the text_input routes (`bench._build_inputs`), as Triton's generate JSON: greedy,
# exactly `output_length` tokens (min_tokens = max_tokens), the prompt left out of the streamed text.
PAYLOAD_TEMPLATE = ('{"text_input": {{ text|tojson }}, "max_tokens": {{ max_tokens }}, "min_tokens": {{ max_tokens }}, '
                    '"stream": true, "temperature": 0.0, "top_k": 1, "exclude_input_in_output": true%s}')


class AiperfLevel(BaseModel):
    """What AIPerf measured at one level (its `profile_export_aiperf.json`), in our report's units."""

    aiperf_version: str
    requests: int  # completed without error
    errors: int
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    tpot_ms_p50: float | None  # its inter_token_latency: (latency - TTFT) / (output tokens - 1), as ours
    output_tokens: int | None  # re-tokenized from the streamed text with the build's tokenizer
    output_tokens_per_s: float | None


def _metric(doc: dict[str, Any], tag: str, stat: str, unit: str) -> float | None:
    """One statistic of one metric of the export; None when the run produced none (e.g. every request failed).

    Raises:
        RunError: the metric is there in another unit (another AIPerf version's layout).
    """
    entry = doc.get(tag)
    if entry is None:
        return None
    if not isinstance(entry, dict) or entry.get("unit") != unit:
        raise RunError(f"aiperf export: {tag} is not in {unit} ({entry!r:.80}); is it {AIPERF.requirement}?")
    value = entry.get(stat)
    return round(float(value), 3) if value is not None else None


def parse_export(doc: dict[str, Any]) -> AiperfLevel:
    """Our figures from a `profile_export_aiperf.json` document.

    Raises:
        RunError: not an AIPerf export, or one in units this version does not write.
    """
    if not isinstance(doc, dict) or "aiperf_version" not in doc:
        raise RunError(f"aiperf wrote no {EXPORT_FILE} document (no aiperf_version); is it {AIPERF.requirement}?")
    tokens = _metric(doc, "total_output_tokens", "avg", "tokens")
    return AiperfLevel(
        aiperf_version=str(doc["aiperf_version"]),
        requests=int(_metric(doc, "request_count", "avg", "requests") or 0),
        errors=int(_metric(doc, "error_request_count", "avg", "requests") or 0),
        ttft_ms_p50=_metric(doc, "time_to_first_token", "p50", "ms"),
        ttft_ms_p99=_metric(doc, "time_to_first_token", "p99", "ms"),
        tpot_ms_p50=_metric(doc, "inter_token_latency", "p50", "ms"),
        output_tokens=int(tokens) if tokens is not None else None,
        output_tokens_per_s=_metric(doc, "output_token_throughput", "avg", "tokens/sec"),
    )


def payload_template(draft_tokens: int | None) -> str:
    """The Jinja payload of one level; `draft_tokens` 0 for the `--speculation off` arm (`num_draft_tokens`)."""
    return PAYLOAD_TEMPLATE % ("" if draft_tokens is None else f', "num_draft_tokens": {int(draft_tokens)}')


def dataset_jsonl(texts: list[str], output_lens: list[int]) -> str:
    """A level's requests as AIPerf `single_turn` JSONL: one `{"text", "output_length"}` a line, in order."""
    return "".join(json.dumps({"text": t, "output_length": n}, ensure_ascii=False) + "\n"
                   for t, n in zip(texts, output_lens, strict=True))


@dataclass(frozen=True)
class Target:
    """What AIPerf drives: the server's HTTP address, the Triton model, and the build's tokenizer (its token
    counts)."""

    http_url: str
    model: str
    tokenizer_dir: str


@dataclass(frozen=True)
class Load:
    """One level's load: `requests` requests, at most `concurrency` in flight, with `request_rate` Poisson
    arrivals (seeded by `seed`) when given."""

    concurrency: int
    requests: int
    request_rate: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class LevelFiles:
    """One level's files: its requests (`single_turn` JSONL), its payload template and AIPerf's artifact
    directory."""

    requests: Path
    template: Path
    artifacts: Path

    @classmethod
    def under(cls, root: Path) -> LevelFiles:
        return cls(root / "requests.jsonl", root / "payload.jinja", root / "artifacts")


def profile_argv(exe: str, target: Target, load: Load, files: LevelFiles, *, request_timeout_s: float) -> list[str]:
    """`aiperf profile` for one level: the `load` of the requests in `files.requests`, in order."""
    model = target.model
    argv = [exe, "profile", "--model", model, "--url", f"http://{target.http_url}", "--endpoint-type", "template",
            "--custom-endpoint", f"/v2/models/{model}/generate_stream", "--streaming",
            "--extra-inputs", f"payload_template:{files.template}", "--extra-inputs", "response_field:text_output",
            "--input-file", str(files.requests), "--custom-dataset-type", "single_turn",
            "--dataset-sampling-strategy", "sequential", "--request-count", str(load.requests),
            "--concurrency", str(load.concurrency)]
    if load.request_rate is not None:
        argv += ["--request-rate", f"{load.request_rate:g}", "--arrival-pattern", "poisson"]
    return argv + ["--random-seed", str(load.seed), "--tokenizer", target.tokenizer_dir,
                   "--request-timeout-seconds", f"{request_timeout_s:g}", "--output-artifact-dir",
                   str(files.artifacts), "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry"]


class Aiperf:
    """`bench --second-opinion aiperf`: checked before our run (`check`), run on every level after it (`run`)."""

    def __init__(self, exe: str, *, request_timeout_s: float = 120.0):
        self.exe = exe
        self.request_timeout_s = request_timeout_s

    @classmethod
    def installed(cls) -> Aiperf:
        """AIPerf from $PIPELINE_AIPERF or its cache venv, installed there on first use (HostError, exit 4)."""
        return cls(AIPERF.ensure())

    @staticmethod
    def check(report: BenchReport, *, http_url: str | None, tokenizer_dir: str | None) -> None:
        """BenchError (before anything is sent) when AIPerf cannot drive this route the way we do."""
        if not (report.streaming and report.min_tokens):
            raise BenchError(f"--second-opinion aiperf drives Triton's HTTP generate_stream with text_input and "
                             f"min_tokens; model '{report.triton_model}' is "
                             f"{'not streamed' if not report.streaming else 'not such a route'}: benchmark the "
                             "ensemble, streaming, or drop --second-opinion")
        if http_url is None:
            raise BenchError("--second-opinion aiperf needs the server's HTTP address with --url: pass --http-url "
                             "127.0.0.1:PORT (or drop --url so that bench starts the server)")
        if tokenizer_dir is None:
            raise BenchError("--second-opinion aiperf counts tokens with the build's tokenizer, and none is here; "
                             "build it here or pass --repo")

    def run(self, report: BenchReport, workload: list[LevelPlan], *, http_url: str, tokenizer_dir: str,
            level_budget_s: float) -> None:
        """Every level of `workload` again through AIPerf; sets each level's `aiperf` in `report`.

        Raises:
            RunError: AIPerf failed or wrote no export (its first ERROR line quoted).
        """
        target = Target(http_url, report.triton_model, tokenizer_dir)
        with tempfile.TemporaryDirectory(prefix="bench-aiperf-") as tmp:
            for i, (plan, stats) in enumerate(zip(workload, report.levels, strict=True)):
                (Path(tmp) / f"level-{i}").mkdir()
                files = LevelFiles.under(Path(tmp) / f"level-{i}")
                files.requests.write_text(dataset_jsonl(plan.texts, plan.max_tokens), encoding="utf-8")
                files.template.write_text(payload_template(0 if plan.mode == "off" else None))
                load = Load(plan.concurrency, len(plan.texts), report.request_rate, report.seed)
                argv = profile_argv(self.exe, target, load, files, request_timeout_s=self.request_timeout_s)
                stats.aiperf = self._profile(argv, files.artifacts / EXPORT_FILE,
                                             level_budget_s + self.request_timeout_s + STARTUP_S).model_dump()

    @staticmethod
    def _profile(argv: list[str], export: Path, timeout_s: float) -> AiperfLevel:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=aiperf_env(),
                                  cwd=export.parent.parent)
        except subprocess.TimeoutExpired as exc:
            raise RunError(f"aiperf took over {timeout_s:.0f} s on one level; rerun, or drop --second-opinion") from exc
        except OSError as exc:
            raise RunError(f"cannot run {argv[0]}: {exc.strerror}; reinstall it (delete {AIPERF.venv}) or set "
                           f"{AIPERF.env}") from exc
        if done.returncode != 0 or not export.is_file():
            raise RunError(f"aiperf failed (exit {done.returncode}): {failure_line(done.stdout + done.stderr)}")
        return parse_export(json.loads(export.read_text(encoding="utf-8")))


def aiperf_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Its environment: Hugging Face offline mode off (with it, AIPerf 0.13 looks a local tokenizer directory up as
    a Hub repo id and fails) and the Hub endpoint a closed loopback port, so that nothing is fetched."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return env | {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}


_LOG_PREFIX = re.compile(r"^[\d:.\- ]*ERROR\s+")
_LOG_SUFFIX = re.compile(r"\s*\(\w+\.py:\d+\)$")


def failure_line(output: str) -> str:
    """The first ERROR line of its log output (timestamp and source location dropped), else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if _LOG_PREFIX.match(line)]
    line = _LOG_SUFFIX.sub("", _LOG_PREFIX.sub("", errors[0])) if errors else (lines[-1] if lines else "no output")
    return line[:OUTPUT_TAIL]


def _pair(ours: float | None, theirs: float | None, spec: str) -> str:
    return " / ".join("n/a" if v is None else format(v, spec) for v in (ours, theirs))


def format_side_by_side(report: BenchReport) -> str:
    """Ours and AIPerf's figures per level (TTFT p50/p99, TPOT p50, output tok/s), then how they were measured."""
    head = ("conc", "spec", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "output tok/s", "aiperf reqs/err")
    rows = [head]
    versions = set()
    for lv in report.levels:
        a = AiperfLevel.model_validate(lv.aiperf) if lv.aiperf else None
        if a is None:
            continue
        versions.add(a.aiperf_version)
        rows.append((str(lv.concurrency), lv.speculation, _pair(lv.ttft_ms_p50, a.ttft_ms_p50, ".1f"),
                     _pair(lv.ttft_ms_p99, a.ttft_ms_p99, ".1f"), _pair(lv.tpot_ms_p50, a.tpot_ms_p50, ".2f"),
                     _pair(lv.output_tokens_per_s, a.output_tokens_per_s, ".1f"), f"{a.requests}/{a.errors}"))
    rate = (f"Poisson arrivals at {report.request_rate:g} req/s (its own draw)" if report.request_rate
            else "closed loop")
    return "\n".join([
        f"second opinion: NVIDIA AIPerf {', '.join(sorted(versions)) or '?'} on the same requests, in order, "
        f"{rate}; each cell ours / aiperf",
        format_table(rows, header=True, right=True),
        "note: aiperf streams over HTTP generate_stream (ours: gRPC) and counts output tokens by re-tokenizing the "
        "streamed text (ours: the server's count); its TPOT is its inter_token_latency, (latency - TTFT) / "
        "(tokens - 1) as ours",
    ])
