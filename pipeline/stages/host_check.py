"""Does this host have the GPU memory, RAM and disk for a build? Checked before the first byte is downloaded.

`check_host_fits` finds which stage outputs are already current (check-only lookups: nothing is built or fetched),
plans what the rest needs (`pipeline.stages.resources`), probes the host (`pipeline.core.host`, injectable) and raises
`HostResourceError` (exit 4) with one line: the numbers and the ways out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.runtimes import runtime_of
from pipeline.core.artifacts import cache_dir, output_root
from pipeline.core.errors import HostResourceError, PipelineError
from pipeline.core.gpus import GIB
from pipeline.core.host import HostResources, probe_host
from pipeline.core.spec import BuildSpec
from pipeline.core.table import format_table
from pipeline.stages.build import STAGES, locate_outputs
from pipeline.stages.download.stage import download_model
from pipeline.stages.package.package import SHARED_MODULE
from pipeline.stages.resources import (
    CUDA_CONTEXT_BYTES,
    STAGE_VOLUME,
    CalibrationMemory,
    ResourcePlan,
    SizeInputs,
    plan_resources,
)

TEMPLATES = Path(__file__).parents[1] / "templates" / "triton"
SKIP_HINT = "--skip-host-check to build anyway"
Probe = Callable[[dict[str, Path]], HostResources]


def volumes() -> dict[str, Path]:
    """Where the stages write: downloads under PIPELINE_CACHE, everything else under PIPELINE_ROOT."""
    return {"cache": cache_dir(), "root": output_root()}


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:,.1f} MiB"


def _tokenizer_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.iterdir()
               if p.is_file() and (p.name.startswith("tokenizer") or p.name in ("special_tokens_map.json",
                                                                                 "chat_template.jinja")))


def repo_code_bytes() -> int:
    """The repository's model code and config templates (a package fact, known before any download), with the
    shared request module once per Python model template that `package` copies it beside."""
    shared = TEMPLATES / SHARED_MODULE
    copies = len(list(TEMPLATES.glob("*/1/model.py")))
    return sum(p.stat().st_size for p in TEMPLATES.rglob("*") if p.is_file()) + (copies - 1) * shared.stat().st_size


def size_inputs(spec: BuildSpec, *, forced: Iterable[str] = ()) -> SizeInputs:
    """Which (stage, role) outputs are current (check-only lookups), and tokenizer sizes of existing downloads."""
    have: set[tuple[str, str]] = set()
    tokenizers: dict[str, int] = {}
    roles = [("target", spec.model)] + ([("draft", spec.draft_model)] if spec.draft_model else [])
    for role, entry in roles:
        try:
            res = download_model(entry, check_only=True)
        except PipelineError:
            continue
        have.add(("download", role))
        tokenizers[role] = _tokenizer_bytes(Path(res.path))
    if len(tokenizers) == len(roles):
        stages = runtime_of(spec).stages
        for until in ("package", "compile", "calibrate"):
            if until not in stages:
                continue
            try:
                locate_outputs(spec, until=until)
            except PipelineError:
                continue
            done = [s for s in STAGES[2 : STAGES.index(until) + 1] if s in stages]
            have |= {(stage, role) for stage in done for role, _ in roles if stage != "package" or role == "target"}
            break
    forced_from = min((STAGES.index(s) for s in forced), default=len(STAGES))
    have = {(s, r) for s, r in have if STAGES.index(s) < forced_from}
    return SizeInputs(present=frozenset(have), tokenizer_bytes=tokenizers, repo_code_bytes=repo_code_bytes())


@dataclass(frozen=True)
class HostFit:
    """The plan, the host and what does not fit ([] when the build fits)."""

    plan: ResourcePlan
    host: HostResources
    stages: tuple[str, ...]
    problems: tuple[str, ...]

    def summary(self) -> str:
        if self.problems:
            return "host: does not fit: " + "; ".join(self.problems)
        parts = [f"disk {label} {_gib(need)} of {_gib(free)} free" for _, label, need, free in _disk_rows(self)]
        for c in _calibrations(self):
            if self.host.gpus:
                parts.append(f"calibrate {c.role} {_gib(_gpu_need(c, len(self.host.gpus)))} GPU of "
                             f"{_gib(self.host.gpu_free_bytes)} free")
            else:
                hours = c.cpu_seconds_per_core / max(1, self.host.cpu_count) / 3600
                parts.append(f"calibrate {c.role} on CPU {_gib(c.cpu_ram_bytes)} RAM of "
                             f"{_gib(self.host.ram_available_bytes)} available (~{hours:,.1f} h)")
        return "host: fits: " + ("; ".join(parts) or "nothing to write")


def _gpu_need(c: CalibrationMemory, gpus: int) -> int:
    """GPU memory over `gpus` GPUs: one CUDA context each."""
    return c.gpu_bytes + (max(1, gpus) - 1) * CUDA_CONTEXT_BYTES


def _calibrations(fit: HostFit) -> list[CalibrationMemory]:
    return [c for c in fit.plan.calibration if "calibrate" in fit.stages and not c.present]


def _disk_rows(fit: HostFit) -> list[tuple[list[str], str, int, int]]:
    """(volume names, their label, bytes needed by the stages being run, free bytes) per filesystem."""
    by_device: dict[int, list[str]] = {}
    for name, vol in fit.host.volumes.items():
        by_device.setdefault(vol.device, []).append(name)
    rows = []
    for names in by_device.values():
        need = sum(d.needed for d in fit.plan.disk if d.stage in fit.stages and d.volume in names)
        label = " + ".join(f"{n} ({fit.host.volumes[n].path})" for n in names)
        rows.append((names, label, need, fit.host.volumes[names[0]].free_bytes))
    return rows


def _disk_problems(fit: HostFit) -> list[str]:
    out = []
    for names, label, need, free in _disk_rows(fit):
        if need > free:
            stages = ", ".join(f"{s} {_gib(fit.plan.stage_bytes(s))}" for s in fit.stages
                               if fit.plan.stage_bytes(s) and STAGE_VOLUME[s] in names)
            out.append(f"disk: {label} needs {_gib(need)} ({stages}) but has {_gib(free)} free, short by "
                       f"{_gib(need - free)}: free space there or point PIPELINE_CACHE / PIPELINE_ROOT at a volume "
                       "with room")
    return out


def _cpu_way_out(c: CalibrationMemory, host: HostResources) -> str:
    hours = c.cpu_seconds_per_core / max(1, host.cpu_count) / 3600
    short = " - not enough here" if c.cpu_ram_bytes > host.ram_available_bytes else ""
    return (f"calibrate on CPU (CUDA_VISIBLE_DEVICES= ) with {_gib(c.cpu_ram_bytes)} RAM "
            f"({_gib(host.ram_available_bytes)} available here{short}), roughly {hours:,.1f} h on "
            f"{host.cpu_count} cores or more")


def _calibration_problems(fit: HostFit, name: Callable[[str], str]) -> list[str]:
    host, out = fit.host, []
    for c in _calibrations(fit):
        terms = " + ".join(f"{k.replace('_', ' ')} {_gib(v)}" for k, v in c.gpu_terms.items() if v)
        if not host.gpus:
            if c.cpu_ram_bytes > host.ram_available_bytes:
                out.append(f"calibrating {name(c.role)} on CPU (no visible GPU) needs {_gib(c.cpu_ram_bytes)} RAM, "
                           f"{_gib(host.ram_available_bytes)} available: run on a GPU host (needs "
                           f"{_gib(c.gpu_bytes)} GPU memory: {terms}) or one with more RAM")
            continue
        need = _gpu_need(c, len(host.gpus))
        if need > host.gpu_free_bytes:
            per_gpu = max(g.free_bytes for g in host.gpus)
            more = math.ceil((c.gpu_bytes - CUDA_CONTEXT_BYTES) / max(1, per_gpu - CUDA_CONTEXT_BYTES))
            hidden = host.gpus_on_host - len(host.gpus)
            ways = [f"use {more} GPUs like these"]
            if hidden > 0:
                ways.append(f"expose the host's other {hidden} GPU(s) with CUDA_VISIBLE_DEVICES")
            ways.append(_cpu_way_out(c, host))
            out.append(f"calibrating {name(c.role)} needs {_gib(need)} GPU memory ({terms}) but the "
                       f"{len(host.gpus)} visible GPU(s) have {_gib(host.gpu_free_bytes)} free: " + ", or ".join(ways))
        elif c.host_bytes_with_gpu > host.ram_available_bytes:
            out.append(f"calibrating {name(c.role)} needs {_gib(c.host_bytes_with_gpu)} host RAM beside the GPUs, "
                       f"{_gib(host.ram_available_bytes)} available: free memory or use a larger host")
    return out


def assess(spec: BuildSpec, plan: ResourcePlan, host: HostResources, stages: Iterable[str]) -> HostFit:
    """Compare `plan` for the stages being run with `host` (pure)."""
    fit = HostFit(plan, host, tuple(s for s in stages if s in STAGE_VOLUME), ())
    entries = {"target": spec.model.name, "draft": spec.draft_model.name if spec.draft_model else "draft"}
    problems = _calibration_problems(fit, entries.__getitem__) + _disk_problems(fit)
    return HostFit(plan, host, fit.stages, tuple(problems))


def check_host_fits(spec: BuildSpec, *, stages: Iterable[str], force: str | None = None,
                    probe: Probe = probe_host) -> HostFit:
    """The host fit of the `stages` about to run (outputs already current need nothing; `force` and later stages
    are rebuilt). Raises `HostResourceError` (exit 4) naming the numbers and the ways out."""
    stages = tuple(stages)
    forced = STAGES[STAGES.index(force):] if force else ()
    plan = plan_resources(spec, size_inputs(spec, forced=forced))
    fit = assess(spec, plan, probe(volumes()), stages)
    if fit.problems:
        raise HostResourceError(f"this host cannot run the build: {'; '.join(fit.problems)} (or {SKIP_HINT})")
    return fit


def format_resources(plan: ResourcePlan) -> str:
    """The resource table of `plan` (human output): disk each stage writes, and calibration memory."""
    rows = [("stage", "volume", "writes")]
    for stage in ("download", "calibrate", "compile", "package", "release"):
        items = [d for d in plan.disk if d.stage == stage]
        if items:
            rows.append((stage + (" (invoke release)" if stage == "release" else ""), items[0].volume,
                         _gib(sum(d.bytes for d in items))))
    lines = [format_table(rows)]
    for c in plan.calibration:
        terms = ", ".join(f"{k.replace('_', ' ')} {_gib(v)}" for k, v in c.gpu_terms.items() if v)
        lines.append(f"calibrate {c.role}: GPU {_gib(c.gpu_bytes)} ({terms}); host RAM {_gib(c.host_bytes_with_gpu)} "
                     f"beside the GPUs, or {_gib(c.cpu_ram_bytes)} on CPU (~{c.cpu_seconds_per_core / 3600:,.1f} "
                     "core-hours)")
    return "\n".join(lines)
